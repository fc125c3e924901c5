//! The adaptive capacity benchmark's figures from what each pod saw second by second: per phase of
//! the service's capacity its convergence time, goodput, p99 and the pods' shares, and for the
//! whole run the one line compared run to run (docs/benchmarks.md, Adaptive capacity).

use std::fmt::Write;

use super::load::Second;

/// A span of the run at one capacity of the service, in whole seconds from the start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Phase {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) workers: u32,
    /// Requests a second the service can serve.
    pub(crate) capacity: f64,
}

/// What is judged good and when: the thresholds of convergence and the part of each phase that
/// counts as settled.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules {
    /// p99 of the admitted requests with one pod at a low rate straight to the service, µs.
    pub(crate) unloaded_p99_us: f64,
    /// Seconds after a change before the phase counts as settled.
    pub(crate) settle: u64,
    /// Requests a second each pod offers.
    pub(crate) rate: f64,
}

/// A converged second has at least this share of the capacity in goodput…
const CONVERGED_GOODPUT: f64 = 0.9;
/// …and a p99 of at most this many times the unloaded p99.
const CONVERGED_P99X: f64 = 2.0;

pub(crate) struct PhaseFigures {
    pub(crate) phase: Phase,
    /// Seconds from the phase's start until every second to its end converged; `None`: never.
    pub(crate) converge: Option<u64>,
    /// Successful answers a second over the settled part, as a share of the capacity.
    pub(crate) goodput: f64,
    /// p99 of the admitted requests over the settled part, µs.
    pub(crate) p99_us: u64,
    /// The whole phase's counts, every pod.
    pub(crate) total: Second,
    /// Each pod's admitted requests a second over the settled part.
    pub(crate) admitted: Vec<f64>,
}

