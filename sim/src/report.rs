//! What a run leaves behind: the table on stdout, and under the results folder a summary CSV
//! and per scenario its time series, its shifts and a plot. Nothing here depends on the wall
//! clock, so the same seed writes the same bytes.

use std::{fmt::Write as _, fs, io, path::Path};

use crate::{
    adaptive::{self, phases},
    metrics::{Cause, Summary},
    service::Record,
    sim::Outcome,
    svg,
};

const COLUMNS: [&str; 18] = [
    "scenario",
    "clients",
    "sim s",
    "util %",
    "over n",
    "peak grant %",
    "mean over %",
    "peak has %",
    "peak resv %",
    "demand reconv max s",
    "÷ refresh",
    "failure reconv max s",
    "÷ refresh",
    "reconv mean s",
    "unsettled",
    "Jain",
    "flat Jain",
    "tree Jain",
];
const RPC_COLUMNS: [&str; 2] = ["RPC/s", "root RPC/s"];

fn percent(fraction: f64) -> String {
    format!("{:.2}", fraction * 100.0)
}

fn optional(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

fn row(outcome: &Outcome) -> Vec<String> {
    let s: &Summary = &outcome.summary;
    vec![
        outcome.name.clone(),
        outcome.clients.to_string(),
        format!("{:.0}", s.duration),
        percent(s.utilization),
        s.overshoot_events.to_string(),
        percent(s.granted_peak),
        optional(s.overshoot_mean.map(|m| m * 100.0), 2),
        percent(s.has_peak),
        percent(s.reserved_peak),
        optional(s.reconvergence_max(Cause::Demand), 1),
        optional(s.reconvergence_max(Cause::Demand).map(|max| max / s.refresh), 2),
        optional(s.reconvergence_max(Cause::Failure), 1),
        optional(s.reconvergence_max(Cause::Failure).map(|max| max / s.refresh), 2),
        optional(s.reconvergence_mean(), 1),
        format!("{}/{}", s.unsettled(), s.shifts.len()),
        optional(s.jain, 4),
        optional(s.flat_jain, 4),
        optional(s.tree_jain, 4),
        format!("{:.2}", s.rpcs_per_second),
        format!("{:.2}", s.root_rpcs_per_second),
    ]
}

/// A fixed-width table, one row per scenario.
pub fn table(outcomes: &[Outcome]) -> String {
    let header: Vec<String> = COLUMNS.iter().chain(&RPC_COLUMNS).map(|c| c.to_string()).collect();
    let rows: Vec<Vec<String>> = std::iter::once(header).chain(outcomes.iter().map(row)).collect();
    let widths: Vec<usize> =
        (0..rows[0].len()).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for (n, r) in rows.iter().enumerate() {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, &w))| if i == 0 { format!("{cell:<w$}") } else { format!("{cell:>w$}") })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
        if n == 0 {
            out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
            out.push('\n');
        }
    }
    out
}

pub fn summary_csv(outcomes: &[Outcome]) -> String {
    let mut out = String::from(
        "scenario,clients,duration_s,utilization,overshoot_events,granted_peak,overshoot_mean,has_peak,\
         reserved_peak,demand_reconvergence_max_s,demand_reconvergence_max_refreshes,failure_reconvergence_max_s,\
         failure_reconvergence_max_refreshes,reconvergence_mean_s,shifts,unsettled,jain,\
         flat_jain,tree_jain,rpcs_per_s,root_rpcs_per_s\n",
    );
    for outcome in outcomes {
        let s = &outcome.summary;
        let blank = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.6}"));
        let _ = writeln!(
            out,
            "{},{},{:.0},{:.6},{},{:.6},{},{:.6},{:.6},{},{},{},{},{},{},{},{},{},{},{:.4},{:.4}",
            outcome.name,
            outcome.clients,
            s.duration,
            s.utilization,
            s.overshoot_events,
            s.granted_peak,
            blank(s.overshoot_mean),
            s.has_peak,
            s.reserved_peak,
            blank(s.reconvergence_max(Cause::Demand)),
            blank(s.reconvergence_max(Cause::Demand).map(|max| max / s.refresh)),
            blank(s.reconvergence_max(Cause::Failure)),
            blank(s.reconvergence_max(Cause::Failure).map(|max| max / s.refresh)),
            blank(s.reconvergence_mean()),
            s.shifts.len(),
            s.unsettled(),
            blank(s.jain),
            blank(s.flat_jain),
            blank(s.tree_jain),
            s.rpcs_per_second,
            s.root_rpcs_per_second,
        );
    }
    out
}

