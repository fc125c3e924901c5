//! The limiter: admission order and refusals, both kinds, in-place changes, and the accuracy
//! guarantee of SPEC §4.4 as properties.

use std::collections::VecDeque;

use proptest::prelude::*;
use sluice_sidecar::core::{Kind, Limiter, MAX_AMOUNT, MAX_QUEUED, Offer, Ticket};

fn queued(offer: Offer) -> Ticket {
    match offer {
        Offer::Queued(ticket) => ticket,
        other => panic!("expected a queued waiter, got {other:?}"),
    }
}

fn poll(limiter: &mut Limiter, now: f64) -> (Vec<Ticket>, Option<f64>) {
    let mut admitted = Vec::new();
    let next = limiter.poll(now, |ticket| admitted.push(ticket));
    (admitted, next)
}

// Rates and times are binary fractions, so the expected waits are exact.

#[test]
fn rate_admits_the_burst_then_says_when_to_retry() {
    let mut limiter = Limiter::new(Kind::Rate, 8.0, 4.0, 0.0);
    for _ in 0..4 {
        assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Admitted);
    }
    assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Rejected { retry_after: Some(0.125) });
    assert_eq!(limiter.offer(0.125, 1.0, 0.0), Offer::Admitted);
}

#[test]
fn waiters_go_in_order_as_tokens_accrue() {
    let mut limiter = Limiter::new(Kind::Rate, 8.0, 4.0, 0.0);
    assert_eq!(limiter.offer(0.0, 4.0, 0.0), Offer::Admitted);
    let first = queued(limiter.offer(0.0, 1.0, 1.0));
    let second = queued(limiter.offer(0.0, 1.0, 1.0));
    let third = queued(limiter.offer(0.0, 1.0, 1.0));
    assert_eq!(limiter.queued(), 3);
    assert_eq!(poll(&mut limiter, 0.0), (vec![], Some(0.125)));
    // 2.5 tokens: two go, the third needs half a token more.
    assert_eq!(poll(&mut limiter, 0.3125), (vec![first, second], Some(0.375)));
    assert_eq!(poll(&mut limiter, 0.375), (vec![third], None));
    assert_eq!(limiter.queued(), 0);
}

#[test]
fn a_wait_beyond_max_wait_is_rejected_with_the_expected_wait() {
    let mut limiter = Limiter::new(Kind::Rate, 8.0, 1.0, 0.0);
    assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Admitted);
    queued(limiter.offer(0.0, 1.0, 0.2));
    // Behind one waiter: its token and this one's.
    assert_eq!(limiter.offer(0.0, 1.0, 0.2), Offer::Rejected { retry_after: Some(0.25) });
    // A later arrival never jumps the queue, even when a token is there.
    assert_eq!(limiter.offer(0.125, 1.0, 0.0), Offer::Rejected { retry_after: Some(0.125) });
    assert_eq!(limiter.queued(), 1);
}

#[test]
fn a_cancelled_waiter_is_neither_admitted_nor_charged() {
    let mut limiter = Limiter::new(Kind::Rate, 8.0, 1.0, 0.0);
    assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Admitted);
    let gone = queued(limiter.offer(0.0, 1.0, 1.0));
    let stays = queued(limiter.offer(0.0, 1.0, 1.0));
    limiter.cancel(gone);
    limiter.cancel(gone);
    assert_eq!(limiter.queued(), 1);
    assert_eq!(poll(&mut limiter, 0.125), (vec![stays], None));
    // Only the admitted waiter paid: a new arrival waits for one token, not two.
    assert_eq!(limiter.offer(0.125, 1.0, 0.0), Offer::Rejected { retry_after: Some(0.125) });
}

