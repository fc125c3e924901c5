//! The sidecar's protection of its listeners (SPEC §4.1): a slow request head and an idle
//! connection are closed, an oversized head is refused, and connections beyond
//! `max_connections` wait for a slot. Raw TCP, so that the client does exactly what each case
//! needs. Times are asserted to an order of magnitude only.

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use sluice_tests::{
    harness::{Sidecar, free_port},
    upstream::UpstreamProcess,
};

/// A standalone sidecar with one listener, its limits set by `limits` (YAML keys of the
/// listener), forwarding to a test upstream with a rule far above any test load.
fn sidecar(upstream: &UpstreamProcess, limits: &str) -> (Sidecar, SocketAddr) {
    let listen: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let config = format!(
        "listeners:\n  - name: app\n    address: {listen}\n    upstream: app\n    {limits}\n\
         upstreams:\n  - name: app\n    url: http://{}\n\
         resources:\n  - id: everything\n    capacity: 1000000\n\
         rules:\n  - resource: everything\n",
        upstream.addr()
    );
    (Sidecar::builder().config(&config).start_sidecar(), listen)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    stream
}

const GET: &[u8] = b"GET /echo HTTP/1.1\r\nhost: app\r\n\r\n";

/// Reads one response head and its `content-length` body; returns the status code.
fn response(stream: &mut TcpStream) -> u16 {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).expect("read a response");
        assert!(n > 0, "closed before a whole response: {:?}", String::from_utf8_lossy(&bytes));
        bytes.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let Some(end) = text.find("\r\n\r\n") else { continue };
        let length = text[..end]
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
            .unwrap_or(0usize);
        if bytes.len() >= end + 4 + length {
            return text[9..12].parse().expect("a status code");
        }
    }
}

/// Waits until the sidecar closes `stream`; returns how long that took. Anything it sends
/// first (such as a 408) is read and dropped.
fn closed_after(stream: &mut TcpStream) -> Duration {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return start.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return start.elapsed(),
            Err(e) => panic!("the connection stayed open ({e}) after {:?}", start.elapsed()),
        }
    }
}

#[test]
fn a_request_head_that_does_not_arrive_in_time_closes_the_connection() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(&upstream, "header_read_timeout: 1s");
    let mut stream = connect(listen);
    stream.write_all(b"GET /echo HTTP/1.1\r\nhost: app\r\n").unwrap();
    let after = closed_after(&mut stream);
    assert!(after >= Duration::from_millis(500) && after < Duration::from_secs(10), "closed after {after:?}");
}

#[test]
fn an_idle_keep_alive_connection_is_closed() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(&upstream, "idle_timeout: 1s");
    let mut stream = connect(listen);
    stream.write_all(GET).unwrap();
    assert_eq!(response(&mut stream), 200);
    let after = closed_after(&mut stream);
    assert!(after >= Duration::from_millis(500) && after < Duration::from_secs(10), "closed after {after:?}");
}

#[test]
fn an_oversized_request_head_is_refused() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(&upstream, "max_header_bytes: 4096");
    let mut stream = connect(listen);
    let big = format!("GET /echo HTTP/1.1\r\nhost: app\r\nx-big: {}\r\n\r\n", "a".repeat(16 * 1024));
    // The sidecar may stop reading and close before the whole head is written.
    let _ = stream.write_all(big.as_bytes());
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 431"), "{answer}");
    // A head within the limit on a new connection still passes.
    let mut stream = connect(listen);
    stream.write_all(GET).unwrap();
    assert_eq!(response(&mut stream), 200);
}

#[test]
fn connections_beyond_the_limit_wait_for_a_slot() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(&upstream, "max_connections: 1");
    let mut first = connect(listen);
    first.write_all(GET).unwrap();
    assert_eq!(response(&mut first), 200);
    // The first connection is kept alive: the second is accepted by the kernel but not served.
    let mut second = connect(listen);
    second.write_all(GET).unwrap();
    second.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut buf = [0u8; 1];
    let waiting = second.read(&mut buf);
    assert!(
        matches!(&waiting, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "{waiting:?}"
    );
    // Closing the first frees the slot, and the second is served.
    drop(first);
    second.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    assert_eq!(response(&mut second), 200);
}
