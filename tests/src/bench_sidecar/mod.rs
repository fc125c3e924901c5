//! The sidecar benchmark (`make bench-sidecar`): wrk against the same `sluice-upstream` directly,
//! through nginx as a reverse proxy and through the sidecar with an active rule whose lease is far
//! above the load, one worker thread each, in one run, each warmed up at full load first (until the
//! sidecar's lease has caught up with the load). Reports throughput, latency under load, the
//! latency of a single closed-loop connection (the added latency without queueing) and the
//! sidecar's idle RSS, against the goals: ≥ 1.2× nginx's throughput, ≤ 100 µs added p50 over
//! direct, ≤ 15 MB idle RSS. Also the CPU each proxy spends per request under load, in user space
//! and in the kernel, which is what decides the throughput ratio when the proxy is the busiest of
//! the three processes. `--sidecar-alt` measures a second sidecar binary (another build of it)
//! in the same interleaved rounds, for comparisons that runs on different occasions cannot settle
//! on a shared machine.

use std::{
    fs,
    io::ErrorKind,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

mod report;

use clap::{Parser, ValueEnum};
use sluice_runtime::errln;
use tempfile::TempDir;

use crate::{
    config::{
        Algorithm, ConfigFile, Kind, Listener, OnLimit, Resource, Rule, ServerConfig, SidecarConfig, Template, Upstream,
    },
    harness::{ServerLaunch, binary, cpu_seconds, free_port, http_get},
    upstream::UpstreamProcess,
};

const GOAL_VS_NGINX: f64 = 1.2;
const GOAL_ADDED_P50_US: f64 = 100.0;
const GOAL_RSS_MB: f64 = 15.0;
const START_TIMEOUT: Duration = Duration::from_secs(20);
const WARM_UP_PASS_SECS: u64 = 2;
/// 30 s: six refresh intervals of the benchmark's lease.
const WARM_UP_PASSES: u32 = 15;

/// A lease far above any load wrk can offer, granted at once.
fn server_config() -> ServerConfig {
    ServerConfig::new().template(Template::catch_all(1e9, Algorithm::fair_share(60, 5).learning(0)))
}

/// Sidecar benchmark: wrk direct, through nginx and through the sidecar.
#[derive(Debug, Parser)]
#[command(name = "sluice-bench-sidecar")]
pub struct Args {
    /// sluice-sidecar binary [default: next to this executable].
    #[arg(long)]
    pub sidecar: Option<PathBuf>,
    /// A second sidecar binary to compare with the first, measured as `sidecar-alt` right after
    /// `sidecar` in every round, under the same load and capacity server.
    #[arg(long)]
    pub sidecar_alt: Option<PathBuf>,
    /// sluice-server binary [default: next to this executable].
    #[arg(long)]
    pub server: Option<PathBuf>,
    /// sluice-upstream binary [default: next to this executable].
    #[arg(long)]
    pub upstream: Option<PathBuf>,
    /// sluice-relay binary [default: next to this executable].
    #[arg(long)]
    pub relay: Option<PathBuf>,
    /// Length of each throughput pass; each single-connection pass takes half of it (whole seconds).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub duration: Duration,
    /// wrk connections in the throughput passes.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: u32,
    #[arg(long, default_value = "wrk")]
    pub wrk: PathBuf,
    #[arg(long, default_value = "nginx")]
    pub nginx: PathBuf,
    /// What to measure, in this order (`sidecar-alt` joins after `sidecar` when `--sidecar-alt`
    /// is given).
    #[arg(long, value_delimiter = ',', default_value = "direct,nginx,relay,sidecar")]
    pub targets: Vec<Target>,
    /// Rounds of passes over every target, interleaved; the goals are judged on the median of
    /// the rounds' figures, as a shared machine's load comes and goes between passes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    Direct,
    Nginx,
    /// `sluice-relay`: bytes copied both ways, no HTTP; the ceiling of any proxy here.
    Relay,
    Sidecar,
    /// The `--sidecar-alt` binary.
    SidecarAlt,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Nginx => "nginx",
            Target::Relay => "relay",
            Target::Sidecar => "sidecar",
            Target::SidecarAlt => "sidecar-alt",
        }
    }

    fn is_sidecar(self) -> bool {
        matches!(self, Target::Sidecar | Target::SidecarAlt)
    }
}

/// What wrk reports for one pass; latencies in µs.
#[derive(Debug, PartialEq)]
pub(crate) struct Pass {
    pub(crate) requests: u64,
    pub(crate) requests_per_sec: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) non_2xx: u64,
}

