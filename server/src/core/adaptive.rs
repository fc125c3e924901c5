//! Adaptive capacity (docs/server.md, Adaptive capacity): a resource's capacity learned from what
//! its clients report of the service it protects, by one controller per resource at the server
//! that owns it, then shared as a configured capacity is.
//!
//! The law works on rates, as leases do. When the service is overloaded — its mean latency more
//! than `tolerance` above the unloaded latency, or more than `error_share` of its answers
//! overload errors — the goodput it sustained is its ceiling, and the capacity goes to that
//! ceiling less the headroom, less what drains the queue found (Little's law: goodput × the
//! latency above the unloaded one) within `drain` seconds. While it is not, and the clients want
//! more than the capacity, the capacity goes straight back to just below the last ceiling, then
//! grows past it by steps that double from `growth`. The unloaded latency is the lowest mean
//! latency of the recent decisions' intervals (a mean, not the fastest answer, so that calls that
//! simply cost more are not taken for a queue). When even the fastest answer of an interval is
//! slower than that for a while — a standing queue, or a service slower for good — the whole
//! fleet lowers its take together for one decision, so that the queue empties and the interval's
//! mean shows the unloaded latency anew: one coordinated probe instead of each client probing
//! alone.

use std::collections::VecDeque;

use super::store::UnixSeconds;
use crate::defaults::{
    ADAPTIVE_BASELINE_DECISIONS, ADAPTIVE_DRAIN, ADAPTIVE_ERROR_SHARE, ADAPTIVE_GROWTH, ADAPTIVE_HEADROOM,
    ADAPTIVE_HISTORY, ADAPTIVE_INTERVAL, ADAPTIVE_MIN_SAMPLES, ADAPTIVE_PROBE_SHARE, ADAPTIVE_REPORTERS_SMOOTHING,
    ADAPTIVE_STALE_DECISIONS, ADAPTIVE_TOLERANCE,
};

/// A template's bounds and its controller's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Adaptive {
    pub min: f64,
    pub max: f64,
    /// The capacity before anything is learned.
    pub initial: f64,
    /// How far above the unloaded latency the mean latency may rise (0.5: 50%).
    pub tolerance: f64,
    /// The share of overload errors among answers the service may give.
    pub error_share: f64,
    /// The share of the ceiling left unused.
    pub headroom: f64,
    /// The first step of growth past the ceiling.
    pub growth: f64,
    /// Seconds in which a queue should drain.
    pub drain: f64,
    /// Seconds between decisions.
    pub interval: i64,
}

impl Adaptive {
    /// Between `min` and `max`, starting at `max`, with the controller's defaults.
    pub fn within(min: f64, max: f64) -> Adaptive {
        Adaptive {
            min,
            max,
            initial: max,
            tolerance: ADAPTIVE_TOLERANCE,
            error_share: ADAPTIVE_ERROR_SHARE,
            headroom: ADAPTIVE_HEADROOM,
            growth: ADAPTIVE_GROWTH,
            drain: ADAPTIVE_DRAIN,
            interval: ADAPTIVE_INTERVAL,
        }
    }
}

/// One client's signals, validated: what its forwarded calls met over `seconds`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Report {
    pub completed: f64,
    pub errors: f64,
    /// Σ latency of the calls that were not errors.
    pub latency_sum: f64,
    pub min_latency: Option<f64>,
    pub seconds: f64,
}

impl Report {
    /// When the first interval of signals starts, if this report is its first: at the start of
    /// what the report spans, so that the interval holds what it counts.
    pub fn start(&self, now: UnixSeconds) -> UnixSeconds {
        now.saturating_sub(self.seconds.ceil() as UnixSeconds)
    }
}

/// The reports of one interval, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Window {
    completed: f64,
    errors: f64,
    latency_sum: f64,
    min_latency: Option<f64>,
    seconds: f64,
}

/// What a window says of the whole fleet, per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    /// Answers that were not errors.
    pub goodput: f64,
    pub errors: f64,
    /// Their mean latency; `None` without one.
    pub latency: Option<f64>,
    pub min_latency: Option<f64>,
    /// Answers the window holds.
    pub samples: f64,
}