impl PhaseFigures {
    /// (max − min) / mean of the admitted rates of `pods`, %.
    pub(crate) fn gap(&self, pods: &[usize]) -> f64 {
        let rates: Vec<f64> = pods.iter().map(|&p| self.admitted[p]).collect();
        let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
        let (min, max) = rates.iter().fold((f64::INFINITY, 0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        if mean > 0.0 { 100.0 * (max - min) / mean } else { 0.0 }
    }

    /// The admitted rate of `pod` over what it could have kept: its demand, or the capacity
    /// when that is less.
    pub(crate) fn kept(&self, pod: usize, rate: f64) -> f64 {
        self.admitted[pod] / rate.min(self.phase.capacity)
    }
}

/// The counts of seconds `from..to` of `pods`, added.
pub(crate) fn sum<'a>(pods: impl IntoIterator<Item = &'a Vec<Second>>, from: u64, to: u64) -> Second {
    let mut total = Second::default();
    for pod in pods {
        for second in &pod[from as usize..to as usize] {
            total.add(second);
        }
    }
    total
}

pub(crate) fn phase(pods: &[Vec<Second>], phase: Phase, rules: &Rules) -> PhaseFigures {
    let converged = |t: u64| {
        let second = sum(pods, t, t + 1);
        second.ok as f64 >= CONVERGED_GOODPUT * phase.capacity
            && second.latency.value_at_quantile(0.99) as f64 <= CONVERGED_P99X * rules.unloaded_p99_us
    };
    let mut first = phase.end;
    while first > phase.start && converged(first - 1) {
        first -= 1;
    }
    let settled_from = (phase.start + rules.settle).min(phase.end);
    let settled = sum(pods, settled_from, phase.end);
    let secs = (phase.end - settled_from).max(1) as f64;
    PhaseFigures {
        phase,
        converge: (first < phase.end).then_some(first - phase.start),
        goodput: settled.ok as f64 / secs / phase.capacity,
        p99_us: settled.latency.value_at_quantile(0.99),
        total: sum(pods, phase.start, phase.end),
        admitted: pods.iter().map(|p| sum([p], settled_from, phase.end).admitted() as f64 / secs).collect(),
    }
}

/// A system's figures over the run.
pub(crate) struct Figures {
    pub(crate) phases: Vec<PhaseFigures>,
    /// The worst phase's settled goodput share.
    pub(crate) goodput: f64,
    /// p99 of the admitted requests over every settled part, over the unloaded p99.
    pub(crate) p99x: f64,
    /// The worst phase's gap between the pods that are treated alike, %.
    pub(crate) fairness: f64,
    /// The slowest convergence after a change of capacity (not the start), s; a phase that never
    /// converged counts its whole length.
    pub(crate) converge: f64,
    /// With a pod in a higher band: the worst phase's share of its demand (or of the capacity
    /// when less) admitted.
    pub(crate) high_kept: Option<f64>,
}

/// The figures of a run of `phases`; `high` is the pod in a higher band, if any, which is left
/// out of the fairness figure.
pub(crate) fn figures(pods: &[Vec<Second>], phases: &[Phase], rules: &Rules, high: Option<usize>) -> Figures {
    let per_phase: Vec<PhaseFigures> = phases.iter().map(|&p| phase(pods, p, rules)).collect();
    let alike: Vec<usize> = (0..pods.len()).filter(|&p| Some(p) != high).collect();
    let mut settled = Second::default();
    for p in phases {
        settled.add(&sum(pods, (p.start + rules.settle).min(p.end), p.end));
    }
    let worst = |f: &dyn Fn(&PhaseFigures) -> f64| per_phase.iter().map(f).fold(f64::INFINITY, f64::min);
    Figures {
        goodput: worst(&|p| p.goodput),
        p99x: settled.latency.value_at_quantile(0.99) as f64 / rules.unloaded_p99_us,
        fairness: per_phase.iter().map(|p| p.gap(&alike)).fold(0.0, f64::max),
        converge: per_phase
            .iter()
            .skip(1)
            .map(|p| p.converge.unwrap_or(p.phase.end - p.phase.start) as f64)
            .fold(0.0, f64::max),
        high_kept: high.map(|pod| worst(&|p| p.kept(pod, rules.rate))),
        phases: per_phase,
    }
}

/// The table of a system's phases.
pub(crate) fn table(figures: &Figures, rules: &Rules) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>9} {:>9} {:>10} {:>8} {:>8} {:>8} {:>7} {:>7}  admitted/s per pod (settled)",
        "phase", "capacity", "converge", "goodput", "p99 ms", "refused", "shed", "failed"
    );
    for p in &figures.phases {
        let converge =
            p.converge.map_or_else(|| format!("never({})", p.phase.end - p.phase.start), |s| format!("{s} s"));
        let pods: Vec<String> = p.admitted.iter().map(|a| format!("{a:.0}")).collect();
        let _ = writeln!(
            out,
            "{:>9} {:>9} {:>10} {:>7.1}% {:>8.1} {:>8} {:>7} {:>7}  {}",
            format!("{}-{}s", p.phase.start, p.phase.end),
            format!("{:.0}/s", p.phase.capacity),
            converge,
            100.0 * p.goodput,
            p.p99_us as f64 / 1000.0,
            p.total.refused,
            p.total.shed,
            p.total.failed,
            pods.join(" ")
        );
    }
    let _ = writeln!(
        out,
        "p99 of admitted requests over the settled parts: {:.1}× the unloaded {:.1} ms",
        figures.p99x,
        rules.unloaded_p99_us / 1000.0
    );
    out
}

/// The line compared run to run.
pub(crate) fn line(system: &str, figures: &Figures) -> String {
    let (refused, failed) = figures.phases.iter().fold((0, 0), |(r, f), p| (r + p.total.refused, f + p.total.failed));
    let mut line = format!(
        "adaptive: system={system} goodput={:.1}% p99x={:.1} fairness={:.1}% converge_s={:.1}",
        100.0 * figures.goodput,
        figures.p99x,
        figures.fairness,
        figures.converge
    );
    if let Some(kept) = figures.high_kept {
        let _ = write!(line, " high_kept={:.0}%", 100.0 * kept);
    }
    let _ = write!(line, " refused={refused} failed={failed}");
    line
}
