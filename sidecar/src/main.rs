//! `sluice-sidecar`: parses flags, starts the runtime and runs the sidecar, or one of its
//! subcommands (`inject`, `uninject`, `webhook`, `check`).
#![forbid(unsafe_code)]

use std::{io::Read, path::Path, process::ExitCode};

use sluice_runtime::{errln, outln, process};
use sluice_sidecar::{
    cli::{self, Command},
    control::app,
    kube::{hold, inject, webhook},
};

fn main() -> ExitCode {
    let cli: cli::Cli = match sluice_runtime::cli::parse("sluice-sidecar") {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match cli.command {
        None => sidecar(cli.sidecar),
        Some(Command::Inject(args)) => {
            rewrite("inject", &args.file, |text| inject::documents(text, &args.settings, &args.config_map))
        }
        Some(Command::Uninject(args)) => rewrite("uninject", &args.file, inject::uninjected),
        Some(Command::Check(check)) => process::check(&check.config, app::check),
        Some(Command::Wait(args)) => match hold::until_ready(&args) {
            Ok(took) => {
                let _ = outln!("sluice-sidecar: ready after {took:?}");
                ExitCode::SUCCESS
            }
            Err(why) => fail(&why, 1),
        },
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

/// `inject` and `uninject`: the input rewritten on standard output, and a line per object on
/// standard error; input that cannot be read or injected exits 1, a pod that already uses what
/// the sidecar adds 64, naming what is wrong.
fn rewrite(
    command: &str,
    file: &Path,
    each: impl FnOnce(&str) -> Result<(String, Vec<String>), inject::Refusal>,
) -> ExitCode {
    let name = file.display();
    let text = match input(file) {
        Ok(text) => text,
        Err(e) => return fail(&format!("{command}: {name}: {e}"), 1),
    };
    match each(&text) {
        // A reader that went away has taken what it wanted.
        Ok((out, report)) => {
            let _ = outln!("{}", out.trim_end());
            for line in report {
                let _ = errln!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&format!("{command}: {name}: {e}"), if e.clash { 64 } else { 1 }),
    }
}

/// Standard input (`-`), a file, or a directory's `.yaml`, `.yml` and `.json` files in name
/// order as one stream of documents.
fn input(path: &Path) -> std::io::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        return Ok(text);
    }
    if !path.is_dir() {
        return std::fs::read_to_string(path);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path)? {
        let file = entry?.path();
        if file.is_file() && file.extension().is_some_and(|e| e == "yaml" || e == "yml" || e == "json") {
            files.push(file);
        }
    }
    files.sort();
    let mut texts = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
        texts.push(text);
    }
    Ok(texts.join("\n---\n"))
}

fn fail(message: &str, code: u8) -> ExitCode {
    process::exit("sluice-sidecar", message, code)
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
