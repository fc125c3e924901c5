use super::*;
use crate::defaults;

#[test]
fn shipped_configurations_are_valid() {
    let example = parse(include_str!("../../../deploy/examples/sidecar.yaml")).expect("example");
    assert_eq!(example.rules[0].resources, ["orders.write", "orders.all"]);
    assert_eq!(example.rules[0].on_limit, OnLimit::Delay);
    let embedded = parse(defaults::EMBEDDED_CONFIG).expect("embedded default");
    assert!(embedded.server.is_none() && embedded.resources[0].capacity == Capacity::new(100.0));
}

#[test]
fn server_addresses_from_the_flag_replace_the_files() {
    let servers = ["leaf.sluice:7777".to_owned()];
    let flags = ServerFlags { addresses: servers.to_vec(), ..ServerFlags::default() };
    let example = parse_with(include_str!("../../../deploy/examples/sidecar.yaml"), &flags, std::path::Path::new(""))
        .expect("example");
    assert_eq!(example.server.expect("leasing").addresses, servers);
    // A standalone file leases from them too; its capacities are then not required.
    let standalone = "listeners: [{name: l, address: 127.0.0.1:1, upstream: u}]\n\
                      upstreams: [{name: u, url: http://127.0.0.1:2}]\nresources: [{id: r}]\n";
    assert!(parse(standalone).is_err());
    let leasing = parse_with(standalone, &flags, std::path::Path::new("")).expect("leasing");
    assert_eq!(leasing.server, Some(ServerConfig { addresses: servers.to_vec(), tls: None }));
}

#[test]
fn server_tls_files_from_the_flags_replace_the_files_and_keep_its_server_name() {
    let path = |p: &str| Some(std::path::PathBuf::from(p));
    let identity = ServerFlags {
        addresses: vec!["root.sluice.svc:7777".into()],
        ca: path("/id/ca.crt"),
        cert: path("/id/tls.crt"),
        key: path("/id/tls.key"),
    };
    let file = "listeners: [{name: l, address: 127.0.0.1:1, upstream: u}]\n\
                upstreams: [{name: u, url: http://127.0.0.1:2}]\nresources: [{id: r}]\n\
                server: {addresses: [x:1], tls: {ca: /file/ca.pem, server_name: root}}\n";
    let parsed = parse_with(file, &identity, std::path::Path::new("")).expect("with the flags").server.unwrap();
    let tls = ServerTls {
        ca: path("/id/ca.crt"),
        cert: path("/id/tls.crt"),
        key: path("/id/tls.key"),
        server_name: Some("root".into()),
    };
    assert_eq!(parsed, ServerConfig { addresses: identity.addresses.clone(), tls: Some(tls) });
    // The CA alone replaces the file's CA only.
    let ca_only = ServerFlags { ca: path("/id/ca.crt"), ..ServerFlags::default() };
    let tls = parse_with(file, &ca_only, std::path::Path::new("")).unwrap().server.unwrap().tls.unwrap();
    assert_eq!((tls.ca, tls.server_name), (path("/id/ca.crt"), Some("root".into())));
    // Without servers to speak TLS to, the flags are one clear error.
    let standalone = "listeners: [{name: l, address: 127.0.0.1:1, upstream: u}]\n\
                      upstreams: [{name: u, url: http://127.0.0.1:2}]\nresources: [{id: r, capacity: 1}]\n";
    let error = parse_with(standalone, &ca_only, std::path::Path::new("")).unwrap_err();
    assert!(
        error.starts_with("--server-tls-ca, --server-tls-cert and --server-tls-key need capacity servers")
            && !error.contains('\n'),
        "{error}"
    );
}

