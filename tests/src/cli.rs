//! What the tool binaries share with the product's: a bad flag prints one line and exits with
//! code 64 (EX_USAGE); any other failure prints the tool's name and why, and exits with 1.

use std::process::ExitCode;

use clap::{Parser, error::ErrorKind};

pub fn main<A: Parser>(name: &str, run: impl FnOnce(A) -> Result<(), String>) -> ExitCode {
    let args = match A::try_parse() {
        Ok(args) => args,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            print!("{e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let text = e.to_string();
            let paragraph: Vec<&str> = text.lines().map(str::trim).take_while(|l| !l.is_empty()).collect();
            let line = paragraph.join(" ");
            eprintln!("{name}: {}", line.strip_prefix("error: ").unwrap_or(&line));
            return ExitCode::from(64);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A multi-threaded runtime for the tools that run async code.
pub fn block_on<F: Future<Output = Result<(), String>>>(run: F) -> Result<(), String> {
    tokio::runtime::Runtime::new().map_err(|e| format!("cannot start the runtime: {e}"))?.block_on(run)
}
