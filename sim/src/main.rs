//! `sluice-sim SCENARIO.yaml...`: runs each scenario, prints the table and writes the results.

use std::{path::PathBuf, process::ExitCode, time::Instant};

use clap::Parser;
use sluice_runtime::{errln, outln};
use sluice_sim::{Scenario, report, run};

#[derive(Parser)]
#[command(about = "Runs Sluice's simulation scenarios on a simulated clock")]
struct Cli {
    /// Where the CSV files and plots go.
    #[arg(long, default_value = "sim-results")]
    out: PathBuf,
    /// Simulated seconds per scenario, instead of each file's duration.
    #[arg(long)]
    duration: Option<f64>,
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
    let mut failed = false;
    for path in &cli.scenarios {
        let started = Instant::now();
        let result = Scenario::load(path).and_then(|mut scenario| {
            scenario.duration = cli.duration.unwrap_or(scenario.duration);
            run(&scenario)
        });
        match result {
            Ok(outcome) => {
                let wall = started.elapsed().as_secs_f64();
                let simulated = outcome.summary.duration;
                let _ = errln!(
                    "{}: {simulated:.0} simulated s in {wall:.2} wall s ({:.0} simulated s per wall s)",
                    outcome.name,
                    simulated / wall
                );
                outcomes.push(outcome);
            }
            Err(error) => {
                let _ = errln!("{}: {error}", path.display());
                failed = true;
            }
        }
    }
    let _ = sluice_runtime::cli::out(format_args!("{}", report::table(&outcomes)));
    if let Err(error) = report::write(&outcomes, &cli.out) {
        let _ = errln!("{}: {error}", cli.out.display());
        return ExitCode::FAILURE;
    }
    let _ = outln!("results in {}", cli.out.display());
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