struct Measurement {
    round: u32,
    target: Target,
    load: Pass,
    single: Pass,
    /// The proxy's CPU per request during the load pass (none for a direct connection).
    cpu: Option<Cpu>,
}

/// CPU time per request, µs.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Cpu {
    user: f64,
    system: f64,
}

impl Cpu {
    fn total(self) -> f64 {
        self.user + self.system
    }
}

pub fn run(args: Args) -> Result<(), String> {
    let targets = targets(&args)?;
    let uses = |target| targets.contains(&target);
    check_installed(&args.wrk, &[])?;
    if uses(Target::Nginx) {
        check_installed(&args.nginx, &["-v"])?;
    }
    let upstream_binary = args.upstream.clone().unwrap_or_else(|| binary("sluice-upstream"));
    let upstream = UpstreamProcess::launch(&upstream_binary, &["--worker-threads", "1"])?;

    // Each guard stops its process when dropped, on every way out of this function.
    // Where each target listens, and its proxy process, whose CPU time is read around its load
    // passes (none for the direct connection).
    let mut addrs = Vec::new();
    let mut sidecar_rss = Vec::new();
    let _nginx = if uses(Target::Nginx) {
        let nginx = Proxy::nginx(&args.nginx, upstream.addr())?;
        addrs.push((Target::Nginx, nginx.addr, Some(nginx.process.child.id())));
        Some(nginx)
    } else {
        None
    };
    let _relay = if uses(Target::Relay) {
        let relay = Proxy::relay(&args.relay.clone().unwrap_or_else(|| binary("sluice-relay")), upstream.addr())?;
        addrs.push((Target::Relay, relay.addr, Some(relay.process.child.id())));
        Some(relay)
    } else {
        None
    };
    // Both sidecars lease from one server, each as a client of its own (their ports differ).
    let server = targets.iter().any(|t| t.is_sidecar()).then(|| {
        ServerLaunch::of(args.server.clone().unwrap_or_else(|| binary("sluice-server")))
            .config(&server_config())
            .start()
    });
    let mut _sidecars = Vec::new();
    for (target, sidecar_binary) in [
        (Target::Sidecar, args.sidecar.clone().unwrap_or_else(|| binary("sluice-sidecar"))),
        (Target::SidecarAlt, args.sidecar_alt.clone().unwrap_or_default()),
    ] {
        let Some(server) = server.as_ref().filter(|_| uses(target)) else { continue };
        let sidecar = Sidecar::start(&sidecar_binary, server.grpc, upstream.addr())?;
        sidecar_rss.push((target, rss_mb(sidecar.process.child.id())?));
        addrs.push((target, sidecar.listener, Some(sidecar.process.child.id())));
        _sidecars.push(sidecar);
    }
    addrs.push((Target::Direct, upstream.addr(), None));

    let secs = args.duration.as_secs().max(1);
    for &target in &targets {
        let _ = errln!("warming up {}", target.name());
        warm_up(&args.wrk, target, addr_of(&addrs, target).0, args.connections)?;
    }
    let mut results = Vec::new();
    for round in 1..=args.rounds {
        for &target in &targets {
            let _ = errln!(
                "round {round}: measuring {} ({secs}s at {} connections, then {}s at 1)",
                target.name(),
                args.connections,
                secs.div_ceil(2)
            );
            let (addr, proxy) = addr_of(&addrs, target);
            let before = proxy.map(cpu_seconds).transpose()?;
            let load = wrk(&args.wrk, addr, args.connections, secs)?;
            let cpu = match (proxy, before) {
                (Some(pid), Some(before)) => Some(per_request(before, cpu_seconds(pid)?, load.requests)),
                _ => None,
            };
            let single = wrk(&args.wrk, addr, 1, secs.div_ceil(2))?;
            results.push(Measurement { round, target, load, single, cpu });
        }
    }
    if let Some(alt) = &args.sidecar_alt {
        let _ = sluice_runtime::cli::out(format_args!("\nsidecar-alt: {}", alt.display()));
    }
    let _ = sluice_runtime::cli::out(format_args!("{}", report::report(&results, args.rounds, &sidecar_rss)));
    match results.iter().find(|m| m.target.is_sidecar() && m.load.non_2xx + m.single.non_2xx > 0) {
        Some(m) => Err(refused(m.target, m.load.non_2xx + m.single.non_2xx, addr_of(&addrs, m.target).0)),
        None => Ok(()),
    }
}

