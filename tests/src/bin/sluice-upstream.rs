//! `sluice-upstream`: see `sluice_tests::upstream`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    sluice_tests::cli::main("sluice-upstream", sluice_tests::upstream::run)
}
