//! `sluice-connections`: see `sluice_tests::connections`.
#![forbid(unsafe_code)]

use sluice_tests::{cli, connections};

fn main() -> std::process::ExitCode {
    cli::main("sluice-connections", |args| cli::block_on(connections::run(args)))
}
