//! `sluice-server`: parses flags, starts the runtime and runs the server, or checks a
//! configuration (`check`).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use sluice_runtime::{cli, errln, process};
use sluice_server::{
    app,
    cli::{Cli, Command},
    config,
};

fn main() -> ExitCode {
    let args = match cli::parse::<Cli>("sluice-server") {
        Ok(Cli { command: Some(Command::Check(check)), .. }) if check.config.starts_with("etcd:") => {
            // What `check` is for, checking a value before it goes into force, is done on the file
            // the value is put into etcd from.
            let why = "check reads files: check the value as a file before putting it into etcd";
            return process::exit("sluice-server", why, 64);
        }
        Ok(Cli { command: Some(Command::Check(check)), .. }) => return process::check(&check.config, config::summary),
        Ok(Cli { server, .. }) => server,
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
        Err(failure) => process::exit("sluice-server", &failure.to_string(), failure.exit_code()),
    }
}
