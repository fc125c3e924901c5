//! The server's ledger under any sequence of client and child-server claims, releases, expiries
//! and clock steps read from the input: no panic, every grant finite and within what was wanted
//! (but for a child server that keeps its last lease); the sharing algorithms never lease out
//! more than the capacity in all to end clients (Σ granted ≤ capacity), and STATIC never more
//! than the capacity to one client. An adaptive resource, fed any signals, keeps its learned
//! capacity finite and within its bounds (its leases may exceed a capacity that just fell, until
//! they refresh, as for a lowered configured one).
#![no_main]
#![forbid(unsafe_code)]

use std::sync::{Arc, LazyLock};

use libfuzzer_sys::fuzz_target;
use sluice_server::{
    config,
    core::{Claim, Holds, Kind, Ledger, Report, Repository, Wants},
};

const REPOSITORY: &str = "
resources:
  - {identifier_glob: fair, capacity: 100, algorithm: {kind: FAIR_SHARE, lease_length: 20, refresh_interval: 5, learning_mode_duration: 0}}
  - {identifier_glob: prop, capacity: 0.5, algorithm: {kind: PROPORTIONAL_SHARE, lease_length: 20, refresh_interval: 5, learning_mode_duration: 0}}
  - {identifier_glob: adaptive, capacity: adaptive, adaptive: {min: 5, max: 500}, algorithm: {kind: FAIR_SHARE, lease_length: 20, refresh_interval: 1, learning_mode_duration: 0}}
  - {identifier_glob: static, capacity: 7, algorithm: {kind: STATIC, lease_length: 20, refresh_interval: 5, learning_mode_duration: 0}}
  - {identifier_glob: '*', capacity: 1000, algorithm: {kind: NO_ALGORITHM, lease_length: 20, refresh_interval: 5, learning_mode_duration: 0}}
";

const RESOURCES: [&str; 5] = ["fair", "prop", "static", "none", "adaptive"];
const CLIENTS: [&str; 6] = ["a", "b", "c", "d", "child-1", "child-2"];

/// With FUZZ_TRACE set (replaying one input), prints each step.
fn trace(line: impl FnOnce() -> String) {
    static ON: LazyLock<bool> = LazyLock::new(|| std::env::var_os("FUZZ_TRACE").is_some());
    if *ON {
        eprintln!("{}", line());
    }
}

/// Reads the input a few bytes at a time; zeros once it is used up.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        b
    }

    /// An amount with a bias to the edges: zero, tiny, exact fractions and huge values.
    fn amount(&mut self) -> f64 {
        match self.byte() % 8 {
            0 => 0.0,
            1 => f64::from(self.byte()) * 1e-9,
            2 => 1e300,
            3 => f64::from(u16::from_le_bytes([self.byte(), self.byte()])) / 64.0,
            _ => f64::from(self.byte()),
        }
    }
}

impl Input<'_> {
    /// Signals within what validation lets through (`validate.rs`): counts up to 1e15, errors
    /// no more than them, latencies and spans up to an hour.
    fn report(&mut self) -> Report {
        let completed = self.amount().min(1e15).floor();
        let errors = (completed * f64::from(self.byte()) / 255.0).floor();
        let seconds = |input: &mut Self| (input.amount() / 64.0).min(3600.0);
        Report {
            completed,
            errors,
            latency_sum: (seconds(self) * (completed - errors)).min(3600.0 * (completed - errors)),
            min_latency: self.byte().is_multiple_of(2).then(|| seconds(self)),
            seconds: seconds(self),
        }
    }
}

/// Parsed once: parsing and compiling the globs would cost more than a run.
static REPOSITORY_PARSED: LazyLock<Arc<Repository>> =
    LazyLock::new(|| Arc::new(config::parse(REPOSITORY, std::path::Path::new("")).expect("valid")));

