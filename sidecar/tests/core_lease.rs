//! The Doorman client half, in conversations with a fake server on a fake clock.

use sluice_client::defaults::BACKOFF_CAP;
use sluice_proto::{GetCapacityResponse, Lease, Mastership, ResourceResponse};
use sluice_sidecar::{
    core::{Answer, Effective, Fallback, LeaseClient, Mode, ResourceSpec},
    defaults::{DENIED_RETRY, FIRST_ASK_AFTER},
};

const T0: f64 = 1_700_000_000.0;

fn spec(id: &str, fallback: Fallback) -> ResourceSpec {
    ResourceSpec { id: id.to_string(), priority: 1, fallback, safe_capacity: 5.0 }
}

fn grant(id: &str, capacity: f64, expiry: f64, refresh: i64, safe: Option<f64>) -> ResourceResponse {
    ResourceResponse {
        resource_id: id.to_string(),
        gets: Lease { expiry_time: expiry as i64, refresh_interval: refresh, capacity },
        safe_capacity: safe,
    }
}

fn answer(grants: Vec<ResourceResponse>) -> GetCapacityResponse {
    GetCapacityResponse { response: grants, mastership: None }
}

fn redirect(address: Option<&str>) -> GetCapacityResponse {
    GetCapacityResponse {
        response: vec![],
        mastership: Some(Mastership { master_address: address.map(str::to_string) }),
    }
}

fn is_due(client: &LeaseClient, now: f64) -> bool {
    client.next_due().is_some_and(|due| due <= now)
}

/// A client with `ids` configured and touched, and its first request sent at T0.
fn asking(ids: &[(&str, Fallback)]) -> LeaseClient {
    let mut client = LeaseClient::new("pod-1:8080".to_string(), 7);
    client.configure(ids.iter().map(|&(id, fallback)| spec(id, fallback)));
    for (id, _) in ids {
        client.touch(T0, id);
    }
    client.request(T0, |_| 10.0).unwrap();
    client
}