/// Every sample: the sums over clients and servers at that instant.
pub fn series_csv(outcome: &Outcome) -> String {
    let mut out =
        String::from("t,capacity,wants,demand,has,granted,unleased,reserved,admitted,jain,flat_jain,tree_jain\n");
    for s in &outcome.samples {
        let [jain, flat_jain, tree_jain] =
            [s.jain, s.flat_jain, s.tree_jain].map(|j| j.map_or_else(String::new, |j| format!("{j:.6}")));
        let _ = writeln!(
            out,
            "{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{},{:.3},{:.3},{jain},{flat_jain},{tree_jain}",
            s.t, s.capacity, s.wants, s.demand, s.has, s.granted, s.unleased, s.reserved, s.admitted
        );
    }
    out
}

/// Every shift after the first learning mode and how long the system took to reconverge.
pub fn shifts_csv(outcome: &Outcome) -> String {
    let mut out = String::from("at,cause,what,reconverged_after_s\n");
    for shift in &outcome.summary.shifts {
        let after = shift.reconverged_after.map_or_else(String::new, |t| format!("{t:.3}"));
        let cause = match shift.cause {
            Cause::Demand => "demand",
            Cause::Failure => "failure",
        };
        let _ = writeln!(out, "{:.3},{cause},\"{}\",{after}", shift.at, shift.what.replace('"', "'"));
    }
    out
}

/// Second by second of a run with a service: its capacity, the capacity learned (at the start
/// of the second), and what the calls sent in that second met.
pub fn service_csv(outcome: &Outcome, record: &Record) -> String {
    let mut out = String::from("t,service_capacity,learned_capacity,admitted,ok,shed,p99_ms\n");
    let phases = phases(record);
    for (t, second) in record.seconds.iter().enumerate() {
        let capacity = phases.iter().find(|p| (p.start..p.end).contains(&t)).map_or(0.0, |p| p.capacity);
        let learned = learned(outcome, t as f64);
        let p99 = adaptive::quantile(second.latencies.clone(), 0.99) * 1000.0;
        let admitted: u64 = second.admitted.iter().sum();
        let _ = writeln!(out, "{t},{capacity:.3},{learned:.3},{admitted},{},{},{p99:.3}", second.ok, second.shed);
    }
    out
}

/// The capacity of the last sample at or before `t`.
pub fn learned(outcome: &Outcome, t: f64) -> f64 {
    let n = outcome.samples.partition_point(|s| s.t <= t);
    n.checked_sub(1).map_or(0.0, |i| outcome.samples[i].capacity)
}

/// Writes `summary.csv`, `table.txt` and per scenario `series.csv`, `shifts.csv`, `plot.svg`,
/// and for a run with a service `service.csv`.
pub fn write(outcomes: &[Outcome], dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    fs::write(dir.join("summary.csv"), summary_csv(outcomes))?;
    fs::write(dir.join("table.txt"), table(outcomes))?;
    for outcome in outcomes {
        let folder = dir.join(&outcome.name);
        fs::create_dir_all(&folder)?;
        fs::write(folder.join("series.csv"), series_csv(outcome))?;
        fs::write(folder.join("shifts.csv"), shifts_csv(outcome))?;
        fs::write(folder.join("plot.svg"), svg::plot(outcome))?;
        if let Some(record) = &outcome.record {
            fs::write(folder.join("service.csv"), service_csv(outcome, record))?;
        }
    }
    Ok(())
}