impl Window {
    pub fn add(&mut self, report: &Report) {
        self.completed += report.completed;
        self.errors += report.errors;
        self.latency_sum += report.latency_sum;
        self.seconds += report.seconds;
        self.min_latency = match (self.min_latency, report.min_latency) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    pub fn is_empty(&self) -> bool {
        self.seconds <= 0.0
    }

    /// The fleet's rates, `clients` each answered at the mean rate of the reports.
    fn rates(&self, clients: f64) -> Option<Rates> {
        if self.is_empty() {
            return None;
        }
        let ok = (self.completed - self.errors).max(0.0);
        let scale = clients / self.seconds;
        Some(Rates {
            goodput: ok * scale,
            errors: self.errors * scale,
            latency: (ok > 0.0).then(|| self.latency_sum / ok),
            min_latency: self.min_latency,
            samples: self.completed,
        })
    }
}

/// Reports as they come, closed interval by interval into the fleet's rates.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Collector {
    window: Window,
    /// How many clients report, smoothed over intervals.
    reporters: Option<f64>,
}

impl Collector {
    pub fn add(&mut self, report: &Report) {
        self.window.add(report);
    }

    /// Closes an interval of `seconds`: the fleet's rates over it, starting the next. Clients
    /// report at times of their own, so an interval may hold two reports of one client and none
    /// of another: a plain sum over the interval would swing with that. Instead the mean rate
    /// per reported second is multiplied by the clients that report, counted by the seconds
    /// their reports span (each client's add up to about every interval) and smoothed over
    /// intervals. Clients that send no signals — Doorman's — are not counted.
    pub fn close(&mut self, seconds: f64) -> Option<Rates> {
        let window = std::mem::take(&mut self.window);
        if seconds <= 0.0 {
            return None;
        }
        let seen = window.seconds / seconds;
        let reporters = self.reporters.map_or(seen, |n| n + ADAPTIVE_REPORTERS_SMOOTHING * (seen - n));
        self.reporters = Some(reporters);
        window.rates(reporters)
    }

    /// What an intermediate server passes up for the `seconds` since its last report: its
    /// subtree's rates as one client's report.
    pub fn report(&mut self, seconds: f64) -> Option<Report> {
        let rates = self.close(seconds)?;
        let ok = rates.goodput * seconds;
        Some(Report {
            completed: ok + rates.errors * seconds,
            errors: rates.errors * seconds,
            latency_sum: rates.latency.map_or(0.0, |l| l * ok),
            min_latency: rates.min_latency,
            seconds,
        })
    }
}

/// Why a decision set the capacity it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Too few answers to judge by: held.
    Quiet,
    /// Latency or errors show an overload: cut to the goodput.
    Overload,
    /// Back to just below the ceiling last measured.
    Recover,
    /// Past the ceiling, the clients wanting more.
    Grow,
    /// The clients want no more than the capacity: held.
    Sated,
    /// The fleet's take lowered to measure the unloaded latency again.
    Probe,
}

impl Reason {
    pub const ALL: [Reason; 6] =
        [Reason::Quiet, Reason::Overload, Reason::Recover, Reason::Grow, Reason::Sated, Reason::Probe];

    pub fn name(self) -> &'static str {
        match self {
            Reason::Quiet => "quiet",
            Reason::Overload => "overload",
            Reason::Recover => "recover",
            Reason::Grow => "grow",
            Reason::Sated => "sated",
            Reason::Probe => "probe",
        }
    }
}

/// One decision, with the inputs it was made on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    pub at: UnixSeconds,
    pub capacity: f64,
    pub reason: Reason,
    pub rates: Option<Rates>,
    /// The unloaded latency it judged by.
    pub baseline: Option<f64>,
    pub ceiling: Option<f64>,
}

