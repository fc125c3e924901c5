//! `sluice-connections` at a thousand keep-alive connections: every one served and held, the
//! sidecar holding a descriptor for each, and its memory per connection within a generous bound.

use std::time::Duration;

use clap::Parser;
use sluice_tests::connections::{self, Args};

/// Far above what a held HTTP/2 connection should cost (hyper's connection state, its buffers
/// and task); what the full 10,000-connection run measures is in docs/benchmarks.md.
const H2_BOUND: f64 = 64.0 * 1024.0;

/// An idle HTTP/1.1 connection holds no buffers (about 5 KB of RSS here, task state and the
/// socket's share); holding its 8 KiB read and write buffers it took over 12 KB.
const HTTP1_BOUND: f64 = 8.0 * 1024.0;

async fn check(protocol: &str, bound: f64) {
    let args =
        Args::parse_from(["sluice-connections", "--connections", "1000", "--protocol", protocol, "--hold", "1s"]);
    let report = connections::measure(&args).await.unwrap();
    let summary = format!("{protocol}: {report:?}");
    assert_eq!(report.served, 1000, "{summary}");
    assert_eq!(report.open_after_hold, 1000, "{summary}");
    assert!(report.fds_per_connection() >= 1.0, "the sidecar holds every connection: {summary}");
    assert!(
        report.bytes_per_connection() < bound,
        "{:.0} bytes per connection; {summary}",
        report.bytes_per_connection()
    );
    assert!(report.ramp < Duration::from_secs(30), "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_http1_connections_are_held() {
    check("http1", HTTP1_BOUND).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_h2_connections_are_held() {
    check("h2", H2_BOUND).await;
}
