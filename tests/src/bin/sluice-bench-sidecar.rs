//! `sluice-bench-sidecar`: see `sluice_tests::bench_sidecar`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use sluice_tests::bench_sidecar::{self, Args};

fn main() -> ExitCode {
    let args = Args::try_parse().unwrap_or_else(|e| {
        if e.use_stderr() {
            eprintln!(
                "sluice-bench-sidecar: {}",
                e.to_string().lines().next().unwrap_or_default().trim_start_matches("error: ")
            );
            std::process::exit(64);
        }
        e.exit()
    });
    match bench_sidecar::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice-bench-sidecar: {e}");
            ExitCode::FAILURE
        }
    }
}