/// A resource's controller.
#[derive(Clone, Debug)]
pub struct Controller {
    settings: Adaptive,
    capacity: f64,
    signals: Collector,
    since: Option<UnixSeconds>,
    /// The mean latencies of the latest intervals, for the baseline.
    means: VecDeque<f64>,
    baseline: Option<f64>,
    ceiling: Option<f64>,
    /// Growth steps in a row past the ceiling.
    streak: u32,
    /// Decisions in a row in which no answer came as fast as the baseline allows.
    stale: u32,
    probing: bool,
    history: VecDeque<Decision>,
    /// Decisions so far, by [`Reason`] in the order of [`Reason::ALL`].
    counts: [u64; Reason::ALL.len()],
}

impl Controller {
    pub fn new(settings: Adaptive) -> Controller {
        Controller {
            capacity: settings.initial,
            settings,
            signals: Collector::default(),
            since: None,
            means: VecDeque::new(),
            baseline: None,
            ceiling: None,
            streak: 0,
            stale: 0,
            probing: false,
            history: VecDeque::new(),
            counts: [0; Reason::ALL.len()],
        }
    }

    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    pub fn settings(&self) -> &Adaptive {
        &self.settings
    }

    /// New bounds and settings (a reloaded template): the capacity learned stays, within them.
    pub fn set_settings(&mut self, settings: Adaptive) {
        self.capacity = self.capacity.clamp(settings.min, settings.max);
        self.settings = settings;
    }

    /// The latest decisions, oldest first.
    pub fn history(&self) -> &VecDeque<Decision> {
        &self.history
    }

    /// How many decisions gave `reason`.
    pub fn decisions(&self, reason: Reason) -> u64 {
        self.counts[reason as usize]
    }

    /// Takes a client's report, which came at `now`.
    pub fn observe(&mut self, report: &Report, now: UnixSeconds) {
        self.since.get_or_insert_with(|| report.start(now));
        self.signals.add(report);
    }

    /// Decides once an interval has passed since the last decision, on what came meanwhile, the
    /// clients wanting `wants` in all. Returns the decision, if one was made.
    pub fn tick(&mut self, now: UnixSeconds, wants: f64) -> Option<Decision> {
        let since = *self.since.get_or_insert(now);
        if now < since.saturating_add(self.settings.interval) {
            return None;
        }
        self.since = Some(now);
        let rates = self.signals.close((now - since) as f64).filter(|r| r.samples >= ADAPTIVE_MIN_SAMPLES);
        let reason = match rates {
            None => Reason::Quiet,
            Some(rates) => self.decide(&rates, wants),
        };
        let decision = Decision {
            at: now,
            capacity: self.capacity,
            reason,
            rates,
            baseline: self.baseline,
            ceiling: self.ceiling,
        };
        if self.history.len() == ADAPTIVE_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(decision);
        self.counts[reason as usize] += 1;
        Some(decision)
    }

