//! `sluice-bench-rls`: see `sluice_tests::bench_rls`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    sluice_tests::cli::main("sluice-bench-rls", sluice_tests::bench_rls::run)
}
