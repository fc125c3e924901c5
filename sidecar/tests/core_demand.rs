//! Demand estimated from offered load, seen through the limiter that records it.

use sluice_sidecar::core::{HEADROOM, Kind, Limiter, Offer};

/// Offers `rate` unit-cost arrivals per second, evenly spaced, over [from, to).
fn offer(limiter: &mut Limiter, rate: f64, from: f64, to: f64) {
    let arrivals = ((to - from) * rate).round() as usize;
    for i in 0..arrivals {
        limiter.offer(from + i as f64 / rate, 1.0, 0.0);
    }
}

fn within(wants: f64, expected: f64, tolerance: f64) -> bool {
    (wants - expected).abs() <= tolerance * expected
}

#[test]
fn an_idle_resource_wants_nothing() {
    let mut limiter = Limiter::new(Kind::Rate, 100.0, 10.0, 0.0);
    assert_eq!(limiter.wants(0.0), 0.0);
    assert_eq!(limiter.wants(100.0), 0.0);
}

#[test]
fn steady_demand_is_asked_for_with_headroom() {
    let mut limiter = Limiter::new(Kind::Rate, f64::INFINITY, f64::INFINITY, 0.0);
    offer(&mut limiter, 100.0, 0.0, 30.0);
    let wants = limiter.wants(30.0);
    assert!(within(wants, 100.0 * HEADROOM, 0.05), "{wants}");
}

#[test]
fn rejected_arrivals_are_demand_too() {
    let mut limiter = Limiter::new(Kind::Rate, 10.0, 1.0, 0.0);
    offer(&mut limiter, 50.0, 0.0, 30.0);
    let wants = limiter.wants(30.0);
    assert!(within(wants, 50.0 * HEADROOM, 0.05), "{wants}");
}

#[test]
fn a_surge_is_seen_within_a_second() {
    let mut limiter = Limiter::new(Kind::Rate, f64::INFINITY, f64::INFINITY, 0.0);
    offer(&mut limiter, 10.0, 0.0, 30.0);
    offer(&mut limiter, 200.0, 30.0, 31.0);
    let wants = limiter.wants(31.0);
    assert!(within(wants, 200.0 * HEADROOM, 0.05), "{wants}");
}

#[test]
fn a_lull_fades_slowly_and_ends_at_zero() {
    let mut limiter = Limiter::new(Kind::Rate, f64::INFINITY, f64::INFINITY, 0.0);
    offer(&mut limiter, 100.0, 0.0, 30.0);
    let steady = limiter.wants(30.0);
    let after_two = limiter.wants(32.0);
    let after_ten = limiter.wants(40.0);
    assert!(after_two > 0.5 * steady && after_two < steady, "{after_two}");
    assert!(after_ten < 0.25 * steady && after_ten > 0.0, "{after_ten}");
    assert_eq!(limiter.wants(100.0), 0.0);
}

#[test]
fn how_often_wants_is_read_does_not_matter() {
    let mut read_often = Limiter::new(Kind::Rate, 50.0, 5.0, 0.0);
    let mut read_once = Limiter::new(Kind::Rate, 50.0, 5.0, 0.0);
    for i in 0..2530 {
        let now = i as f64 * 0.01;
        // Bursts of a second with two-second gaps, read at an unrelated cadence.
        if now % 3.0 < 1.0 {
            read_often.offer(now, 1.0, 0.0);
            read_once.offer(now, 1.0, 0.0);
        }
        if i % 7 == 0 {
            read_often.wants(now);
        }
    }
    let (often, once) = (read_often.wants(25.3), read_once.wants(25.3));
    assert!((often - once).abs() <= 1e-9 * once, "{often} vs {once}");
}

#[test]
fn concurrency_wants_the_recent_peak() {
    let mut limiter = Limiter::new(Kind::Concurrency, 3.0, 0.0, 0.0);
    // Five at once: three admitted, two queued, all wanted.
    for _ in 0..5 {
        limiter.offer(1.0, 1.0, 10.0);
    }
    for _ in 0..3 {
        limiter.release(1.1, 1.0);
    }
    limiter.poll(1.1, |_| {});
    for _ in 0..2 {
        limiter.release(1.2, 1.0);
    }
    assert_eq!(limiter.in_flight(), 0.0);
    assert!(within(limiter.wants(2.0), 5.0 * HEADROOM, 1e-9));
    assert!(within(limiter.wants(5.0), 5.0 * HEADROOM, 1e-9));
    assert_eq!(limiter.wants(10.0), 0.0);
}

#[test]
fn concurrency_held_long_is_still_wanted() {
    let mut limiter = Limiter::new(Kind::Concurrency, 10.0, 0.0, 0.0);
    for _ in 0..3 {
        assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Admitted);
    }
    // Long streams: no arrival for a minute, yet three are in flight.
    assert!(within(limiter.wants(60.0), 3.0 * HEADROOM, 1e-9));
}

