//! What the tool binaries share: their flags parsed as the product's binaries parse theirs
//! (`sluice_runtime::cli::parse`: a bad flag prints one line and exits with 64), and any other
//! failure printed with the tool's name, exit code 1.

use std::process::ExitCode;

use clap::Parser;
use sluice_runtime::errln;

pub fn main<A: Parser>(name: &str, run: impl FnOnce(A) -> Result<(), String>) -> ExitCode {
    let args = match sluice_runtime::cli::parse(name) {
        Ok(args) => args,
        Err(code) => return code,
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = errln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A multi-threaded runtime for the tools that run async code.
pub fn block_on<F: Future<Output = Result<(), String>>>(run: F) -> Result<(), String> {
    tokio::runtime::Runtime::new().map_err(|e| format!("cannot start the runtime: {e}"))?.block_on(run)
}
