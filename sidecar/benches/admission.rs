//! The admission hot path: one `Limiter::offer` that admits, bare and behind the `Mutex` the
//! proxy holds it in (budget: 50 ns uncontended); a gate's admission, on a fixed resource and on
//! a key among 10,000 live keys of a keyed resource (goal: within 2× of the fixed one), the same
//! key each time and every key in turn; and
//! the bulk GetCapacity request a sidecar holding 10,000 keys builds each refresh.

use std::{hint::black_box, sync::Mutex, time::Duration};

use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::FutureExt;
use prost::Message;
use sluice_sidecar::{
    config,
    core::{Cost, Fallback, Kind, LeaseClient, Limiter, Offer, ResourceSpec},
    enforce::{Gate, Keyed},
};

/// Live keys in the keyed benchmarks.
const KEYS: usize = 10_000;

/// A rate far above the load, so every offer admits.
fn roomy() -> Limiter {
    Limiter::new(Kind::Rate, 1e12, 1e12, 0.0)
}

fn offer(c: &mut Criterion) {
    let mut limiter = roomy();
    let mut now = 0.0;
    c.bench_function("offer_admitted", |b| {
        b.iter(|| {
            now += 1e-6;
            assert_eq!(limiter.offer(black_box(now), black_box(1.0), 0.0), Offer::Admitted);
        })
    });

    let locked = Mutex::new(roomy());
    let mut now = 0.0;
    c.bench_function("offer_admitted_mutex", |b| {
        b.iter(|| {
            now += 1e-6;
            let offer = locked.lock().unwrap().offer(black_box(now), black_box(1.0), 0.0);
            assert_eq!(offer, Offer::Admitted);
        })
    });
}

/// A standalone configuration with a fixed resource `fixed` and a keyed one `keyed` (per
/// `x-tenant`), both far above the load.
fn resources() -> config::Config {
    let yaml = format!(
        "listeners:\n  - {{name: l, address: 127.0.0.1:1, upstream: u}}\n\
         upstreams:\n  - {{name: u, url: http://127.0.0.1:2}}\n\
         resources:\n  - {{id: fixed, capacity: 1e12, burst: 1e12}}\n  \
         - {{id: orders.per-tenant, capacity: 1e12, burst: 1e12, per: {{header: x-tenant}}, max_keys: {KEYS}}}\n"
    );
    config::parse(&yaml).expect("a valid configuration")
}

fn admitted(gate: &Gate) {
    let admitted = gate.admit(black_box(Cost::ONE), Duration::ZERO).now_or_never().expect("no wait");
    assert!(admitted.is_ok());
}

fn gates(c: &mut Criterion) {
    let mut config = resources();
    let fixed = Gate::new(config.resources.remove(0), None);
    c.bench_function("admit_fixed", |b| b.iter(|| admitted(&fixed)));

    let keyed = Keyed::new(config.resources.remove(0), None);
    let tenants: Vec<String> = (0..KEYS).map(|i| format!("tenant-{i:05}")).collect();
    for tenant in &tenants {
        keyed.gate(Some(tenant.as_bytes())).expect("a safe key");
    }
    // One tenant over and over among the 10,000: the table's lookup, its gate in cache.
    let hot = tenants[KEYS / 2].as_bytes();
    c.bench_function("admit_keyed_10000_keys_same_key", |b| {
        b.iter(|| admitted(&keyed.gate(Some(black_box(hot))).expect("a live key")))
    });
    // Every key in turn: each admission also reaches a gate not in cache.
    let mut next = tenants.iter().cycle();
    c.bench_function("admit_keyed_10000_keys_in_turn", |b| {
        b.iter(|| {
            let tenant = next.next().expect("endless");
            admitted(&keyed.gate(Some(black_box(tenant.as_bytes()))).expect("a live key"))
        })
    });
}

/// One refresh's request for 10,000 keys, as the lease client builds it, and its encoding.
fn bulk_request(c: &mut Criterion) {
    let mut client = LeaseClient::new("pod-7f9c4d8b6-x2lqz:9000".into(), 1);
    let ids: Vec<String> = (0..KEYS).map(|i| format!("orders.per-tenant/tenant-{i:05}")).collect();
    client.configure(ids.iter().map(|id| ResourceSpec {
        id: id.clone(),
        priority: 0,
        fallback: Fallback::Safe,
        safe_capacity: f64::INFINITY,
    }));
    ids.iter().for_each(|id| client.touch(0.0, id));
    // A second on, past the wait for a new resource's first requests to show their rate.
    let request = client.request(1.0, |_| 3.3).expect("a request");
    assert_eq!(request.resource.len(), KEYS);
    eprintln!("bulk GetCapacity request for {KEYS} keys: {} bytes encoded", request.encoded_len());
    client.on_error(1.0, true);
    c.bench_function("bulk_request_10000_keys", |b| {
        b.iter(|| {
            let request = client.request(black_box(1.0), |_| 3.3).expect("a request");
            client.on_error(1.0, true);
            black_box(request.encode_to_vec())
        })
    });
}

criterion_group! {
    name = admission;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = offer, gates, bulk_request
}
criterion_main!(admission);