/// The targets to measure: `--targets`, with `sidecar-alt` after `sidecar` (else last) when
/// `--sidecar-alt` names a binary.
fn targets(args: &Args) -> Result<Vec<Target>, String> {
    let mut targets = args.targets.clone();
    match (&args.sidecar_alt, targets.contains(&Target::SidecarAlt)) {
        (Some(_), false) => {
            let at = targets.iter().position(|&t| t == Target::Sidecar).map_or(targets.len(), |i| i + 1);
            targets.insert(at, Target::SidecarAlt);
        }
        (None, true) => return Err("the sidecar-alt target needs --sidecar-alt PATH".into()),
        _ => {}
    }
    Ok(targets)
}

/// A target's address and proxy process.
fn addr_of(addrs: &[(Target, SocketAddr, Option<u32>)], target: Target) -> (SocketAddr, Option<u32>) {
    addrs.iter().find(|(t, ..)| *t == target).map(|&(_, addr, pid)| (addr, pid)).expect("every target was started")
}

/// Full load until a pass gets only 2xx: the sidecar asks for the load it was recently offered,
/// so after a step from idle its lease needs a few refresh intervals to catch up.
fn warm_up(wrk_path: &Path, target: Target, addr: SocketAddr, connections: u32) -> Result<(), String> {
    let mut refused_total = 0;
    for _ in 0..WARM_UP_PASSES {
        let pass = wrk(wrk_path, addr, connections, WARM_UP_PASS_SECS)?;
        if pass.non_2xx == 0 {
            return Ok(());
        }
        let _ = errln!(
            "  {} non-2xx in {WARM_UP_PASS_SECS}s at {:.0} req/s, continuing",
            pass.non_2xx,
            pass.requests_per_sec
        );
        refused_total += pass.non_2xx;
    }
    Err(refused(target, refused_total, addr))
}

/// The failure when a target refuses requests, with one of its answers to show why.
fn refused(target: Target, count: u64, addr: SocketAddr) -> String {
    let sample = match http_get(addr, "/") {
        Ok((code, body)) => format!("GET / now answers {code}: {}", body.trim()),
        Err(e) => format!("GET / now fails: {e}"),
    };
    format!(
        "{}: {count} requests got non-2xx statuses, but the lease must be far above the load; {sample}",
        target.name()
    )
}

/// Fails with the install hint when `program` cannot be run at all.
fn check_installed(program: &Path, args: &[&str]) -> Result<(), String> {
    match Command::new(program).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Err(e) if e.kind() == ErrorKind::NotFound => Err("install them: apt-get install -y wrk nginx-light".into()),
        Err(e) => Err(format!("cannot run {}: {e}", program.display())),
        Ok(_) => Ok(()),
    }
}

/// One wrk pass of `secs` seconds over `connections` connections, one thread, against `addr`'s `/`
/// (also the rate limit service benchmark's).
pub(crate) fn wrk(wrk: &Path, addr: SocketAddr, connections: u32, secs: u64) -> Result<Pass, String> {
    let output = Command::new(wrk)
        .args(["-t1", &format!("-c{connections}"), &format!("-d{secs}s"), "--latency", &format!("http://{addr}/")])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", wrk.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("wrk failed ({}): {stdout}{}", output.status, String::from_utf8_lossy(&output.stderr)));
    }
    parse_wrk(&stdout).ok_or_else(|| format!("cannot read wrk's report:\n{stdout}"))
}

fn parse_wrk(report: &str) -> Option<Pass> {
    let value =
        |prefix: &str| report.lines().find_map(|line| line.trim_start().strip_prefix(prefix)).map(|rest| rest.trim());
    let requests = report.lines().find_map(|line| line.trim_start().split_once(" requests in "))?.0;
    Some(Pass {
        requests: requests.parse().ok()?,
        requests_per_sec: value("Requests/sec:")?.parse().ok()?,
        p50_us: micros(value("50%")?)?,
        p99_us: micros(value("99%")?)?,
        non_2xx: value("Non-2xx or 3xx responses:").map_or(Some(0), |n| n.parse().ok())?,
    })
}

/// A wrk latency such as `87.00us`, `1.23ms` or `2.00s`, in µs.
fn micros(latency: &str) -> Option<f64> {
    let split = latency.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = latency.split_at(split);
    let scale = match unit {
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        _ => return None,
    };
    Some(number.parse::<f64>().ok()? * scale)
}

/// Resident memory in MB (10^6 bytes), from /proc.
fn rss_mb(pid: u32) -> Result<f64, String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| format!("cannot read RSS: {e}"))?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse::<f64>().ok())
        .ok_or("no VmRSS in /proc/PID/status")?;
    Ok(kib * 1024.0 / 1e6)
}

