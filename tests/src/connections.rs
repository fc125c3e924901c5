//! `sluice-connections`: many concurrent keep-alive connections to one sidecar. It starts a
//! sidecar (a rule far above the load on every request) in front of `sluice-upstream`, opens N
//! connections (HTTP/1.1 or h2c), sends one request on each and keeps them all open, and reads
//! the sidecar's resident memory and open descriptors before and after: the memory each
//! connection costs.

use std::{
    fs,
    net::SocketAddr,
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_runtime::outln;
use tokio::{net::TcpStream, sync::Semaphore};

use crate::{
    config::{Listener, Resource, Rule, SidecarConfig, Upstream},
    harness::Sidecar,
    upstream::UpstreamProcess,
};

/// Holds N keep-alive connections open through one sidecar and reports its memory per connection.
#[derive(Debug, Parser)]
#[command(name = "sluice-connections")]
pub struct Args {
    /// Connections to open and keep open.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub connections: u64,
    #[arg(long, value_enum, default_value = "http1")]
    pub protocol: Protocol,
    /// Connections being opened or awaiting their answer at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub in_flight: u64,
    /// How long to keep them all open once every one has had its answer, before counting those
    /// still open.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub hold: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    Http1,
    /// HTTP/2 over cleartext, prior knowledge.
    H2,
}

/// The sidecar's resident memory and open descriptors at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub rss_bytes: u64,
    pub fds: u64,
}

impl Usage {
    pub fn of(pid: u32) -> Result<Usage, String> {
        Ok(Usage { rss_bytes: rss_bytes(pid)?, fds: open_fds(pid)? })
    }
}

/// Resident memory from /proc/PID/status (VmRSS).
pub fn rss_bytes(pid: u32) -> Result<u64, String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| format!("process {pid}: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| format!("no VmRSS in /proc/{pid}/status"))
}

/// Open file descriptors: the entries of /proc/PID/fd.
pub fn open_fds(pid: u32) -> Result<u64, String> {
    let entries = fs::read_dir(format!("/proc/{pid}/fd")).map_err(|e| format!("process {pid}: {e}"))?;
    Ok(entries.count() as u64)
}

/// Raises this process's soft limit on open files to its hard limit (children inherit it), with
/// util-linux's `prlimit`, and returns the limit in force.
pub fn raise_fd_limit() -> Result<u64, String> {
    let limits = fs::read_to_string("/proc/self/limits").map_err(|e| format!("/proc/self/limits: {e}"))?;
    let line =
        limits.lines().find(|l| l.starts_with("Max open files")).ok_or("no open-file limit in /proc/self/limits")?;
    let mut numbers = line["Max open files".len()..].split_whitespace();
    let (soft, hard) = (numbers.next().unwrap_or_default(), numbers.next().unwrap_or_default());
    if soft == hard {
        return hard.parse().map_err(|_| format!("open-file limit {hard:?}"));
    }
    let status = Command::new("prlimit")
        .args(["--pid", &std::process::id().to_string(), &format!("--nofile={hard}:{hard}")])
        .status()
        .map_err(|e| format!("prlimit (util-linux): {e}"))?;
    if !status.success() {
        return Err(format!("prlimit could not raise the open-file limit from {soft} to {hard}"));
    }
    hard.parse().map_err(|_| format!("open-file limit {hard:?}"))
}

/// What a run found.
#[derive(Debug)]
pub struct Report {
    pub connections: u64,
    /// Connections that got a 200.
    pub served: u64,
    /// Connections still open after the hold.
    pub open_after_hold: u64,
    pub before: Usage,
    pub after: Usage,
    /// Time to open and serve them all.
    pub ramp: Duration,
}

impl Report {
    pub fn bytes_per_connection(&self) -> f64 {
        self.after.rss_bytes.saturating_sub(self.before.rss_bytes) as f64 / self.connections as f64
    }

    pub fn fds_per_connection(&self) -> f64 {
        self.after.fds.saturating_sub(self.before.fds) as f64 / self.connections as f64
    }
}

/// One client connection, kept open by holding its sender.
enum Open {
    Http1(http1::SendRequest<Empty<Bytes>>),
    H2(http2::SendRequest<Empty<Bytes>>),
}

impl Open {
    fn is_closed(&self) -> bool {
        match self {
            Open::Http1(send) => send.is_closed(),
            Open::H2(send) => send.is_closed(),
        }
    }
}

