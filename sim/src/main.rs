//! `sluice-sim SCENARIO.yaml...`: runs each scenario (or each with several seeds), prints the
//! table, and for a scenario with a service its figures, and writes the results.

use std::{path::PathBuf, process::ExitCode, time::Instant};

use clap::Parser;
use sluice_runtime::{errln, outln};
use sluice_sim::{Scenario, adaptive, report, run};

#[derive(Parser)]
#[command(about = "Runs Sluice's simulation scenarios on a simulated clock")]
struct Cli {
    /// Where the CSV files and plots go.
    #[arg(long, default_value = "sim-results")]
    out: PathBuf,
    /// Simulated seconds per scenario, instead of each file's duration.
    #[arg(long)]
    duration: Option<f64>,
    /// Runs each scenario with seeds 1 to N instead of its own, each run under its name with
    /// `-seed-N`; a scenario with a service reports its figures' mean and worst over them.
    #[arg(long)]
    seeds: Option<u64>,
    /// Scenario files.
    #[arg(required = true)]
    scenarios: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let cli: Cli = match sluice_runtime::cli::parse("sluice-sim") {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let mut outcomes = Vec::new();
    let mut sweeps = Vec::new();
    let mut failed = false;
    for path in &cli.scenarios {
        let scenario = match Scenario::load(path) {
            Ok(scenario) => Scenario { duration: cli.duration.unwrap_or(scenario.duration), ..scenario },
            Err(error) => {
                let _ = errln!("{error}");
                failed = true;
                continue;
            }
        };
        let runs: Vec<Scenario> = match cli.seeds {
            None => vec![scenario.clone()],
            Some(n) => (1..=n)
                .map(|seed| Scenario { seed, name: format!("{}-seed-{seed}", scenario.name), ..scenario.clone() })
                .collect(),
        };
        let mut figures = Vec::new();
        for run_of in runs {
            let started = Instant::now();
            match run(&run_of) {
                Ok(outcome) => {
                    let wall = started.elapsed().as_secs_f64();
                    let simulated = outcome.summary.duration;
                    let _ = errln!(
                        "{}: {simulated:.0} simulated s in {wall:.2} wall s ({:.0} simulated s per wall s)",
                        outcome.name,
                        simulated / wall
                    );
                    figures.extend(outcome.record.as_ref().map(adaptive::figures));
                    outcomes.push(outcome);
                }
                Err(error) => {
                    let _ = errln!("{}: {error}", path.display());
                    failed = true;
                }
            }
        }
        if cli.seeds.is_some() && !figures.is_empty() {
            sweeps.push(format!("{} scenario={}", adaptive::sweep(&figures), scenario.name));
        }
    }
    let _ = sluice_runtime::cli::out(format_args!("{}", report::table(&outcomes)));
    for outcome in &outcomes {
        if let Some(record) = &outcome.record {
            let _ = outln!("{} scenario={}", adaptive::line(&adaptive::figures(record)), outcome.name);
        }
    }
    for sweep in &sweeps {
        let _ = outln!("{sweep}");
    }
    if let Err(error) = report::write(&outcomes, &cli.out) {
        let _ = errln!("{}: {error}", cli.out.display());
        return ExitCode::FAILURE;
    }
    let _ = outln!("results in {}", cli.out.display());
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
