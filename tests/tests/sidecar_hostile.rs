//! The sidecar against peers that do not play fair: clients that declare absurd costs, stop
//! reading or leave mid-answer, upstreams that drop requests, stall mid-body or frame their
//! answers wrongly. Raw sockets on both sides, so that each peer does exactly what its case
//! needs and the upstream's view is the exact bytes it received.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        Arc, Barrier,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_tests::{
    config::{ConfigFile, Cost, Kind, Listener, OnLimit, Resource, Rule, SidecarConfig, Upstream},
    harness::{Sidecar, run, standalone_sidecar},
    raw::{Connection, RawUpstream, closed_after, connect, read_all, response},
    upstream::{
        UpstreamProcess,
        echo::{EchoRequest, echo_client::EchoClient},
    },
    wait::{eventually_blocking, lazily},
};
use tonic::Code;

/// A standalone sidecar in front of `upstream`, charging every request to `resource` by `rule`.
fn start(upstream: SocketAddr, resource: Resource, rule: Rule) -> (Sidecar, SocketAddr) {
    standalone_sidecar(Listener::app(), Upstream::app(upstream), resource, rule)
}

/// The one resource a sidecar here has.
fn r() -> Resource {
    Resource::new("r")
}

/// One concurrency permit, refused at once beyond it.
fn one_at_a_time() -> Resource {
    r().kind(Kind::Concurrency).capacity(1.0)
}

fn reject() -> Rule {
    Rule::charging("r").on_limit(OnLimit::Reject)
}

