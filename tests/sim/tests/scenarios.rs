//! Short runs of the shipped scenarios: they replay exactly, and they meet the targets.

use std::path::{Path, PathBuf};

use sluice_sim::{Outcome, Scenario, report, run, svg};

fn path(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(file)
}

fn scenario(file: &str, duration: f64) -> Scenario {
    let mut scenario = Scenario::load(&path(file)).unwrap();
    scenario.duration = duration;
    scenario
}

/// Everything a run writes.
fn output(outcome: Outcome) -> Vec<String> {
    let outcomes = [outcome];
    vec![
        report::table(&outcomes),
        report::summary_csv(&outcomes),
        report::series_csv(&outcomes[0]),
        report::shifts_csv(&outcomes[0]),
        svg::plot(&outcomes[0]),
    ]
}

/// What is written, not the samples themselves: those may differ in their last bits (≈ 2e-13
/// here), because each band of a ledger seeds its tree at random, which orders its float sums.
#[test]
fn the_same_seed_writes_the_same_bytes() {
    for (file, duration) in [("2-join-leave.yaml", 1000.0), ("4-failover.yaml", 1300.0)] {
        let mut scenario = scenario(file, duration);
        let first = output(run(&scenario).unwrap());
        assert_eq!(first, output(run(&scenario).unwrap()), "{file}");
        scenario.seed += 1;
        assert_ne!(first[2], output(run(&scenario).unwrap())[2], "{file}: another seed, another run");
    }
}

#[test]
fn steady_clients_get_the_whole_capacity_fairly() {
    let s = run(&scenario("1-steady.yaml", 900.0)).unwrap().summary;
    assert!(s.utilization >= 0.98, "utilization {}", s.utilization);
    assert!(s.granted_peak <= 1.0 + 1e-9, "peak granted {}", s.granted_peak);
    assert!(s.has_peak <= 1.02, "peak held {}", s.has_peak);
    assert!(s.jain.unwrap() >= 0.99, "Jain {:?}", s.jain);
    assert!(s.rpcs_per_second > 0.0);
}

#[test]
fn a_new_master_learns_and_the_capacity_is_handed_out_again() {
    let mut scenario = scenario("4-failover.yaml", 900.0);
    scenario.events.truncate(1);
    scenario.events[0].at = 300.0;
    let outcome = run(&scenario).unwrap();
    let s = &outcome.summary;
    // No master during the election: the ledgers are empty while the clients keep their leases.
    let electing: Vec<_> = outcome.samples.iter().filter(|x| x.t > 300.0 && x.t < 310.0).collect();
    assert!(electing.iter().all(|x| x.granted == 0.0 && x.has > 0.9 * x.capacity));
    assert!(s.utilization >= 0.98, "utilization {}", s.utilization);
    assert!(s.granted_peak <= 1.02 && s.has_peak <= 1.02, "peaks {} {}", s.granted_peak, s.has_peak);
    // Learning mode holds grants for a lease length; after it, at most three refreshes.
    let bound = scenario.repository().unwrap().find(&scenario.resource).algorithm.lease_length as f64 + 3.0 * s.refresh;
    let election = s.shifts.iter().find(|shift| shift.what.contains("elects")).expect("an election");
    assert!(election.reconverged_after.is_some_and(|t| t <= bound), "{election:?}, bound {bound}");
    assert!(s.jain.unwrap() >= 0.99, "Jain {:?}", s.jain);
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
    assert_eq!(s.overshoot_events, 0);
    assert!(s.granted_peak <= 1.0 + 1e-9, "peak granted {}", s.granted_peak);
}

#[test]
fn every_scenario_loads_and_trees_wait_for_phase_two() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(path("")).unwrap().map(|entry| entry.unwrap().path()).collect();
    files.sort();
    assert_eq!(files.len(), 7);
    for file in files {
        let scenario = Scenario::load(&file).unwrap();
        if !scenario.topology.levels.is_empty() {
            let error = run(&scenario).err().unwrap();
            assert!(error.contains("needs the server tree (phase 2)"), "{error}");
        }
    }
}
