//! The server load generator (`make bench-server`): drives `GetCapacity` for N distinct clients
//! over a few connections and reports throughput, latency and the server's memory per lease.
//! It speaks only Doorman's protocol, so it can be pointed at any Doorman-compatible server.
//!
//! The callers form a closed loop: each sends its next call when the last one has ended, and a
//! call's latency is from just before it is sent until its answer, error or timeout. Little's
//! law then ties the figures together (callers = calls per second × mean latency), and the
//! report prints both sides of it as a check on the accounting.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use clap::Parser;
use hdrhistogram::Histogram;
use sluice_proto::{DiscoveryRequest, GetCapacityRequest, ResourceRequest, capacity_client::CapacityClient};
use sluice_runtime::outln;
use tonic::transport::{Channel, Endpoint};

use crate::{
    config::{Algorithm, ServerConfig, Template},
    harness::{ServerLaunch, cpu_seconds},
};

/// Load generator for Doorman-protocol capacity servers.
#[derive(Debug, Parser)]
#[command(name = "sluice-loadgen")]
pub struct Args {
    /// Server to drive (ignored with --launch).
    #[arg(long, default_value = "127.0.0.1:7777")]
    pub addr: String,
    /// Numbers of distinct clients to run with, one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "100,10000,100000,1000000")]
    pub clients: Vec<usize>,
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    pub callers: usize,
    /// Connections the callers share.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Measurement time per number of clients, after every client has its lease.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub duration: Duration,
    /// Resource the clients ask for.
    #[arg(long, default_value = "bench")]
    pub resource: String,
    /// A call with no answer after this long counts as an error, with this latency.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// PID of the server, to report its resident memory per lease.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Start this sluice-server binary afresh for each number of clients (FAIR_SHARE, capacity
    /// half the total demand, leases that outlive the run, no learning mode) instead of --addr.
    #[arg(long)]
    pub launch: Option<PathBuf>,
}

/// One line of the report.
pub struct Measurement {
    pub clients: usize,
    pub prefill: Duration,
    /// Successful measured calls.
    pub rpcs: u64,
    pub elapsed: Duration,
    /// Every measured call's latency, failed ones included.
    pub latency_us: Histogram<u64>,
    /// Failed calls (errors and timeouts), prefill included.
    pub errors: u64,
    /// Failed measured calls: with `rpcs`, the calls the latencies are of.
    pub measured_errors: u64,
    pub rss_per_lease: Option<f64>,
    /// Server CPU time (user + system) per measured RPC.
    pub cpu_per_rpc: Option<Duration>,
}

impl Measurement {
    pub fn rate(&self) -> f64 {
        self.rpcs as f64 / self.elapsed.as_secs_f64()
    }

    /// The mean latency Little's law predicts for `callers` always busy: callers ÷ calls ended
    /// per second, failed ones included.
    pub fn little_latency(&self, callers: usize) -> Duration {
        let calls = (self.rpcs + self.measured_errors).max(1) as f64;
        Duration::from_secs_f64(callers as f64 * self.elapsed.as_secs_f64() / calls)
    }
}

/// Latencies up to an hour are kept (with 3 significant digits). `Histogram::new` would start
/// out tracking values up to 2 only, and `saturating_record` clamps rather than grows: every
/// call slower than 2 ms was recorded as 2 µs.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

/// Client `i`'s steady demand, between 1 and 100, spread so that water-filling has work to do.
fn wants(i: usize) -> f64 {
    (1 + ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % 100) as f64
}

fn launched_config(clients: usize) -> ServerConfig {
    // Mean demand is ~50 per client: capacity for half of it keeps FAIR_SHARE cutting.
    let capacity = (clients * 25) as f64;
    ServerConfig::new().template(Template::catch_all(capacity, Algorithm::fair_share(7200, 60).learning(0)))
}

fn rss_bytes(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 =
        status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024.0)
}

/// CPU time the process has used so far (user + system).
fn cpu_time(pid: u32) -> Option<Duration> {
    cpu_seconds(pid).ok().map(|(user, system)| Duration::from_secs_f64(user + system))
}