/// `GET path` on a connection of its own: the status code, or 0 if the connection closed
/// without an answer.
fn status(listen: SocketAddr, path: &str, headers: &str) -> u16 {
    let mut stream = connect(listen);
    let request = format!("GET {path} HTTP/1.1\r\nhost: app\r\n{headers}connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let answer = read_all(&mut stream);
    answer.get(9..12).and_then(|code| code.parse().ok()).unwrap_or(0)
}

/// Asks for `path` until it is answered 200: how long that took.
fn admitted(listen: SocketAddr, path: &str, what: &str) -> Duration {
    eventually_blocking(lazily(|| format!("{what}: still answered {}", status(listen, path, ""))), || {
        status(listen, path, "") == 200
    })
}

/// Answers every request 200 with a small body, keeping the connection.
fn answer_ok(mut connection: Connection) {
    while connection.read_head().is_some() {
        if connection.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_declared_cost_above_what_the_resource_takes_at_once_is_refused() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = start(
        upstream.addr(),
        r().capacity(10.0).burst(2.0),
        reject().cost(Cost::Header { header: "x-cost".into(), default: None }),
    );
    let cost = |value: &str| status(listen, "/echo", &format!("x-cost: {value}\r\n"));
    // 1e300 on a full bucket: refused as a bad request, charged nowhere. So the burst still
    // passes, and the next is refused with its Retry-After (that computation once panicked,
    // the resource in debt for ever, and the connection dropped without an answer).
    let statuses = [cost("1e300"), cost("2"), cost("1")];
    assert_eq!(statuses, [400, 200, 429]);
    let mut stream = connect(listen);
    stream.write_all(b"GET /echo HTTP/1.1\r\nhost: app\r\nx-cost: 3\r\nconnection: close\r\n\r\n").unwrap();
    let answer = read_all(&mut stream);
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("declared cost 3 is above the 2 that rule"),
        "{answer}"
    );

    let mut grpc = EchoClient::connect(format!("http://{listen}")).await.unwrap();
    let mut call = tonic::Request::new(EchoRequest::default());
    call.metadata_mut().insert("x-cost", "1e300".parse().unwrap());
    let refused = grpc.unary(call).await.expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
}

#[test]
fn a_tiny_capacity_refuses_with_a_bounded_retry_after() {
    let upstream = RawUpstream::start(answer_ok);
    let (_sidecar, listen) = start(upstream.addr(), r().capacity(1e-25).burst(1.0), reject());
    assert_eq!(status(listen, "/", ""), 200, "the bucket starts full");
    // The next token is 1e25 s away: more than a Duration holds, which once panicked.
    for _ in 0..2 {
        let mut stream = connect(listen);
        stream.write_all(b"GET / HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n").unwrap();
        let answer = read_all(&mut stream);
        assert!(answer.starts_with("HTTP/1.1 429"), "{answer:?}");
        let retry_after: u64 = answer
            .lines()
            .find_map(|l| l.strip_prefix("retry-after: "))
            .and_then(|v| v.trim().parse().ok())
            .expect("a Retry-After");
        assert_eq!(retry_after, 86_400, "a day at most");
    }
}

#[test]
fn a_max_wait_no_clock_can_hold_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sidecar.yaml");
    let years = Duration::from_secs(300_000_000_000 * 31_557_600);
    let rule = Rule::charging("r").on_limit(OnLimit::Delay).max_wait(years);
    let nowhere = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let config = SidecarConfig::proxy(Listener::new("app", nowhere(1)), Upstream::app(nowhere(2)))
        .resource(r().capacity(1.0))
        .rule(rule);
    std::fs::write(&path, config.yaml()).unwrap();
    let out = run("sluice-sidecar", &["--config", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("rules[0] (rules[0]).max_wait: must be at most 1day"), "{stderr}");
}

#[test]
fn a_request_an_upstream_drops_is_retried_once_at_most() {
    const POOLED: usize = 50;
    let dropping = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let together = Arc::new(Barrier::new(POOLED));
    let upstream = RawUpstream::start({
        let dropping = dropping.clone();
        move |mut connection| {
            while connection.read_head().is_some() {
                if dropping.load(Ordering::SeqCst) {
                    return; // closed without an answer
                }
                // The first requests are held until all have come, each on a connection of its own.
                if answered.fetch_add(1, Ordering::SeqCst) < POOLED {
                    together.wait();
                }
                if connection.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").is_err() {
                    return;
                }
            }
        }
    });
    let (_sidecar, listen) = start(upstream.addr(), r().capacity(1e6), Rule::charging("r"));
    let clients: Vec<_> = (0..POOLED).map(|_| thread::spawn(move || status(listen, "/pool", ""))).collect();
    for client in clients {
        assert_eq!(client.join().unwrap(), 200);
    }
    assert_eq!(upstream.received().len(), POOLED, "one connection each, now idle in the pool");

    dropping.store(true, Ordering::SeqCst);
    assert_eq!(status(listen, "/dropped", ""), 502);
    assert_eq!(upstream.requests("GET /dropped"), 2, "the request and one retry (RFC 9110 §9.2.2)");
    // A POST is not idempotent: never retried once the upstream may have seen it.
    let mut stream = connect(listen);
    stream.write_all(b"POST /posted HTTP/1.1\r\nhost: app\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").unwrap();
    assert_eq!(response(&mut stream), 502);
    assert_eq!(upstream.requests("POST /posted"), 1);
}

#[test]
fn a_client_that_stops_reading_its_answer_is_cut_off_and_frees_its_permit() {
    let upstream = RawUpstream::start(|mut connection| {
        while let Some(head) = connection.read_head() {
            if head.starts_with("GET /big") {
                // Far more than the socket buffers between here and the client hold.
                let _ = connection.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1073741824\r\n\r\n");
                let piece = vec![b'x'; 64 * 1024];
                while connection.write(&piece).is_ok() {}
                return;
            }
            if connection.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").is_err() {
                return;
            }
        }
    });
    let (_sidecar, listen) = standalone_sidecar(
        Listener::app().send_timeout(Duration::from_secs(3)),
        Upstream::app(upstream.addr()),
        one_at_a_time(),
        reject(),
    );
    let mut reader = connect(listen);
    reader.write_all(b"GET /big HTTP/1.1\r\nhost: app\r\n\r\n").unwrap();
    let mut head = [0u8; 1024];
    reader.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&head));
    // It reads no more: its answer holds the one permit until the send timeout cuts it off.
    assert_eq!(status(listen, "/small", ""), 429);
    let took = admitted(listen, "/small", "the stalled reader's permit");
    assert!(took >= Duration::from_secs(1), "freed after {took:?}, before the send timeout");
    closed_after(&mut reader);
}

