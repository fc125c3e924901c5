//! What a run with a service behind the resource is judged by: the figures the adaptive capacity
//! benchmark gives the real binaries (`tests/src/bench_adaptive/figures.rs`, issue 31).
//!
//! Per phase of the service's capacity, from the calls sent in each whole second:
//!
//! - goodput: successful answers a second over the settled part (from [`SETTLE`] seconds after
//!   the phase's start to its end), as a share of the service's capacity; the worst phase's;
//! - p99x: the p99 latency of the admitted calls over every settled part, over the unloaded p99
//!   (the service time: a lone call to the idle service takes exactly that);
//! - fairness: the largest gap between the clients' admitted rates over a settled part,
//!   (max − min) / mean, %;
//! - convergence: after each change of the service, the seconds until every second to the
//!   phase's end has a goodput of at least 90% of the capacity and a p99 of at most twice the
//!   unloaded one; the slowest (a phase that never converged counts its whole length).

use std::fmt::Write as _;

use crate::{
    clock::Time,
    service::{Record, Second},
};

/// Seconds after a change before its phase counts as settled.
pub const SETTLE: usize = 5;
/// A converged second has at least this share of the capacity in goodput…
const CONVERGED_GOODPUT: f64 = 0.9;
/// …and a p99 of at most this many times the unloaded p99.
const CONVERGED_P99X: f64 = 2.0;

/// Whole seconds of the run at one capacity of the service.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Phase {
    pub start: usize,
    pub end: usize,
    /// Calls a second the service can serve.
    pub capacity: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PhaseFigures {
    pub phase: Phase,
    /// Seconds from the phase's start until every second to its end converged; `None`: never.
    pub converge: Option<usize>,
    /// Successful answers a second over the settled part, as a share of the capacity.
    pub goodput: f64,
    /// Each client's admitted calls a second over the settled part.
    pub admitted: Vec<f64>,
}

