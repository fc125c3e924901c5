use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::*;

const FILE: &str = r#"
domain: edge
descriptors:
  - key: generic_key
    value: demo
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: remote_address
    rate_limit: {unit: Minute, requests_per_unit: 600, name: per-ip}
  - key: path
    value: "/api/*"
    rate_limit: {unit: hour, requests_per_unit: 3600}
  - key: path
    value: /api/health
    rate_limit: {unlimited: true}
  - key: client_id
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: day, requests_per_unit: 86400, replaces: [{name: per-ip}]}
        shadow_mode: true
        detailed_metric: true
  - key: tenant
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: year, requests_per_unit: 1}
"#;

fn domain() -> Domain {
    Domain::parse(FILE).expect("file")
}

fn find(d: &Domain, entries: &[(&str, &str)]) -> Option<(String, Option<String>)> {
    d.find(entries.iter().copied()).map(|f| (d.limits[f.limit].id.clone(), f.key))
}

#[test]
fn limits_become_resources_named_by_domain_and_path() {
    let d = domain();
    let ids: Vec<_> = d.limits.iter().map(|l| (l.id.as_str(), l.keyed)).collect();
    assert_eq!(
        ids,
        [
            ("edge/generic_key=demo", false),
            ("edge/remote_address=", true),
            ("edge/path=%2Fapi%2F%2A", true),
            ("edge/path=%2Fapi%2Fhealth", false),
            ("edge/client_id=/plan=gold", true),
            ("edge/tenant=acme/user=", true),
        ]
    );
    let gold = &d.limits[4];
    assert!(gold.shadow && gold.detailed);
    assert_eq!(gold.replaces, ["per-ip"]);
    assert_eq!(d.limits[1].name.as_deref(), Some("per-ip"));
    assert_eq!(d.limits[3].quota, None);
}

#[test]
fn units_are_rates_and_a_bucket_of_one_unit() {
    let d = domain();
    let q = |i: usize| d.limits[i].quota.unwrap();
    assert_eq!((q(0).rate(), q(0).window()), (20.0, 1.0));
    assert_eq!((q(1).rate(), q(1).window()), (10.0, 60.0));
    assert_eq!(q(4).rate(), 1.0);
    assert_eq!(q(4).window(), 86_400.0);
    assert_eq!(q(5).unit.seconds(), 365.0 * 86_400.0);
    assert_eq!(Unit::Month.seconds(), 30.0 * 86_400.0);
}

#[test]
fn matching_prefers_exact_then_wildcard_then_any_value() {
    let d = domain();
    assert_eq!(find(&d, &[("generic_key", "demo")]), Some(("edge/generic_key=demo".into(), None)));
    assert_eq!(find(&d, &[("generic_key", "other")]), None);
    assert_eq!(
        find(&d, &[("remote_address", "10.0.0.1")]),
        Some(("edge/remote_address=".into(), Some("10.0.0.1".into())))
    );
    assert_eq!(find(&d, &[("path", "/api/health")]), Some(("edge/path=%2Fapi%2Fhealth".into(), None)));
    assert_eq!(
        find(&d, &[("path", "/api/orders")]),
        Some(("edge/path=%2Fapi%2F%2A".into(), Some("/api/orders".into())))
    );
    assert_eq!(find(&d, &[("path", "/web")]), None);
    // Nested: the limit is the last entry's node's; an intermediate node's is not applied.
    assert_eq!(find(&d, &[("client_id", "c1")]), None);
    assert_eq!(
        find(&d, &[("client_id", "c1"), ("plan", "gold")]),
        Some(("edge/client_id=/plan=gold".into(), Some("c1".into())))
    );
    assert_eq!(find(&d, &[("client_id", "c1"), ("plan", "gold"), ("x", "y")]), None);
    assert_eq!(
        find(&d, &[("tenant", "acme"), ("user", "u/1")]),
        Some(("edge/tenant=acme/user=".into(), Some("u/1".into())))
    );
    assert_eq!(find(&d, &[]), None);
}