#[test]
fn a_cost_above_the_burst_goes_on_a_full_bucket_and_leaves_debt() {
    let mut limiter = Limiter::new(Kind::Rate, 8.0, 2.0, 0.0);
    assert_eq!(limiter.offer(0.0, 5.0, 0.0), Offer::Admitted);
    // 3 tokens of debt and 1 to pay.
    assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Rejected { retry_after: Some(0.5) });
    // Queued, a big one waits for a full bucket rather than for tokens it can never hold.
    let big = queued(limiter.offer(0.0, 5.0, 1.0));
    assert_eq!(poll(&mut limiter, 0.0), (vec![], Some(0.625)));
    assert_eq!(poll(&mut limiter, 0.625), (vec![big], None));
}

#[test]
fn lowering_the_rate_lets_no_more_than_the_new_rate_through() {
    let mut limiter = Limiter::new(Kind::Rate, 100.0, 10.0, 0.0);
    let offers: Vec<Offer> = (0..30).map(|_| limiter.offer(0.0, 1.0, 10.0)).collect();
    assert_eq!(offers.iter().filter(|offer| **offer == Offer::Admitted).count(), 10);
    assert_eq!(limiter.queued(), 20);
    // 6.25 tokens accrue at 100/s, then the rate drops to 8/s with a burst of 1.
    limiter.set_capacity(0.0625, 8.0, 1.0);
    assert_eq!(limiter.capacity(), 8.0);
    let (admitted, mut wake) = poll(&mut limiter, 0.0625);
    assert_eq!(admitted.len(), 1, "tokens above the new burst are dropped");
    // Polled when told to (as the proxy does), the next second admits exactly the new rate.
    let mut later = 0;
    while let Some(at) = wake.filter(|&at| at <= 1.0625) {
        let (admitted, next) = poll(&mut limiter, at);
        later += admitted.len();
        wake = next;
    }
    assert_eq!(later, 8);
}

#[test]
fn raising_the_rate_releases_no_burst() {
    let mut limiter = Limiter::new(Kind::Rate, 1.0, 1.0, 0.0);
    assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Admitted);
    limiter.set_capacity(0.5, 128.0, 128.0);
    // Half a token from the old rate, the other half at 128/s.
    assert_eq!(limiter.offer(0.5, 1.0, 0.0), Offer::Rejected { retry_after: Some(0.5 / 128.0) });
}

#[test]
fn refunded_tokens_return_up_to_the_burst() {
    let mut limiter = Limiter::new(Kind::Rate, 1.0, 2.0, 0.0);
    assert_eq!(limiter.offer(0.0, 2.0, 0.0), Offer::Admitted);
    limiter.refund(0.0, 5.0);
    assert_eq!(limiter.offer(0.0, 2.0, 0.0), Offer::Admitted);
    assert!(matches!(limiter.offer(0.0, 1.0, 0.0), Offer::Rejected { .. }));
}

#[test]
fn concurrency_admits_within_the_permits_and_queues_for_a_release() {
    let mut limiter = Limiter::new(Kind::Concurrency, 2.0, 0.0, 0.0);
    assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Admitted);
    assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Admitted);
    assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Rejected { retry_after: None });
    let waiter = queued(limiter.offer(0.0, 1.0, 1.0));
    assert_eq!(limiter.in_flight(), 2.0);
    assert_eq!(poll(&mut limiter, 0.1), (vec![], None));
    limiter.release(0.2, 1.0);
    assert_eq!(poll(&mut limiter, 0.2), (vec![waiter], None));
    assert_eq!(limiter.in_flight(), 2.0);
    // Refunding a permit releases it too.
    limiter.refund(0.3, 1.0);
    assert_eq!(limiter.in_flight(), 1.0);
}

