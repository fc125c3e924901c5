//! Adaptive capacity end to end (docs/server.md, Adaptive capacity), with the real server, two
//! sidecars and `sluice-upstream`'s capacity model changed while it runs:
//! - the capacity learned falls below the load once the service cannot take it, and rises to
//!   the load again once the service gets its workers back;
//! - the sidecars' signals reach the controller (its decisions show goodput and latency);
//! - a Doorman client, which sends no signals, still gets its grants.
//!
//! Only directions and generous bounds are asserted: how well and how fast is the benchmark's
//! (`make bench-adaptive`).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use sluice_proto::{GetCapacityRequest, ResourceRequest};
use sluice_tests::{
    config::{Algorithm, Listener, OnLimit, Resource, Rule, ServerConfig, SidecarConfig, Template, Upstream},
    harness::{Server, Sidecar, binary, status_json},
    http::{http1, offer, send},
    upstream::UpstreamProcess,
    wait::{eventually, lazily},
};

/// 4 workers × 20 ms: 200 calls a second; 10 workers: 500.
const SERVICE_TIME: &str = "20ms";
/// Each of the two sidecars is offered 150 calls a second: 300 in all.
const OFFERED_PER_SIDECAR: f64 = 150.0;
const MAX: f64 = 2000.0;

fn resource(server: &Server) -> Option<serde_json::Value> {
    let status = status_json(server.admin)?;
    status["resources"].as_array()?.iter().find(|r| r["id"] == "work").cloned()
}

fn capacity(server: &Server) -> f64 {
    resource(server).and_then(|r| r["capacity"].as_f64()).unwrap_or(f64::NAN)
}

fn decisions(server: &Server, reason: &str) -> u64 {
    let decisions = resource(server).map(|r| r["adaptive"]["decisions"].clone()).unwrap_or_default();
    let counts = decisions.as_array().cloned().unwrap_or_default();
    counts.iter().find(|pair| pair[0] == reason).and_then(|pair| pair[1].as_u64()).unwrap_or(0)
}

fn sidecar(server: &Server, upstream: SocketAddr) -> Sidecar {
    let config = SidecarConfig::proxy(Listener::app(), Upstream::app(upstream))
        .leasing_from([server.grpc])
        .resource(Resource::new("work"))
        .rule(Rule::charging("work").on_limit(OnLimit::Reject));
    Sidecar::launch(&config).start()
}

async fn workers(upstream: SocketAddr, n: u32) {
    let request =
        http::Request::put(format!("http://{upstream}/model?workers={n}")).body(Full::<Bytes>::default()).unwrap();
    let answer = send(&http1(), request, Duration::from_secs(10)).await.expect("an answer to PUT /model");
    assert_eq!(answer.status, 200, "{}", answer.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capacity_learned_follows_the_service() {
    let args = ["--workers", "4", "--service-time", SERVICE_TIME, "--queue", "200"];
    let upstream = UpstreamProcess::launch(&binary("sluice-upstream"), &args).unwrap_or_else(|e| panic!("{e}"));
    let algorithm = Algorithm::fair_share(10, 1).learning(0);
    let config = ServerConfig::new()
        .template(Template::adaptive("work", 10.0, MAX, algorithm.clone()))
        .template(Template::catch_all(0.0, algorithm));
    let server = Server::launch().config(&config).start();
    let sidecars: Vec<Sidecar> = (0..2).map(|_| sidecar(&server, upstream.addr())).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = sidecars
        .iter()
        .map(|s| offer(&format!("http://{}/job", s.listen()), OFFERED_PER_SIDECAR, stop.clone()))
        .collect();

    // It starts at its most; the service takes 200 of the 300 a second offered.
    let why = lazily(|| format!("with the service at 200/s: {:?}; log:\n{}", resource(&server), server.logs()));
    eventually(why, async || capacity(&server) < 260.0).await;
    assert!(decisions(&server, "overload") > 0, "cut for an overload");
    let work = resource(&server).unwrap();
    let last = &work["adaptive"]["history"][0];
    assert!(last["goodput"].as_f64().is_some_and(|g| g > 0.0), "the sidecars' signals came: {last}");
    assert!(last["latency"].as_f64().is_some_and(|l| l >= 0.02), "latency of 20 ms or more: {last}");

    // A Doorman client sends no signals and gets its share all the same, once the sidecars,
    // which hold all of it, have refreshed.
    let mut doorman = server.client().await;
    let request = GetCapacityRequest {
        client_id: "doorman".into(),
        resource: vec![ResourceRequest {
            resource_id: "work".into(),
            priority: 0,
            has: None,
            wants: 10.0,
            signals: None,
        }],
    };
    let mut granted = 0.0;
    eventually("a grant for the Doorman client", async || {
        let answer = doorman.get_capacity(request.clone()).await.expect("an answer").into_inner();
        granted = answer.response[0].gets.capacity;
        granted > 0.0
    })
    .await;
    assert!(granted <= capacity(&server), "granted {granted} of {}", capacity(&server));

    // 500 a second again: the capacity grows back to what is offered.
    workers(upstream.addr(), 10).await;
    let why = lazily(|| format!("with the service at 500/s: {:?}; log:\n{}", resource(&server), server.logs()));
    eventually(why, async || capacity(&server) >= 2.0 * OFFERED_PER_SIDECAR).await;
    assert!(decisions(&server, "recover") + decisions(&server, "grow") > 0, "grown back");

    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.expect("the load ends");
    }
}
