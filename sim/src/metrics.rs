//! What a run is judged by, from samples taken every `sample_every` seconds:
//!
//! - utilization: Σ has / min(capacity, Σ wants), averaged over the samples after the first
//!   learning mode (SPEC §6); `has` is what each client enforces (lease or fallback), `wants`
//!   what its sidecar would ask for at that moment;
//! - overshoot: Σ of the unexpired grants the end clients hold (their leases from the servers
//!   they talk to, not fallbacks), above the root's capacity: how many separate episodes, the
//!   peak and the mean while above (% of capacity). Also the peak the root has reserved for its
//!   clients, and the peak of what clients enforce (leases and fallbacks);
//! - reconvergence: after each shift (a scenario event or mishap, its start or end), the time
//!   until Σ has is again no more than [`TOLERANCE`] short of min(capacity, Σ wants), and stays
//!   so for one refresh interval of the clients' servers, after the shortfall the shift caused:
//!   the next one that begins within a lease length (so that a consequence that waits for
//!   leases to run out counts) and before the next shift, or else one under way that no
//!   earlier shift caused. Reported apart for shifts in demand (clients joining, leaving,
//!   spiking, calming down: what Doorman's "reconverged within 2 minutes after a shift in
//!   demand" measured) and failures (crashes, elections, network loss and its end), which a
//!   subtree cut off for longer than a lease cannot reconverge from before it is reachable
//!   again;
//! - fairness: Jain's index of the clients' `has` against the exact fair split — the one the
//!   servers' exact algorithm makes with perfect knowledge of the true demands: max-min over
//!   all clients for a lone root or a tree that passes up profiles; for a tree that passes up
//!   sums, each server's max-min over its children's aggregates ([`fairness::tree_split`]),
//!   since a server that sees one Σ wants per subtree defines no other split. It is averaged
//!   over the steady samples after the first learning mode: converged, with every client
//!   holding a lease. A client without one — cut off from its servers, or still waiting for
//!   its first answer — enforces its fallback (the safe capacity, SPEC §3.5), which by design
//!   knows nothing of its demand; such samples measure the outage or the join, not the
//!   sharing. A true demand is the offered load with the sidecar's [`HEADROOM`], what a
//!   sidecar that knew its load exactly would ask for: without it, clients below the fair
//!   level would count as favoured by the headroom alone. Beside it, the index against the
//!   max-min split over all clients (`flat_jain`), and that of a sums tree's exact split
//!   itself (`tree_jain`): how fair such a tree can be at all;
//! - server RPCs per second: all servers, and the root alone.

use sluice_sidecar::core::HEADROOM;

use crate::{clock::Time, fairness};

/// How far short of its target Σ has may be and count as converged.
pub const TOLERANCE: f64 = 0.02;

/// The state of the whole system at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub t: Time,
    pub capacity: f64,
    /// Σ what the sidecars would ask for.
    pub wants: f64,
    /// Σ offered load.
    pub demand: f64,
    /// Σ capacity the clients enforce.
    pub has: f64,
    /// Σ unexpired grants the clients hold (leases, not fallbacks).
    pub granted: f64,
    /// Clients without a lease (cut off, or waiting for their first answer): they enforce a
    /// fallback.
    pub unleased: usize,
    /// Σ unexpired leases in the root's ledger: what it has reserved for its clients.
    pub reserved: f64,
    /// Cost admitted per second since the previous sample.
    pub admitted: f64,
    /// Jain's index against the exact fair split, after the first learning mode.
    pub jain: Option<f64>,
    /// Jain's index against the max-min split over all clients.
    pub flat_jain: Option<f64>,
    /// Jain's index of a sums tree's exact split against the max-min split over all clients
    /// (1 for a lone root; `None` for a tree that passes up profiles, whose exact split is that
    /// one).
    pub tree_jain: Option<f64>,
}

impl Sample {
    /// What Σ has should approach.
    pub fn target(&self) -> f64 {
        self.capacity.min(self.wants)
    }