    fn decide(&mut self, rates: &Rates, wants: f64) -> Reason {
        let s = &self.settings;
        if let Some(latency) = rates.latency {
            if std::mem::take(&mut self.probing) {
                self.means.clear();
            }
            if self.means.len() == ADAPTIVE_BASELINE_DECISIONS {
                self.means.pop_front();
            }
            self.means.push_back(latency);
            self.baseline = self.means.iter().copied().reduce(f64::min);
        }
        if let (Some(min), Some(baseline)) = (rates.min_latency, self.baseline) {
            self.stale = if min > baseline * (1.0 + s.tolerance) { self.stale + 1 } else { 0 };
        }
        let error_share = rates.errors / (rates.errors + rates.goodput).max(f64::MIN_POSITIVE);
        let slow = match (rates.latency, self.baseline) {
            (Some(latency), Some(baseline)) => latency > baseline * (1.0 + s.tolerance),
            _ => false,
        };
        let (capacity, reason) = if self.stale >= ADAPTIVE_STALE_DECISIONS {
            // Checked first: a service slower for good looks overloaded at every decision.
            self.stale = 0;
            self.probing = true;
            (self.capacity * ADAPTIVE_PROBE_SHARE, Reason::Probe)
        } else if error_share > s.error_share || slow {
            let queued = match (rates.latency, self.baseline) {
                (Some(latency), Some(baseline)) => rates.goodput * (latency - baseline).max(0.0),
                _ => 0.0,
            };
            self.ceiling = Some(rates.goodput);
            self.streak = 0;
            (rates.goodput * (1.0 - s.headroom) - queued / s.drain, Reason::Overload)
        } else if wants <= self.capacity {
            self.streak = 0;
            (self.capacity, Reason::Sated)
        } else {
            match self.ceiling.map(|c| c * (1.0 - s.headroom)) {
                Some(below) if self.capacity < below => (below, Reason::Recover),
                _ => {
                    let step = (s.growth * f64::from(1u32 << self.streak.min(16))).min(1.0);
                    self.streak = self.streak.saturating_add(1);
                    (self.capacity * (1.0 + step), Reason::Grow)
                }
            }
        };
        self.capacity = capacity.clamp(s.min, s.max);
        reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Adaptive {
        Adaptive::within(10.0, 5000.0)
    }

    /// A report of one client over a second: `ok` answers at `latency`, the fastest `min`.
    fn report(ok: f64, errors: f64, latency: f64, min: f64) -> Report {
        Report { completed: ok + errors, errors, latency_sum: ok * latency, min_latency: Some(min), seconds: 1.0 }
    }

    #[test]
    fn rates_do_not_swing_with_how_reports_fall_into_intervals() {
        let mut c = Collector::default();
        // Three clients at 100/s, reporting every second: one interval holds four reports,
        // the next two, and so on.
        let mut goodputs = vec![];
        for reports in [3, 4, 2, 3, 4, 2, 3, 3, 4, 2] {
            (0..reports).for_each(|_| c.add(&report(100.0, 0.0, 0.01, 0.01)));
            goodputs.push(c.close(1.0).unwrap().goodput);
        }
        let last = goodputs.last().unwrap();
        assert!((last - 300.0).abs() < 30.0, "{goodputs:?}");
        assert_eq!(c.close(1.0), None, "nothing reported");
    }

    #[test]
    fn a_subtree_passes_its_rates_up_as_one_report() {
        let mut c = Collector::default();
        // Two clients reporting a second each, over the two seconds since the last report.
        c.add(&Report { seconds: 2.0, ..report(180.0, 20.0, 0.02, 0.01) });
        c.add(&Report { seconds: 2.0, ..report(180.0, 20.0, 0.04, 0.005) });
        let up = c.report(2.0).unwrap();
        // Two clients at 90 ok + 10 errors a second, over two seconds.
        assert_eq!(up.completed, 400.0);
        assert_eq!(up.errors, 40.0);
        assert!((up.latency_sum / 360.0 - 0.03).abs() < 1e-12);
        assert_eq!(up.min_latency, Some(0.005));
        assert_eq!(up.seconds, 2.0);
    }

    /// A controller whose first interval starts at 0.
    fn controller(settings: Adaptive) -> Controller {
        let mut c = Controller::new(settings);
        assert_eq!(c.tick(0, 0.0), None);
        c
    }

    /// The decision at `t` on the fleet's traffic of the second before, as one report.
    fn decide(c: &mut Controller, t: UnixSeconds, r: Report, wants: f64) -> Decision {
        c.observe(&r, t);
        c.tick(t, wants).expect("an interval passed")
    }

    #[test]
    fn overload_cuts_to_the_goodput_less_headroom_and_the_queue_to_drain() {
        let mut c = controller(settings());
        // Unloaded: 10 ms. Then 1000 ok/s at a mean of 110 ms: 100 calls queued on average.
        let d = decide(&mut c, 1, report(1000.0, 0.0, 0.010, 0.010), 1800.0);
        assert_eq!((d.reason, d.capacity), (Reason::Sated, 5000.0), "wants below the capacity");
        let d = decide(&mut c, 2, report(1000.0, 0.0, 0.110, 0.012), 1800.0);
        assert_eq!(d.reason, Reason::Overload);
        assert!((d.capacity - (950.0 - 100.0 / 2.0)).abs() < 1e-9, "{}", d.capacity);
        assert_eq!(d.ceiling, Some(1000.0));
    }

    #[test]
    fn calls_that_cost_more_than_the_fastest_are_not_a_queue() {
        let mut c = controller(Adaptive { initial: 1000.0, ..settings() });
        for t in 1..20 {
            let d = decide(&mut c, t, report(950.0, 0.0, 0.004, 0.001), 1800.0);
            assert_ne!(d.reason, Reason::Overload, "at {t}");
        }
        assert_eq!(c.capacity(), 1875.0, "grown past what the clients want, then held");
    }

    #[test]
    fn errors_alone_are_an_overload() {
        let mut c = controller(settings());
        let d = decide(&mut c, 1, report(400.0, 100.0, 0.010, 0.010), 1800.0);
        assert_eq!(d.reason, Reason::Overload);
        assert!((d.capacity - 380.0).abs() < 1e-9);
    }

    #[test]
    fn recovery_goes_back_below_the_ceiling_then_grows_by_doubling_steps() {
        let mut c = controller(settings());
        decide(&mut c, 1, report(1000.0, 0.0, 0.010, 0.010), 1800.0);
        let d = decide(&mut c, 2, report(400.0, 0.0, 0.5, 0.3), 1800.0);
        assert!(d.capacity < 380.0);
        let d = decide(&mut c, 3, report(200.0, 0.0, 0.011, 0.010), 1800.0);
        assert_eq!((d.reason, d.capacity), (Reason::Recover, 380.0));
        let mut capacities = vec![];
        for t in [4, 5, 6] {
            capacities.push(decide(&mut c, t, report(380.0, 0.0, 0.010, 0.010), 1800.0).capacity);
        }
        assert_eq!(capacities, [475.0, 712.5, 1425.0]);
        // Bounded by max, and held where the clients want no more.
        let d = decide(&mut c, 7, report(1000.0, 0.0, 0.010, 0.010), 900.0);
        assert_eq!((d.reason, d.capacity), (Reason::Sated, 1425.0));
    }

    #[test]
    fn the_capacity_stays_within_its_bounds() {
        let mut c = controller(settings());
        let d = decide(&mut c, 1, report(5.0, 30.0, 0.010, 0.010), 1800.0);
        assert_eq!(d.capacity, 10.0);
        c.set_settings(Adaptive { min: 50.0, ..settings() });
        assert_eq!(c.capacity(), 50.0);
    }

    #[test]
    fn too_few_answers_hold_the_capacity() {
        let mut c = controller(settings());
        let d = decide(&mut c, 1, report(5.0, 5.0, 1.0, 1.0), 1800.0);
        assert_eq!((d.reason, d.capacity), (Reason::Quiet, 5000.0));
        assert_eq!(c.tick(1, 1800.0), None, "one decision an interval");
    }

    #[test]
    fn a_slower_service_is_probed_fleet_wide_and_its_new_latency_taken() {
        let mut c = controller(Adaptive { initial: 1000.0, ..settings() });
        decide(&mut c, 1, report(950.0, 0.0, 0.010, 0.010), 1800.0);
        // The service now takes 25 ms at best: every answer is "slow" against 10 ms.
        let mut t = 2;
        let mut reasons = vec![];
        loop {
            let ok = c.capacity().min(400.0);
            let d = decide(&mut c, t, report(ok, 0.0, 0.026, 0.025), 1800.0);
            reasons.push(d.reason);
            t += 1;
            if d.reason == Reason::Probe || t > 30 {
                break;
            }
        }
        assert_eq!(reasons.last(), Some(&Reason::Probe), "{reasons:?}");
        // The answers during the probe are the new unloaded latency.
        let d = decide(&mut c, t, report(200.0, 0.0, 0.025, 0.025), 1800.0);
        assert_eq!(d.baseline, Some(0.025));
        assert_ne!(d.reason, Reason::Overload);
    }
}
