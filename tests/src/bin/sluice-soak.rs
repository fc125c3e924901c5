//! `sluice-soak`: see `sluice_tests::soak`.
#![forbid(unsafe_code)]

use sluice_tests::{cli, soak};

fn main() -> std::process::ExitCode {
    cli::main("sluice-soak", |args| cli::block_on(soak::run(args)))
}
