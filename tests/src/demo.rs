//! `make demo`: a capacity server, a demo upstream, a sidecar in front of it and a load generator
//! offering three times the capacity, printing every second what was offered, admitted and
//! rejected and the lease in force. Part way through a second sidecar (another pod) joins with
//! the same demand, and the capacity is shared between them. Ctrl-C stops everything.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use clap::Parser;
use sluice_runtime::outln;
use tokio::net::TcpListener;

use crate::{
    config::{Algorithm, Kind, Listener, OnLimit, Resource, Rule, ServerConfig, SidecarConfig, Template, Upstream},
    harness::{Server, ServerLaunch, Sidecar, SidecarLaunch},
    http::{http1, send},
    upstream,
};

/// Runs a capacity server, sidecars, an upstream and load, printing the limit being enforced.
#[derive(Debug, Parser)]
#[command(name = "sluice-demo")]
pub struct Args {
    /// How long to run (default: until Ctrl-C).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// When the second sidecar joins.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    pub join_after: Duration,
    /// Requests per second offered through each sidecar.
    #[arg(long, default_value_t = 300)]
    pub rate: u32,
    /// The directory holding sluice-server and sluice-sidecar (default: next to this program).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
}

const CAPACITY: f64 = 100.0;
const RESOURCE: &str = "demo/api";

/// The capacity server's configuration: `demo/api` shares 100 requests/s fairly.
fn server_config() -> ServerConfig {
    let algorithm = Algorithm::fair_share(5, 1).learning(2);
    ServerConfig::new()
        .template(Template::catch_all(CAPACITY, algorithm).description("the demo upstream's shared capacity"))
}

/// A sidecar in front of `upstream` whose one rule leases `demo/api` from `server` and rejects
/// beyond the lease (also the soak's sidecars).
pub fn sidecar_config(server: SocketAddr, upstream: SocketAddr) -> SidecarConfig {
    SidecarConfig::proxy(Listener::app(), Upstream::new("demo", format!("http://{upstream}")))
        .leasing_from([server])
        .resource(Resource::new(RESOURCE).kind(Kind::Rate))
        .rule(Rule::charging(RESOURCE).name("everything").on_limit(OnLimit::Reject))
}

/// One sidecar with its load and counters.
struct Pod {
    name: &'static str,
    sidecar: Sidecar,
    offered: Arc<AtomicU64>,
    admitted: Arc<AtomicU64>,
    rejected: Arc<AtomicU64>,
    /// The counters at the previous line, and when they were read.
    last: ((u64, u64, u64), Instant),
}

