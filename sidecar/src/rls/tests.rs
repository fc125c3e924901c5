//! The decisions of the rate limit service on a standalone plan: no runtime beyond the gates'
//! own (no call waits), real files in a temporary folder.

use futures_util::FutureExt;
use sluice_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

use super::*;
use crate::{config, plan::Plan};

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: generic_key
    value: two
    rate_limit: {unit: second, requests_per_unit: 2, name: two}
  - key: generic_key
    value: many
    rate_limit: {unit: minute, requests_per_unit: 6000}
  - key: generic_key
    value: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: generic_key
    value: free
    rate_limit: {unlimited: true}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: plan
    value: gold
    rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: two}]}
"#;

fn plan() -> (Plan, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.yaml"), LIMITS).unwrap();
    let text = "rate_limit_service: {address: 127.0.0.1:0, files: [limits.yaml]}\n";
    let config = config::parse_with(text, &config::ServerFlags::default(), dir.path()).expect("config");
    (Plan::build(config, None, None).expect("plan"), dir)
}

fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
        limit: None,
        hits_addend: hits,
    }
}

fn call(
    plan: &Plan,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> Result<RateLimitResponse, String> {
    let request = RateLimitRequest { domain: domain.into(), descriptors, hits_addend: hits };
    let limits = plan.domains.get(domain).map(Arc::as_ref);
    decide(limits, &request).now_or_never().expect("no call waits")
}

fn codes(answer: &RateLimitResponse) -> (i32, Vec<i32>) {
    (answer.overall_code, answer.statuses.iter().map(|s| s.code).collect())
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[test]
fn a_limit_admits_its_bucket_then_answers_over_with_headers() {
    let (plan, _dir) = plan();
    let two = || vec![descriptor(&[("generic_key", "two")], None)];
    let first = call(&plan, "edge", two(), 0).unwrap();
    assert_eq!(codes(&first), (OK, vec![OK]));
    let status = &first.statuses[0];
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!((limit.name.as_str(), limit.requests_per_unit, limit.unit), ("two", 2, 1));
    assert_eq!(status.limit_remaining, 1);
    assert!(first.response_headers_to_add.is_empty());
    assert_eq!(codes(&call(&plan, "edge", two(), 0).unwrap()), (OK, vec![OK]));
    let over = call(&plan, "edge", two(), 0).unwrap();
    assert_eq!(codes(&over), (OVER, vec![OVER]));
    assert_eq!(over.statuses[0].limit_remaining, 0);
    let reset = over.statuses[0].duration_until_reset.unwrap();
    assert!(reset.seconds == 1 || (reset.seconds == 0 && reset.nanos > 900_000_000), "{reset:?}");
    let headers: Vec<(&str, &str)> =
        over.response_headers_to_add.iter().map(|h| (h.key.as_str(), h.value.as_str())).collect();
    assert_eq!(headers[0], ("retry-after", "1"));
    assert_eq!(headers[1], ("ratelimit-policy", "\"edge/generic_key=two\";q=2;w=1"));
    assert_eq!(headers[2].0, "ratelimit");
    assert!(headers[2].1.starts_with("\"edge/generic_key=two\";r=0;t="), "{headers:?}");
}

#[test]
fn all_or_nothing_over_several_descriptors() {
    let (plan, _dir) = plan();
    let both = || vec![descriptor(&[("generic_key", "many")], None), descriptor(&[("generic_key", "two")], None)];
    // 100 a second with a bucket of 6000 for "many"; 2 for "two".
    for _ in 0..2 {
        assert_eq!(codes(&call(&plan, "edge", both(), 0).unwrap()), (OK, vec![OK, OK]));
    }
    let over = call(&plan, "edge", both(), 0).unwrap();
    assert_eq!(codes(&over), (OVER, vec![OK, OVER]));
    // "many" got its hit back: 2 of its 6000 are spent, not 3.
    let alone = call(&plan, "edge", vec![descriptor(&[("generic_key", "many")], None)], 0).unwrap();
    assert_eq!(alone.statuses[0].limit_remaining, 6000 - 3);
}

#[test]
fn hits_are_the_descriptors_own_else_the_calls() {
    let (plan, _dir) = plan();
    let many = |hits| vec![descriptor(&[("generic_key", "many")], hits)];
    assert_eq!(call(&plan, "edge", many(None), 10).unwrap().statuses[0].limit_remaining, 5990);
    assert_eq!(call(&plan, "edge", many(Some(90)), 10).unwrap().statuses[0].limit_remaining, 5900);
    // More than the bucket ever holds: over, and nothing charged.
    let huge = call(&plan, "edge", many(Some(u64::MAX)), 0).unwrap();
    assert_eq!(codes(&huge), (OVER, vec![OVER]));
    assert_eq!(call(&plan, "edge", many(Some(0)), 0).unwrap().statuses[0].limit_remaining, 5900);
}

#[test]
fn shadow_unlimited_unknown_and_replaced_limits_answer_ok() {
    let (plan, _dir) = plan();
    let shadow = || vec![descriptor(&[("generic_key", "shadow")], None)];
    for _ in 0..3 {
        assert_eq!(codes(&call(&plan, "edge", shadow(), 0).unwrap()), (OK, vec![OK]));
    }
    let gate = plan.gate("edge/generic_key=shadow").unwrap();
    assert_eq!(gate.metrics.decisions()[2..], [0, 2], "two shadow refusals counted, and no refusal");
    let free = call(&plan, "edge", vec![descriptor(&[("generic_key", "free")], None)], 0).unwrap();
    assert_eq!((free.statuses[0].code, free.statuses[0].limit_remaining), (OK, u32::MAX));
    let unknown = call(&plan, "elsewhere", vec![descriptor(&[("generic_key", "two")], None)], 0).unwrap();
    assert_eq!(codes(&unknown), (OK, vec![OK]));
    let unmatched = call(&plan, "edge", vec![descriptor(&[("generic_key", "none")], None)], 0).unwrap();
    assert_eq!((codes(&unmatched), unmatched.statuses[0].current_limit.is_none()), ((OK, vec![OK]), true));
    // Gold replaces "two": five calls pass though "two" holds two.
    let gold = || vec![descriptor(&[("generic_key", "two")], None), descriptor(&[("plan", "gold")], None)];
    for _ in 0..5 {
        let answer = call(&plan, "edge", gold(), 0).unwrap();
        assert_eq!(codes(&answer), (OK, vec![OK, OK]));
        assert!(answer.statuses[0].current_limit.is_none(), "the replaced limit is not applied");
    }
    assert_eq!(codes(&call(&plan, "edge", gold(), 0).unwrap()), (OVER, vec![OK, OVER]));
}

#[test]
fn each_value_of_an_open_descriptor_has_its_own_limit() {
    let (plan, _dir) = plan();
    let user = |name: &str| vec![descriptor(&[("user", name)], None)];
    assert_eq!(codes(&call(&plan, "edge", user("ann"), 0).unwrap()), (OK, vec![OK]));
    assert_eq!(codes(&call(&plan, "edge", user("ann"), 0).unwrap()), (OVER, vec![OVER]));
    assert_eq!(codes(&call(&plan, "edge", user("bob"), 0).unwrap()), (OK, vec![OK]));
    assert!(plan.lease_gate("edge/user=/bob").is_some());
    // A value too long for an id is refused, as an HTTP request's would be.
    let long = "x".repeat(2000);
    assert_eq!(codes(&call(&plan, "edge", user(&long), 0).unwrap()), (OVER, vec![OVER]));
}

#[test]
fn malformed_calls_are_invalid() {
    let (plan, _dir) = plan();
    let err = |domain: &str, descriptors| call(&plan, domain, descriptors, 0).unwrap_err();
    assert_eq!(err("", vec![descriptor(&[("user", "a")], None)]), "domain: must not be empty");
    assert_eq!(err("edge", vec![]), "descriptors: from 1 to 64 per call, got 0");
    assert_eq!(err("edge", vec![descriptor(&[("user", "a")], None); 65]), "descriptors: from 1 to 64 per call, got 65");
    assert_eq!(err("edge", vec![descriptor(&[], None)]), "descriptors[0].entries: must not be empty");
}
