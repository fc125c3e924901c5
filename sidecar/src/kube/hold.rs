//! `sluice-sidecar wait`: holds a classic sidecar's pod until the sidecar is ready, the way
//! Istio's `holdApplicationUntilProxyStarts` does. The classic sidecar is the pod's first
//! container and runs this as its `postStart` hook; the kubelet starts the next container only
//! once the hook returns, so the application's first calls find the sidecar listening.

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    thread,
    time::{Duration, Instant},
};

use sluice_runtime::cli::positive_duration;

use super::inject::ADMIN_PORT;
use crate::defaults::{self, HOLD_POLL_INTERVAL};

/// `sluice-sidecar wait`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The sidecar's admin listener, whose `/ready` says when it is ready; default: the injected
    /// sidecar's, port 9901 of $POD_IP (127.0.0.1 without it).
    #[arg(long)]
    pub admin_addr: Option<SocketAddr>,

    /// How long to wait at most; past it, the application starts all the same (exit 1).
    #[arg(long, value_parser = positive_duration, default_value = defaults::HOLD_TIMEOUT)]
    pub timeout: Duration,
}

/// Waits until `/ready` answers 200: `Ok` with the time it took, else `Err` once `timeout` passed.
pub fn until_ready(args: &Args) -> Result<Duration, String> {
    let admin = args.admin_addr.unwrap_or_else(|| {
        let pod_ip = std::env::var("POD_IP").ok().and_then(|ip| ip.parse().ok());
        SocketAddr::new(pod_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)), ADMIN_PORT)
    });
    let start = Instant::now();
    loop {
        if ready(admin) {
            return Ok(start.elapsed());
        }
        if start.elapsed() >= args.timeout {
            return Err(format!("the sidecar at {admin} was not ready within {:?}", args.timeout));
        }
        thread::sleep(HOLD_POLL_INTERVAL);
    }
}

/// One `GET /ready`: whether it answered 200.
fn ready(admin: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&admin, HOLD_POLL_INTERVAL) else { return false };
    let _ = stream.set_read_timeout(Some(HOLD_POLL_INTERVAL));
    let _ = stream.set_write_timeout(Some(HOLD_POLL_INTERVAL));
    if stream.write_all(b"GET /ready HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    // The status line is all that matters: "HTTP/1.1 200 OK".
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[8..12] == b" 200"
}
