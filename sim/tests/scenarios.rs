//! Short runs of the shipped scenarios with their fixed seeds: they replay exactly, and they meet
//! the targets — utilization ≥ 98% after the first learning mode (99% for scenario 5),
//! overshoot ≤ 102%, Jain ≥ 0.99 against the exact fair split, and for the tree reconvergence
//! within three refresh intervals of the leaf level after a shift in demand. Scenario 7 meets
//! all four over the hour, passing up sums (the default) and passing up wants profiles
//! (`7-tree-mishaps-profile.yaml`), where fairness is judged against the max-min split over all
//! clients, which sums cannot reach. Not with every seed (`docs/simulation.md`).

use std::path::{Path, PathBuf};

use sluice_sim::{
    Outcome, Scenario,
    metrics::{Cause, Summary},
    report, run, svg,
};

fn path(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(file)
}

fn scenario(file: &str, duration: f64) -> Scenario {
    let mut scenario = Scenario::load(&path(file)).unwrap();
    scenario.duration = duration;
    scenario
}

/// Everything a run writes.
fn output(outcome: &Outcome) -> Vec<String> {
    let outcomes = std::slice::from_ref(outcome);
    vec![
        report::table(outcomes),
        report::summary_csv(outcomes),
        report::series_csv(outcome),
        report::shifts_csv(outcome),
        svg::plot(outcome),
    ]
}

/// The targets for utilization, overshoot and fairness (against the exact fair split:
/// for a tree that passes up sums, the split its servers' algorithm defines, see `metrics`).
fn assert_targets(name: &str, s: &Summary) {
    assert!(s.utilization >= 0.98, "{name}: utilization {}", s.utilization);
    assert!(s.granted_peak <= 1.02, "{name}: peak granted {}", s.granted_peak);
    assert!(s.jain.unwrap() >= 0.99, "{name}: Jain {:?}", s.jain);
}

/// Every ledger is seeded (`Ledger::with_seed`), so the samples themselves replay bit for bit,
/// and so does everything written from them.
#[test]
fn the_same_seed_replays_exactly() {
    for (file, duration) in [("2-join-leave.yaml", 1000.0), ("4-failover.yaml", 1300.0), ("7-tree-mishaps.yaml", 600.0)]
    {
        let mut scenario = scenario(file, duration);
        let first = run(&scenario).unwrap();
        let again = run(&scenario).unwrap();
        assert!(first.samples == again.samples, "{file}: the samples differ");
        assert_eq!(output(&first), output(&again), "{file}");
        scenario.seed += 1;
        assert_ne!(output(&first)[2], output(&run(&scenario).unwrap())[2], "{file}: another seed, another run");
    }
}

/// Scenario 1, short: five steady clients on a root get the whole capacity, fairly.
#[test]
fn scenario_1_steady_clients_get_the_whole_capacity_fairly() {
    let s = run(&scenario("1-steady.yaml", 900.0)).unwrap().summary;
    assert_targets("1-steady", &s);
    // The root's ledger never holds more than its capacity; clients may, briefly, when an
    // answer that cut a lease is lost and the client keeps its old one until it asks again.
    assert!(s.reserved_peak <= 1.0 + 1e-9, "peak reserved {}", s.reserved_peak);
    assert!(s.has_peak <= 1.02, "peak held {}", s.has_peak);
    assert!(s.rpcs_per_second > 0.0);
}

/// Scenario 4, short: the root's master dies once; the new one learns, and the capacity is
/// handed out again.
#[test]
fn scenario_4_a_new_master_learns_and_the_capacity_is_handed_out_again() {
    let mut scenario = scenario("4-failover.yaml", 900.0);
    scenario.events.truncate(1);
    scenario.events[0].at = 300.0;
    let outcome = run(&scenario).unwrap();
    let s = &outcome.summary;
    // No master during the election: the root's ledger is empty while the clients keep their
    // leases.
    let electing: Vec<_> = outcome.samples.iter().filter(|x| x.t > 300.0 && x.t < 310.0).collect();
    assert!(electing.iter().all(|x| x.reserved == 0.0 && x.granted > 0.9 * x.capacity));
    assert_targets("4-failover", s);
    assert!(s.has_peak <= 1.02 && s.reserved_peak <= 1.0 + 1e-9, "peaks {} {}", s.has_peak, s.reserved_peak);
    // Learning mode holds grants for a lease length; after it, at most three refreshes.
    let bound = scenario.repository().unwrap().find(&scenario.resource).algorithm.lease_length as f64 + 3.0 * s.refresh;
    let election = s.shifts.iter().find(|shift| shift.what.contains("elects")).expect("an election");
    assert!(election.reconverged_after.is_some_and(|t| t <= bound), "{election:?}, bound {bound}");
}

