//! `make soak`: the demo's topology grown into a tree — a root capacity server, a leaf server
//! under it, several sidecars leasing from the leaf in front of one `sluice-upstream` — under
//! steady open-loop load for a set time. Every interval it samples each process's resident
//! memory and open descriptors and each sidecar's latency percentiles, prints a line and writes
//! CSV rows; at the end it prints tables of the first steady sample and the last, and fails if
//! any process grew (see [`growth`]) or too many requests went unanswered.

use std::{
    fmt::Write as _,
    fs,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use clap::Parser;
use hdrhistogram::Histogram;
use sluice_runtime::outln;
use tokio::{task::JoinHandle, time::MissedTickBehavior};

use crate::{
    config::{Algorithm, ServerConfig, Template},
    connections::Usage,
    demo,
    harness::{Server, Sidecar},
    http::{http1, send},
    upstream::UpstreamProcess,
};

/// Soak test: a server tree, sidecars and an upstream under steady load, watched for growth.
#[derive(Debug, Parser)]
#[command(name = "sluice-soak")]
pub struct Args {
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub duration: Duration,
    /// Time between samples.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub interval: Duration,
    /// Samples before this are shown but left out of the growth rule: start-up, first leases,
    /// connection pools and allocator arenas filling.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1m")]
    pub warm_up: Duration,
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub sidecars: u32,
    /// Requests per second offered through each sidecar, at fixed times (open loop).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub rate: u32,
    /// Where the samples go, one row per process per sample.
    #[arg(long, default_value = "soak-results/samples.csv")]
    pub csv: PathBuf,
}

/// The root's capacity: below what the sidecars are offered together (50/s each by default),
/// so that leases are contended and every sidecar rejects some of its load all along.
const CAPACITY: f64 = 120.0;

/// A request unanswered after this long has failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Growth allowed between the first and the last quarter of the steady samples: the larger of
/// a fraction of the first quarter's median and an absolute floor (what allocators and pools
/// wander by when nothing leaks).
pub const RSS_GROWTH: (f64, u64) = (0.10, 4 << 20);
pub const FD_GROWTH: (f64, u64) = (0.10, 8);

/// At most this fraction of the requests offered in the steady part may go unanswered.
pub const MAX_FAILED: f64 = 0.01;

fn server_config(capacity: f64) -> ServerConfig {
    ServerConfig::new().template(Template::catch_all(capacity, Algorithm::fair_share(10, 2).learning(0)))
}

/// Requests through one sidecar since the last sample.
struct Window {
    /// Latency of admitted requests (µs), from the time each was due to be sent.
    latency_us: Histogram<u64>,
    admitted: u64,
    rejected: u64,
    failed: u64,
}

impl Window {
    fn new() -> Window {
        Window {
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds"),
            admitted: 0,
            rejected: 0,
            failed: 0,
        }
    }
}

/// One sidecar's traffic over one interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    pub admitted: u64,
    pub rejected: u64,
    pub failed: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Every process at one moment; `traffic` for the sidecars only.
#[derive(Debug, Clone)]
pub struct Sample {
    pub at: Duration,
    pub usage: Vec<Usage>,
    pub traffic: Vec<Option<Traffic>>,
}

/// The growth rule's finding for one process.
#[derive(Debug, Clone)]
pub struct Growth {
    pub process: String,
    /// Over the first and last quarter of the steady samples: medians of RSS, lowest counts of
    /// descriptors.
    pub rss: (u64, u64),
    pub fds: (u64, u64),
    pub rss_ok: bool,
    pub fds_ok: bool,
}

fn median(mut values: Vec<u64>) -> u64 {
    values.sort_unstable();
    values[values.len() / 2]
}

/// Whether `last` is within the allowed growth `(fraction, floor)` of `first`.
fn within(first: u64, last: u64, (fraction, floor): (f64, u64)) -> bool {
    last <= first + ((first as f64 * fraction) as u64).max(floor)
}

/// The growth rule. The samples from `warm_up` on are the steady part; it needs at least four.
/// Per process, the RSS of its last quarter may exceed that of its first quarter by at most
/// [`RSS_GROWTH`], and its open descriptors by at most [`FD_GROWTH`]; quarters apart, so that a
/// slow leak has room to show. RSS is compared by the quarters' medians, so that one sample
/// caught mid-burst decides nothing. Descriptors are compared by the quarters' lowest counts:
/// pooled connections come and go with the load's concurrency (a slow spell on a shared machine
/// opens more, and they close after the pools' idle timeouts of a minute or so), while a leaked
/// descriptor never goes, and raises the lowest count with it.
pub fn growth(names: &[String], samples: &[Sample], warm_up: Duration) -> Result<Vec<Growth>, String> {
    let steady: Vec<&Sample> = samples.iter().filter(|s| s.at >= warm_up).collect();
    if steady.len() < 4 {
        return Err(format!("{} samples after the warm-up: the growth rule needs at least 4", steady.len()));
    }
    let quarter = steady.len().div_ceil(4);
    let (first, last) = (&steady[..quarter], &steady[steady.len() - quarter..]);
    Ok(names
        .iter()
        .enumerate()
        .map(|(p, name)| {
            let rss_median = |part: &[&Sample]| median(part.iter().map(|s| s.usage[p].rss_bytes).collect());
            let fds_lowest = |part: &[&Sample]| part.iter().map(|s| s.usage[p].fds).min().unwrap_or_default();
            let rss = (rss_median(first), rss_median(last));
            let fds = (fds_lowest(first), fds_lowest(last));
            Growth {
                process: name.clone(),
                rss_ok: within(rss.0, rss.1, RSS_GROWTH),
                fds_ok: within(fds.0, fds.1, FD_GROWTH),
                rss,
                fds,
            }
        })
        .collect())
}

/// The processes of the run, in the order of the report's columns.
struct Topology {
    root: Server,
    leaf: Server,
    upstream: UpstreamProcess,
    sidecars: Vec<(Sidecar, SocketAddr)>,
}

impl Topology {
    fn start(sidecars: u32) -> Result<Topology, String> {
        let root = Server::launch().config(&server_config(CAPACITY)).args(["--log", "warn"]).start();
        // The leaf's own template grants nothing: all it hands out comes from the root.
        let leaf = Server::launch()
            .config(&server_config(0.0))
            .args(["--parent", &root.grpc.to_string(), "--log", "warn"])
            .start();
        let upstream = UpstreamProcess::launch(&crate::harness::binary("sluice-upstream"), &[] as &[&str])?;
        let sidecars = (0..sidecars)
            .map(|_| {
                let sidecar =
                    Sidecar::launch(&demo::sidecar_config(leaf.grpc, upstream.addr())).args(["--log", "warn"]).start();
                let listen = sidecar.listen();
                (sidecar, listen)
            })
            .collect();
        Ok(Topology { root, leaf, upstream, sidecars })
    }

    fn names(&self) -> Vec<String> {
        let fixed = ["root".to_owned(), "leaf".to_owned(), "upstream".to_owned()];
        fixed.into_iter().chain((1..=self.sidecars.len()).map(|i| format!("sidecar-{i}"))).collect()
    }

    fn pids(&self) -> Vec<u32> {
        let fixed = [self.root.pid(), self.leaf.pid(), self.upstream.pid()];
        fixed.into_iter().chain(self.sidecars.iter().map(|(s, _)| s.pid())).collect()
    }

    fn logs(&self, process: usize) -> String {
        match process {
            0 => self.root.logs(),
            1 => self.leaf.logs(),
            2 => self.upstream.logs(),
            i => self.sidecars[i - 3].0.logs(),
        }
    }
}

/// Offers `rate` requests a second through `listen` at fixed times, each timed from when it was
/// due, so that a stall delays the requests behind it in the figures too.
fn load(listen: SocketAddr, rate: u32, window: Arc<Mutex<Window>>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let client = http1();
        let url = format!("http://{listen}/");
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
        ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
        loop {
            let due = ticks.tick().await;
            let (client, url, window) = (client.clone(), url.clone(), window.clone());
            tokio::spawn(async move {
                let request = http::Request::get(url).body(Default::default()).expect("a valid request");
                let answer = send(&client, request, REQUEST_TIMEOUT).await;
                let took = due.elapsed();
                let mut window = window.lock().expect("not poisoned");
                match answer.map(|a| a.status.as_u16()) {
                    Some(200) => {
                        window.admitted += 1;
                        window.latency_us.saturating_record(took.as_micros() as u64);
                    }
                    Some(429) => window.rejected += 1,
                    _ => window.failed += 1,
                }
            });
        }
    })
}

