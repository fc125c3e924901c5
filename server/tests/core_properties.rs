//! Properties of the core on random request sequences (SPEC §3.2–3.3).

use std::sync::Arc;

use proptest::prelude::*;
use sluice_server::core::{Algorithm, Claim, Holds, Kind, Ledger, Repository, Resource, Template, UnixSeconds, Wants};

const RESOURCE: &str = "r";
const LEASE_LENGTH: i64 = 6;

#[derive(Clone, Debug)]
enum Op {
    Request { client: usize, wants: f64, subclients: f64, advance: i64 },
    Release { client: usize },
}

fn op(clients: usize) -> impl Strategy<Value = Op> {
    let wants = prop_oneof![Just(0.0), 0.0..300.0, (0u32..300).prop_map(f64::from)];
    prop_oneof![
        6 => (0..clients, wants, 1u32..5, 0i64..3).prop_map(|(client, wants, s, advance)| Op::Request {
            client,
            wants,
            subclients: f64::from(s),
            advance
        }),
        1 => (0..clients).prop_map(|client| Op::Release { client }),
    ]
}

fn ledger(kind: Kind, capacity: f64, learning_mode_duration: i64) -> Ledger {
    let template = Template {
        identifier_glob: "*".into(),
        capacity,
        adaptive: None,
        safe_capacity: None,
        description: None,
        algorithm: Algorithm {
            kind,
            lease_length: LEASE_LENGTH,
            refresh_interval: 2,
            parameters: vec![],
            learning_mode_duration: Some(learning_mode_duration),
        },
    };
    Ledger::new(Arc::new(Repository::new(vec![template]).unwrap()), 0)
}

/// An end client's claim at priority 0, weighted by `subclients`.
fn claim(wants: f64, subclients: f64, has: Option<f64>) -> Claim {
    Claim { wants: [Wants { priority: 0, wants, subclients }].into(), has, holds: Holds::Own, signals: None }
}

fn client(i: usize) -> String {
    format!("client-{i}")
}