    /// Whether the capacity that could be handed out is (within [`TOLERANCE`]). Holding more
    /// than the target is not a shortfall: above the wants it is given back at the next
    /// refresh, above the capacity it is overshoot, measured on its own.
    pub fn converged(&self) -> bool {
        self.has >= (1.0 - TOLERANCE) * self.target()
    }

    /// Converged, and every client leased: the samples fairness is judged on.
    pub fn steady(&self) -> bool {
        self.converged() && self.unleased == 0
    }
}

/// Per-client figures at one instant, for [`Sample`]'s fairness.
pub struct ClientState {
    /// The server it talks to.
    pub server: usize,
    /// Offered load.
    pub demand: f64,
    pub has: f64,
}

/// Jain's index of the clients' `has` against the exact fair split of `capacity` and against
/// the max-min split over all clients; and for a tree whose servers pass up sums (`parents`:
/// `Some`), whose exact split is [`fairness::tree_split`], that split's own index against the
/// max-min one. A tree that passes up profiles has the max-min split as its exact split.
pub fn jain(
    capacity: f64,
    parents: Option<&[Option<usize>]>,
    clients: &[ClientState],
) -> (Option<f64>, Option<f64>, Option<f64>) {
    let demands: Vec<f64> = clients.iter().map(|c| c.demand * HEADROOM).collect();
    let grants: Vec<f64> = clients.iter().map(|c| c.has).collect();
    let fair = fairness::max_min(&demands, capacity);
    let flat = fairness::jain(&grants, &fair);
    let Some(parents) = parents else { return (flat, flat, None) };
    let placed: Vec<(usize, f64)> = clients.iter().zip(&demands).map(|(c, &d)| (c.server, d)).collect();
    let tree = fairness::tree_split(capacity, parents, &placed);
    (fairness::jain(&grants, &tree), flat, fairness::jain(&tree, &fair))
}

/// What moved: what clients ask for, or the servers and network that answer them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cause {
    Demand,
    /// Ranks above demand: shifts at the same instant are judged as a failure.
    Failure,
}

/// A shift in demand or supply, and how long the system took to settle after it.
#[derive(Clone, Debug, PartialEq)]
pub struct Shift {
    pub at: Time,
    pub cause: Cause,
    pub what: String,
    /// `None`: not within the run.
    pub reconverged_after: Option<Time>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub duration: Time,
    /// When the first learning mode ends; the averages start there.
    pub learning_end: Time,
    /// Refresh interval of the servers the clients talk to.
    pub refresh: Time,
    /// How long after a shift a shortfall still counts as its consequence: the lease length.
    pub horizon: Time,
    /// Fraction (1 = 100%).
    pub utilization: f64,
    pub overshoot_events: usize,
    /// Peak Σ granted / capacity, whether above or not.
    pub granted_peak: f64,
    /// Mean Σ granted / capacity over the samples above capacity.
    pub overshoot_mean: Option<f64>,
    /// Peak Σ has / capacity: includes fallbacks.
    pub has_peak: f64,
    /// Peak of what the root reserved / capacity.
    pub reserved_peak: f64,
    pub shifts: Vec<Shift>,
    /// Against the exact fair split: the target's yardstick.
    pub jain: Option<f64>,
    /// Against the max-min split over all clients, over the same samples.
    pub flat_jain: Option<f64>,
    /// A sums tree's exact split against the max-min one, over the same samples.
    pub tree_jain: Option<f64>,
    pub rpcs_per_second: f64,
    pub root_rpcs_per_second: f64,
}

