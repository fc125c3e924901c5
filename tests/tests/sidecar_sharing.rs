//! Two sidecars sharing one resource through a capacity server (SPEC §4.3–4.4): under demand of
//! three times the capacity they converge to equal shares within three refresh intervals, admit
//! within 2% of their lease, and together never more than the capacity plus the bursts.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use sluice_tests::{
    harness::{Server, Sidecar, free_port},
    http::{http1, send},
    upstream::UpstreamProcess,
};

const CAPACITY: f64 = 40.0;
/// Longer than the sidecar's demand estimate takes to rise (about a second), so that the
/// second request of each carries the full demand.
const REFRESH_SECONDS: u64 = 2;
/// Each sidecar is offered 1.5 × the capacity: 3 × its fair share of 20/s.
const OFFERED_PER_SIDECAR: f64 = 60.0;

fn admitted(sidecar: &Sidecar) -> f64 {
    sidecar.metric("sluice_sidecar_requests_total{resource=\"shared\",decision=\"allowed\"}").unwrap_or(0.0)
}

fn lease(sidecar: &Sidecar) -> f64 {
    let status: serde_json::Value = serde_json::from_str(&sidecar.get("/debug/status.json").1).unwrap();
    status["resources"][0]["capacity"].as_f64().unwrap_or(f64::INFINITY)
}

/// Offers `rate` requests per second to `listen`, open loop, until `stop`.
fn offer(listen: SocketAddr, rate: f64, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = http1();
        let url = format!("http://{listen}/");
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        while !stop.load(Ordering::Relaxed) {
            ticks.tick().await;
            let client = client.clone();
            let request = http::Request::get(&url).body(Default::default()).expect("a valid request");
            // Requests still out when the sidecars stop get no answer; that is not a failure.
            tokio::spawn(async move { send(&client, request, Duration::from_secs(10)).await });
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_share_fairly_and_stay_within_capacity() {
    let upstream = UpstreamProcess::start(None);
    let server = Server::builder()
        .config(&format!(
            "resources:\n  - identifier_glob: \"*\"\n    capacity: {CAPACITY}\n    \
             algorithm: {{kind: FAIR_SHARE, lease_length: 5, refresh_interval: {REFRESH_SECONDS}, learning_mode_duration: 0}}\n"
        ))
        .start();
    let sidecars: Vec<(Sidecar, SocketAddr)> = (0..2)
        .map(|_| {
            let listen: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let yaml = format!(
                "server:\n  addresses: [\"{}\"]\n\
                 listeners:\n  - name: app\n    address: {listen}\n    upstream: app\n\
                 upstreams:\n  - name: app\n    url: http://{}\n\
                 resources:\n  - id: shared\n\
                 rules:\n  - resource: shared\n    on_limit: reject\n",
                server.grpc,
                upstream.addr()
            );
            (Sidecar::builder().config(&yaml).start_sidecar(), listen)
        })
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = sidecars.iter().map(|(_, listen)| offer(*listen, OFFERED_PER_SIDECAR, stop.clone())).collect();
    let started = Instant::now();

    // Fair shares within three refresh intervals of the load starting. The sidecar whose
    // share the other still holds is asked back at the shortest interval (capacity in
    // transit), so both get there in under two.
    let deadline = Duration::from_secs(3 * REFRESH_SECONDS);
    let converged = |s: &Sidecar| (lease(s) - CAPACITY / 2.0).abs() < 0.5;
    while !sidecars.iter().all(|(s, _)| converged(s)) {
        let leases: Vec<f64> = sidecars.iter().map(|(s, _)| lease(s)).collect();
        assert!(
            started.elapsed() < deadline,
            "leases {leases:?} after {:?}, want {} each",
            started.elapsed(),
            CAPACITY / 2.0
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("fair shares after {:?}", started.elapsed());

    // A 10 s window: each admits within 2% of its lease; together no more than C·10 s + bursts.
    let before: Vec<f64> = sidecars.iter().map(|(s, _)| admitted(s)).collect();
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after: Vec<f64> = sidecars.iter().map(|(s, _)| admitted(s)).collect();
    let seconds = window.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }

    let mut total = 0.0;
    for (i, (sidecar, _)) in sidecars.iter().enumerate() {
        let count = after[i] - before[i];
        total += count;
        let expected = lease(sidecar) * seconds;
        let error = (count - expected).abs() / expected;
        println!(
            "sidecar {i}: admitted {count} in {seconds:.2} s against a lease of {expected:.1} ({:.2}% off)",
            error * 100.0
        );
        assert!(error <= 0.02, "sidecar {i} admitted {count}, lease allows {expected:.1}");
    }
    // Each bucket holds at most 10% of a second of its rate (the default burst).
    let bound = CAPACITY * seconds + 2.0 * (CAPACITY / 2.0 * 0.1).max(2.0);
    println!("together: {total} admitted, bound {bound:.1}");
    assert!(total <= bound, "{total} admitted > {bound:.1}");
}
