//! `sluice-loadgen`: see `sluice_tests::loadgen`.
#![forbid(unsafe_code)]

use sluice_tests::{cli, loadgen};

fn main() -> std::process::ExitCode {
    cli::main("sluice-loadgen", |args| cli::block_on(loadgen::run(args)))
}