impl Summary {
    pub fn compute(
        samples: &[Sample],
        shifts: Vec<(Time, Cause, String)>,
        learning_end: Time,
        refresh: Time,
        horizon: Time,
        rpcs: u64,
        root_rpcs: u64,
    ) -> Summary {
        let duration = samples.last().map_or(0.0, |s| s.t);
        let after: Vec<&Sample> = samples.iter().filter(|s| s.t >= learning_end).collect();
        let utilization = mean(after.iter().filter(|s| s.target() > 0.0).map(|s| s.has / s.target())).unwrap_or(0.0);
        let ratio = |s: &Sample| s.granted / s.capacity;
        let above = |s: &Sample| s.granted > s.capacity * (1.0 + 1e-9);
        let overshoot_events = samples.windows(2).filter(|w| !above(&w[0]) && above(&w[1])).count()
            + samples.first().is_some_and(above) as usize;
        Summary {
            duration,
            learning_end,
            refresh,
            horizon,
            utilization,
            overshoot_events,
            granted_peak: samples.iter().map(ratio).fold(0.0, f64::max),
            overshoot_mean: mean(samples.iter().filter(|s| above(s)).map(ratio)),
            has_peak: samples.iter().map(|s| s.has / s.capacity).fold(0.0, f64::max),
            reserved_peak: samples.iter().map(|s| s.reserved / s.capacity).fold(0.0, f64::max),
            shifts: reconvergence(samples, shifts, learning_end, refresh, horizon),
            jain: mean(after.iter().filter(|s| s.steady()).filter_map(|s| s.jain)),
            flat_jain: mean(after.iter().filter(|s| s.steady()).filter_map(|s| s.flat_jain)),
            tree_jain: mean(after.iter().filter(|s| s.steady() && s.jain.is_some()).filter_map(|s| s.tree_jain)),
            rpcs_per_second: rpcs as f64 / duration.max(f64::MIN_POSITIVE),
            root_rpcs_per_second: root_rpcs as f64 / duration.max(f64::MIN_POSITIVE),
        }
    }

    /// The longest reconvergence among the shifts of `cause` that reconverged.
    pub fn reconvergence_max(&self, cause: Cause) -> Option<Time> {
        self.settled(Some(cause)).reduce(f64::max)
    }

    /// The mean reconvergence over all shifts that reconverged.
    pub fn reconvergence_mean(&self) -> Option<Time> {
        mean(self.settled(None))
    }

    /// Shifts after which the system did not reconverge within the run.
    pub fn unsettled(&self) -> usize {
        self.shifts.iter().filter(|shift| shift.reconverged_after.is_none()).count()
    }

    /// The reconvergence times of the shifts (of `cause`, if given) that reconverged.
    fn settled(&self, cause: Option<Cause>) -> impl Iterator<Item = Time> + '_ {
        self.shifts
            .iter()
            .filter(move |shift| cause.is_none_or(|c| shift.cause == c))
            .filter_map(|shift| shift.reconverged_after)
    }
}

/// For each shift after `learning_end`: how long until the system is converged again after
/// the shortfall it caused — from the shift to the end of that shortfall, the end being a
/// converged sample from which it stays converged for `refresh` seconds (or to the end of the
/// run); 0 if it caused none. A shortfall is caused by the last shift before it began if it
/// began within `horizon` seconds of it (the longest a consequence can wait to show: a lease
/// outliving its server), else by the first shift that comes while it lasts; each shortfall is
/// charged once, and a shift answers for the first it caused — a later one it caused is
/// charged to no shift.
fn reconvergence(
    samples: &[Sample],
    mut shifts: Vec<(Time, Cause, String)>,
    learning_end: Time,
    refresh: Time,
    horizon: Time,
) -> Vec<Shift> {
    shifts.sort_by(|a, b| a.0.total_cmp(&b.0));
    shifts.dedup_by(|later, earlier| {
        let same = later.0 == earlier.0;
        if same {
            earlier.1 = earlier.1.max(later.1);
            earlier.2 = format!("{}; {}", earlier.2, later.2);
        }
        same
    });
    shifts.retain(|(at, ..)| *at >= learning_end && samples.last().is_some_and(|s| *at <= s.t));
    let owners = shortfalls(samples, refresh).into_iter().filter_map(|(began, settled)| {
        let last = shifts.partition_point(|(at, ..)| *at <= began);
        let cause = last.checked_sub(1).filter(|&i| began < shifts[i].0 + horizon);
        let during = || Some(last).filter(|&i| i < shifts.len() && settled.is_none_or(|end| shifts[i].0 < end));
        Some((cause.or_else(during)?, settled))
    });
    let mut caused: Vec<Option<Option<Time>>> = vec![None; shifts.len()];
    for (owner, settled) in owners {
        caused[owner].get_or_insert(settled);
    }
    shifts
        .into_iter()
        .zip(caused)
        .map(|((at, cause, what), caused)| {
            let reconverged_after = match caused {
                None => Some(0.0),
                Some(settled) => settled.map(|end| end - at),
            };
            Shift { at, cause, what, reconverged_after }
        })
        .collect()
}

