//! `sluice-server`: parses flags, starts the runtime and runs the server.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use sluice_runtime::{cli, errln};
use sluice_server::{app, cli::Args};

fn main() -> ExitCode {
    let args: Args = match cli::parse("sluice-server") {
        Ok(args) => args,
        Err(code) => return code,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = errln!("sluice-server: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(app::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            let _ = errln!("sluice-server: {failure}");
            ExitCode::from(failure.exit_code())
        }
    }
}
