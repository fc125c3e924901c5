//! `sluice-sidecar`: parses flags, starts the runtime and runs the sidecar.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::error::ErrorKind;
use sluice_server::cli::usage_line;
use sluice_sidecar::{app, cli};

fn main() -> ExitCode {
    let args = match cli::parse() {
        Ok(args) => args,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            print!("{e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("sluice-sidecar: {}", usage_line(&e));
            return ExitCode::from(64);
        }
    };
    // One worker: the current-thread scheduler, whose tasks wake each other without the
    // cross-thread queues and atomics of the work-stealing one.
    let mut builder = if args.worker_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(usize::from(args.worker_threads));
        builder
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sluice-sidecar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(app::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("sluice-sidecar: {failure}");
            ExitCode::from(failure.exit_code())
        }
    }
}
