//! `sluice-demo`: see `sluice_tests::demo`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use sluice_tests::demo::{self, Args};

#[tokio::main]
async fn main() -> ExitCode {
    match demo::run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice-demo: {e}");
            ExitCode::FAILURE
        }
    }
}
