use std::time::Duration;

use http::StatusCode;

use super::{
    figures::{Phase, Rules, figures, line},
    load::{Outcome, Second, classify},
};

const TIMEOUT: Duration = Duration::from_secs(2);

#[test]
fn answers_are_told_apart_by_who_gave_them() {
    let at = |status: u16, shed: bool| {
        classify(Some((StatusCode::from_u16(status).unwrap(), shed)), Duration::ZERO, TIMEOUT)
    };
    assert_eq!(at(200, false), Outcome::Ok);
    assert_eq!(at(429, false), Outcome::Refused);
    assert_eq!(at(503, false), Outcome::Refused, "a proxy's or limiter's 503");
    assert_eq!(at(503, true), Outcome::Shed, "the service's full queue");
    assert_eq!(at(502, false), Outcome::Failed { admitted: true });
    assert_eq!(
        classify(None, TIMEOUT, TIMEOUT),
        Outcome::Failed { admitted: true },
        "a timeout waited past the limiter"
    );
    assert_eq!(classify(None, Duration::from_millis(3), TIMEOUT), Outcome::Failed { admitted: false });
}

/// A second of one pod: `ok` answers and `refused`, every admitted one taking `ms`.
fn second(ok: u64, refused: u64, ms: u64) -> Second {
    let mut s = Second { ok, refused, ..Second::default() };
    for _ in 0..ok {
        s.latency.record(ms * 1000).unwrap();
    }
    s
}

#[test]
fn convergence_is_the_first_second_from_which_every_second_is_good() {
    let phases = [
        Phase { start: 0, end: 4, workers: 10, capacity: 100.0 },
        Phase { start: 4, end: 10, workers: 4, capacity: 40.0 },
    ];
    let rules = Rules { unloaded_p99_us: 10_000.0, settle: 2, rate: 60.0 };
    // Two pods: the first phase good from second 1; the second good from second 7 (a good second
    // at 5 does not count, 6 is slow), and pod 1 admits half of pod 0 once settled.
    let pod0 = vec![
        second(10, 0, 10),
        second(50, 10, 10),
        second(50, 10, 10),
        second(50, 10, 10),
        second(30, 30, 10),
        second(30, 30, 10),
        second(30, 30, 50),
        second(30, 30, 10),
        second(30, 30, 10),
        second(30, 30, 10),
    ];
    let pod1 = [second(10, 0, 10), second(50, 10, 10), second(50, 10, 10), second(50, 10, 10), second(0, 60, 10)]
        .into_iter()
        .chain([10, 15, 15, 15, 15].map(|ok| second(ok, 60 - ok, 10)))
        .collect();
    let f = figures(&[pod0, pod1], &phases, &rules, None);
    assert_eq!(f.phases[0].converge, Some(1));
    assert_eq!(f.phases[1].converge, Some(3));
    assert_eq!(f.converge, 3.0, "the slowest after a change, not the start");
    // Settled second phase (6..10): 45 ok/s of 40.
    assert!((f.phases[1].goodput - 45.0 / 40.0).abs() < 1e-9);
    assert!((f.goodput - 1.0).abs() < 1e-9, "the worst phase: 100 of 100 in 2..4");
    assert!((f.fairness - 100.0 * 15.0 / 22.5).abs() < 1e-9, "pods at 30 and 15 admitted/s");
    assert!(line("sluice", &f).starts_with("adaptive: system=sluice goodput=100.0% p99x="));
}

#[test]
fn a_phase_that_never_converges_counts_its_length_and_a_high_band_is_judged_apart() {
    let phases = [
        Phase { start: 0, end: 2, workers: 10, capacity: 100.0 },
        Phase { start: 2, end: 5, workers: 4, capacity: 40.0 },
    ];
    let rules = Rules { unloaded_p99_us: 10_000.0, settle: 1, rate: 60.0 };
    let high = vec![second(60, 0, 10); 5];
    let low = vec![second(20, 40, 100); 5];
    let f = figures(&[high, low.clone(), low], &phases, &rules, Some(0));
    assert_eq!(f.phases[1].converge, None, "p99 of 100 ms is never within 2× of 10 ms");
    assert_eq!(f.converge, 3.0);
    assert_eq!(f.fairness, 0.0, "the two low pods alike");
    assert!(
        (f.high_kept.unwrap() - 1.0).abs() < 1e-9,
        "the worst phase: 60/s of min(60, 100); 60/s of a capacity of 40 is more than kept"
    );
    assert!(line("sluice-bands", &f).contains(" high_kept="));
}
