//! `sluice-loadgen`'s latency figures hold together against a slow server: a real sluice-server
//! behind a proxy that delays every chunk each way.

use std::time::Duration;

use clap::Parser;
use sluice_tests::{
    config::{Algorithm, ServerConfig, Template},
    faults::{Fault, FaultProxy},
    harness::Server,
    loadgen::{self, Args},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_agrees_with_littles_law_against_a_slow_server() {
    let config = ServerConfig::new().template(Template::catch_all(1000.0, Algorithm::fair_share(600, 60).learning(0)));
    let server = Server::launch().config(&config).start();
    let proxy = FaultProxy::start(server.grpc);
    // Each way: a round trip takes at least 40 ms, far above anything the accounting could
    // mistake for it (it once recorded every call slower than 2 ms as 2 µs).
    let delay = Duration::from_millis(20);
    proxy.set(Fault::Delay(delay));
    let callers = 8;
    let args = Args::parse_from([
        "sluice-loadgen",
        "--addr",
        &proxy.addr().to_string(),
        "--callers",
        &callers.to_string(),
        "--connections",
        "2",
        "--duration",
        "3s",
    ]);
    let (m, _) = loadgen::measure_size(&args, 50).await.unwrap();
    assert_eq!(m.errors, 0);
    let p50 = Duration::from_micros(m.latency_us.value_at_quantile(0.5));
    let mean = Duration::from_secs_f64(m.latency_us.mean() / 1e6);
    let little = m.little_latency(callers);
    let report = format!("{} calls in {:?}: p50 {p50:?}, mean {mean:?}, Little {little:?}", m.rpcs, m.elapsed);
    assert!(p50 >= 2 * delay && p50 < 10 * delay, "{report}");
    // Closed-loop callers that are never idle: callers ÷ throughput is the mean latency, less
    // the moments between one call's end and the next one's start.
    let ratio = mean.as_secs_f64() / little.as_secs_f64();
    assert!((0.8..=1.05).contains(&ratio), "mean ÷ Little = {ratio:.2}; {report}");
    assert!((0.7..=1.3).contains(&(p50.as_secs_f64() / little.as_secs_f64())), "{report}");
}