/// Every shortfall: when it began, and when the system was converged again for `refresh`
/// seconds (`None`: not within the run).
fn shortfalls(samples: &[Sample], refresh: Time) -> Vec<(Time, Option<Time>)> {
    // Where the converged run through each sample ends (−∞ if it is not converged).
    let mut run_end = vec![f64::NEG_INFINITY; samples.len()];
    for i in (0..samples.len()).rev() {
        if samples[i].converged() {
            run_end[i] = run_end.get(i + 1).copied().filter(|end| end.is_finite()).unwrap_or(samples[i].t);
        }
    }
    let end = samples.last().map_or(0.0, |s| s.t);
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(began) = (from..samples.len()).find(|&i| !samples[i].converged()) {
        let settled = (began + 1..samples.len()).find(|&i| run_end[i] >= samples[i].t + refresh || run_end[i] == end);
        found.push((samples[began].t, settled.map(|i| samples[i].t)));
        match settled {
            Some(i) => from = i,
            None => break,
        }
    }
    found
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, sum) = values.fold((0usize, 0.0), |(n, sum), v| (n + 1, sum + v));
    (n > 0).then(|| sum / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: Time, wants: f64, has: f64, granted: f64) -> Sample {
        Sample {
            t,
            capacity: 100.0,
            wants,
            demand: wants,
            has,
            granted,
            unleased: 0,
            reserved: granted,
            admitted: 0.0,
            jain: Some(1.0),
            flat_jain: Some(1.0),
            tree_jain: Some(1.0),
        }
    }

    #[test]
    fn summary_of_a_short_history() {
        let samples = [
            sample(0.0, 200.0, 0.0, 0.0),
            sample(1.0, 200.0, 100.0, 100.0),
            sample(2.0, 200.0, 90.0, 103.0),
            sample(3.0, 200.0, 95.0, 90.0),
            sample(4.0, 80.0, 80.0, 101.0),
            sample(5.0, 80.0, 80.0, 80.0),
            sample(6.0, 80.0, 81.0, 80.0),
        ];
        let shifts = vec![
            (2.0, Cause::Demand, "drop".into()),
            (0.5, Cause::Demand, "during learning".into()),
            (2.0, Cause::Failure, "same time".into()),
        ];
        let summary = Summary::compute(&samples, shifts, 1.0, 2.0, 60.0, 12, 6);
        // has / min(capacity, wants) over t ≥ 1: 1, 0.9, 0.95, 1, 1, 1.0125.
        assert!((summary.utilization - 5.8625 / 6.0).abs() < 1e-12);
        assert_eq!(summary.overshoot_events, 2);
        assert!((summary.granted_peak - 1.03).abs() < 1e-12);
        assert!((summary.overshoot_mean.unwrap() - 1.02).abs() < 1e-12);
        assert_eq!(summary.has_peak, 1.0);
        let merged =
            Shift { at: 2.0, cause: Cause::Failure, what: "drop; same time".into(), reconverged_after: Some(2.0) };
        assert_eq!(summary.shifts, [merged]);
        assert_eq!((summary.reconvergence_max(Cause::Failure), summary.unsettled()), (Some(2.0), 0));
        assert_eq!(summary.reconvergence_max(Cause::Demand), None);
        assert_eq!((summary.rpcs_per_second, summary.root_rpcs_per_second), (2.0, 1.0));
        assert!((summary.reserved_peak - 1.03).abs() < 1e-12);
    }

    #[test]
    fn fairness_is_judged_on_steady_samples_only() {
        let mut samples: Vec<Sample> = (0..4).map(|t| sample(t as f64, 200.0, 100.0, 100.0)).collect();
        samples[1].jain = Some(0.5);
        // A client on its fallback: the sum is fine, the split is the outage's.
        samples[2].unleased = 1;
        samples[2].jain = Some(0.7);
        // Short of the target.
        samples[3].has = 90.0;
        samples[3].jain = Some(0.9);
        let summary = Summary::compute(&samples, Vec::new(), 0.0, 2.0, 60.0, 0, 0);
        assert_eq!(summary.jain, Some(0.75));
    }

    #[test]
    fn fairness_is_judged_against_the_split_the_tree_defines() {
        // Root → two leaves (fairness.rs's example): leaf 1's clients want 5 and 35, leaf 2's
        // 30 and 30, of a capacity of 80. A tree that passes up sums gives leaf 1's big client
        // 35; the max-min split over all four gives it 25.
        let parents = [None, Some(0), Some(0)];
        let clients: Vec<ClientState> = [(1, 5.0, 5.0), (1, 35.0, 35.0), (2, 30.0, 20.0), (2, 30.0, 20.0)]
            .into_iter()
            .map(|(server, wants, has)| ClientState { server, demand: wants / HEADROOM, has })
            .collect();
        let (exact, flat, tree) = jain(80.0, Some(&parents), &clients);
        assert!((exact.unwrap() - 1.0).abs() < 1e-12, "{exact:?}");
        assert!(flat.unwrap() < 0.98 && flat == tree, "{flat:?} {tree:?}");
        // Passing up profiles, the max-min split is the tree's own.
        assert_eq!(jain(80.0, None, &clients), (flat, flat, None));
    }

    #[test]
    fn a_shortfall_belongs_to_the_last_shift_before_it() {
        let has = [100.0, 100.0, 100.0, 70.0, 80.0, 100.0, 100.0, 100.0, 60.0, 100.0, 100.0, 100.0];
        let samples: Vec<Sample> = has.iter().enumerate().map(|(t, &h)| sample(t as f64, 200.0, h, h)).collect();
        let shifts = vec![
            (0.5, Cause::Demand, "calm".into()),
            (2.5, Cause::Failure, "cut".into()),
            (3.5, Cause::Demand, "spike".into()),
        ];
        let summary = Summary::compute(&samples, shifts, 0.0, 2.0, 60.0, 0, 0);
        let after: Vec<Option<Time>> = summary.shifts.iter().map(|shift| shift.reconverged_after).collect();
        // The dip from 3 s follows the cut at 2.5 s, which is charged until 5 s (converged and
        // staying so for 2 s). The spike comes during that dip: it answers for the next one, at
        // 8 s, settled at 9 s.
        assert_eq!(after, [Some(0.0), Some(2.5), Some(5.5)]);
        assert_eq!(
            (summary.reconvergence_max(Cause::Demand), summary.reconvergence_max(Cause::Failure)),
            (Some(5.5), Some(2.5))
        );
    }

    #[test]
    fn a_shortfall_no_shift_caused_is_charged_to_a_shift_that_comes_while_it_lasts() {
        let has = [100.0, 100.0, 100.0, 100.0, 70.0, 70.0, 100.0, 100.0, 100.0];
        let samples: Vec<Sample> = has.iter().enumerate().map(|(t, &h)| sample(t as f64, 200.0, h, h)).collect();
        let shifts = vec![(0.5, Cause::Demand, "early".into()), (4.5, Cause::Failure, "during".into())];
        // A horizon of 1.5 s: the dip at 4 s is too late to be the early shift's.
        let summary = Summary::compute(&samples, shifts, 0.0, 2.0, 1.5, 0, 0);
        let after: Vec<Option<Time>> = summary.shifts.iter().map(|shift| shift.reconverged_after).collect();
        assert_eq!(after, [Some(0.0), Some(1.5)]);
    }
}