fn per_request(before: (f64, f64), after: (f64, f64), requests: u64) -> Cpu {
    let per = |seconds: f64| seconds * 1e6 / requests.max(1) as f64;
    Cpu { user: per(after.0 - before.0), system: per(after.1 - before.1) }
}

/// A child process with its log file, killed and reaped when dropped.
struct Process {
    name: &'static str,
    child: Child,
    log_path: PathBuf,
}

impl Process {
    fn spawn(name: &'static str, command: &mut Command, log_path: PathBuf) -> Result<Process, String> {
        let log = fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        Ok(Process { name, child, log_path })
    }

    /// Waits until `ready` holds, failing early if the process exits.
    fn wait_ready(&mut self, ready: impl Fn() -> bool) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("{} exited during start-up with {status}; log:\n{}", self.name, self.logs()));
            }
            if ready() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{} not ready after {START_TIMEOUT:?}; log:\n{}", self.name, self.logs()));
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    fn logs(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serves_ok(addr: SocketAddr) -> bool {
    matches!(http_get(addr, "/"), Ok((200, _)))
}

/// A proxy process other than the sidecar, listening on `addr`, with its files in `_dir`.
struct Proxy {
    process: Process,
    addr: SocketAddr,
    _dir: TempDir,
}

impl Proxy {
    /// nginx as a keep-alive reverse proxy to `upstream`, everything it writes inside its own
    /// directory. One process serves (no master): killing the child stops nginx, with no worker
    /// left behind to hold the port.
    fn nginx(nginx: &Path, upstream: SocketAddr) -> Result<Proxy, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let d = dir.path().display();
        let config = format!(
            r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log stderr;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream backend {{
        server {upstream};
        keepalive 64;
    }}
    server {{
        listen {addr};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"#
        );
        let config_path = dir.path().join("nginx.conf");
        fs::write(&config_path, config).map_err(|e| format!("{}: {e}", config_path.display()))?;
        let mut command = Command::new(nginx);
        command.arg("-p").arg(dir.path()).arg("-c").arg(&config_path).args(["-e", "stderr"]);
        let mut process = Process::spawn("nginx", &mut command, dir.path().join("nginx.log"))?;
        process.wait_ready(|| serves_ok(addr))?;
        Ok(Proxy { process, addr, _dir: dir })
    }

    /// `sluice-relay` from this listener to `upstream`.
    fn relay(binary: &Path, upstream: SocketAddr) -> Result<Proxy, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut command = Command::new(binary);
        command.args(["--addr", &addr.to_string(), "--upstream", &upstream.to_string()]);
        let mut process = Process::spawn("sluice-relay", &mut command, dir.path().join("relay.log"))?;
        process.wait_ready(|| serves_ok(addr))?;
        Ok(Proxy { process, addr, _dir: dir })
    }
}

struct Sidecar {
    process: Process,
    listener: SocketAddr,
    _dir: TempDir,
}

impl Sidecar {
    /// The sidecar with one listener, one upstream and one rate rule leased from `server`; ready
    /// once `/ready` answers 200 and it has proxied one request.
    fn start(binary: &Path, server: SocketAddr, upstream: SocketAddr) -> Result<Sidecar, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        let listener = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        // The lease follows the measured load with 10% headroom; a deep bucket absorbs the swings of
        // a closed-loop load between refreshes, so that the rule admits every request yet charges it.
        let config = SidecarConfig::proxy(
            Listener::new("bench", listener),
            Upstream::new("backend", format!("http://{upstream}")),
        )
        .leasing_from([server])
        .resource(Resource::new("bench").kind(Kind::Rate).burst(1e9))
        .rule(Rule::charging("bench").on_limit(OnLimit::Reject));
        let config_path = dir.path().join("sidecar.yaml");
        fs::write(&config_path, config.yaml()).map_err(|e| format!("{}: {e}", config_path.display()))?;
        let mut command = Command::new(binary);
        command.arg("--config").arg(&config_path).args(["--admin-addr", &admin.to_string(), "--worker-threads", "1"]);
        let mut process = Process::spawn("sluice-sidecar", &mut command, dir.path().join("sidecar.log"))?;
        process.wait_ready(|| matches!(http_get(admin, "/ready"), Ok((200, _))))?;
        if !serves_ok(listener) {
            return Err(format!("the sidecar does not proxy GET / with 200; log:\n{}", process.logs()));
        }
        Ok(Sidecar { process, listener, _dir: dir })
    }
}

#[cfg(test)]
mod tests;
