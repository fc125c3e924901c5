//! `sluice-sidecar`: parses flags, starts the runtime and runs the sidecar.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use sluice_runtime::errln;
use sluice_sidecar::{app, cli};

fn main() -> ExitCode {
    let args: cli::Args = match sluice_runtime::cli::parse("sluice-sidecar") {
        Ok(args) => args,
        Err(code) => return code,
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
            let _ = errln!("sluice-sidecar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(app::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            let _ = errln!("sluice-sidecar: {failure}");
            ExitCode::from(failure.exit_code())
        }
    }
}
