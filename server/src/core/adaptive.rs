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

use std::collections::{BTreeMap, VecDeque};

use super::store::UnixSeconds;
use crate::defaults::{
    ADAPTIVE_BASELINE_DECISIONS, ADAPTIVE_DRAIN, ADAPTIVE_ERROR_SHARE, ADAPTIVE_GROWTH, ADAPTIVE_HEADROOM,
    ADAPTIVE_HISTORY, ADAPTIVE_HOLD_DECISIONS, ADAPTIVE_INTERVAL, ADAPTIVE_MIN_SAMPLES, ADAPTIVE_PROBE_BACKOFFS,
    ADAPTIVE_PROBE_SHARE, ADAPTIVE_REPORT_HORIZON, ADAPTIVE_STALE_DECISIONS, ADAPTIVE_TOLERANCE,
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
    fn ok(&self) -> f64 {
        (self.completed - self.errors).max(0.0)
    }
}

/// What the clients' latest reports say of the whole fleet, per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    /// Answers that were not errors.
    pub goodput: f64,
    pub errors: f64,
    /// Their mean latency; `None` without one.
    pub latency: Option<f64>,
    pub min_latency: Option<f64>,
}

/// Each client's latest report, for the fleet's rates: the sum of each client's own rate.
/// Clients report at times of their own, so a decision's interval may hold two reports of one
/// client and none of another; the latest of each does not swing with that, as a sum over the
/// interval would. A client that sends no signals — Doorman's — counts for nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fleet {
    /// Ordered, so that the sums come out the same in every run (simulations replay them).
    latest: BTreeMap<Box<str>, (Report, UnixSeconds)>,
    /// Answers reported since the last [`Fleet::rates`].
    fresh: f64,
}

impl Fleet {
    pub fn add(&mut self, client: &str, report: Report, now: UnixSeconds) {
        self.fresh += report.completed;
        match self.latest.get_mut(client) {
            Some(latest) => *latest = (report, now),
            None => {
                self.latest.insert(client.into(), (report, now));
            }
        }
    }

    /// Answers reported since the last [`Fleet::rates`].
    pub fn fresh(&self) -> f64 {
        self.fresh
    }