#[test]
fn a_smaller_semaphore_drains_before_admitting() {
    let mut limiter = Limiter::new(Kind::Concurrency, 3.0, 0.0, 0.0);
    for _ in 0..3 {
        assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Admitted);
    }
    limiter.set_capacity(0.0, 1.0, 0.0);
    let waiter = queued(limiter.offer(0.0, 1.0, 1.0));
    limiter.release(0.1, 1.0);
    assert!(poll(&mut limiter, 0.1).0.is_empty());
    limiter.release(0.2, 1.0);
    assert!(poll(&mut limiter, 0.2).0.is_empty());
    limiter.release(0.3, 1.0);
    assert_eq!(poll(&mut limiter, 0.3).0, [waiter]);
    // Growing admits the next at once.
    limiter.set_capacity(0.4, 2.0, 0.0);
    assert_eq!(limiter.offer(0.4, 1.0, 0.0), Offer::Admitted);
}

#[test]
fn a_request_larger_than_the_semaphore_goes_alone() {
    let mut limiter = Limiter::new(Kind::Concurrency, 2.0, 0.0, 0.0);
    assert_eq!(limiter.offer(0.0, 5.0, 0.0), Offer::Admitted);
    let waiter = queued(limiter.offer(0.0, 1.0, 1.0));
    limiter.release(0.1, 5.0);
    assert_eq!(poll(&mut limiter, 0.1).0, [waiter]);
    assert_eq!(limiter.in_flight(), 1.0);
}

#[test]
fn the_queue_is_bounded() {
    let mut limiter = Limiter::new(Kind::Concurrency, 1.0, 0.0, 0.0);
    assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Admitted);
    for _ in 0..MAX_QUEUED {
        queued(limiter.offer(0.0, 1.0, 1.0));
    }
    assert_eq!(limiter.offer(0.0, 1.0, 1.0), Offer::Rejected { retry_after: None });
    assert_eq!(limiter.queued(), MAX_QUEUED);
}

#[test]
fn no_capacity_rejects_everything() {
    for kind in [Kind::Rate, Kind::Concurrency] {
        let mut limiter = Limiter::new(kind, 0.0, 10.0, 0.0);
        assert_eq!(limiter.offer(0.0, 1.0, 5.0), Offer::Rejected { retry_after: None });
        assert_eq!(limiter.offer(1.0, 0.5, 0.0), Offer::Rejected { retry_after: None });
        assert!(limiter.wants(1.0) > 0.0, "rejected arrivals are demand");
    }
}

#[test]
fn a_surge_past_the_lease_asked_for_waits_for_a_larger_one() {
    for kind in [Kind::Rate, Kind::Concurrency] {
        // After a lull the lease dwindled to nothing; the last request asked for nothing.
        let mut limiter = Limiter::new(kind, 0.0, 2.0, 0.0).leased();
        assert_eq!(limiter.ask(0.0), 0.0);
        let waiters: Vec<Ticket> = (0..4).map(|_| queued(limiter.offer(100.0, 1.0, 5.0))).collect();
        assert!(limiter.surged(100.0), "{kind:?}: the lease client is due to ask again");
        assert_eq!(limiter.offer(100.0, 1.0, 0.0), Offer::Rejected { retry_after: None }, "reject mode does not wait");
        // The larger lease comes and lets them through.
        limiter.set_capacity(100.25, 16.0, 4.0);
        let mut admitted = poll(&mut limiter, 100.25).0;
        admitted.extend(poll(&mut limiter, 100.375).0);
        assert_eq!(admitted, waiters, "{kind:?}");
        // Once asked for, the demand is judged by the lease it got.
        assert!(limiter.ask(100.375) >= 4.0, "{kind:?}");
        limiter.set_capacity(100.375, 0.0, 4.0);
        assert_eq!(limiter.offer(100.375, 1.0, 5.0), Offer::Rejected { retry_after: None }, "{kind:?}");
    }
    // A rate whose trickle of a lease would take too long waits too, where a standalone one
    // (nobody to ask) refuses at once.
    let mut leased = Limiter::new(Kind::Rate, 0.125, 1.0, 0.0).leased();
    let mut standalone = Limiter::new(Kind::Rate, 0.125, 1.0, 0.0);
    leased.ask(0.0);
    for limiter in [&mut leased, &mut standalone] {
        assert_eq!(limiter.offer(50.0, 1.0, 5.0), Offer::Admitted);
    }
    queued(leased.offer(50.0, 4.0, 5.0));
    assert_eq!(standalone.offer(50.0, 4.0, 5.0), Offer::Rejected { retry_after: Some(8.0) });
}

