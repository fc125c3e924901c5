//! `sluice-demo`: see `sluice_tests::demo`.
#![forbid(unsafe_code)]

use sluice_tests::{cli, demo};

fn main() -> std::process::ExitCode {
    cli::main("sluice-demo", |args| cli::block_on(demo::run(args)))
}
