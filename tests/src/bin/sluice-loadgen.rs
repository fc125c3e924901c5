//! `sluice-loadgen`: see `sluice_tests::loadgen`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use sluice_tests::loadgen::{self, Args};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::try_parse().unwrap_or_else(|e| {
        if e.use_stderr() {
            eprintln!(
                "sluice-loadgen: {}",
                e.to_string().lines().next().unwrap_or_default().trim_start_matches("error: ")
            );
            std::process::exit(64);
        }
        e.exit()
    });
    match loadgen::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice-loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}