#[test]
fn waiters_stay_queued_while_capacity_is_gone() {
    let mut limiter = Limiter::new(Kind::Rate, 8.0, 1.0, 0.0);
    assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Admitted);
    let waiter = queued(limiter.offer(0.0, 1.0, 5.0));
    limiter.set_capacity(0.0625, 0.0, 1.0);
    assert_eq!(poll(&mut limiter, 3.0), (vec![], None));
    // Half a token accrued before the stop; the rest at 8/s.
    limiter.set_capacity(3.0, 8.0, 1.0);
    assert_eq!(poll(&mut limiter, 3.0), (vec![], Some(3.0625)));
    assert_eq!(poll(&mut limiter, 3.0625), (vec![waiter], None));
}

#[test]
fn unlimited_capacity_admits_everything_without_nan() {
    for kind in [Kind::Rate, Kind::Concurrency] {
        let mut limiter = Limiter::new(kind, f64::INFINITY, f64::INFINITY, 0.0);
        for i in 0..1000 {
            assert_eq!(limiter.offer(i as f64 * 0.001, 3.0, 0.0), Offer::Admitted);
        }
        limiter.refund(1.0, 3.0);
        let wants = limiter.wants(1.0);
        assert!(wants.is_finite() && wants > 0.0);
        // Back to a limit: a full bucket of the new burst, no more.
        limiter.set_capacity(1.0, 8.0, 2.0);
        limiter.release(1.0, 3.0);
        assert!(!limiter.in_flight().is_nan());
        if kind == Kind::Rate {
            assert_eq!(limiter.offer(1.0, 2.0, 0.0), Offer::Admitted);
            assert_eq!(limiter.offer(1.0, 1.0, 0.0), Offer::Rejected { retry_after: Some(0.125) });
        }
        let waiter = limiter.offer(1.0, 1.0, 10.0);
        limiter.set_capacity(2.0, f64::INFINITY, f64::INFINITY);
        let (admitted, next) = poll(&mut limiter, 2.0);
        if let Offer::Queued(ticket) = waiter {
            assert_eq!(admitted, [ticket]);
        }
        assert_eq!(next, None);
    }
}

#[test]
fn nonsense_costs_and_capacities_count_as_zero() {
    let mut limiter = Limiter::new(Kind::Rate, f64::NAN, -1.0, 0.0);
    assert_eq!(limiter.capacity(), 0.0);
    limiter.set_capacity(0.0, 10.0, 1.0);
    assert_eq!(limiter.offer(0.0, f64::NAN, 0.0), Offer::Admitted);
    assert_eq!(limiter.offer(0.0, f64::INFINITY, 1.0), Offer::Rejected { retry_after: None });
    assert!(!limiter.wants(1.0).is_nan());
}

/// One step of a random workload.
#[derive(Clone, Debug)]
enum Step {
    Arrive { after: f64, cost: f64, max_wait: f64 },
    SetRate { after: f64, rate: f64 },
    Cancel { after: f64, pick: usize },
}

fn step(burst: f64) -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0.0..0.05f64, 0.01..=burst, prop_oneof![Just(0.0), 0.0..1.0f64])
            .prop_map(|(after, cost, max_wait)| Step::Arrive { after, cost, max_wait }),
        1 => (0.0..0.5f64, prop_oneof![Just(0.0), 0.0..200.0f64]).prop_map(|(after, rate)| Step::SetRate { after, rate }),
        1 => (0.0..0.05f64, any::<usize>()).prop_map(|(after, pick)| Step::Cancel { after, pick }),
    ]
}

/// A piecewise-constant rate and its integral.
struct Schedule {
    /// (since, rate, ∫ rate dt from 0 to since), in time order.
    changes: Vec<(f64, f64, f64)>,
}