#[test]
fn a_lone_root_never_overshoots_whatever_goes_wrong() {
    let text = std::fs::read_to_string(path("1-steady.yaml")).unwrap();
    let mishaps =
        "mishaps: {every: 60, from: 120, spike: {add: 100, for: 120}, crash: {election: 10}, outage: {for: 90}}";
    let mut scenario = Scenario::parse(&format!("{text}{mishaps}\n")).unwrap();
    scenario.duration = 1200.0;
    let s = run(&scenario).unwrap().summary;
    for kind in ["spikes", "crashes", "loss"] {
        assert!(s.shifts.iter().any(|shift| shift.what.contains(kind)), "no mishap of kind {kind}");
    }
    assert!(s.reserved_peak <= 1.0 + 1e-9, "peak reserved {}", s.reserved_peak);
    assert!(s.granted_peak <= 1.02, "peak granted {}", s.granted_peak);
}

/// Scenario 7, short: the first ten minutes — five mishaps (a leaf crash, a region cut off
/// past its lease, a region crash, a second leaf crash and a second region crash).
fn scenario_7_short() -> Outcome {
    run(&scenario("7-tree-mishaps.yaml", 600.0)).unwrap()
}

/// What the tree guarantees today, mishaps or not.
#[test]
fn scenario_7_the_root_never_hands_out_more_than_its_capacity() {
    let outcome = scenario_7_short();
    let s = &outcome.summary;
    for kind in ["crashes", "elects", "loss"] {
        assert!(s.shifts.iter().any(|shift| shift.what.contains(kind)), "no mishap of kind {kind}");
    }
    assert!(s.reserved_peak <= 1.0 + 1e-9, "peak reserved at the root {}", s.reserved_peak);
    // Every message between servers goes through the real protocol: the regions and leaves
    // ask their parents, so there are more RPCs than the clients alone make.
    assert!(s.rpcs_per_second > 3.0 * s.root_rpcs_per_second);
    // Before the first mishap, nothing is handed out above the capacity — as long as no answer
    // is lost: a client whose answer cutting its lease was lost keeps the old lease until it
    // asks again, while the servers have already counted the cut (this seed, with the
    // scenario's 0.1% message loss: 500.011 of 500 for one second at 159 s).
    let mut lossless = scenario("7-tree-mishaps.yaml", 300.0);
    lossless.network.loss = 0.0;
    let calm = run(&lossless).unwrap().samples;
    assert!(calm.iter().all(|x| x.granted <= x.capacity + 1e-9), "overshoot before the mishaps");
}

/// Scenario 5, the whole hour: the tree without mishaps hands out ≥ 99% of the capacity, and
/// Jain's index against the split its algorithm defines is ≥ 0.99.
#[test]
fn scenario_5_the_tree_hands_out_the_capacity() {
    let s = run(&scenario("5-tree.yaml", 3600.0)).unwrap().summary;
    assert!(s.utilization >= 0.99, "utilization {}", s.utilization);
    // Clients may hold a little more, briefly, when an answer that cut a lease is lost (as in
    // scenario 1); the servers' ledgers never do.
    assert!(s.granted_peak <= 1.02, "peak granted {}", s.granted_peak);
    assert!(s.reserved_peak <= 1.0 + 1e-9, "peak reserved {}", s.reserved_peak);
    assert!(s.jain.unwrap() >= 0.99, "Jain {:?}", s.jain);
}

