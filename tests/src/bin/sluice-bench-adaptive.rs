//! `sluice-bench-adaptive`: see `sluice_tests::bench_adaptive`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    sluice_tests::cli::main("sluice-bench-adaptive", sluice_tests::bench_adaptive::run)
}