impl Schedule {
    fn new(rate: f64) -> Schedule {
        Schedule { changes: vec![(0.0, rate, 0.0)] }
    }

    fn change(&mut self, now: f64, rate: f64) {
        let integral = self.integral(now);
        self.changes.push((now, rate, integral));
    }

    /// ∫ rate dt from 0 to `t`.
    fn integral(&self, t: f64) -> f64 {
        let at = self.changes.partition_point(|&(since, _, _)| since <= t) - 1;
        let (since, rate, integral) = self.changes[at];
        integral + (t - since) * rate
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Over every window, admitted cost ≤ ∫ rate + burst, across rate changes, waiting and
    /// cancelled waiters.
    #[test]
    fn admitted_cost_never_exceeds_the_rate_plus_the_burst(
        (burst, initial, steps) in (0.5..20.0f64).prop_flat_map(|burst| {
            (Just(burst), 0.0..200.0f64, proptest::collection::vec(step(burst), 1..300))
        })
    ) {
        let mut limiter = Limiter::new(Kind::Rate, initial, burst, 0.0);
        let mut schedule = Schedule::new(initial);
        let mut admitted: Vec<(f64, f64)> = Vec::new();
        let mut waiting: Vec<(Ticket, f64)> = Vec::new();
        let mut now = 0.0;
        for step in steps {
            match step {
                Step::Arrive { after, cost, max_wait } => {
                    now += after;
                    match limiter.offer(now, cost, max_wait) {
                        Offer::Admitted => admitted.push((now, cost)),
                        Offer::Queued(ticket) => waiting.push((ticket, cost)),
                        Offer::Rejected { .. } => {}
                    }
                }
                Step::SetRate { after, rate } => {
                    now += after;
                    limiter.set_capacity(now, rate, burst);
                    schedule.change(now, rate);
                }
                Step::Cancel { after, pick } => {
                    now += after;
                    if !waiting.is_empty() {
                        let (ticket, _) = waiting.remove(pick % waiting.len());
                        limiter.cancel(ticket);
                    }
                }
            }
            limiter.poll(now, |ticket| {
                let at = waiting.iter().position(|&(queued, _)| queued == ticket).unwrap();
                admitted.push((now, waiting.remove(at).1));
            });
            prop_assert_eq!(limiter.queued(), waiting.len());
        }
        for (i, &(from, _)) in admitted.iter().enumerate() {
            let mut total = 0.0;
            for &(to, cost) in &admitted[i..] {
                total += cost;
                let allowed = schedule.integral(to) - schedule.integral(from) + burst;
                prop_assert!(total <= allowed + 1e-6, "{total} admitted in [{from}, {to}], allowed {allowed}");
            }
        }
    }

}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Under continuous overload (arrivals never further apart than a token), what is
    /// admitted over 10 s is within 2% of rate × 10 s, waiting or not, when polled as the
    /// limiter asks.
    #[test]
    fn overload_is_admitted_at_the_rate(
        rate in 10.0..1000.0f64,
        overload in 1.5..5.0f64,
        max_wait in prop_oneof![Just(0.0), 0.05..1.0f64],
        seed in any::<u64>(),
    ) {
        let burst = (rate * 0.1).max(2.0);
        let mut limiter = Limiter::new(Kind::Rate, rate, burst, 0.0);
        let mut rng = fastrand::Rng::with_seed(seed);
        // Waiters leave in arrival order, admitted or timed out, as their deadlines come in order.
        let mut deadlines: VecDeque<(Ticket, f64)> = VecDeque::new();
        let mut admitted = 0.0;
        let mut wake = None;
        let mut arrival: f64 = 0.0;
        while arrival < 13.0 {
            let deadline = deadlines.front().map_or(f64::INFINITY, |&(_, deadline)| deadline);
            let now = arrival.min(wake.unwrap_or(f64::INFINITY)).min(deadline);
            let counts = (2.0..12.0).contains(&now);
            wake = limiter.poll(now, |ticket| {
                assert_eq!(deadlines.pop_front().map(|(queued, _)| queued), Some(ticket));
                admitted += if counts { 1.0 } else { 0.0 };
            });
            while let Some(&(ticket, _)) = deadlines.front().filter(|&&(_, deadline)| deadline <= now) {
                limiter.cancel(ticket);
                deadlines.pop_front();
            }
            if now == arrival {
                match limiter.offer(now, 1.0, max_wait) {
                    Offer::Admitted => admitted += if counts { 1.0 } else { 0.0 },
                    Offer::Queued(ticket) => {
                        deadlines.push_back((ticket, now + max_wait));
                        wake = limiter.poll(now, |_| unreachable!("queued only behind others"));
                    }
                    Offer::Rejected { .. } => {}
                }
                arrival += (0.5 + rng.f64()) / (rate * overload);
            }
        }
        // A window after the initial burst and the queue filling.
        let expected = rate * 10.0;
        prop_assert!((admitted - expected).abs() <= 0.02 * expected, "{admitted} admitted, {expected} expected");
    }
}

