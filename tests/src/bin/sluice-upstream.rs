//! `sluice-upstream`: see `sluice_tests::upstream`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use sluice_tests::upstream::{self, Args};

fn main() -> ExitCode {
    let args = Args::try_parse().unwrap_or_else(|e| {
        if e.use_stderr() {
            eprintln!(
                "sluice-upstream: {}",
                e.to_string().lines().next().unwrap_or_default().trim_start_matches("error: ")
            );
            std::process::exit(64);
        }
        e.exit()
    });
    match upstream::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice-upstream: {e}");
            ExitCode::FAILURE
        }
    }
}