#[test]
fn errors_name_the_item_and_field() {
    let base = "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    upstream: u\n\
                upstreams:\n  - name: u\n    url: http://127.0.0.1:2\n";
    let cases = [
        ("resources:\n  - id: r\n", "resources[0] (r).capacity: required in standalone mode"),
        (
            "resources:\n  - id: r\n    capacity: -1\n",
            "resources[0] (r).capacity: must be from 0 to 1e15 or .inf, got -1",
        ),
        (
            "resources:\n  - id: r\n    capacity: 1\nrules:\n  - resource: x\n",
            "rules[0] (rules[0]).resource: \"x\" is not a declared resource (defined: \"r\")",
        ),
        (
            "resources:\n  - id: r\n    capacity: 1\nrules:\n  - resource: r\n    on_limit: delay\n",
            "`on_limit: delay` needs a max_wait above 0",
        ),
        ("resources:\n  - id: r\n    capacity: 1\nrules:\n  - resource: r\n    also: [r]\n", "\"r\" is charged twice"),
        ("resources:\n  - id: r\n    capacity: 1\n  - id: r\n    capacity: 2\n", "resources: \"r\" is defined twice"),
        (
            "resources:\n  - id: r\n    capacity: 1\nrules:\n  - {name: a, resource: r}\n  - {name: a, resource: r}\n",
            "rules: \"a\" is defined twice",
        ),
    ];
    for (tail, expected) in cases {
        let error = parse(&format!("{base}{tail}")).expect_err(tail);
        assert!(error.contains(expected), "{error:?} should contain {expected:?}");
    }
    let bad_url = base.replace("http://127.0.0.1:2", "ftp://x");
    assert!(parse(&bad_url).unwrap_err().contains("must be http://host[:port] or https://host[:port]"));
    let path_url = base.replace("http://127.0.0.1:2", "http://x/base");
    assert!(parse(&path_url).unwrap_err().contains("must not have a path"));
}

#[test]
fn every_error_is_found_one_per_line_without_echoes() {
    let text = "listeners:\n  - {name: l, address: 127.0.0.1:1, upstream: u, max_requests: 0}\n\
                upstreams:\n  - {name: u, url: http://127.0.0.1:2}\n  - {name: v, url: ftp://x}\n\
                resources:\n  - {id: r, capacity: -5}\n  - {id: s, capacity: 1, burst: 0}\n\
                rules:\n  - {resource: r, match: {listener: nowhere}}\n";
    let error = parse(text).expect_err("four mistakes");
    let lines: Vec<&str> = error.lines().collect();
    assert_eq!(lines.len(), 3, "{error}");
    assert!(lines[0].starts_with("upstreams[1] (v).url: "), "{error}");
    assert_eq!(lines[1], "resources[0] (r).capacity: must be from 0 to 1e15 or .inf, got -5");
    assert_eq!(lines[2], "resources[1] (s).burst: must be above 0 and at most 1e15, got 0");
    // The listener names the invalid upstream's neighbour, and the rules wait for valid resources
    // and listeners: once those are fixed, their own mistakes are found.
    let fixed =
        text.replace("ftp://x", "http://x").replace("capacity: -5", "capacity: 5").replace("burst: 0", "burst: 1");
    assert_eq!(parse(&fixed).unwrap_err(), "listeners[0] (l).max_requests: must be from 1 to 1000000, got 0");
    let unknown = fixed.replace(", max_requests: 0", "").replace("upstream: u", "upstream: w");
    assert_eq!(
        parse(&unknown).unwrap_err(),
        "listeners[0] (l).upstream: no upstream named \"w\" (defined: \"u\", \"v\")"
    );
    let rule = unknown.replace("upstream: w", "upstream: u");
    assert_eq!(
        parse(&rule).unwrap_err(),
        "rules[0] (rules[0]).match.listener: no listener named \"nowhere\" (defined: \"l\")"
    );
}