#[test]
fn a_low_steady_rate_is_no_surge_and_a_fallback_waits_for_none() {
    // One arrival a second, asked for as such: a couple of close arrivals are noise.
    let mut limiter = Limiter::new(Kind::Rate, 1.0, 2.0, 0.0).leased();
    for second in 0..10 {
        limiter.offer(f64::from(second), 1.0, 0.0);
    }
    limiter.ask(10.0);
    limiter.offer(10.0, 1.0, 0.0);
    limiter.offer(10.0, 1.0, 0.0);
    assert!(!limiter.surged(10.0));
    // Tenfold is a surge, unless the resource lives on its fallback.
    for _ in 0..10 {
        limiter.offer(10.0, 1.0, 0.0);
    }
    assert!(limiter.surged(10.0));
    limiter.unleased();
    assert!(!limiter.surged(10.0));
}

#[test]
fn amounts_beyond_the_protocols_maximum_are_bounded() {
    // A limited resource refuses a cost no capacity could pay, and never goes into a debt
    // larger than the largest it admits.
    let mut limiter = Limiter::new(Kind::Rate, 1e300, 1e300, 0.0);
    assert_eq!((limiter.capacity(), limiter.burst()), (MAX_AMOUNT, MAX_AMOUNT));
    limiter.set_capacity(0.0, 10.0, 2.0);
    assert_eq!(limiter.offer(0.0, 1e300, 0.0), Offer::Rejected { retry_after: None });
    assert_eq!(limiter.offer(0.0, MAX_AMOUNT, 0.0), Offer::Admitted, "a full bucket takes what it may");
    let Offer::Rejected { retry_after: Some(wait) } = limiter.offer(0.0, 1.0, 0.0) else { panic!("in debt") };
    assert!(wait.is_finite() && wait > 1e13, "{wait}");
    // Unlimited, it admits any cost, counted as at most the maximum.
    let mut limiter = Limiter::new(Kind::Concurrency, f64::INFINITY, f64::INFINITY, 0.0);
    assert_eq!(limiter.offer(0.0, 1e300, 0.0), Offer::Admitted);
    assert_eq!(limiter.in_flight(), MAX_AMOUNT);
    assert!(limiter.wants(0.0).is_finite());
}

#[test]
fn the_largest_cost_is_a_rates_burst_or_a_semaphores_capacity() {
    assert_eq!(Limiter::new(Kind::Rate, 100.0, 10.0, 0.0).largest_cost(), 10.0);
    assert_eq!(Limiter::new(Kind::Concurrency, 100.0, 10.0, 0.0).largest_cost(), 100.0);
    assert_eq!(Limiter::new(Kind::Concurrency, 0.0, 2.0, 0.0).largest_cost(), 2.0, "no capacity: the burst");
}