/// Connects, sends `GET /` and reads the answer; the connection stays open.
async fn open(addr: SocketAddr, protocol: Protocol) -> Result<Open, String> {
    let stream = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let io = TokioIo::new(stream);
    let request = || http::Request::get("/").header(http::header::HOST, "app").body(Empty::new());
    let (open, response) = match protocol {
        Protocol::Http1 => {
            let (mut send, connection) = http1::handshake(io).await.map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(connection);
            let response = send.send_request(request().expect("a valid request")).await;
            (Open::Http1(send), response)
        }
        Protocol::H2 => {
            let (mut send, connection) =
                http2::handshake(TokioExecutor::new(), io).await.map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(connection);
            let response = send.send_request(request().expect("a valid request")).await;
            (Open::H2(send), response)
        }
    };
    let response = response.map_err(|e| format!("request: {e}"))?;
    let status = response.status();
    response.into_body().collect().await.map_err(|e| format!("body: {e}"))?;
    if status != http::StatusCode::OK {
        return Err(format!("status {status}"));
    }
    Ok(open)
}

fn config(upstream: SocketAddr, connections: u64) -> SidecarConfig {
    // Room above the connections under test; an idle timeout the hold cannot reach.
    let listener = Listener::app().max_connections(connections as usize + 100).idle_timeout(Duration::from_secs(3600));
    SidecarConfig::proxy(listener, Upstream::app(upstream))
        .resource(Resource::new("everything").capacity(1e9))
        .rule(Rule::charging("everything"))
}

/// Starts the upstream and sidecar, opens and holds the connections, and measures.
pub async fn measure(args: &Args) -> Result<Report, String> {
    let limit = raise_fd_limit()?;
    // This process holds one descriptor per connection, and so does the sidecar, plus its pool
    // toward the upstream (at most one per request in flight).
    let needed = args.connections + args.in_flight + 100;
    if limit < needed {
        return Err(format!(
            "{} connections need an open-file limit of at least {needed}; the hard limit is {limit} (raise `ulimit -Hn`)",
            args.connections
        ));
    }
    let upstream = UpstreamProcess::launch(&crate::harness::binary("sluice-upstream"), &[] as &[&str])?;
    let sidecar = tokio::task::block_in_place(|| {
        Sidecar::launch(&config(upstream.addr(), args.connections)).args(["--log", "warn"]).start()
    });
    let listen = sidecar.listen();
    // One request first, so that what starts with the first request (the pool, the limiter's
    // state) is in the baseline; then its connection is gone.
    drop(open(listen, args.protocol).await?);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = Usage::of(sidecar.pid())?;

    let start = Instant::now();
    let slots = Arc::new(Semaphore::new(args.in_flight as usize));
    let tasks: Vec<_> = (0..args.connections)
        .map(|_| {
            let (slots, protocol) = (slots.clone(), args.protocol);
            tokio::spawn(async move {
                let _slot = slots.acquire_owned().await.expect("never closed");
                open(listen, protocol).await
            })
        })
        .collect();
    let mut held = Vec::with_capacity(tasks.len());
    let mut first_error = None;
    for task in tasks {
        match task.await.expect("connection task") {
            Ok(open) => held.push(open),
            Err(e) => drop(first_error.get_or_insert(e)),
        }
    }
    let ramp = start.elapsed();
    tokio::time::sleep(args.hold).await;
    let after = Usage::of(sidecar.pid())?;
    let open_after_hold = held.iter().filter(|c| !c.is_closed()).count() as u64;
    let report =
        Report { connections: args.connections, served: held.len() as u64, open_after_hold, before, after, ramp };
    if let Some(error) = first_error {
        return Err(format!(
            "{} of {} connections failed, the first with: {error}",
            report.connections - report.served,
            report.connections
        ));
    }
    Ok(report)
}

pub async fn run(args: Args) -> Result<(), String> {
    let report = measure(&args).await?;
    let mb = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let _ = outln!(
        "{} {:?} keep-alive connections through one sidecar: {} served in {:.1} s, {} still open after {:?}",
        report.connections,
        args.protocol,
        report.served,
        report.ramp.as_secs_f64(),
        report.open_after_hold,
        args.hold
    );
    let _ = outln!(
        "sidecar RSS {:.1} MB → {:.1} MB, open descriptors {} → {}",
        mb(report.before.rss_bytes),
        mb(report.after.rss_bytes),
        report.before.fds,
        report.after.fds
    );
    let _ = outln!(
        "per connection: {:.0} bytes of RSS, {:.2} descriptors",
        report.bytes_per_connection(),
        report.fds_per_connection()
    );
    if report.open_after_hold < report.connections {
        return Err(format!("{} connections were closed during the hold", report.connections - report.open_after_hold));
    }
    Ok(())
}