impl Pod {
    fn start(
        name: &'static str,
        server: SocketAddr,
        upstream: SocketAddr,
        rate: u32,
        bin_dir: &Option<PathBuf>,
    ) -> Pod {
        let config = sidecar_config(server, upstream);
        let launch = match bin_dir {
            Some(dir) => SidecarLaunch::of(dir.join("sluice-sidecar"), &config),
            None => Sidecar::launch(&config),
        };
        let sidecar = launch.args(["--log", "warn"]).start();
        let listen = sidecar.listen();
        let pod = Pod {
            name,
            sidecar,
            offered: Arc::default(),
            admitted: Arc::default(),
            rejected: Arc::default(),
            last: ((0, 0, 0), Instant::now()),
        };
        let (offered, admitted, rejected) = (pod.offered.clone(), pod.admitted.clone(), pod.rejected.clone());
        tokio::spawn(async move {
            let client = http1();
            let url = format!("http://{listen}/");
            let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
            loop {
                ticks.tick().await;
                offered.fetch_add(1, Ordering::Relaxed);
                let (client, url, admitted, rejected) =
                    (client.clone(), url.clone(), admitted.clone(), rejected.clone());
                tokio::spawn(async move {
                    let request = http::Request::get(url).body(Default::default()).expect("a valid request");
                    // No answer (the sidecar is stopping) counts as neither.
                    if let Some(answer) = send(&client, request, Duration::from_secs(5)).await {
                        let counter = if answer.status == 429 { rejected } else { admitted };
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        pod
    }

    /// The rates since the previous line and the lease, e.g.
    /// `A: 300 offered  50 admitted 250 rejected, lease  50.0 (leased)`. Counts are divided by
    /// the time actually elapsed: a line printed late (say while another sidecar starts) covers
    /// more than a second, and its raw counts would read as a rate above the limit.
    fn line(&mut self) -> (String, u64) {
        let now = (
            self.offered.load(Ordering::Relaxed),
            self.admitted.load(Ordering::Relaxed),
            self.rejected.load(Ordering::Relaxed),
        );
        let (last, at) = std::mem::replace(&mut self.last, (now, Instant::now()));
        let seconds = at.elapsed().as_secs_f64().max(1e-3);
        let rate = |now: u64, last: u64| ((now - last) as f64 / seconds).round() as u64;
        let (offered, admitted, rejected) = (rate(now.0, last.0), rate(now.1, last.1), rate(now.2, last.2));
        let status: serde_json::Value =
            serde_json::from_str(&self.sidecar.get("/debug/status.json").1).unwrap_or_default();
        let resource = &status["resources"][0];
        let lease = resource["capacity"].as_f64().map_or_else(|| "none".to_owned(), |c| format!("{c:5.1}"));
        let mode = resource["mode"].as_str().unwrap_or("?");
        let text = format!(
            "{}: {offered:>3} offered {admitted:>3} admitted {rejected:>3} rejected, lease {lease} ({mode})",
            self.name
        );
        (text, admitted)
    }
}

pub async fn run(args: Args) -> Result<(), String> {
    let server_launch = match &args.bin_dir {
        Some(dir) => ServerLaunch::of(dir.join("sluice-server")),
        None => Server::launch(),
    };
    let server = server_launch.config(&server_config()).args(["--log", "warn"]).start();
    let upstream_listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("demo upstream: {e}"))?;
    let upstream_addr = upstream_listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(upstream::serve(upstream_listener, None));

    let _ = outln!(
        "capacity server on {} — {RESOURCE:?} shares {CAPACITY} requests/s (FAIR_SHARE, refresh 1 s); for its first 2 s \
         it is in learning mode and grants newcomers nothing",
        server.grpc
    );
    let _ = outln!(
        "demo upstream on {upstream_addr}; each sidecar is offered {} requests/s (3× the capacity when alone)",
        args.rate
    );
    let mut pods = vec![Pod::start("A", server.grpc, upstream_addr, args.rate, &args.bin_dir)];
    let _ = outln!(
        "sidecar A: admin http://{}/debug/status; sidecar B joins after {:?}; Ctrl-C stops",
        pods[0].sidecar.admin,
        args.join_after
    );

    let start = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = tokio::signal::ctrl_c() => break,
        }
        let t = start.elapsed();
        // Starting a sidecar and reading its status block: off the runtime's workers, so the
        // load generators and their counters keep time meanwhile.
        let shown = tokio::task::block_in_place(|| {
            if pods.len() == 1 && t >= args.join_after {
                pods.push(Pod::start("B", server.grpc, upstream_addr, args.rate, &args.bin_dir));
                outln!("— sidecar B joins: the capacity is now shared —")?;
            }
            let mut total = 0;
            let parts: Vec<String> = pods
                .iter_mut()
                .map(|p| {
                    let (text, admitted) = p.line();
                    total += admitted;
                    text
                })
                .collect();
            outln!("t={:>3}s  {}  | Σ admitted {total:>3}/s of {CAPACITY}", t.as_secs(), parts.join("  | "))
        });
        // Nobody reads any more (`make demo | head`): stop as on Ctrl-C.
        if shown.is_err() || args.duration.is_some_and(|d| t >= d) {
            break;
        }
    }
    // Sidecars stop on SIGTERM, releasing their leases, as in a pod shutting down.
    for pod in &mut pods {
        pod.sidecar.signal("TERM");
        pod.sidecar.wait_exit(Duration::from_secs(15));
    }
    let _ = outln!("stopped");
    Ok(())
}