async fn connect(addr: &str, connections: usize, timeout: Duration) -> Result<Vec<Channel>, String> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("--addr {addr}: {e}"))?
        .tcp_nodelay(true)
        .timeout(timeout);
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections {
        channels.push(endpoint.connect().await.map_err(|e| format!("cannot connect to {addr}: {e}"))?);
    }
    Ok(channels)
}

/// What the callers do: ask for client `i`'s lease, or the Discovery baseline.
#[derive(Clone)]
enum Call {
    Lease { resource: Arc<str>, prefix: Arc<str> },
    Discovery,
}

impl Call {
    async fn once(&self, client: &mut CapacityClient<Channel>, i: usize) -> bool {
        match self {
            Call::Lease { resource, prefix } => {
                let request = GetCapacityRequest {
                    client_id: format!("{prefix}{i}"),
                    resource: vec![ResourceRequest {
                        resource_id: resource.to_string(),
                        priority: 0,
                        has: None,
                        wants: wants(i),
                        signals: None,
                    }],
                };
                client.get_capacity(request).await.is_ok()
            }
            Call::Discovery => client.discovery(DiscoveryRequest {}).await.is_ok(),
        }
    }
}

struct Totals {
    rpcs: u64,
    errors: u64,
    latency_us: Histogram<u64>,
    elapsed: Duration,
}

/// Every client once, in order, spread over the callers.
async fn prefill(channels: &[Channel], callers: usize, call: &Call, clients: usize) -> Totals {
    let next = Arc::new(AtomicUsize::new(0));
    run_callers(channels, callers, call, move |_| {
        let i = next.fetch_add(1, Ordering::Relaxed);
        (i < clients).then_some(i)
    })
    .await
}

/// Random clients among `clients` until `duration` has passed.
async fn measure(channels: &[Channel], callers: usize, call: &Call, clients: usize, duration: Duration) -> Totals {
    let deadline = Instant::now() + duration;
    run_callers(channels, callers, call, move |state: &mut u64| {
        // xorshift64: cheap, and each caller has its own sequence.
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        (Instant::now() < deadline).then_some((*state % clients as u64) as usize)
    })
    .await
}

