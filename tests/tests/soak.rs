//! A short `sluice-soak`: the tree, the sidecars and the upstream come up, every sample has
//! sane figures for every process, the CSV holds them all, and the growth rule is applied.

use clap::Parser;
use sluice_tests::soak::{self, Args};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_reports_every_process_and_judges_growth() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("samples.csv");
    let args = Args::parse_from([
        "sluice-soak",
        "--duration",
        "16s",
        "--interval",
        "2s",
        "--warm-up",
        "6s",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    let soak = soak::soak(&args).await.unwrap();
    let names = ["root", "leaf", "upstream", "sidecar-1", "sidecar-2", "sidecar-3"];
    assert_eq!(soak.names, names);
    assert!((7..=9).contains(&soak.samples.len()), "a sample every 2 s for 16 s: {}", soak.samples.len());
    for sample in &soak.samples {
        for (usage, name) in sample.usage.iter().zip(names) {
            assert!(usage.rss_bytes > 1 << 20 && usage.rss_bytes < 1 << 30, "{name}: {usage:?}");
            assert!(usage.fds >= 3 && usage.fds < 1000, "{name}: {usage:?}");
        }
        assert!(sample.traffic[..3].iter().all(Option::is_none));
        for t in sample.traffic[3..].iter().map(|t| t.expect("sidecars have traffic")) {
            // 50 requests a second through each, some of them rejected: 120/s are shared.
            let answered = t.admitted + t.rejected;
            assert!((60..=140).contains(&answered), "{:?}: {t:?}", sample.at);
            assert!(t.admitted > 0 && t.p50_ms > 0.0 && t.p50_ms <= t.p99_ms && t.p99_ms < 1000.0, "{t:?}");
        }
    }
    // The rule ran over every process, on the steady samples only.
    assert_eq!(soak.growth.len(), names.len());
    let rows = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(rows.lines().count(), 1 + soak.samples.len() * names.len(), "{rows}");
    assert!(rows.starts_with("t_s,process,rss_bytes,fds,"), "{rows}");
    assert!(soak.offered > 0);
    assert!(soak.failures().is_empty(), "{:?}", soak.failures());
}