fuzz_target!(|data: &[u8]| {
    let mut ledger = Ledger::new(REPOSITORY_PARSED.clone(), 0).with_seed(u64::from(data.first().copied().unwrap_or(0)));
    let mut input = Input(data);
    let mut now = 0;
    // Resources a child server claimed: its lease keeps what its clients may still hold, or
    // live on once it lapses, which the others' grants need not leave room for (store.rs,
    // `Holds`); the capacity bounds only what end clients are granted.
    let mut served_server = [false; RESOURCES.len()];
    while !input.0.is_empty() {
        let op = input.byte();
        let client = CLIENTS[usize::from(input.byte()) % CLIENTS.len()];
        let resource_index = usize::from(input.byte()) % RESOURCES.len();
        let resource = RESOURCES[resource_index];
        match op % 6 {
            0 | 1 => {
                let wants = input.amount();
                let has = (op & 8 != 0).then(|| input.amount().min(1e12));
                let mut claim = Claim::single(i64::from(input.byte() % 3), wants, has);
                if op & 16 != 0 {
                    claim.signals = Some(Box::new(input.report()));
                }
                let grant = ledger.claim(now, client, resource, &claim);
                trace(|| format!("t={now} {client} claims {resource}: {claim:?} -> {grant:?}"));
                assert!(grant.capacity.is_finite() && (0.0..=wants).contains(&grant.capacity), "{grant:?} for {wants}");
                assert!(grant.safe_capacity.is_finite());
            }
            2 => {
                // A child server: a band or two, on behalf of many subclients.
                let bands = (0..1 + input.byte() % 2)
                    .map(|p| Wants {
                        priority: i64::from(p),
                        wants: input.amount(),
                        subclients: 1.0 + f64::from(input.byte()),
                    })
                    .collect();
                let has = (op & 8 != 0).then(|| input.amount().min(1e12));
                let signals = (op & 16 != 0).then(|| Box::new(input.report()));
                let claim = Claim { wants: bands, has, holds: has.map_or(Holds::Unknown, Holds::Reported), signals };
                served_server[resource_index] = true;
                let grant = ledger.claim(now, client, resource, &claim);
                trace(|| format!("t={now} {client} claims {resource}: {claim:?} -> {grant:?}"));
                assert!(grant.capacity.is_finite() && grant.capacity >= 0.0, "{grant:?}");
                // One that does not say what its clients hold keeps its last lease for a while,
                // whatever it wants now (store.rs, `Holds::Unknown`).
                if has.is_some() {
                    let wants = claim.total_wants();
                    assert!(grant.capacity <= wants * (1.0 + 1e-12), "{grant:?} for {wants}");
                }
            }
            3 => {
                ledger.release(now, client, resource);
                trace(|| format!("t={now} {client} releases {resource}"));
            }
            4 => now += i64::from(input.byte() % 30),
            _ => {
                let expired = ledger.expire(now, usize::from(input.byte()));
                trace(|| format!("t={now} {expired} leases expired"));
            }
        }
        for (i, id) in RESOURCES.iter().enumerate() {
            let Some(r) = ledger.resource(id) else { continue };
            let Some(capacity) = r.capacity(now) else { continue };
            let mut live = r.leases().iter().filter(|l| l.expiry > now);
            trace(|| format!("  {id}: {:?}", r.leases().iter().collect::<Vec<_>>()));
            let slack = 1e-9 * capacity.max(1.0);
            if let Some(c) = r.controller() {
                assert!(capacity.is_finite() && (5.0..=500.0).contains(&capacity), "{id}: learned {capacity}");
                trace(|| format!("  {id}: {:?}", c.history().back()));
                continue;
            }
            match r.algorithm().kind {
                Kind::FairShare | Kind::ProportionalShare if !served_server[i] => {
                    let held: f64 = live.map(|l| l.demand.has).sum();
                    assert!(held <= capacity + slack, "{id}: Σ granted {held} > capacity {capacity}");
                }
                Kind::Static => {
                    assert!(live.all(|l| l.demand.has <= capacity + slack), "{id}: a lease above {capacity}");
                }
                _ => {}
            }
        }
    }
});