/// Scenario 7's targets over the whole hour, as they are set, passing up sums: ≥ 98% of the
/// capacity handed out on average (98.74% with this seed), what the clients hold from the
/// servers' ledgers within 102% of the root's capacity through crashes, elections and cut-off
/// subtrees (100.00%), Jain ≥ 0.99 against the split the tree's algorithm defines (0.9907), and
/// every shift in demand reconverged within three refresh intervals of the clients' servers
/// (9 s; 6 s at most), as Doorman's "within 2 minutes after a shift in demand". Failures are
/// reported apart and have no such target: a failover holds a subtree's grants for the new
/// master's learning mode and a cut-off subtree lives on safe capacity until its outage ends.
/// Not every seed does as well (`docs/simulation.md`): over seeds 1–25, utilization with all
/// 25 (98.4–99.1%), Jain with 8 (mean 0.989), reconvergence with 12 (456 of 476 demand shifts);
/// the peak with every seed of 1–50 (100.55% at most). The first minutes alone run lower: they
/// hold a crash and an outage in every three minutes without the calmer stretches that follow.
#[test]
fn scenario_7_meets_every_target() {
    let s = run(&scenario("7-tree-mishaps.yaml", 3600.0)).unwrap().summary;
    assert_targets("7-tree-mishaps", &s);
    let max = s.reconvergence_max(Cause::Demand).unwrap();
    assert!(max <= 3.0 * s.refresh, "reconverged after {max} s, refresh {} s", s.refresh);
    assert_eq!(s.unsettled(), 0);
    // Against the max-min split over all 45 clients, which a server that sees one Σ wants per
    // subtree cannot make: below 0.99, as even that tree's exact split is.
    assert!(s.flat_jain.unwrap() < s.jain.unwrap() && s.tree_jain.unwrap() < 0.99, "{s:?}");
}

/// Scenario 7 where the servers pass up wants profiles, over the hour: utilization ≥ 98% (98.4%
/// with this seed, 97.9–98.8% over seeds 1–25), what the clients hold from the ledgers within
/// 102% of the capacity (99.95%; so with every seed of 1–50), and Jain's index ≥ 0.99 (0.991;
/// mean 0.989 over seeds 1–25) against the max-min split over all clients, which is this tree's
/// exact split.
#[test]
fn scenario_7_with_profiles_meets_utilization_overshoot_and_fairness() {
    let s = run(&scenario("7-tree-mishaps-profile.yaml", 3600.0)).unwrap().summary;
    assert_targets("7-tree-mishaps-profile", &s);
    assert!(s.reserved_peak <= 1.0 + 1e-9, "peak reserved at the root {}", s.reserved_peak);
    assert_eq!(
        (s.tree_jain, s.flat_jain),
        (None, s.jain),
        "the max-min split is the exact split of a tree of profiles"
    );
    // Not the target (below), but where it stands: every demand shift settles, 10 of the 11
    // within three refresh intervals.
    let demand: Vec<_> = s.shifts.iter().filter(|shift| shift.cause == Cause::Demand).collect();
    let within = demand.iter().filter(|x| x.reconverged_after.is_some_and(|t| t <= 3.0 * s.refresh)).count();
    assert_eq!(s.unsettled(), 0);
    assert!(within * 10 >= demand.len() * 8, "{demand:?}");
}

/// The same target passing up profiles: met with this seed since a client's retries back off no
/// longer than its refresh interval (before, a one-second dip 46 s after a spike was charged to
/// it: 47 s). Over seeds 1–25 it is met with 3 (`docs/simulation.md`).
#[test]
fn scenario_7_reconvergence_target_with_profiles() {
    let s = run(&scenario("7-tree-mishaps-profile.yaml", 3600.0)).unwrap().summary;
    let max = s.reconvergence_max(Cause::Demand).unwrap();
    assert!(max <= 3.0 * s.refresh, "reconverged after {max} s, refresh {} s", s.refresh);
}

/// Scenario 5 passing up profiles, the whole hour: the exactly fair tree still hands out ≥ 99%
/// (99.1% with this seed; 98.9–99.2% over seeds 1–25), and Jain ≥ 0.99 (0.992).
#[test]
fn scenario_5_with_profiles_hands_out_the_capacity_fairly() {
    let s = run(&scenario("5-tree-profile.yaml", 3600.0)).unwrap().summary;
    assert!(s.utilization >= 0.99, "utilization {}", s.utilization);
    assert_targets("5-tree-profile", &s);
    assert!(s.reserved_peak <= 1.0 + 1e-9, "peak reserved {}", s.reserved_peak);
}

#[test]
fn every_scenario_loads_and_runs() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(path("")).unwrap().map(|entry| entry.unwrap().path()).collect();
    files.sort();
    assert_eq!(files.len(), 10);
    for file in files {
        let mut scenario = Scenario::load(&file).unwrap();
        // A glimpse of each: just past the first learning mode, when capacity is handed out.
        scenario.duration = 90.0;
        if scenario.client_count() > 1000 {
            scenario.clients[0].count = 1000;
        }
        let outcome = run(&scenario).unwrap();
        assert!(outcome.samples.last().is_some_and(|s| s.granted > 0.0), "{}", file.display());
    }
}