impl PhaseFigures {
    /// (max − min) / mean of the clients' admitted rates, %.
    pub fn gap(&self) -> f64 {
        let mean = self.admitted.iter().sum::<f64>() / self.admitted.len().max(1) as f64;
        let (min, max) = self.admitted.iter().fold((f64::INFINITY, 0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        if mean > 0.0 { 100.0 * (max - min) / mean } else { 0.0 }
    }
}

/// A run's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    pub phases: Vec<PhaseFigures>,
    /// The worst phase's settled goodput share.
    pub goodput: f64,
    pub p99x: f64,
    /// The worst phase's gap between the clients, %.
    pub fairness: f64,
    /// The slowest convergence after a change, s.
    pub converge: f64,
}

/// The phases of a run: from each change of the service's capacity (at a whole second at or
/// after it) to the next, or to the end of the record.
pub fn phases(record: &Record) -> Vec<Phase> {
    let end = record.seconds.len();
    let starts: Vec<(usize, f64)> = record.capacity.iter().map(|&(at, c)| ((at.ceil() as usize).min(end), c)).collect();
    let ends = starts.iter().skip(1).map(|&(start, _)| start).chain([end]);
    starts.iter().zip(ends).map(|(&(start, capacity), end)| Phase { start, end, capacity }).collect()
}

/// The calls of seconds `from..to`, together.
fn sum(seconds: &[Second], from: usize, to: usize) -> Second {
    let mut total = Second { admitted: vec![0; seconds.first().map_or(0, |s| s.admitted.len())], ..Second::default() };
    for second in &seconds[from..to] {
        total.ok += second.ok;
        total.shed += second.shed;
        total.admitted.iter_mut().zip(&second.admitted).for_each(|(t, a)| *t += a);
        total.latencies.extend(&second.latencies);
    }
    total
}

/// The `q` quantile of `latencies` (the nearest rank); 0 without any.
pub fn quantile(mut latencies: Vec<Time>, q: f64) -> Time {
    if latencies.is_empty() {
        return 0.0;
    }
    let rank = ((q * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len()) - 1;
    *latencies.select_nth_unstable_by(rank, f64::total_cmp).1
}

/// Whether second `t` is converged for a service of `capacity`.
pub fn converged(record: &Record, t: usize, capacity: f64) -> bool {
    let second = &record.seconds[t];
    second.ok as f64 >= CONVERGED_GOODPUT * capacity
        && quantile(second.latencies.clone(), 0.99) <= CONVERGED_P99X * record.unloaded
}

fn phase(record: &Record, phase: Phase) -> PhaseFigures {
    let mut first = phase.end;
    while first > phase.start && converged(record, first - 1, phase.capacity) {
        first -= 1;
    }
    let settled_from = (phase.start + SETTLE).min(phase.end);
    let settled = sum(&record.seconds, settled_from, phase.end);
    let secs = (phase.end - settled_from).max(1) as f64;
    PhaseFigures {
        phase,
        converge: (first < phase.end).then_some(first - phase.start),
        goodput: settled.ok as f64 / secs / phase.capacity,
        admitted: settled.admitted.iter().map(|&a| a as f64 / secs).collect(),
    }
}

pub fn figures(record: &Record) -> Figures {
    let phases = phases(record);
    let per_phase: Vec<PhaseFigures> = phases.iter().map(|&p| phase(record, p)).collect();
    let mut settled = Vec::new();
    for p in &phases {
        settled.extend(sum(&record.seconds, (p.start + SETTLE).min(p.end), p.end).latencies);
    }
    Figures {
        goodput: per_phase.iter().map(|p| p.goodput).fold(f64::INFINITY, f64::min),
        p99x: quantile(settled, 0.99) / record.unloaded,
        fairness: per_phase.iter().map(PhaseFigures::gap).fold(0.0, f64::max),
        converge: per_phase
            .iter()
            .skip(1)
            .map(|p| p.converge.unwrap_or(p.phase.end - p.phase.start) as f64)
            .fold(0.0, f64::max),
        phases: per_phase,
    }
}

/// The figures in the benchmark's form, to compare with its `system=sluice` line.
pub fn line(figures: &Figures) -> String {
    format!(
        "adaptive: system=sim goodput={:.1}% p99x={:.1} fairness={:.1}% converge_s={:.1}",
        100.0 * figures.goodput,
        figures.p99x,
        figures.fairness,
        figures.converge
    )
}

/// Each figure's mean and worst over runs of one scenario with several seeds.
pub fn sweep(runs: &[Figures]) -> String {
    let n = runs.len().max(1) as f64;
    let mean = |f: fn(&Figures) -> f64| runs.iter().map(f).sum::<f64>() / n;
    let low = |f: fn(&Figures) -> f64| runs.iter().map(f).fold(f64::INFINITY, f64::min);
    let high = |f: fn(&Figures) -> f64| runs.iter().map(f).fold(f64::NEG_INFINITY, f64::max);
    let mut out = String::new();
    let _ = write!(
        out,
        "adaptive: system=sim seeds={} mean goodput={:.1}% p99x={:.2} fairness={:.1}% converge_s={:.1}",
        runs.len(),
        100.0 * mean(|f| f.goodput),
        mean(|f| f.p99x),
        mean(|f| f.fairness),
        mean(|f| f.converge)
    );
    let _ = write!(
        out,
        "; worst goodput={:.1}% p99x={:.2} fairness={:.1}% converge_s={:.1}",
        100.0 * low(|f| f.goodput),
        high(|f| f.p99x),
        high(|f| f.fairness),
        high(|f| f.converge)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second of `ok` answers at `latency` from each of two clients (`skew` fewer from the
    /// second).
    fn second(ok: u64, latency: Time, skew: u64) -> Second {
        Second {
            ok: 2 * ok - skew,
            shed: 0,
            admitted: vec![ok, ok - skew],
            latencies: vec![latency; (2 * ok - skew) as usize],
        }
    }

    #[test]
    fn figures_of_a_short_record() {
        // 100/s until 8 s, then 50/s. Settled from 5 and 13 s.
        let mut seconds: Vec<Second> = (0..8).map(|_| second(50, 0.01, 0)).collect();
        // After the drop: two slow seconds, one good, one slow again, then good ones.
        seconds.extend([0.05, 0.05, 0.01, 0.03].map(|l| second(25, l, 0)));
        seconds.extend((0..8).map(|_| second(25, 0.015, 4)));
        let record = Record { seconds, capacity: vec![(0.0, 100.0), (7.5, 50.0)], unloaded: 0.01 };
        let f = figures(&record);
        assert_eq!(
            f.phases.iter().map(|p| p.phase).collect::<Vec<_>>(),
            [Phase { start: 0, end: 8, capacity: 100.0 }, Phase { start: 8, end: 20, capacity: 50.0 }]
        );
        assert_eq!((f.phases[0].converge, f.phases[1].converge), (Some(0), Some(4)));
        assert_eq!(f.converge, 4.0, "the slowest after a change, not the start");
        // 46 a second in 13..20 of 50.
        assert!((f.goodput - 0.92).abs() < 1e-12, "{}", f.goodput);
        assert!((f.p99x - 1.5).abs() < 1e-12, "{}", f.p99x);
        assert!((f.fairness - 100.0 * 4.0 / 23.0).abs() < 1e-9, "clients at 25 and 21 a second");
        assert_eq!(line(&f), "adaptive: system=sim goodput=92.0% p99x=1.5 fairness=17.4% converge_s=4.0");
        let swept = sweep(&[f.clone(), Figures { goodput: 1.0, converge: 2.0, ..f }]);
        assert!(swept.contains("mean goodput=96.0%") && swept.contains("worst goodput=92.0%"), "{swept}");
        assert!(swept.contains("converge_s=3.0;") && swept.ends_with("converge_s=4.0"), "{swept}");
    }

    #[test]
    fn the_quantile_is_the_nearest_rank() {
        let latencies: Vec<Time> = (1..=200).map(f64::from).collect();
        assert_eq!(quantile(latencies.clone(), 0.99), 198.0);
        assert_eq!(quantile(latencies, 0.5), 100.0);
        assert_eq!(quantile(Vec::new(), 0.99), 0.0);
    }
}