#[test]
fn a_sliver_of_a_rate_names_a_finite_turn() {
    let mut limiter = Limiter::new(Kind::Rate, 1e-25, 1.0, 0.0);
    assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Admitted);
    let Offer::Rejected { retry_after: Some(wait) } = limiter.offer(0.0, 1.0, 0.0) else { panic!("refused") };
    // Far beyond what a Duration holds, but a number the gate can bound.
    assert!((wait / 1e25 - 1.0).abs() < 1e-12, "{wait}");
    let waiter = queued(limiter.offer(0.0, 1.0, f64::INFINITY));
    let (none, turn) = poll(&mut limiter, 0.0);
    let turn = turn.expect("a turn");
    assert!(none.is_empty() && (turn / 1e25 - 1.0).abs() < 1e-12, "{turn}");
    assert_eq!(poll(&mut limiter, turn), (vec![waiter], None));
}

#[test]
fn a_charge_after_the_fact_leaves_bounded_debt_that_later_arrivals_wait_out() {
    let mut limiter = Limiter::new(Kind::Rate, 8.0, 4.0, 0.0);
    // A body of 100 against a bucket of 4: 2 of debt at most.
    limiter.charge(0.0, 100.0, 2.0);
    assert_eq!(limiter.offer(0.0, 0.0, 0.0), Offer::Rejected { retry_after: Some(0.25) });
    assert_eq!(limiter.offer(0.0, 1.0, 0.0), Offer::Rejected { retry_after: Some(0.375) });
    assert_eq!(limiter.offer(0.25, 0.0, 0.0), Offer::Admitted, "the debt is repaid");
    // A bucket deeper in debt than a later charge's bound stays as deep.
    limiter.charge(0.25, 100.0, 8.0);
    limiter.charge(0.25, 1.0, 2.0);
    assert_eq!(limiter.offer(0.25, 0.0, 0.0), Offer::Rejected { retry_after: Some(1.0) });
    // Within the tokens there are, a charge is an ordinary one.
    limiter.charge(1.75, 3.0, 2.0);
    assert_eq!(limiter.offer(1.75, 1.0, 0.0), Offer::Admitted);
    assert_eq!(limiter.offer(1.75, 1.0, 0.0), Offer::Rejected { retry_after: Some(0.125) });
    // The bytes count as offered load; a semaphore has nothing to charge after the fact.
    assert!(limiter.wants(1.75) > 0.0);
    let mut semaphore = Limiter::new(Kind::Concurrency, 1.0, 1.0, 0.0);
    semaphore.charge(0.0, 100.0, 1.0);
    assert_eq!(semaphore.offer(0.0, 1.0, 0.0), Offer::Admitted);
}

#[test]
fn pieces_that_wait_their_turn_pass_at_the_rate() {
    // A body paced in pieces of 48 against 1024 a second and a bucket of 128, for 5 s.
    let (rate, burst, piece) = (1024.0, 128.0, 48.0);
    let mut limiter = Limiter::new(Kind::Rate, rate, burst, 0.0);
    let (mut now, mut passed) = (0.0, 0.0);
    let mut waits = Vec::new();
    while now < 5.0 {
        match limiter.offer(now, piece, 1.0) {
            Offer::Admitted => passed += piece,
            Offer::Queued(ticket) => {
                let (admitted, turn) = poll(&mut limiter, now);
                assert!(admitted.is_empty());
                let turn = turn.expect("a rate names the turn");
                waits.push(turn - now);
                now = turn;
                assert_eq!(poll(&mut limiter, now), (vec![ticket], None));
                passed += piece;
            }
            Offer::Rejected { .. } => panic!("a piece within the burst always gets its turn"),
        }
    }
    // The bucket's content at once, then the rate: never more, and short of it by a piece at most.
    let most = burst + rate * now;
    assert!(passed <= most && passed > most - piece, "{passed} of {most}");
    assert!(waits.iter().all(|&w| w <= piece / rate + 1e-9), "no piece waits longer than it takes to earn");
}
