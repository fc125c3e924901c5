use std::{net::SocketAddr, time::Duration};

use super::*;

/// The sidecar refuses unknown fields and values of the wrong form: every setting and
/// variant here is spelled as it reads them.
#[test]
fn the_sidecar_reads_every_setting_as_written() {
    let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let tls = ServerTls {
        ca: Some("ca.pem".into()),
        cert: Some("client.pem".into()),
        key: Some("client.key".into()),
        server_name: Some("capacity.test".into()),
    };
    let every_listener_setting = Listener::new("app", at(9000))
        .max_connections(10)
        .max_requests(5)
        .idle_timeout(Duration::from_secs(60))
        .header_read_timeout(Duration::from_millis(1500))
        .send_timeout(Duration::from_secs(3))
        .max_header_bytes(4096);
    let keyed = |id: &str, per: Per| Resource::new(id).per(per).max_keys(100).idle_timeout(Duration::from_secs(300));
    let config =
        SidecarConfig::proxy(every_listener_setting, Upstream::new("orders", "https://orders.test").ca("ca.pem"))
            .leasing_from([at(7777), at(7778)])
            .server_tls(tls)
            .listener(Listener::new("edge", at(9001)))
            .upstream(
                Upstream::new("api", "http://127.0.0.1:8081")
                    .hosts(&["api.test"])
                    .timeout(Duration::from_secs(30))
                    .body_idle_timeout(Duration::from_secs(300)),
            )
            .resource(Resource::new("all").kind(Kind::Rate).capacity(f64::INFINITY).burst(10.0).priority(1))
            .resource(
                Resource::new("pool").kind(Kind::Concurrency).when_unreachable(Fallback::Optimistic).safe_capacity(2.0),
            )
            .resource(Resource::new("strict").when_unreachable(Fallback::Pessimistic))
            .resource(Resource::new("safe").when_unreachable(Fallback::Safe))
            .resource(keyed("tenants", Per::Header("x-tenant".into())).metrics(Metrics::PerKey))
            .resource(keyed("segments", Per::PathSegment(1)).metrics(Metrics::PerResource))
            .resource(keyed("queries", Per::Query("t".into())))
            .resource(keyed("services", Per::Grpc(GrpcPart::Service)))
            .resource(keyed("methods", Per::Grpc(GrpcPart::Method)))
            .resource(keyed("verbs", Per::Method))
            .resource(keyed("hosts", Per::Host))
            .rule(
                Rule::charging("all")
                    .name("writes")
                    .matching(
                        Match::default()
                            .methods(&["POST", "PUT"])
                            .path(PathMatch::Prefix("/v1".into()))
                            .header("x-tier", "gold"),
                    )
                    .also("pool")
                    .cost(Cost::Header { header: "x-cost".into(), default: Some(2.0) })
                    .max_cost(50.0)
                    .on_limit(OnLimit::Delay)
                    .max_wait(Duration::from_millis(200)),
            )
            .rule(Rule::charging("methods").matching(Match::default().grpc("pkg.Svc", Some("Get")).listener("app")))
            .rule(Rule::charging("hosts").matching(Match::default().host("*.test")).on_limit(OnLimit::Shadow))
            .rule(Rule::charging("segments").matching(Match::default().path(PathMatch::Exact("/s".into()))))
            .rule(Rule::charging("queries").matching(Match::default().path(PathMatch::Glob("/q/*".into()))))
            .rule(Rule::charging("all").cost(Cost::Bytes(Body::Request)).on_limit(OnLimit::Reject))
            .rule(Rule::charging("all").cost(Cost::Bytes(Body::Response)))
            .rule(Rule::charging("tenants").cost(Cost::Units(0.5)));
    if let Err(e) = sluice_sidecar::config::parse(&config.yaml()) {
        panic!("{e}:\n{}", config.yaml());
    }
}

/// The rate limit service's settings as the sidecar reads them, with no listeners.
#[test]
fn the_sidecar_reads_the_rate_limit_service_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratelimit.yaml");
    let limits =
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 60}\n";
    std::fs::write(&file, limits).unwrap();
    let service = RateLimitService::new(SocketAddr::from(([127, 0, 0, 1], 8081)), [&file])
        .max_requests(50)
        .max_keys(10)
        .idle_timeout(Duration::from_secs(60))
        .when_unreachable(Fallback::Pessimistic);
    let config =
        SidecarConfig::new().leasing_from([SocketAddr::from(([127, 0, 0, 1], 7777))]).rate_limit_service(service);
    let parsed = sluice_sidecar::config::parse(&config.yaml()).unwrap_or_else(|e| panic!("{e}:\n{}", config.yaml()));
    let service = parsed.rate_limit_service.expect("the service");
    assert_eq!((service.address.port(), service.max_requests), (8081, 50));
    let resource = parsed.resources.iter().find(|r| r.id == "edge/remote_address=").expect("the keyed limit");
    assert_eq!(resource.key.as_ref().map(|k| k.max_keys), Some(10));
}