    /// The fleet's rates from the clients that reported within [`ADAPTIVE_REPORT_HORIZON`]
    /// seconds of `now`; the others are forgotten.
    pub fn rates(&mut self, now: UnixSeconds) -> Option<Rates> {
        self.fresh = 0.0;
        self.forget(now);
        let reports = self.latest.values().map(|(r, _)| r).filter(|r| r.seconds > 0.0);
        let (mut goodput, mut errors, mut latency, mut min_latency, mut any) = (0.0, 0.0, 0.0, None::<f64>, false);
        for r in reports {
            any = true;
            goodput += r.ok() / r.seconds;
            errors += r.errors / r.seconds;
            latency += r.latency_sum / r.seconds;
            min_latency = match (min_latency, r.min_latency) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        any.then(|| Rates { goodput, errors, latency: (goodput > 0.0).then(|| latency / goodput), min_latency })
    }

    /// Forgets the clients that last reported more than [`ADAPTIVE_REPORT_HORIZON`] seconds
    /// before `now`: at every decision, quiet or not, so that clients come and gone (or ids made
    /// up by one client) are not kept.
    pub fn forget(&mut self, now: UnixSeconds) {
        self.latest.retain(|_, (_, at)| now.saturating_sub(*at) <= ADAPTIVE_REPORT_HORIZON);
    }

    /// What an intermediate server passes up for the `seconds` since its last report: its
    /// subtree's rates as one client's report.
    pub fn report(&mut self, now: UnixSeconds, seconds: f64) -> Option<Report> {
        let rates = self.rates(now)?;
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
    /// Just below the ceiling, before probing past it.
    Hold,
    /// Past the ceiling, the clients wanting more.
    Grow,
    /// The clients want no more than the capacity: held.
    Sated,
    /// The fleet's take lowered to measure the unloaded latency again.
    Probe,
}

impl Reason {
    pub const ALL: [Reason; 7] =
        [Reason::Quiet, Reason::Overload, Reason::Recover, Reason::Hold, Reason::Grow, Reason::Sated, Reason::Probe];

    pub fn name(self) -> &'static str {
        match self {
            Reason::Quiet => "quiet",
            Reason::Overload => "overload",
            Reason::Recover => "recover",
            Reason::Hold => "hold",
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
    signals: Fleet,
    since: Option<UnixSeconds>,
    /// The mean latencies of the latest intervals, for the baseline.
    means: VecDeque<f64>,
    baseline: Option<f64>,
    ceiling: Option<f64>,
    /// Growth steps in a row past the ceiling.
    streak: u32,
    /// Decisions without an overload since the capacity came back below the ceiling.
    held: u32,
    /// Probes past the ceiling in a row that found it where it was: each doubles the decisions
    /// held before the next, so that a service at its capacity is not overloaded every few
    /// seconds to find out.
    futile: u32,
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
            signals: Fleet::default(),
            since: None,
            means: VecDeque::new(),
            baseline: None,
            ceiling: None,
            streak: 0,
            held: 0,
            futile: 0,
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
    /// Takes `client`'s report, which came at `now`.
    pub fn observe(&mut self, client: &str, report: Report, now: UnixSeconds) {
        self.signals.add(client, report, now);
    }

    /// Decides once an interval has passed since the last decision, on what came meanwhile, the
    /// clients wanting `wants` in all. Returns the decision, if one was made.
    pub fn tick(&mut self, now: UnixSeconds, wants: f64) -> Option<Decision> {
        let since = *self.since.get_or_insert(now);
        if now < since.saturating_add(self.settings.interval) {
            return None;
        }
        self.since = Some(now);
        // Too few new answers wait for more rather than being judged alone, so that a capacity
        // at a small `min` still gets decisions.
        let rates = match self.signals.fresh() >= ADAPTIVE_MIN_SAMPLES {
            true => self.signals.rates(now),
            false => {
                self.signals.forget(now);
                None
            }
        };
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
        let error_share = rates.errors / (rates.errors + rates.goodput).max(f64::MIN_POSITIVE);
        // A service shedding load is overloaded, not slower: its queue is no unloaded latency.
        if let (Some(min), Some(baseline)) = (rates.min_latency, self.baseline) {
            let slower = min > baseline * (1.0 + s.tolerance) && error_share <= s.error_share;
            self.stale = if slower { self.stale + 1 } else { 0 };
        }
        let slow = match (rates.latency, self.baseline) {
            (Some(latency), Some(baseline)) => latency > baseline * (1.0 + s.tolerance),
            _ => false,
        };
        let overloaded = error_share > s.error_share || slow;
        let (capacity, reason) = if self.stale >= ADAPTIVE_STALE_DECISIONS {
            // Checked first: a service slower for good looks overloaded at every decision.
            self.stale = 0;
            self.probing = true;
            (self.capacity * ADAPTIVE_PROBE_SHARE, Reason::Probe)
        } else if overloaded {
            // What still waits: the fastest call's wait, not the mean's, which is mostly of
            // calls that queued while the queue was longer.
            let queued = match (rates.min_latency, self.baseline) {
                (Some(min), Some(baseline)) => rates.goodput * (min - baseline).max(0.0),
                _ => 0.0,
            };
            // Where even the fastest call waited, calls were shed, or the clients, wanting more
            // than the capacity, got well under it through, the service was busy all the
            // interval: its goodput is what it can do. Otherwise it idled some of the time (the
            // queue built up or drained within the interval) and did at least that much.
            let saturated = error_share > s.error_share
                || matches!((rates.min_latency, self.baseline), (Some(m), Some(b)) if m > b * (1.0 + s.tolerance))
                || (wants > self.capacity && rates.goodput < self.capacity * (1.0 - s.headroom));
            let ceiling = match self.ceiling {
                Some(c) if !saturated => c.max(rates.goodput),
                _ => rates.goodput,
            };
            // After growing past the ceiling: did the probe find more room?
            if self.streak > 0 {
                let same = self.ceiling.is_some_and(|c| ceiling <= c * (1.0 + s.headroom));
                self.futile = if same { self.futile.saturating_add(1) } else { 0 };
            } else if self.ceiling.is_some_and(|c| ceiling < c * (1.0 - s.headroom)) {
                // The service lost capacity: probe again soon, it may get it back.
                self.futile = 0;
            }
            self.ceiling = Some(ceiling);
            (self.streak, self.held) = (0, 0);
            (ceiling * (1.0 - s.headroom) - queued / s.drain, Reason::Overload)
        } else if wants <= self.capacity {
            self.streak = 0;
            (self.capacity, Reason::Sated)
        } else {
            self.held = self.held.saturating_add(1);
            match self.ceiling.map(|c| c * (1.0 - s.headroom)) {
                Some(below) if self.capacity < below => (below, Reason::Recover),
                // Just below the ceiling, the service is given a few decisions to show it keeps
                // up before it is probed past it: each probe may cost an overload.
                Some(_) if self.held <= ADAPTIVE_HOLD_DECISIONS << self.futile.min(ADAPTIVE_PROBE_BACKOFFS) => {
                    (self.capacity, Reason::Hold)
                }
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
    fn the_fleet_is_the_sum_of_each_clients_latest_rates() {
        let mut f = Fleet::default();
        // Three clients at 100/s; "a" reported twice, the latest counts.
        f.add("a", report(50.0, 0.0, 0.01, 0.01), 0);
        f.add("a", report(100.0, 0.0, 0.01, 0.01), 1);
        f.add("b", Report { seconds: 2.0, ..report(200.0, 0.0, 0.03, 0.02) }, 1);
        f.add("c", report(100.0, 10.0, 0.02, 0.005), 1);
        assert_eq!(f.fresh(), 460.0);
        let rates = f.rates(2).unwrap();
        assert_eq!((rates.goodput, rates.errors), (300.0, 10.0));
        assert!((rates.latency.unwrap() - 0.02).abs() < 1e-12, "{rates:?}");
        assert_eq!(rates.min_latency, Some(0.005));
        assert_eq!(f.fresh(), 0.0, "counted anew");
        // A client that stopped reporting counts for nothing once its report is old.
        f.add("a", report(100.0, 0.0, 0.01, 0.01), 1 + ADAPTIVE_REPORT_HORIZON + 1);
        assert_eq!(f.rates(1 + ADAPTIVE_REPORT_HORIZON + 1).unwrap().goodput, 100.0);
        assert_eq!(Fleet::default().rates(0), None);
        f.forget(100);
        assert_eq!(f.rates(100), None, "all forgotten");
    }

    #[test]
    fn a_subtree_passes_its_rates_up_as_one_report() {
        let mut f = Fleet::default();
        f.add("a", report(90.0, 10.0, 0.02, 0.01), 0);
        f.add("b", report(90.0, 10.0, 0.04, 0.005), 0);
        let up = f.report(0, 2.0).unwrap();
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

    /// The decision at `t` on the fleet's traffic of the second before, as one client's report.
    fn decide(c: &mut Controller, t: UnixSeconds, r: Report, wants: f64) -> Decision {
        c.observe("fleet", r, t);
        c.tick(t, wants).expect("an interval passed")
    }

    #[test]
    fn overload_cuts_to_the_ceiling_less_headroom_and_the_queue_to_drain() {
        let mut c = controller(settings());
        let d = decide(&mut c, 1, report(1000.0, 0.0, 0.010, 0.010), 1800.0);
        assert_eq!((d.reason, d.capacity), (Reason::Sated, 5000.0), "wants below the capacity");
        // 1,000 ok/s, even the fastest call waiting 100 ms: 100 calls still queued.
        let d = decide(&mut c, 2, report(1000.0, 0.0, 0.150, 0.110), 6000.0);
        assert_eq!(d.reason, Reason::Overload);
        assert!((d.capacity - (950.0 - 100.0 / 2.0)).abs() < 1e-9, "{}", d.capacity);
        assert_eq!(d.ceiling, Some(1000.0));
    }

    #[test]
    fn a_ceiling_is_measured_only_where_the_service_was_busy_all_the_interval() {
        let mut c = controller(Adaptive { initial: 950.0, ..settings() });
        decide(&mut c, 1, report(950.0, 0.0, 0.010, 0.010), 1800.0);
        decide(&mut c, 2, report(1000.0, 0.0, 0.030, 0.020), 1800.0);
        // The queue drains within the interval (the fastest call did not wait): the goodput
        // is what the service did, not all it can do.
        let d = decide(&mut c, 3, report(940.0, 0.0, 0.030, 0.010), 1800.0);
        assert_eq!((d.reason, d.ceiling), (Reason::Overload, Some(1000.0)));
        // The service slowed down: the clients, wanting more than their 950, got 400 through.
        let d = decide(&mut c, 4, report(400.0, 0.0, 0.030, 0.010), 1800.0);
        assert_eq!((d.reason, d.ceiling, d.capacity), (Reason::Overload, Some(400.0), 380.0));
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
    fn recovery_goes_back_below_the_ceiling_holds_then_probes_less_often_when_futile() {
        let mut c = controller(settings());
        decide(&mut c, 1, report(1000.0, 0.0, 0.010, 0.010), 1800.0);
        let d = decide(&mut c, 2, report(400.0, 100.0, 0.5, 0.3), 1800.0);
        assert_eq!(d.ceiling, Some(400.0));
        assert!(d.capacity < 380.0);
        let steady = report(380.0, 0.0, 0.010, 0.010);
        let d = decide(&mut c, 3, steady, 1800.0);
        assert_eq!((d.reason, d.capacity), (Reason::Recover, 380.0));
        let reasons: Vec<Reason> = (4..8).map(|t| decide(&mut c, t, steady, 1800.0).reason).collect();
        assert_eq!(reasons, [Reason::Hold, Reason::Hold, Reason::Grow, Reason::Grow]);
        assert_eq!(c.capacity(), 380.0 * 1.25 * 1.5, "doubling steps");
        // The probe finds the same ceiling: cut, recovered, then held twice as long.
        decide(&mut c, 8, report(400.0, 50.0, 0.2, 0.1), 1800.0);
        let reasons: Vec<Reason> = (9..17).map(|t| decide(&mut c, t, steady, 1800.0).reason).collect();
        // Six decisions below the ceiling, the recovery's included, where there were three.
        assert_eq!(reasons.iter().filter(|r| **r == Reason::Hold).count(), 5, "{reasons:?}");
        // Held where the clients want no more.
        let d = decide(&mut c, 17, steady, 300.0);
        assert_eq!(d.reason, Reason::Sated);
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
    fn too_few_answers_wait_for_more() {
        let mut c = controller(settings());
        let d = decide(&mut c, 1, report(5.0, 5.0, 1.0, 1.0), 1800.0);
        assert_eq!((d.reason, d.capacity), (Reason::Quiet, 5000.0));
        assert_eq!(c.tick(1, 1800.0), None, "one decision an interval");
        let d = decide(&mut c, 2, report(5.0, 5.0, 1.0, 1.0), 1800.0);
        assert_eq!(d.reason, Reason::Overload, "20 answers over two intervals");
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