#[test]
fn a_first_use_is_asked_for_once_its_rate_shows_and_refreshed_on_the_servers_interval() {
    let mut client = LeaseClient::new("pod-1:8080".to_string(), 7);
    assert_eq!(client.client_id(), "pod-1:8080");
    assert!(client.configure([spec("a", Fallback::Safe), spec("b", Fallback::Safe)]).is_empty());
    assert_eq!(client.next_due(), None, "nothing in use, nothing to ask");
    assert!(client.request(T0, |_| 1.0).is_none());

    client.touch(T0, "a");
    client.touch(T0, "unknown");
    // Its fallback (a safe capacity of 5) admits meanwhile: asked for once its rate shows.
    assert!(!is_due(&client, T0));
    assert!(is_due(&client, T0 + FIRST_ASK_AFTER));
    let request = client.request(T0, |id| if id == "a" { 42.0 } else { 0.0 }).unwrap();
    assert_eq!(request.client_id, "pod-1:8080");
    assert_eq!(request.resource.len(), 1);
    assert_eq!(request.resource[0].resource_id, "a");
    assert_eq!(request.resource[0].priority, 1);
    assert_eq!(request.resource[0].wants, 42.0);
    assert_eq!(request.resource[0].has, None);
    assert_eq!(client.next_due(), None, "one request at a time");
    assert_eq!(client.effective(T0, "a").unwrap().mode, Mode::Pending);

    let response = answer(vec![grant("a", 30.0, T0 + 60.0, 5, Some(7.0)), grant("gone", 1.0, T0 + 60.0, 1, None)]);
    assert_eq!(client.on_response(T0 + 0.5, response), Answer::Updated);
    let effective = client.effective(T0 + 1.0, "a").unwrap();
    assert_eq!(
        effective,
        Effective {
            capacity: 30.0,
            mode: Mode::Leased,
            fallback: Fallback::Safe,
            expiry: Some((T0 + 60.0) as i64),
            refresh_interval: Some(5)
        }
    );
    assert_eq!(effective.label(), "leased");
    assert_eq!(client.next_due(), Some(T0 + 5.5));
    assert_eq!(client.effective(T0, "gone"), None);

    // The refresh carries the lease held and every resource in use.
    client.touch(T0 + 1.0, "b");
    assert!(is_due(&client, T0 + 1.0 + FIRST_ASK_AFTER));
    let refresh = client.request(T0 + 1.0 + FIRST_ASK_AFTER, |_| 3.0).unwrap();
    assert_eq!(refresh.resource.iter().map(|r| r.resource_id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(refresh.resource[0].has.as_ref().map(|lease| lease.capacity), Some(30.0));
}

#[test]
fn the_smallest_refresh_interval_wins_but_never_below_a_second() {
    let mut client = asking(&[("a", Fallback::Safe), ("b", Fallback::Safe)]);
    let response = answer(vec![grant("a", 1.0, T0 + 60.0, 10, None), grant("b", 1.0, T0 + 60.0, 3, None)]);
    client.on_response(T0, response);
    assert_eq!(client.next_due(), Some(T0 + 3.0));
    client.request(T0 + 3.0, |_| 1.0).unwrap();
    client.on_response(T0 + 3.0, answer(vec![grant("a", 1.0, T0 + 60.0, 0, None)]));
    assert_eq!(client.next_due(), Some(T0 + 4.0));
}

#[test]
fn a_resource_touched_during_a_request_is_asked_for_right_after() {
    let mut client = asking(&[("a", Fallback::Safe)]);
    client.configure([spec("a", Fallback::Safe), spec("b", Fallback::Safe)]);
    client.touch(T0, "b");
    assert_eq!(client.next_due(), None);
    client.on_response(T0 + 0.1, answer(vec![grant("a", 1.0, T0 + 60.0, 10, None)]));
    assert!(is_due(&client, T0 + 0.1));
    assert_eq!(client.effective(T0 + 0.1, "b").unwrap().mode, Mode::Pending);
}

/// The delays after successive errors, from a client with no valid lease.
fn backoffs(seed: u64, errors: usize) -> Vec<f64> {
    let mut client = LeaseClient::new("c".to_string(), seed);
    client.configure([spec("a", Fallback::Safe)]);
    client.touch(T0, "a");
    let mut now = T0;
    (0..errors)
        .map(|_| {
            client.request(now, |_| 1.0).unwrap();
            client.on_error(now, false);
            let due = client.next_due().unwrap();
            let delay = due - now;
            now = due;
            delay
        })
        .collect()
}

#[test]
fn errors_back_off_exponentially_with_jitter() {
    let delays = backoffs(1, 9);
    for (i, delay) in delays.iter().enumerate() {
        let ceiling = f64::min(2f64.powi(i as i32), BACKOFF_CAP);
        assert!(
            (ceiling / 2.0..=ceiling).contains(delay),
            "attempt {i}: {delay} outside [{}, {ceiling}]",
            ceiling / 2.0
        );
    }
    assert_eq!(backoffs(1, 9), delays, "the same seed replays");
    assert_ne!(backoffs(2, 9), delays, "another seed spreads out");
}

#[test]
fn an_error_moves_on_to_an_untried_address_at_once_and_backs_off_after_the_round() {
    let mut client = asking(&[("a", Fallback::Safe)]);
    // One address failed (a dead replica) and another is untried: asked at once.
    client.on_error(T0 + 5.0, true);
    assert!(is_due(&client, T0 + 5.0));
    assert_eq!(client.effective(T0 + 5.0, "a").unwrap().mode, Mode::Fallback, "no lease meanwhile");
    // The other failed too: the backoff starts from its base, as after a first error.
    client.request(T0 + 5.0, |_| 1.0).unwrap();
    client.on_error(T0 + 6.0, false);
    let delay = client.next_due().unwrap() - (T0 + 6.0);
    assert!((0.5..=1.0).contains(&delay), "{delay}");
}

#[test]
fn a_success_resets_the_backoff() {
    let mut client = asking(&[("a", Fallback::Safe)]);
    for _ in 0..5 {
        client.on_error(T0, false);
        client.request(T0, |_| 1.0).unwrap();
    }
    client.on_response(T0, answer(vec![grant("a", 1.0, T0 + 60.0, 10, None)]));
    client.request(T0 + 10.0, |_| 1.0).unwrap();
    client.on_error(T0 + 10.0, false);
    let delay = client.next_due().unwrap() - (T0 + 10.0);
    assert!((0.5..=1.0).contains(&delay), "{delay}");
}

#[test]
fn a_retry_comes_before_a_valid_lease_expires() {
    let mut client = asking(&[("a", Fallback::Safe)]);
    client.on_response(T0, answer(vec![grant("a", 1.0, T0 + 20.0, 10, None)]));
    let mut now = T0 + 10.0;
    for _ in 0..6 {
        client.request(now, |_| 1.0).unwrap();
        client.on_error(now, false);
        let due = client.next_due().unwrap();
        assert!(due <= (T0 + 18.0).max(now + 0.5) && due >= now + 0.5, "{due}");
        now = due;
    }
}

#[test]
fn a_redirect_is_followed_at_once_then_backs_off() {
    let mut client = asking(&[("a", Fallback::Safe)]);
    client.on_response(T0, answer(vec![grant("a", 30.0, T0 + 60.0, 10, None)]));
    client.request(T0 + 10.0, |_| 1.0).unwrap();
    let answer = client.on_response(T0 + 10.0, redirect(Some("master:1234")));
    assert_eq!(answer, Answer::Redirect(Some("master:1234".to_string())));
    assert!(is_due(&client, T0 + 10.0));
    assert_eq!(client.effective(T0 + 10.0, "a").unwrap().capacity, 30.0, "leases are kept");

    // Sent back and forth: the second redirect in a row waits.
    client.request(T0 + 10.0, |_| 1.0).unwrap();
    client.on_response(T0 + 10.0, redirect(Some("other:1234")));
    assert!(!is_due(&client, T0 + 10.0));

    // Nobody knows the master: retry later.
    let mut client = asking(&[("a", Fallback::Safe)]);
    assert_eq!(client.on_response(T0, redirect(None)), Answer::Redirect(None));
    assert!(!is_due(&client, T0));
    assert_eq!(client.effective(T0, "a").unwrap().mode, Mode::Fallback);
}

#[test]
fn without_a_lease_each_resource_falls_back_as_configured() {
    let ids = [("safe", Fallback::Safe), ("optimistic", Fallback::Optimistic), ("pessimistic", Fallback::Pessimistic)];
    let mut client = asking(&ids);
    // Before any answer: pending, on the fallback; the configured safe capacity stands in.
    let pending: Vec<(f64, &str)> = ids
        .iter()
        .map(|(id, _)| client.effective(T0, id).unwrap())
        .map(|effective| (effective.capacity, effective.label()))
        .collect();
    assert_eq!(pending, [(5.0, "pending"), (f64::INFINITY, "pending"), (0.0, "pending")]);

    let grants = ids.iter().map(|(id, _)| grant(id, 30.0, T0 + 60.0, 10, Some(7.0))).collect();
    client.on_response(T0, answer(grants));
    assert!(ids.iter().all(|(id, _)| client.effective(T0 + 59.9, id).unwrap().mode == Mode::Leased));

    // Expired: the server's safe capacity, no limit, nothing.
    let expired: Vec<(f64, &str)> = ids
        .iter()
        .map(|(id, _)| client.effective(T0 + 60.0, id).unwrap())
        .map(|effective| (effective.capacity, effective.label()))
        .collect();
    assert_eq!(
        expired,
        [(7.0, "fallback_safe"), (f64::INFINITY, "fallback_optimistic"), (0.0, "fallback_pessimistic")]
    );
    // An expired lease is not offered back to the server: what the fallback holds the client
    // to is, up to the safe capacity, so a server back in learning mode grants that.
    let request = client.request(T0 + 60.0, |_| 1.0).unwrap();
    let has = |id: &str| {
        let lease = request.resource.iter().find(|r| r.resource_id == id).unwrap().has.unwrap();
        (lease.capacity, lease.expiry_time)
    };
    let held: Vec<(f64, i64)> = ids.iter().map(|(id, _)| has(id)).collect();
    assert_eq!(held, [(7.0, T0 as i64 + 60), (7.0, T0 as i64 + 60), (0.0, T0 as i64 + 60)]);
}

#[test]
fn a_safe_capacity_of_minus_one_means_no_limit() {
    let mut client = asking(&[("a", Fallback::Safe)]);
    client.on_response(T0, answer(vec![grant("a", 30.0, T0 + 60.0, 10, Some(-1.0))]));
    assert_eq!(client.effective(T0 + 61.0, "a").unwrap().capacity, f64::INFINITY);
}

#[test]
fn an_error_before_any_answer_decides_the_fallback() {
    let mut client = asking(&[("a", Fallback::Pessimistic)]);
    client.on_error(T0 + 5.0, false);
    let effective = client.effective(T0 + 5.0, "a").unwrap();
    assert_eq!((effective.capacity, effective.label()), (0.0, "fallback_pessimistic"));
}

#[test]
fn resources_dropped_from_the_config_are_released_and_the_rest_kept() {
    let mut client = asking(&[("a", Fallback::Safe), ("b", Fallback::Safe)]);
    client.configure([spec("a", Fallback::Safe), spec("b", Fallback::Safe), spec("idle", Fallback::Safe)]);
    client.on_response(T0, answer(vec![grant("a", 30.0, T0 + 60.0, 10, None), grant("b", 20.0, T0 + 60.0, 10, None)]));

    let mut changed = spec("a", Fallback::Optimistic);
    changed.priority = 3;
    assert_eq!(client.configure([changed]), ["b"], "only what was in use is released");
    let effective = client.effective(T0 + 1.0, "a").unwrap();
    assert_eq!((effective.capacity, effective.fallback), (30.0, Fallback::Optimistic));
    assert_eq!(client.effective(T0 + 1.0, "b"), None);
    let request = client.request(T0 + 10.0, |_| 1.0).unwrap();
    assert_eq!(request.resource.len(), 1);
    assert_eq!(request.resource[0].priority, 3);

    // Nothing left in use: nothing due.
    client.on_response(T0 + 10.0, answer(vec![grant("a", 30.0, T0 + 70.0, 10, None)]));
    client.configure([]);
    assert_eq!(client.next_due(), None);
}

#[test]
fn shutdown_releases_everything_in_use() {
    let mut client = asking(&[("a", Fallback::Safe), ("b", Fallback::Safe)]);
    client.configure([spec("a", Fallback::Safe), spec("b", Fallback::Safe), spec("idle", Fallback::Safe)]);
    client.on_response(T0, answer(vec![grant("a", 30.0, T0 + 60.0, 10, None)]));
    assert_eq!(client.release_all(), ["a", "b"]);
    assert_eq!(client.next_due(), None);
    assert_eq!(client.effective(T0, "a").unwrap().mode, Mode::Fallback);
    assert!(client.release_all().is_empty());
}

#[test]
fn a_surge_is_asked_for_before_the_refresh_interval_is_up() {
    let mut client = asking(&[("a", Fallback::Safe)]);
    client.on_response(T0, answer(vec![grant("a", 10.0, T0 + 60.0, 20, None)]));
    assert_eq!(client.next_due(), Some(T0 + 20.0));
    // Reported 10: a move within 10% waits for the refresh.
    client.demand_moved(T0 + 2.0, |_| 10.5);
    assert_eq!(client.next_due(), Some(T0 + 20.0));
    // Tripled demand (or demand gone) is asked for a quarter of the interval after the answer.
    client.demand_moved(T0 + 2.0, |_| 30.0);
    assert_eq!(client.next_due(), Some(T0 + 5.0));
    let request = client.request(T0 + 5.0, |_| 30.0).unwrap();
    assert_eq!(request.resource[0].wants, 30.0);
    client.on_response(T0 + 5.0, answer(vec![grant("a", 30.0, T0 + 65.0, 20, None)]));
    client.demand_moved(T0 + 2.0, |_| 1.0);
    assert_eq!(client.next_due(), Some(T0 + 10.0));
}

#[test]
fn a_first_use_without_a_fallback_to_admit_meanwhile_is_asked_for_at_once() {
    let mut client = LeaseClient::new("c".to_string(), 7);
    client.configure([spec("a", Fallback::Safe), spec("none", Fallback::Pessimistic)]);
    client.touch(T0, "a");
    assert_eq!(client.next_due(), Some(T0 + FIRST_ASK_AFTER));
    client.touch(T0 + 0.1, "none");
    assert!(is_due(&client, T0 + 0.1));
}

#[test]
fn an_idle_resource_is_pending_again_until_its_next_use_is_asked_for_like_a_first() {
    let mut client = asking(&[("a", Fallback::Safe)]);
    client.on_response(T0, answer(vec![grant("a", 10.0, T0 + 60.0, 10, Some(7.0))]));
    // Wanting nothing, it is asked for until its lease is down to 0...
    let request = client.request(T0 + 10.0, |_| 0.0).unwrap();
    assert_eq!(request.resource[0].wants, 0.0);
    client.on_response(T0 + 10.0, answer(vec![grant("a", 0.0, T0 + 70.0, 10, Some(7.0))]));
    assert_eq!(client.effective(T0 + 10.0, "a").unwrap().mode, Mode::Leased);
    // ...then no more: it is pending, on the fallback (the server's safe capacity), and the
    // client has nothing to ask for.
    assert!(client.request(T0 + 20.0, |_| 0.0).is_none());
    assert_eq!(client.next_due(), None);
    let effective = client.effective(T0 + 20.0, "a").unwrap();
    assert_eq!((effective.capacity, effective.label()), (7.0, "pending"));
    client.demand_moved(T0 + 30.0, |_| 0.0);
    assert_eq!(client.next_due(), None);
    // Used again: asked for once its rate shows, holding nothing.
    client.demand_moved(T0 + 40.0, |_| 50.0);
    assert_eq!(client.next_due(), Some(T0 + 40.0 + FIRST_ASK_AFTER));
    let request = client.request(T0 + 40.0 + FIRST_ASK_AFTER, |_| 50.0).unwrap();
    assert_eq!((request.resource[0].wants, request.resource[0].has), (50.0, None));
}

#[test]
fn after_an_answer_retries_back_off_no_longer_than_its_refresh_interval() {
    for (refresh, cap) in [(2, 2.0), (60, BACKOFF_CAP)] {
        let mut client = asking(&[("a", Fallback::Safe)]);
        client.on_response(T0, answer(vec![grant("a", 10.0, T0 + 1000.0, refresh, None)]));
        let mut now = T0 + refresh as f64;
        for attempt in 0..8 {
            client.request(now, |_| 1.0).unwrap();
            client.on_error(now, false);
            let delay = client.next_due().unwrap() - now;
            let ceiling = f64::min(2f64.powi(attempt), cap);
            assert!(delay >= ceiling / 2.0 && delay <= ceiling, "refresh {refresh}, attempt {attempt}: {delay}");
            now += delay;
        }
    }
}

#[test]
fn a_first_lease_short_of_the_demand_is_corrected_at_once() {
    let mut client = LeaseClient::new("c".to_string(), 7);
    client.configure([spec("a", Fallback::Safe)]);
    client.touch(T0, "a");
    let at = T0 + FIRST_ASK_AFTER;
    client.request(at, |_| 70.0).unwrap();
    client.on_response(at, answer(vec![grant("a", 70.0, T0 + 60.0, 10, None)]));
    // A quarter of a second later the rate shows better: asked again then, not a second later.
    client.demand_moved(at + 0.25, |_| 88.0);
    assert_eq!(client.next_due(), Some(at + FIRST_ASK_AFTER));
    client.request(at + 0.25, |_| 88.0).unwrap();
    client.on_response(at + 0.25, answer(vec![grant("a", 88.0, T0 + 60.0, 10, None)]));
    // Past its first moments, the usual spacing.
    client.demand_moved(T0 + 2.0, |_| 150.0);
    assert_eq!(client.next_due(), Some(at + 0.25 + 2.5));
}

#[test]
fn resources_a_policy_refuses_let_nothing_pass_while_the_others_are_asked_for_at_once() {
    let mut client = asking(&[("allowed", Fallback::Optimistic), ("refused", Fallback::Optimistic)]);
    assert!(client.on_denied(T0 + 0.1, &["refused".to_string()]));
    let refused = client.effective(T0 + 0.1, "refused").unwrap();
    assert_eq!((refused.capacity, refused.mode, refused.label()), (0.0, Mode::Denied, "denied"));
    assert!(is_due(&client, T0 + 0.1), "the others are asked for at once");
    let request = client.request(T0 + 0.1, |_| 10.0).unwrap();
    let ids: Vec<&str> = request.resource.iter().map(|r| r.resource_id.as_str()).collect();
    assert_eq!(ids, ["allowed"]);
    client.on_response(T0 + 0.2, answer(vec![grant("allowed", 10.0, T0 + 60.0, 5, None)]));
    assert_eq!(client.effective(T0 + 1.0, "allowed").unwrap().mode, Mode::Leased);
    // Asked for again once the refusal is over, with the next refresh; refused until a lease
    // comes, not on its fallback meanwhile.
    let later = T0 + 0.1 + DENIED_RETRY;
    assert_eq!(client.effective(later, "refused").unwrap().mode, Mode::Denied);
    let request = client.request(later, |_| 10.0).unwrap();
    assert_eq!(request.resource.len(), 2);
    client.on_response(later + 0.1, answer(vec![grant("refused", 3.0, later + 60.0, 5, None)]));
    assert_eq!(client.effective(later + 0.2, "refused").unwrap().mode, Mode::Leased);
}

#[test]
fn a_client_whose_every_resource_is_refused_asks_again_when_the_refusal_ends() {
    let mut client = asking(&[("refused", Fallback::Safe)]);
    assert!(client.on_denied(T0, &["refused".to_string()]));
    assert!(client.request(T0, |_| 10.0).is_none(), "nothing to ask for meanwhile");
    assert_eq!(client.next_due(), Some(T0 + DENIED_RETRY));
    // A refusal naming nothing configured here is an error like any other: backed off.
    let mut other = asking(&[("a", Fallback::Safe)]);
    assert!(!other.on_denied(T0, &["unknown".to_string()]));
    assert!(!is_due(&other, T0));
}