/// What a soak found; `growth` is the rule applied to `samples`.
pub struct Soak {
    pub names: Vec<String>,
    pub samples: Vec<Sample>,
    pub growth: Vec<Growth>,
    /// Requests offered and unanswered in the steady part.
    pub offered: u64,
    pub failed: u64,
}

impl Soak {
    /// Why the soak failed, if it did.
    pub fn failures(&self) -> Vec<String> {
        let mut failures: Vec<String> = self
            .growth
            .iter()
            .flat_map(|g| {
                let rss = (!g.rss_ok)
                    .then(|| format!("{}: RSS grew from {:.1} MB to {:.1} MB", g.process, mb(g.rss.0), mb(g.rss.1)));
                let fds = (!g.fds_ok)
                    .then(|| format!("{}: open descriptors grew from {} to {}", g.process, g.fds.0, g.fds.1));
                rss.into_iter().chain(fds)
            })
            .collect();
        if self.failed as f64 > self.offered as f64 * MAX_FAILED {
            failures.push(format!("{} of {} requests got no answer", self.failed, self.offered));
        }
        failures
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn csv_rows(names: &[String], sample: &Sample) -> String {
    let mut rows = String::new();
    for (p, name) in names.iter().enumerate() {
        let Usage { rss_bytes, fds } = sample.usage[p];
        let traffic = sample.traffic[p].map_or_else(
            || ",,,,".to_owned(),
            |t| format!("{},{},{},{:.3},{:.3}", t.admitted, t.rejected, t.failed, t.p50_ms, t.p99_ms),
        );
        let _ = writeln!(rows, "{:.1},{name},{rss_bytes},{fds},{traffic}", sample.at.as_secs_f64());
    }
    rows
}

const CSV_HEADER: &str = "t_s,process,rss_bytes,fds,admitted,rejected,failed,p50_ms,p99_ms\n";

/// A table of every process at one sample.
fn table(title: &str, names: &[String], sample: &Sample, interval: Duration) -> String {
    let mut out = format!("{title} (t={:.0}s)\n", sample.at.as_secs_f64());
    let _ = writeln!(
        out,
        "{:<10} {:>8} {:>5} {:>10} {:>10} {:>7} {:>8} {:>8}",
        "process", "RSS MB", "FDs", "admitted/s", "rejected/s", "failed", "p50 ms", "p99 ms"
    );
    let per_second = |n: u64| n as f64 / interval.as_secs_f64();
    for (p, name) in names.iter().enumerate() {
        let usage = sample.usage[p];
        let _ = write!(out, "{name:<10} {:>8.1} {:>5}", mb(usage.rss_bytes), usage.fds);
        if let Some(t) = sample.traffic[p] {
            let _ = write!(
                out,
                " {:>10.1} {:>10.1} {:>7} {:>8.2} {:>8.2}",
                per_second(t.admitted),
                per_second(t.rejected),
                t.failed,
                t.p50_ms,
                t.p99_ms
            );
        }
        out.push('\n');
    }
    out
}

/// Runs the soak, printing as it goes, and returns what it found (the verdict is the caller's).
pub async fn soak(args: &Args) -> Result<Soak, String> {
    if args.interval.is_zero() || args.duration < args.interval {
        return Err("--interval must be > 0 and at most --duration".into());
    }
    if let Some(dir) = args.csv.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut csv = CSV_HEADER.to_owned();
    fs::write(&args.csv, &csv).map_err(|e| format!("{}: {e}", args.csv.display()))?;
    let topology = tokio::task::block_in_place(|| Topology::start(args.sidecars))?;
    let (names, pids) = (topology.names(), topology.pids());
    let _ = outln!(
        "soak: {} for {:?}, a sample every {:?} (growth judged after {:?}); root {} ← leaf {} ← {} sidecars, {} req/s each → upstream {}",
        args.csv.display(),
        args.duration,
        args.interval,
        args.warm_up,
        topology.root.grpc,
        topology.leaf.grpc,
        args.sidecars,
        args.rate,
        topology.upstream.addr()
    );
    let windows: Vec<Arc<Mutex<Window>>> =
        topology.sidecars.iter().map(|_| Arc::new(Mutex::new(Window::new()))).collect();
    let loads: Vec<JoinHandle<()>> =
        topology.sidecars.iter().zip(&windows).map(|((_, listen), w)| load(*listen, args.rate, w.clone())).collect();

    let start = Instant::now();
    let mut ticks = tokio::time::interval_at((start + args.interval).into(), args.interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut samples = Vec::new();
    let (mut offered, mut failed) = (0, 0);
    loop {
        ticks.tick().await;
        let at = start.elapsed();
        let mut usage = Vec::with_capacity(pids.len());
        for (p, pid) in pids.iter().enumerate() {
            usage.push(
                Usage::of(*pid).map_err(|e| format!("{} is gone ({e}); its log:\n{}", names[p], topology.logs(p)))?,
            );
        }
        let mut traffic = vec![None; 3];
        for window in &windows {
            let w = std::mem::replace(&mut *window.lock().expect("not poisoned"), Window::new());
            let ms = |q| w.latency_us.value_at_quantile(q) as f64 / 1000.0;
            traffic.push(Some(Traffic {
                admitted: w.admitted,
                rejected: w.rejected,
                failed: w.failed,
                p50_ms: ms(0.5),
                p99_ms: ms(0.99),
            }));
        }
        let sample = Sample { at, usage, traffic };
        if at >= args.warm_up {
            for t in sample.traffic.iter().flatten() {
                offered += t.admitted + t.rejected + t.failed;
                failed += t.failed;
            }
        }
        let _ = outln!("{}", line(&names, &sample));
        csv.push_str(&csv_rows(&names, &sample));
        fs::write(&args.csv, &csv).map_err(|e| format!("{}: {e}", args.csv.display()))?;
        samples.push(sample);
        if at + args.interval / 2 >= args.duration {
            break;
        }
    }
    loads.iter().for_each(JoinHandle::abort);
    let growth = growth(&names, &samples, args.warm_up)?;
    Ok(Soak { names, samples, growth, offered, failed })
}

/// One sample on one line: `t=30s rss MB root 9.1 … | fds … | p50/p99 ms sidecar-1 0.4/1.9 …`.
fn line(names: &[String], sample: &Sample) -> String {
    let mut rss = String::new();
    let mut fds = String::new();
    let mut latency = String::new();
    for (p, name) in names.iter().enumerate() {
        let _ = write!(rss, " {name} {:.1}", mb(sample.usage[p].rss_bytes));
        let _ = write!(fds, " {}", sample.usage[p].fds);
        if let Some(t) = sample.traffic[p] {
            let _ = write!(latency, " {:.2}/{:.2}", t.p50_ms, t.p99_ms);
        }
    }
    format!("t={:>5.0}s  RSS MB{rss}  | FDs{fds}  | sidecars p50/p99 ms{latency}", sample.at.as_secs_f64())
}

pub async fn run(args: Args) -> Result<(), String> {
    let soak = soak(&args).await?;
    let first_steady = soak.samples.iter().find(|s| s.at >= args.warm_up).expect("the growth rule found some");
    let last = soak.samples.last().expect("samples");
    let _ = outln!("\n{}", table("first sample after the warm-up", &soak.names, first_steady, args.interval));
    let _ = outln!("{}", table("last sample", &soak.names, last, args.interval));
    let _ = outln!(
        "growth from the first to the last quarter after the warm-up, RSS by median, FDs by lowest count (allowed: {:.0}% or {} MB of RSS, {:.0}% or {} FDs, whichever is more):",
        RSS_GROWTH.0 * 100.0,
        RSS_GROWTH.1 >> 20,
        FD_GROWTH.0 * 100.0,
        FD_GROWTH.1
    );
    for g in &soak.growth {
        let verdict = |ok| if ok { "ok" } else { "GREW" };
        let _ = outln!(
            "{:<10} RSS {:>6.1} → {:>6.1} MB {:<4}  FDs {:>4} → {:>4} {}",
            g.process,
            mb(g.rss.0),
            mb(g.rss.1),
            verdict(g.rss_ok),
            g.fds.0,
            g.fds.1,
            verdict(g.fds_ok)
        );
    }
    let _ = outln!(
        "{} requests offered after the warm-up, {} unanswered; samples in {}",
        soak.offered,
        soak.failed,
        args.csv.display()
    );
    let failures = soak.failures();
    if failures.is_empty() {
        let _ = outln!("soak passed");
        Ok(())
    } else {
        Err(format!("soak failed: {}", failures.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples every 10 s of one process whose RSS (MB) and descriptors follow `f`.
    fn series(n: u64, f: impl Fn(u64) -> (u64, u64)) -> Vec<Sample> {
        (0..n)
            .map(|i| {
                let (rss_mb, fds) = f(i);
                Sample {
                    at: Duration::from_secs(10 * i),
                    usage: vec![Usage { rss_bytes: rss_mb << 20, fds }],
                    traffic: vec![None],
                }
            })
            .collect()
    }

    fn judge(samples: &[Sample]) -> (bool, bool) {
        let g = &growth(&["p".to_owned()], samples, Duration::from_secs(60)).unwrap()[0];
        (g.rss_ok, g.fds_ok)
    }

    #[test]
    fn noise_and_warm_up_pass_a_leak_fails() {
        // A warm-up that grows, then noise: passes.
        let noisy = series(40, |i| if i < 6 { (10 + 5 * i, 10 + 3 * i) } else { (40 + i % 3, 30 + i % 4) });
        assert_eq!(judge(&noisy), (true, true));
        // One spike in the last quarter is not growth.
        let spike = series(40, |i| if i == 38 { (80, 60) } else { (40, 30) });
        assert_eq!(judge(&spike), (true, true));
        // Pools that swell with a slow spell and shrink again, in the last quarter more than in
        // the first: not growth.
        let pools = series(40, |i| {
            (
                40,
                if i % 5 == 0 {
                    30
                } else if i > 30 {
                    50
                } else {
                    34
                },
            )
        });
        assert_eq!(judge(&pools), (true, true));
        // 1 MB every 30 s and a descriptor every 20 s: caught.
        let leak = series(40, |i| (40 + i / 3, 30 + i / 2));
        assert_eq!(judge(&leak), (false, false));
        // Small processes have an absolute floor: 3 MB on 10 MB and 5 FDs on 10 are within it.
        let small = series(40, |i| (10 + 3 * u64::from(i > 30), 10 + 5 * u64::from(i > 30)));
        assert_eq!(judge(&small), (true, true));
    }

    #[test]
    fn too_few_steady_samples_is_an_error() {
        assert!(growth(&["p".to_owned()], &series(9, |_| (1, 1)), Duration::from_secs(60)).is_err());
        assert!(growth(&["p".to_owned()], &series(10, |_| (1, 1)), Duration::from_secs(60)).is_ok());
    }
}