async fn run_callers<F>(channels: &[Channel], callers: usize, call: &Call, pick: F) -> Totals
where
    F: Fn(&mut u64) -> Option<usize> + Send + Sync + 'static,
{
    let pick = Arc::new(pick);
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|k| {
            let mut client = CapacityClient::new(channels[k % channels.len()].clone());
            let (call, pick) = (call.clone(), pick.clone());
            tokio::spawn(async move {
                let mut latency = latency_histogram();
                let (mut rpcs, mut errors) = (0u64, 0u64);
                let mut state = 0x2545_F491_4F6C_DD1D_u64 ^ (k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                while let Some(i) = pick(&mut state) {
                    let sent = Instant::now();
                    let ok = call.once(&mut client, i).await;
                    // A failed call kept its caller busy as long as a good one: leaving it out
                    // would report only the fast part of what the callers went through.
                    latency.saturating_record(sent.elapsed().as_micros() as u64);
                    if ok {
                        rpcs += 1;
                    } else {
                        errors += 1;
                    }
                }
                (rpcs, errors, latency)
            })
        })
        .collect();
    let mut totals = Totals { rpcs: 0, errors: 0, latency_us: latency_histogram(), elapsed: Duration::ZERO };
    for task in tasks {
        let (rpcs, errors, latency) = task.await.expect("caller task");
        totals.rpcs += rpcs;
        totals.errors += errors;
        totals.latency_us.add(latency).expect("histograms add");
    }
    totals.elapsed = start.elapsed();
    totals
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// The measurement for `clients` distinct clients against a fresh server (`--launch`) or
/// `--addr`, with the Discovery rate over the same connections and callers for comparison.
pub async fn measure_size(args: &Args, clients: usize) -> Result<(Measurement, f64), String> {
    let server = args.launch.as_ref().map(|binary| {
        ServerLaunch::of(binary.clone()).config(&launched_config(clients)).args(["--log", "warn"]).start()
    });
    let addr = server.as_ref().map_or_else(|| args.addr.clone(), |s| s.grpc.to_string());
    let pid = server.as_ref().map(|s| s.pid()).or(args.server_pid);
    let channels = connect(&addr, args.connections, args.timeout).await?;

    // Baseline in the same run: the cheapest RPC over the same connections and callers.
    let baseline =
        measure(&channels, args.callers, &Call::Discovery, 1, args.duration.min(Duration::from_secs(3))).await;
    let call = Call::Lease { resource: args.resource.as_str().into(), prefix: format!("n{clients}-client-").into() };
    let rss_before = pid.and_then(rss_bytes);
    let filled = prefill(&channels, args.callers, &call, clients).await;
    let rss_after = pid.and_then(rss_bytes);
    let cpu_before = pid.and_then(cpu_time);
    let measured = measure(&channels, args.callers, &call, clients, args.duration).await;
    let cpu_used = pid.and_then(cpu_time).zip(cpu_before).map(|(after, before)| after.saturating_sub(before));
    let m = Measurement {
        clients,
        prefill: filled.elapsed,
        rpcs: measured.rpcs,
        elapsed: measured.elapsed,
        errors: filled.errors + measured.errors,
        measured_errors: measured.errors,
        rss_per_lease: rss_before.zip(rss_after).map(|(b, a)| (a - b) / clients as f64),
        cpu_per_rpc: cpu_used.map(|cpu| cpu / measured.rpcs.max(1) as u32),
        latency_us: measured.latency_us,
    };
    Ok((m, baseline.rpcs as f64 / baseline.elapsed.as_secs_f64()))
}

/// Runs every size and prints the report.
pub async fn run(args: Args) -> Result<(), String> {
    if args.callers == 0 || args.connections == 0 || args.clients.contains(&0) {
        return Err("--callers, --connections and every --clients must be > 0".into());
    }
    let target = match &args.launch {
        Some(binary) => format!("{} (started afresh for each size)", binary.display()),
        None => args.addr.clone(),
    };
    let _ = outln!(
        "target {target}; resource {:?}; {} callers over {} connections; {:?} per size",
        args.resource,
        args.callers,
        args.connections,
        args.duration
    );
    let _ = outln!(
        "{:>9} {:>10} {:>11} {:>9} {:>9} {:>9} {:>10} {:>13} {:>13} {:>14} {:>8}",
        "clients",
        "prefill s",
        "GetCap/s",
        "p50 ms",
        "p99 ms",
        "mean ms",
        "Little ms",
        "vs Discovery",
        "RSS/lease B",
        "srv CPU µs/RPC",
        "errors"
    );
    let mut first_rate = None;
    for &clients in &args.clients {
        let (m, discovery_rate) = measure_size(&args, clients).await?;
        let _ = outln!(
            "{:>9} {:>10.1} {:>11.0} {:>9.3} {:>9.3} {:>9.3} {:>10.3} {:>12.2}x {:>13} {:>14} {:>8}",
            m.clients,
            m.prefill.as_secs_f64(),
            m.rate(),
            ms(&m.latency_us, 0.5),
            ms(&m.latency_us, 0.99),
            m.latency_us.mean() / 1000.0,
            m.little_latency(args.callers).as_secs_f64() * 1000.0,
            m.rate() / discovery_rate,
            m.rss_per_lease.map_or_else(|| "-".to_owned(), |b| format!("{b:.0}")),
            m.cpu_per_rpc.map_or_else(|| "-".to_owned(), |c| format!("{:.1}", c.as_secs_f64() * 1e6)),
            m.errors
        );
        first_rate.get_or_insert(m.rate());
    }
    let _ = outln!(
        "(latency: every measured call, failed ones included, from send to answer; Little ms = callers ÷ calls \
         ended per second, which the mean should match)"
    );
    if let (Some(first), Some(&smallest)) = (first_rate, args.clients.first()) {
        let _ = outln!(
            "(vs Discovery: GetCapacity rate ÷ Discovery rate on the same connections; baseline size {smallest} ran at {first:.0}/s)"
        );
    }
    Ok(())
}