#[test]
fn every_duration_and_amount_has_a_limit() {
    let listener = |extra: &str| {
        format!(
            "listeners:\n  - {{name: l, address: 127.0.0.1:1, upstream: u{extra}}}\n\
             upstreams:\n  - {{name: u, url: http://127.0.0.1:2}}\n"
        )
    };
    let with = |resource: &str, rule: &str| {
        format!("{}resources:\n  - {{id: r, {resource}}}\nrules:\n  - {{resource: r{rule}}}\n", listener(""))
    };
    let cases = [
        (listener(", idle_timeout: 25h"), "listeners[0] (l).idle_timeout: must be at most 1day"),
        (listener(", header_read_timeout: 0s"), "listeners[0] (l).header_read_timeout: must be greater than 0"),
        (listener(", send_timeout: 300000000000years"), "listeners[0] (l).send_timeout: must be at most 1day"),
        (
            listener(", max_connections: 1000001"),
            "listeners[0] (l).max_connections: must be from 1 to 1000000, got 1000001",
        ),
        (listener(", max_requests: 0"), "listeners[0] (l).max_requests: must be from 1 to 1000000, got 0"),
        (listener(", max_header_bytes: 2000000"), "listeners[0] (l).max_header_bytes: must be from 1 to 1048576"),
        (
            listener("").replace("http://127.0.0.1:2", "http://127.0.0.1:2, timeout: 2days"),
            "upstreams[0] (u).timeout: must be at most 1day",
        ),
        (
            listener("").replace("http://127.0.0.1:2", "http://127.0.0.1:2, body_idle_timeout: 0s"),
            "upstreams[0] (u).body_idle_timeout: must be greater than 0",
        ),
        (with("capacity: 1e300", ""), "resources[0] (r).capacity: must be from 0 to 1e15 or .inf, got 1e300"),
        (
            with("capacity: 1, safe_capacity: .nan", ""),
            "resources[0] (r).safe_capacity: must be from 0 to 1e15 or .inf, got NaN",
        ),
        (with("capacity: 1, burst: .inf", ""), "resources[0] (r).burst: must be above 0 and at most 1e15, got inf"),
        (with("capacity: 1", ", cost: 1e16"), "rules[0] (rules[0]).cost: must be from 0 to 1e15, got 1e16"),
        (
            with("capacity: 1", ", cost: {header: x-cost, default: -1}"),
            "rules[0] (rules[0]).cost.default: must be from 0 to 1e15, got -1",
        ),
        (
            with("capacity: 1", ", cost: 2, max_cost: 5"),
            "rules[0] (rules[0]).max_cost: bounds a cost read from a header only",
        ),
        (
            format!(
                "{}resources:\n  - {{id: r, capacity: 1}}\n  - {{id: p, kind: concurrency, capacity: 1}}\n\
                 rules:\n  - {{resource: r, also: [p], cost: request_bytes}}\n",
                listener("")
            ),
            "rules[0] (rules[0]).cost: bytes are charged to rate resources only (bytes a second); \"p\" is a \
             concurrency resource",
        ),
        (
            with("capacity: 1", ", cost: {header: x-cost, default: 6}, max_cost: 5"),
            "rules[0] (rules[0]).cost.default: is above max_cost",
        ),
        (
            with("capacity: 1", ", cost: {header: x-cost}, max_cost: 0"),
            "rules[0] (rules[0]).max_cost: must be above 0 and at most 1e15, got 0",
        ),
        (
            with("capacity: 1", ", on_limit: delay, max_wait: 300000000000years"),
            "rules[0] (rules[0]).max_wait: must be at most 1day",
        ),
    ];
    for (yaml, expected) in cases {
        let error = parse(&yaml).expect_err(&yaml);
        assert!(error.contains(expected), "{error:?} should contain {expected:?}");
    }
    // At the limits, and the smallest capacities, all is well.
    let fine = with("capacity: 1e-25, burst: 1e15, safe_capacity: .inf", ", cost: {header: x-cost}, max_cost: 1e15")
        .replace("upstream: u}", "upstream: u, idle_timeout: 1day, send_timeout: 24h, max_connections: 1000000}");
    let config = parse(&fine).expect("within the limits");
    assert_eq!(config.resources[0].capacity, Capacity::new(1e-25));
    assert_eq!(config.listeners[0].send_timeout, defaults::MAX_SETTING_DURATION);
    assert_eq!(config.upstreams[0].body_idle_timeout, defaults::UPSTREAM_BODY_IDLE_TIMEOUT);
    let CostRule::Header { max, default, .. } = &config.rules[0].cost else { panic!("a header cost") };
    assert_eq!((*max, *default), (Some(Cost::MAX), Cost::ONE));
    for (cost, of) in [("request_bytes", Side::Request), ("response_bytes", Side::Response)] {
        let config = parse(&with("capacity: 1", &format!(", cost: {cost}, max_cost: 65536"))).expect(cost);
        assert_eq!(config.rules[0].cost, CostRule::Bytes { of, max: Cost::new(65536.0) });
    }
}

