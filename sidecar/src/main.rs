//! `sluice-sidecar`: parses flags, starts the runtime and runs the sidecar, or one of its
//! subcommands (`inject`, `webhook`, `check`).
#![forbid(unsafe_code)]

use std::{io::Read, process::ExitCode};

use sluice_runtime::{errln, outln, process};
use sluice_sidecar::{
    cli::{self, Command},
    control::app,
    kube::{inject, webhook},
};

fn main() -> ExitCode {
    let cli: cli::Cli = match sluice_runtime::cli::parse("sluice-sidecar") {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match cli.command {
        None => sidecar(cli.sidecar),
        Some(Command::Inject(args)) => run_inject(args),
        Some(Command::Check(check)) => process::check(&check.config, app::check),
        Some(Command::Webhook(args)) => {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => return fail(&format!("cannot start the runtime: {e}"), 1),
            };
            match runtime.block_on(webhook::run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(failure) => fail(&failure.to_string(), failure.exit_code()),
            }
        }
    }
}

/// `inject`: the file (or standard input) with the sidecar in every pod template, on standard
/// output, and a line per object on standard error; a file that cannot be read or injected exits
/// 1, a pod that already uses what the sidecar adds 64, naming what is wrong.
fn run_inject(args: cli::Inject) -> ExitCode {
    let mut text = String::new();
    let read = if args.file.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(&args.file).map(|t| text = t)
    };
    let name = args.file.display();
    if let Err(e) = read {
        return fail(&format!("inject: {name}: {e}"), 1);
    }
    match inject::documents(&text, &args.settings, &args.config_map) {
        // A reader that went away has taken what it wanted.
        Ok((out, report)) => {
            let _ = outln!("{}", out.trim_end());
            for line in report {
                let _ = errln!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&format!("inject: {name}: {e}"), if e.clash { 64 } else { 1 }),
    }
}

fn fail(message: &str, code: u8) -> ExitCode {
    let _ = errln!("sluice-sidecar: {message}");
    ExitCode::from(code)
}

fn sidecar(args: cli::Args) -> ExitCode {
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
        Err(e) => return fail(&format!("cannot start the runtime: {e}"), 1),
    };
    match runtime.block_on(app::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => fail(&failure.to_string(), failure.exit_code()),
    }
}
