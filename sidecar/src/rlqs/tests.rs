//! A stream's buckets on a standalone plan, without a runtime: what each is assigned, when it is
//! pushed again, what its reports charge, and the input a stream ends on.

use std::time::{Duration, Instant};

use sluice_proto::envoy::{
    service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaUsageReports,
        rate_limit_quota_response::{BucketAction, bucket_action},
        rate_limit_quota_usage_reports::BucketQuotaUsage,
    },
    r#type::v3::RateLimitStrategy,
};
use tonic::Code;

use super::{assign, session::Session};
use crate::{
    config,
    core::{Applied, Capacity},
    plan::Plan,
};

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: name
    value: sluice
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 20}
  - key: name
    value: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: name
    value: free
    rate_limit: {unlimited: true}
  - key: name
    value: fixed
    rate_limit: {unit: minute, requests_per_unit: 600}
"#;

fn plan(capacity: &str) -> (Plan, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.yaml"), LIMITS.replace("20}", &format!("{capacity}}}"))).unwrap();
    let text = "rate_limit_service: {address: 127.0.0.1:0, files: [limits.yaml]}\n";
    let config = config::parse_with(text, &config::ServerFlags::default(), dir.path()).expect("config");
    (Plan::build(config, None, None).expect("plan"), dir)
}

fn usage(entries: &[(&str, &str)], allowed: u64, denied: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId { bucket: entries.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect() }),
        time_elapsed: None,
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

fn report(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports { domain: domain.into(), bucket_quota_usages: usages }
}

fn strategies(actions: &[BucketAction]) -> Vec<RateLimitStrategy> {
    actions
        .iter()
        .map(|a| match &a.bucket_action {
            Some(bucket_action::BucketAction::QuotaAssignmentAction(q)) => {
                assert_eq!(q.assignment_time_to_live, Some(assign::time_to_live()));
                q.rate_limit_strategy.expect("a strategy")
            }
            other => panic!("an assignment, got {other:?}"),
        })
        .collect()
}

#[test]
fn a_first_report_is_answered_with_each_buckets_assignment() {
    let (plan, _dir) = plan("20");
    let mut session = Session::new(10);
    let now = Instant::now();
    let first = report(
        "edge",
        vec![
            usage(&[("tenant", "a"), ("name", "sluice")], 1, 0),
            usage(&[("name", "free")], 1, 0),
            usage(&[("name", "shadow")], 1, 0),
            usage(&[("name", "nothing")], 1, 0),
        ],
    );
    let actions = session.report(&first, now, &plan).expect("answered");
    let allow = assign::allow_all();
    assert_eq!(strategies(&actions), [assign::strategy(20.0, 1.0), allow, allow, allow]);
    // The bucket id comes back as it was reported.
    assert_eq!(actions[0].bucket_id, first.bucket_quota_usages[0].bucket_id);
    // Nothing moved: nothing more until the assignments are due again.
    assert!(session.tick(now + Duration::from_secs(1), &plan).is_empty());
    assert!(session.report(&first, now + Duration::from_secs(2), &plan).expect("answered").is_empty());
    let again = session.tick(now + crate::defaults::RLQS_REPUSH_AFTER, &plan);
    assert_eq!(again.len(), 4, "pushed again before Envoy's copy runs out");
}

#[test]
fn an_unknown_domain_is_allowed_all() {
    let (plan, _dir) = plan("20");
    let mut session = Session::new(10);
    let actions =
        session.report(&report("other", vec![usage(&[("name", "sluice")], 1, 0)]), Instant::now(), &plan).unwrap();
    assert_eq!(strategies(&actions), [assign::allow_all()]);
}

#[test]
fn a_rate_of_zero_is_deny_all() {
    let (plan, _dir) = plan("0");
    let mut session = Session::new(10);
    let bucket = usage(&[("name", "sluice"), ("tenant", "a")], 1, 0);
    let actions = session.report(&report("edge", vec![bucket]), Instant::now(), &plan).unwrap();
    assert_eq!(strategies(&actions), [assign::deny_all()]);
}