#[test]
fn keyed_resources_are_checked() {
    let with = |server: &str, resources: &str| {
        format!(
            "{server}listeners:\n  - {{name: l, address: 127.0.0.1:1, upstream: u}}\n\
             upstreams:\n  - {{name: u, url: http://127.0.0.1:2}}\nresources:\n{resources}"
        )
    };
    let standalone = |resources: &str| with("", resources);
    let leasing = |resources: &str| with("server: {addresses: [\"127.0.0.1:3\"]}\n", resources);
    let long = "x".repeat(960);
    let cases = [
        (
            standalone("  - {id: k, capacity: 1, max_keys: 5}\n"),
            "resources[0] (k).per: max_keys, idle_timeout and metrics need `per`",
        ),
        (standalone("  - {id: k, capacity: 1, per: {header: x, query: y}}\n"), "(k).per: give exactly one of header"),
        (
            standalone("  - {id: k, capacity: 1, per: {header: \"a b\"}}\n"),
            "(k).per.header: \"a b\" is not a header name",
        ),
        (standalone("  - {id: k, capacity: 1, per: host, max_keys: 0}\n"), "(k).max_keys: must be from 1 to 10000"),
        (
            standalone("  - {id: k, capacity: 1, per: host, idle_timeout: 0s}\n"),
            "(k).idle_timeout: must be greater than 0",
        ),
        (
            standalone(&format!("  - {{id: {long}, capacity: 1, per: host}}\n")),
            "a keyed resource's id is at most 959 bytes",
        ),
        (
            standalone("  - {id: k, capacity: 1, per: method}\n  - {id: k/GET, capacity: 1}\n"),
            "resources (k/GET).id: could be a key of the keyed resource \"k\"",
        ),
        (
            leasing("  - {id: a, per: method, max_keys: 5000}\n  - {id: b, per: host, max_keys: 4996}\n  - {id: c}\n"),
            "resources: up to 10001 ids",
        ),
    ];
    for (yaml, expected) in cases {
        let error = parse(&yaml).expect_err(&yaml);
        assert!(error.contains(expected), "{error:?} should contain {expected:?}");
    }
    let fits =
        leasing("  - {id: a, per: method, max_keys: 5000}\n  - {id: b, per: host, max_keys: 4995}\n  - {id: c}\n");
    let config = parse(&fits).expect("10,000 ids");
    let key = config.resources[0].key.as_ref().unwrap();
    assert_eq!((key.max_keys, key.idle_timeout, key.per_key_metrics), (5000, defaults::KEY_IDLE_TIMEOUT, false));
    let per_key = parse(&standalone("  - {id: k, capacity: 1, per: {path_segment: 2}, metrics: per_key}\n")).unwrap();
    let key = per_key.resources[0].key.as_ref().unwrap();
    assert_eq!(
        (&key.per, key.max_keys, key.per_key_metrics),
        (&KeyAttribute::PathSegment(2), defaults::MAX_KEYS, true)
    );
}

