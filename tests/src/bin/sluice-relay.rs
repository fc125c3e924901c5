//! `sluice-relay`: see `sluice_tests::relay`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    sluice_tests::cli::main("sluice-relay", sluice_tests::relay::run)
}
