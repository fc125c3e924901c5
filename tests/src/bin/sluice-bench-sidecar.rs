//! `sluice-bench-sidecar`: see `sluice_tests::bench_sidecar`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    sluice_tests::cli::main("sluice-bench-sidecar", sluice_tests::bench_sidecar::run)
}