#[test]
fn a_rate_limit_service_makes_its_limits_resources() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write(
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - {key: ip, rate_limit: {unit: minute, requests_per_unit: 120}, \
         descriptors: [{key: path, rate_limit: {unit: second, requests_per_unit: 1}}]}\n  - {key: k, value: v, rate_limit: {unit: day, requests_per_unit: 8640, name: daily}}\n  - {key: k, value: free, rate_limit: {unlimited: true}}\n",
    );
    write("again.yaml", "domain: edge\n");
    write("bad.yaml", "domain: x\ndescriptors:\n  - {key: k, rate_limit: {unit: week}}\n");
    let parse = |text: &str| parse_with(text, &ServerFlags::default(), dir.path());
    let config =
        parse("rate_limit_service: {address: 127.0.0.1:8081, files: [edge.yaml]}\n").expect("no listener needed");
    let made: Vec<_> = config
        .resources
        .iter()
        .map(|r| (r.id.as_str(), r.capacity.map(|c| c.get()), r.burst, r.key.is_some()))
        .collect();
    assert_eq!(
        made,
        [
            ("edge/ip=", Some(2.0), Burst::Window(60.0), true),
            ("edge/ip=/path=", Some(1.0), Burst::Window(1.0), true),
            ("edge/k=v", Some(0.1), Burst::Window(86_400.0), false)
        ]
    );
    let service = config.rate_limit_service.as_ref().unwrap();
    assert_eq!((service.domains.len(), service.max_requests), (1, defaults::MAX_REQUESTS));
    let leasing = parse(
        "server: {addresses: ['127.0.0.1:7777']}\nrate_limit_service: {address: 127.0.0.1:8081, files: [edge.yaml]}\n",
    )
    .unwrap();
    assert_eq!(leasing.resources[0].capacity, None, "with a server, the servers say the capacity");
    assert_eq!(leasing.resources[0].safe_capacity.map(|c| c.get()), Some(2.0));
    let cases = [
        (
            "rate_limit_service: {address: 127.0.0.1:8081, files: []}\n",
            "rate_limit_service.files: from 1 to 64 envoyproxy/ratelimit files, got 0",
        ),
        (
            "rate_limit_service: {address: 127.0.0.1:8081, files: [none.yaml]}\n",
            "rate_limit_service.files[0] (none.yaml): cannot read",
        ),
        (
            "rate_limit_service: {address: 127.0.0.1:8081, files: [bad.yaml]}\n",
            "rate_limit_service.files[0] (bad.yaml): descriptors[0].rate_limit.unit: \"week\" is not one of",
        ),
        (
            "rate_limit_service: {address: 127.0.0.1:8081, files: [edge.yaml, again.yaml]}\n",
            "rate_limit_service.files[1] (again.yaml): domain \"edge\" is in an earlier file too",
        ),
        (
            "rate_limit_service: {address: 127.0.0.1:8081, files: [edge.yaml], max_keys: 0}\n",
            "max_keys: must be from 1",
        ),
        (
            "rate_limit_service: {address: 127.0.0.1:8081, files: [edge.yaml]}\nresources: [{id: edge/k=v, capacity: 1}]\n",
            "resources: \"edge/k=v\" is defined twice",
        ),
        (
            "listeners: [{name: l, address: 127.0.0.1:9000, upstream: u}]\nupstreams: [{name: u, url: 'http://127.0.0.1:1'}]\n\
             rules: [{resource: edge/k=v}]\nrate_limit_service: {address: 127.0.0.1:8081, files: [edge.yaml]}\n",
            "rules[0] (rules[0]).resource: \"edge/k=v\" is not a declared resource",
        ),
        ("resources: []\n", "listeners: at least one listener is required (or a rate_limit_service)"),
    ];
    for (yaml, expected) in cases {
        let error = parse(yaml).expect_err(yaml);
        assert!(error.contains(expected), "{error:?} should contain {expected:?}");
    }
}