#[test]
fn several_open_values_make_one_key_that_keeps_them_apart() {
    let d = Domain::parse(
        "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let key = |a: &str, b: &str| d.find([("a", a), ("b", b)]).unwrap().key.unwrap();
    assert_eq!(key("x", "y"), "x/y");
    assert_ne!(key("x/y", "z"), key("x", "y/z"));
}

#[test]
fn bad_files_name_where() {
    let err = |text: &str| Domain::parse(text).unwrap_err();
    assert_eq!(err("domain: ''\n"), "domain: must not be empty");
    assert_eq!(
        err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"),
        "descriptors[0].rate_limit.unit: \"fortnight\" is not one of second, minute, hour, day, month, year"
    );
    assert_eq!(
        err(
            "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n        rate_limit: {requests_per_unit: 1}\n"
        ),
        "descriptors[0].descriptors[0].rate_limit.unit: required (second, minute, hour, day, month or year)"
    );
    assert_eq!(
        err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n"),
        "descriptors[0].rate_limit: an unlimited limit takes no unit and no requests_per_unit"
    );
    assert_eq!(
        err("domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n"),
        "descriptors[1]: duplicate descriptor (k: v) among its siblings"
    );
    assert_eq!(err("domain: d\ndescriptors:\n  - {key: ''}\n"), "descriptors[0].key: must not be empty");
    assert!(err("domain: d\ndescriptors:\n  - {key: k, colour: red}\n").contains("unknown field `colour`"));
    assert!(
        err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n")
            .contains("requests_per_unit")
    );
    let long = format!(
        "domain: d\ndescriptors:\n  - key: k\n    value: {}\n    rate_limit: {{unit: second}}\n",
        "v".repeat(1100)
    );
    assert!(err(&long).starts_with("descriptors[0]: its resource id is 1104 bytes, more than 1024"), "{}", err(&long));
    let mut deep = String::from("domain: d\ndescriptors:\n");
    for level in 0..=MAX_DEPTH {
        let pad = "  ".repeat(2 * level);
        deep.push_str(&format!("{pad}  - key: k\n{pad}    descriptors:\n"));
    }
    deep.push_str(&format!("{}  - key: k\n", "  ".repeat(2 * (MAX_DEPTH + 1))));
    assert!(err(&deep).ends_with("descriptors nest at most 16 levels deep"), "{}", err(&deep));
}

#[test]
fn too_many_descriptors_is_refused() {
    let mut text = String::from("domain: d\ndescriptors:\n");
    for i in 0..=MAX_DESCRIPTORS {
        text.push_str(&format!("  - {{key: k, value: v{i}}}\n"));
    }
    assert_eq!(Domain::parse(&text).unwrap_err(), "descriptors: a file holds at most 10000 descriptors");
}

proptest! {
    #[test]
    fn a_component_is_unreserved_bytes_and_escapes_only(text in ".{0,40}") {
        let c = component(&text);
        prop_assert!(c.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)));
        let decoded: Vec<u8> = {
            let b = c.as_bytes();
            let (mut out, mut i) = (Vec::new(), 0);
            while i < b.len() {
                if b[i] == b'%' {
                    out.push(u8::from_str_radix(&c[i + 1..i + 3], 16).unwrap());
                    i += 3;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            out
        };
        prop_assert_eq!(decoded, text.as_bytes());
    }
}

#[test]
fn named_files_are_read_leniently_and_resolved() {
    let dir = Path::new("/etc/sluice");
    let text = "rate_limit_service: {files: [a.yaml, /abs/b.yaml], colour: red}\nlisteners: 7\n";
    assert_eq!(named_files(text, "rate_limit_service", dir), [dir.join("a.yaml"), PathBuf::from("/abs/b.yaml")]);
    assert!(named_files(text, "rate_limits", dir).is_empty());
    assert!(named_files("[", "rate_limit_service", dir).is_empty());
    let many = format!("s: {{files: [{}]}}\n", vec!["f"; MAX_FILES + 5].join(", "));
    assert_eq!(named_files(&many, "s", dir).len(), MAX_FILES);
}

#[test]
fn a_file_is_read_only_if_regular_and_bounded() {
    assert_eq!(read(Path::new("/dev/zero")).unwrap_err().to_string(), "not a regular file");
    let dir = std::env::temp_dir().join(format!("sluice-ratelimit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.yaml");
    std::fs::File::create(&big).unwrap().set_len(MAX_FILE_BYTES as u64 + 1).unwrap();
    assert_eq!(read(&big).unwrap_err().to_string(), "larger than 16 MiB");
    std::fs::write(&big, "domain: d\n").unwrap();
    assert_eq!(read(&big).unwrap(), "domain: d\n");
    std::fs::remove_dir_all(&dir).unwrap();
}