#[tokio::test]
async fn an_http2_stream_given_no_window_is_reset_and_frees_its_permit() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = standalone_sidecar(
        Listener::app().send_timeout(Duration::from_secs(3)),
        Upstream::app(upstream.addr()),
        one_at_a_time(),
        reject(),
    );
    let tcp = tokio::net::TcpStream::connect(listen).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = http::Request::get(format!("http://{listen}/echo")).body(Full::<Bytes>::default()).unwrap();
    let answer = sender.send_request(request).await.unwrap();
    assert_eq!(answer.status(), 200);
    // No byte of its body can come: it holds the one permit until the send timeout resets it.
    let refused = tokio::task::spawn_blocking(move || status(listen, "/echo", "")).await.unwrap();
    assert_eq!(refused, 429);
    let took = tokio::task::spawn_blocking(move || admitted(listen, "/echo", "the zero-window stream's permit"))
        .await
        .unwrap();
    assert!(took >= Duration::from_secs(1), "freed after {took:?}, before the send timeout");
    let body = tokio::time::timeout(Duration::from_secs(10), answer.into_body().collect()).await;
    assert!(matches!(body, Ok(Err(_))), "the stream was reset: {body:?}");
}

/// Answers `GET /stall` with the first 10 of 100 bytes, then nothing while the connection stays
/// open; anything else 200.
fn stalling_upstream() -> RawUpstream {
    RawUpstream::start(|mut connection| {
        while let Some(head) = connection.read_head() {
            if head.starts_with("GET /stall") {
                let _ = connection.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789");
                thread::sleep(Duration::from_secs(120));
                return;
            }
            if connection.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").is_err() {
                return;
            }
        }
    })
}

/// Sends `GET /stall` and reads its head and the 10 bytes that come.
fn stalled(listen: SocketAddr) -> TcpStream {
    let mut stream = connect(listen);
    stream.write_all(b"GET /stall HTTP/1.1\r\nhost: app\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"0123456789") {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    stream
}

#[test]
fn a_client_that_leaves_a_stalled_answer_frees_its_permit_at_once() {
    let upstream = stalling_upstream();
    let (_sidecar, listen) = start(upstream.addr(), one_at_a_time(), reject());
    let client = stalled(listen);
    assert_eq!(status(listen, "/small", ""), 429, "the stalled answer holds the permit");
    drop(client);
    // Default timeouts are minutes long: the departure itself must free it.
    let took = admitted(listen, "/small", "the departed client's permit");
    assert!(took < Duration::from_secs(10), "freed after {took:?}: by a timeout, not the departure");
}

#[test]
fn an_upstream_body_that_stalls_is_cut_after_its_idle_timeout() {
    let upstream = stalling_upstream();
    let (_sidecar, listen) = standalone_sidecar(
        Listener::app(),
        Upstream::app(upstream.addr()).body_idle_timeout(Duration::from_secs(1)),
        one_at_a_time(),
        reject(),
    );
    let mut client = stalled(listen);
    let after = closed_after(&mut client);
    assert!(after >= Duration::from_millis(500) && after < Duration::from_secs(10), "closed after {after:?}");
    assert_eq!(status(listen, "/small", ""), 200, "the permit went with the answer");
}

#[test]
fn an_http_1_0_response_with_transfer_encoding_is_refused_and_its_connection_closed() {
    let upstream = RawUpstream::start(|mut connection| {
        while connection.read_head().is_some() {
            let answer = "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n\
                          5\r\nhello\r\n0\r\n\r\n";
            if connection.write(answer.as_bytes()).is_err() {
                return;
            }
        }
    });
    let (_sidecar, listen) = start(upstream.addr(), r().capacity(1e6), Rule::charging("r"));
    let statuses = [status(listen, "/first", ""), status(listen, "/second", "")];
    // RFC 9112 §6.1: HTTP/1.0 has no transfer codings, so the framing is faulty: refused, and
    // the connection it came on carries nothing more.
    assert_eq!(statuses, [502, 502]);
    let per_connection: Vec<usize> = upstream.received().iter().map(|r| r.matches("GET /").count()).collect();
    assert_eq!(per_connection, [1, 1], "one request per upstream connection");
}
