//! The admission hot path: one `Limiter::offer` that admits, bare and behind the `Mutex` the
//! proxy holds it in. Budget: 50 ns uncontended.

use std::{hint::black_box, sync::Mutex, time::Duration};

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_sidecar::core::{Kind, Limiter, Offer};

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

criterion_group! {
    name = admission;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = offer
}
criterion_main!(admission);