/// Σ of the grants of unexpired leases, counted lease by lease.
fn unexpired_grants(resource: &Resource, now: UnixSeconds) -> f64 {
    resource.leases().iter().filter(|l| l.expiry > now).map(|l| l.demand.has).sum()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

/// Runs the ops, checking the invariants after each; returns the final time.
fn run(ledger: &mut Ledger, ops: &[Op], check_cap: bool) -> Result<UnixSeconds, TestCaseError> {
    let mut now = 0;
    for op in ops {
        match *op {
            Op::Release { client: c } => {
                ledger.release(now, &client(c), RESOURCE);
            }
            Op::Request { client: c, wants, subclients, advance } => {
                now += advance;
                let claim = claim(wants, subclients, None);
                let grant = ledger.claim(now, &client(c), RESOURCE, &claim);
                prop_assert!(
                    grant.capacity >= 0.0 && grant.capacity <= wants,
                    "grant {} for wants {wants}",
                    grant.capacity
                );
                prop_assert_eq!(grant.expiry, now + LEASE_LENGTH);
                prop_assert!(grant.safe_capacity.is_finite());
            }
        }
        let Some(resource) = ledger.resource(RESOURCE) else { continue };
        let capacity = resource.template().capacity;
        if check_cap {
            let held = unexpired_grants(resource, now);
            prop_assert!(held <= capacity + 1e-9 * capacity.max(1.0), "Σ grants {held} > capacity {capacity}");
        }
        // The band's running sums against a recomputation from the leases.
        let sums = resource.bands().sums();
        let leases: Vec<_> = resource.leases().iter().collect();
        prop_assert!(close(sums.wants, leases.iter().map(|l| l.demand.wants).sum()));
        prop_assert!(close(sums.subclients, leases.iter().map(|l| l.demand.subclients).sum()));
        prop_assert!(close(sums.has, leases.iter().map(|l| l.demand.has).sum()));
        prop_assert_eq!(resource.leases().len(), leases.len());
    }
    Ok(now)
}

/// Weighted max-min fair allocation by progressive filling, straight from its definition.
fn water_filling(capacity: f64, demands: &[(f64, f64)]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by(|&a, &b| (demands[a].0 / demands[a].1).total_cmp(&(demands[b].0 / demands[b].1)));
    let mut left = capacity;
    let mut weight: f64 = demands.iter().map(|d| d.1).sum();
    let mut out = vec![0.0; demands.len()];
    for i in order {
        let (wants, s) = demands[i];
        let share = left / weight * s;
        out[i] = wants.min(share);
        left -= out[i];
        weight -= s;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn sharing_algorithms_never_overshoot(
        kind in prop_oneof![Just(Kind::ProportionalShare), Just(Kind::FairShare)],
        capacity in prop_oneof![Just(0.0), 1.0..1_000.0],
        ops in prop::collection::vec(op(8), 1..200),
    ) {
        run(&mut ledger(kind, capacity, 0), &ops, true)?;
    }

    #[test]
    fn learning_mode_never_overshoots_either(
        capacity in 1.0..1_000.0,
        reported in prop::collection::vec(0.0..400.0f64, 1..40),
    ) {
        let mut ledger = ledger(Kind::FairShare, capacity, 1_000);
        for (i, has) in reported.iter().enumerate() {
            let claim = claim(has * 1.5, 1.0, Some(*has));
            let grant = ledger.claim(0, &client(i % 10), RESOURCE, &claim);
            prop_assert!(grant.capacity <= *has);
            let held = unexpired_grants(ledger.resource(RESOURCE).unwrap(), 0);
            prop_assert!(held <= capacity * (1.0 + 1e-12));
        }
    }

    #[test]
    fn other_algorithms_never_grant_more_than_wanted(
        kind in prop_oneof![Just(Kind::NoAlgorithm), Just(Kind::Static)],
        capacity in 0.0..1_000.0,
        ops in prop::collection::vec(op(8), 1..100),
    ) {
        let mut ledger = ledger(kind, capacity, 0);
        run(&mut ledger, &ops, false)?;
        if kind == Kind::Static && let Some(r) = ledger.resource(RESOURCE) {
            prop_assert!(r.leases().iter().all(|l| l.demand.has <= capacity));
        }
    }

    #[test]
    fn fair_share_converges_to_exact_water_filling(
        capacity in 1.0..1_000.0,
        history in prop::collection::vec(op(8), 0..100),
        wants in prop::collection::vec((0.0..400.0f64, 1u32..5), 1..8),
        orders in prop::collection::vec(any::<u64>(), 3),
    ) {
        let mut ledger = ledger(Kind::FairShare, capacity, 0);
        let now = run(&mut ledger, &history, true)?;
        // Whoever is not in the final set gives its lease back.
        for c in wants.len()..8 {
            ledger.release(now, &client(c), RESOURCE);
        }
        // The first round states the final wants; after it, every client refreshes twice more
        // with those wants unchanged. Each round, every client refreshes once, in a shuffled order.
        let mut last = vec![0.0; wants.len()];
        for seed in orders {
            let mut order: Vec<usize> = (0..wants.len()).collect();
            order.sort_by_key(|&i| (seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).rotate_left(17));
            for i in order {
                let (w, s) = wants[i];
                let claim = claim(w, f64::from(s), None);
                last[i] = ledger.claim(now, &client(i), RESOURCE, &claim).capacity;
            }
        }
        let demands: Vec<(f64, f64)> = wants.iter().map(|&(w, s)| (w, f64::from(s))).collect();
        let exact = water_filling(capacity, &demands);
        for (i, (got, want)) in last.iter().zip(&exact).enumerate() {
            prop_assert!((got - want).abs() <= 1e-6 * capacity.max(1.0), "client {i}: got {got}, exact {want}");
        }
    }
}