#[test]
fn reported_load_is_charged_to_the_gate_spread_over_time() {
    let (plan, _dir) = plan("20");
    let mut session = Session::new(10);
    let start = Instant::now();
    let bucket = || usage(&[("name", "sluice"), ("tenant", "a")], 40, 60);
    session.report(&report("edge", vec![bucket()]), start, &plan).unwrap();
    let gate = plan.keyed.first().expect("the keyed limit").gates().into_iter().next().expect("the key's gate");
    assert!(gate.used(), "a first report puts the resource in use");
    // 100 requests over 5 s: 20 a second from then on, charged tick by tick.
    session.report(&report("edge", vec![bucket()]), start + Duration::from_secs(5), &plan).unwrap();
    let (before, _) = gate.level();
    session.tick(start + Duration::from_secs(5) + Duration::from_millis(100), &plan);
    let (after, _) = gate.level();
    assert!(after < before, "the load was taken from the bucket: {before} -> {after}");
}

#[test]
fn bad_input_ends_the_stream() {
    let (plan, _dir) = plan("20");
    let now = Instant::now();
    let code =
        |session: &mut Session, r: RateLimitQuotaUsageReports| session.report(&r, now, &plan).unwrap_err().code();
    let mut session = Session::new(1);
    assert_eq!(code(&mut session, report("", vec![])), Code::InvalidArgument);
    let mut nothing = usage(&[], 1, 0);
    assert_eq!(code(&mut session, report("edge", vec![nothing.clone()])), Code::InvalidArgument);
    nothing.bucket_id = None;
    assert_eq!(code(&mut session, report("edge", vec![nothing])), Code::InvalidArgument);
    session.report(&report("edge", vec![usage(&[("name", "a")], 1, 0)]), now, &plan).unwrap();
    assert_eq!(code(&mut session, report("other", vec![])), Code::InvalidArgument);
    assert_eq!(code(&mut session, report("edge", vec![usage(&[("name", "b")], 1, 0)])), Code::ResourceExhausted);
}

#[test]
fn a_lease_that_moves_is_pushed_at_the_next_look() {
    let (plan, _dir) = plan("20");
    let mut session = Session::new(10);
    let start = Instant::now();
    let fixed = || report("edge", vec![usage(&[("name", "fixed")], 1, 0)]);
    let first = session.report(&fixed(), start, &plan).unwrap();
    // 600 a minute: 10 a second, a minute's worth deep.
    assert_eq!(strategies(&first), [assign::strategy(10.0, 60.0)]);
    let gate = plan.gates.iter().find(|g| g.id.contains("fixed")).expect("the fixed limit's gate").clone();
    let lease = |capacity: f64| Applied { capacity: Capacity::saturating(capacity), mode: "leased", expiry: None };
    gate.apply(lease(5.0));
    let moved = session.tick(start + Duration::from_millis(500), &plan);
    assert_eq!(strategies(&moved), [assign::strategy(5.0, 60.0)]);
    gate.apply(lease(0.0));
    // Within the look's interval nothing is looked at; at the next look, the lease of 0.
    assert!(session.tick(start + Duration::from_millis(600), &plan).is_empty());
    assert_eq!(strategies(&session.tick(start + Duration::from_secs(1), &plan)), [assign::deny_all()]);
}

#[test]
fn a_reconnected_buckets_counts_are_spread_over_their_time_elapsed() {
    let (plan, _dir) = plan("20");
    let mut session = Session::new(10);
    let start = Instant::now();
    let mut again = usage(&[("name", "fixed")], 50, 0);
    again.time_elapsed = Some(prost_types::Duration { seconds: 5, nanos: 0 });
    session.report(&report("edge", vec![again]), start, &plan).unwrap();
    let gate = plan.gates.iter().find(|g| g.id.contains("fixed")).expect("the fixed limit's gate").clone();
    // Not charged at once: the bucket is still full.
    let (full, _) = gate.level();
    assert_eq!(full, 600.0);
    // 50 over 5 s: 10 a second from then on, so 10 in the next second.
    session.tick(start + Duration::from_secs(1), &plan);
    let (level, _) = gate.level();
    assert!((level - 590.0).abs() < 1.0, "{level}");
}

#[test]
fn a_bucket_no_longer_reported_is_forgotten() {
    let (plan, _dir) = plan("20");
    let mut session = Session::new(1);
    let start = Instant::now();
    let fixed = || report("edge", vec![usage(&[("name", "fixed")], 1, 0)]);
    assert_eq!(session.report(&fixed(), start, &plan).unwrap().len(), 1);
    let later = start + crate::defaults::RLQS_STALE_AFTER;
    assert!(session.tick(later, &plan).is_empty(), "forgotten, not pushed again");
    // Reported again, it is new (and fits the bound of one bucket again).
    assert_eq!(session.report(&fixed(), later, &plan).unwrap().len(), 1);
}