#[test]
fn a_first_burst_is_measured_from_its_first_arrival() {
    let mut limiter = Limiter::new(Kind::Rate, f64::INFINITY, f64::INFINITY, 0.0);
    // One arrival counts for no more than a tenth of a second's worth.
    limiter.offer(100.0, 1.0, 0.0);
    assert!(within(limiter.wants(100.0), 10.0 * HEADROOM, 1e-9));
    // A quarter of a second at 80/s shows 80/s, not the 20/s it would be over a whole second.
    offer(&mut limiter, 80.0, 100.0 + 1.0 / 80.0, 100.25);
    let wants = limiter.wants(100.25);
    assert!(within(wants, 80.0 * HEADROOM, 0.05), "{wants}");
    // Steady at it, nothing changes.
    offer(&mut limiter, 80.0, 100.25, 110.0);
    assert!(within(limiter.wants(110.0), 80.0 * HEADROOM, 0.05));
}

#[test]
fn the_first_burst_after_demand_faded_to_nothing_is_measured_alike() {
    let mut limiter = Limiter::new(Kind::Rate, f64::INFINITY, f64::INFINITY, 0.0);
    offer(&mut limiter, 10.0, 0.0, 30.0);
    assert_eq!(limiter.wants(200.0), 0.0);
    offer(&mut limiter, 80.0, 200.0, 200.25);
    let wants = limiter.wants(200.25);
    assert!(within(wants, 80.0 * HEADROOM, 0.05), "{wants}");
    // After a mere lull, a burst is judged over the whole window, with the rest of the demand.
    offer(&mut limiter, 10.0, 200.25, 230.0);
    offer(&mut limiter, 80.0, 232.0, 232.25);
    assert!(limiter.wants(232.25) < 40.0 * HEADROOM);
}

/// Callers that each send a request, wait for its answer (`max_wait` up to 2 s), think for
/// `think` seconds and send the next, from 0 to `until`, on a clock of millisecond steps;
/// returns the cost admitted.
fn closed_loop(limiter: &mut Limiter, callers: usize, think: f64, until: f64) -> f64 {
    let mut next: Vec<f64> = (0..callers).map(|i| i as f64 * think / callers as f64).collect();
    let mut waiting = std::collections::HashMap::new();
    let mut admitted = 0.0;
    for step in 0..(until * 1000.0) as usize {
        let now = step as f64 / 1000.0;
        limiter.poll(now, |ticket| {
            next[waiting.remove(&ticket).unwrap()] = now + think;
            admitted += 1.0;
        });
        for (caller, next) in next.iter_mut().enumerate() {
            if *next <= now {
                *next = match limiter.offer(now, 1.0, 2.0) {
                    Offer::Queued(ticket) => {
                        waiting.insert(ticket, caller);
                        f64::INFINITY
                    }
                    Offer::Admitted => {
                        admitted += 1.0;
                        now + think
                    }
                    Offer::Rejected { .. } => now + think,
                };
            }
        }
    }
    admitted
}

#[test]
fn callers_held_back_by_their_lease_are_asked_for_up_to_twice_over() {
    // 16 callers who would send 80/s, held to a lease of 20/s: their arrivals show 20/s.
    let mut limiter = Limiter::new(Kind::Rate, 20.0, 2.0, 0.0);
    let admitted = closed_loop(&mut limiter, 16, 0.2, 5.0);
    assert!(within(admitted / 5.0, 20.0, 0.1), "{admitted}");
    let wants = limiter.wants(5.0);
    assert!(within(wants, 2.0 * 20.0 * HEADROOM, 0.1), "{wants}");
    // With a lease that holds nobody back, what they send (80/s).
    let mut limiter = Limiter::new(Kind::Rate, 100.0, 10.0, 0.0);
    closed_loop(&mut limiter, 16, 0.2, 5.0);
    let wants = limiter.wants(5.0);
    assert!(within(wants, 80.0 * HEADROOM, 0.05), "{wants}");
}

#[test]
fn arrivals_refused_show_the_demand_and_the_queue_adds_nothing() {
    // An open loop of 40/s over a lease of 20/s in delay mode: the queue fills up to the
    // longest wait, and the rest is refused.
    let mut limiter = Limiter::new(Kind::Rate, 20.0, 2.0, 0.0);
    for i in 0..400 {
        let now = i as f64 / 40.0;
        limiter.poll(now, |_| {});
        limiter.offer(now, 1.0, 0.5);
    }
    assert!(limiter.queued() > 5);
    let wants = limiter.wants(10.0);
    assert!(within(wants, 40.0 * HEADROOM, 0.05), "{wants}");
}
