//! Costs in bytes through the real sidecar: `request_bytes` charged up front by Content-Length
//! (HTTP/1.1 and HTTP/2) up to the rule's bound and metered as it streams above it, a streamed
//! upload paced to the rate in `delay` mode (HTTP/1.1 chunked on a raw socket, and a gRPC client
//! stream over HTTP/2), and `response_bytes` leaving debt no deeper than the rule's bound, which
//! later requests wait out or are refused for.

use std::{
    io::Write,
    net::SocketAddr,
    sync::mpsc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::Full;
use prost::Message;
use sluice_tests::{
    config::{Body, Cost, Listener, Match, OnLimit, PathMatch, Resource, Rule, SidecarConfig, Upstream},
    harness::Sidecar,
    http::{Answer, HttpClient, h2c, http1, send},
    raw::{self, RawUpstream},
    upstream::{
        UpstreamProcess,
        echo::{EchoRequest, echo_client::EchoClient},
    },
};

/// A standalone sidecar in front of `upstream` with these `resources` and `rules`: the sidecar
/// and its listener.
fn sidecar(
    upstream: SocketAddr,
    resources: impl IntoIterator<Item = Resource>,
    rules: impl IntoIterator<Item = Rule>,
) -> (Sidecar, SocketAddr) {
    let mut config = SidecarConfig::proxy(Listener::app(), Upstream::app(upstream));
    for resource in resources {
        config = config.resource(resource);
    }
    for rule in rules {
        config = config.rule(rule);
    }
    let sidecar = Sidecar::launch(&config).start();
    let listen = sidecar.listen();
    (sidecar, listen)
}

/// A resource of `capacity` bytes a second, `burst` deep.
fn byte_rate(id: &str, capacity: f64, burst: f64) -> Resource {
    Resource::new(id).capacity(capacity).burst(burst)
}

/// A rule charging `resource` the bytes of `body`.
fn charging_bytes(resource: &str, body: Body) -> Rule {
    Rule::charging(resource).cost(Cost::Bytes(body))
}

fn delaying(rule: Rule, max_wait: Duration) -> Rule {
    rule.on_limit(OnLimit::Delay).max_wait(max_wait)
}

/// [`sidecar`] in front of a fresh test upstream, which it returns first.
fn standalone(
    resources: impl IntoIterator<Item = Resource>,
    rules: impl IntoIterator<Item = Rule>,
) -> (UpstreamProcess, Sidecar, SocketAddr) {
    let upstream = UpstreamProcess::start(None);
    let (sidecar, listen) = sidecar(upstream.addr(), resources, rules);
    (upstream, sidecar, listen)
}

async fn post(client: &HttpClient, url: &str, bytes: usize) -> Answer {
    let request = http::Request::post(url).body(Full::new(Bytes::from(vec![b'x'; bytes]))).unwrap();
    send(client, request, Duration::from_secs(10)).await.unwrap_or_else(|| panic!("no answer to POST {url}"))
}

async fn get(client: &HttpClient, url: &str, header: Option<(&str, &str)>) -> Answer {
    let mut request = http::Request::get(url);
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    let request = request.body(Full::default()).unwrap();
    send(client, request, Duration::from_secs(10)).await.unwrap_or_else(|| panic!("no answer to GET {url}"))
}

/// The bytes the echo upstream says it received in the request body.
fn echoed(answer: &Answer) -> usize {
    let json: serde_json::Value = serde_json::from_str(&answer.body).expect("the echo's JSON");
    json["body"].as_str().expect("a body").len()
}

#[tokio::test]
async fn a_known_length_is_charged_up_front_over_http1_and_http2() {
    // 1000 bytes a second with 10,000 saved: two bodies of 4000 pass at once, a third does not.
    let prefix = |p: &str| Match::default().path(PathMatch::Prefix(p.into()));
    let (_upstream, sidecar, addr) = standalone(
        [byte_rate("h1", 1000.0, 10_000.0), byte_rate("h2", 1000.0, 10_000.0)],
        [
            charging_bytes("h1", Body::Request).name("uploads").matching(prefix("/echo/h1")).max_cost(10_000.0),
            delaying(
                charging_bytes("h2", Body::Request).name("delayed").matching(prefix("/echo/h2")),
                Duration::from_secs(5),
            ),
        ],
    );
    let client = http1();
    let url = format!("http://{addr}/echo/h1");
    for _ in 0..2 {
        let answer = post(&client, &url, 4000).await;
        assert_eq!((answer.status.as_u16(), echoed(&answer)), (200, 4000));
    }
    let refused = post(&client, &url, 4000).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.headers["retry-after"], "2", "2000 bytes short at 1000 a second");
    assert!(refused.body.contains("resource \"h1\""), "{}", refused.body);
    // A body of no length costs nothing, and the bucket is not in debt.
    assert_eq!(get(&client, &url, None).await.status, 200);
    // A length above max_cost is metered as it streams, as a body of unknown length is: admitted
    // on a bucket not in debt and, in reject mode, charged after the fact, into debt (2000 less
    // 10,001: about 8 s of the rate).
    let large = post(&client, &url, 10_001).await;
    assert_eq!((large.status.as_u16(), echoed(&large)), (200, 10_001), "{}", large.body);
    let in_debt = get(&client, &url, None).await;
    assert_eq!(in_debt.status, 429, "{}", in_debt.body);
    let retry: u64 = in_debt.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((7..=9).contains(&retry), "about 8001 bytes of debt at 1000 a second: {retry}");

    // HTTP/2 declares the length too; in delay mode the third body waits for its bytes.
    let client = h2c();
    let url = format!("http://{addr}/echo/h2");
    for _ in 0..2 {
        let answer = post(&client, &url, 4000).await;
        assert_eq!((answer.status.as_u16(), echoed(&answer)), (200, 4000));
        assert!(answer.body.contains("HTTP/2"), "{}", answer.body);
    }
    let start = Instant::now();
    let answer = post(&client, &url, 4000).await;
    let waited = start.elapsed();
    assert_eq!((answer.status.as_u16(), echoed(&answer)), (200, 4000));
    assert!(waited > Duration::from_millis(1700) && waited < Duration::from_millis(2800), "waited {waited:?}");
    // Above the defaulted bound, the burst, a body is paced as it streams: here its first piece,
    // a whole burst, could not have its turn within max_wait (it is 10 s of the rate).
    let paced = post(&client, &url, 10_001).await;
    assert_eq!(paced.status, 429, "{}", paced.body);
    assert_eq!(sidecar.metric("sluice_sidecar_admitted_cost_total{resource=\"h1\"}"), Some(18_001.0));
    assert_eq!(sidecar.metric("sluice_sidecar_admitted_cost_total{resource=\"h2\"}"), Some(12000.0));
}

/// Bytes a second of the paced uploads, and their buckets: 0.1 s of the rate, by default.
const RATE: f64 = 200_000.0;
const BURST: f64 = RATE / 10.0;

/// The rate a paced upload of `bytes` went at when it took `took`: what came after the bucket's
/// content, over the time; printed, and checked within 5% of [`RATE`].
fn check_pace(what: &str, bytes: usize, took: Duration) {
    let rate = (bytes as f64 - BURST) / took.as_secs_f64();
    println!("{what}: {bytes} bytes in {took:?}: {rate:.0} bytes/s paced, lease {RATE} (x{:.4})", rate / RATE);
    assert!((rate / RATE - 1.0).abs() < 0.05, "{what}: {rate:.0} bytes/s is not within 5% of {RATE}");
}

/// A sidecar that paces uploads to [`RATE`] in front of `upstream`.
fn paced(upstream: SocketAddr) -> (Sidecar, SocketAddr) {
    sidecar(
        upstream,
        [Resource::new("uploads").capacity(RATE)],
        [delaying(charging_bytes("uploads", Body::Request), Duration::from_secs(1))],
    )
}

#[tokio::test]
async fn a_chunked_upload_is_paced_to_the_rate() {
    // The upstream times the body from its head to its last chunk, and counts its bytes.
    let (arrived, timed) = mpsc::channel();
    let upstream = RawUpstream::start(move |mut connection| {
        connection.read_head().expect("a request head");
        let head_at = Instant::now();
        let body = connection.read_until(b"0\r\n\r\n").expect("the whole body");
        let took = head_at.elapsed();
        connection.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").unwrap();
        arrived.send((took, body.iter().filter(|&&b| b == b'x').count())).unwrap();
    });
    let (sidecar, addr) = paced(upstream.addr());
    // 5 s of the rate after the bucket's content, in chunks of 4 KiB as fast as the socket takes.
    let total = (BURST + 5.0 * RATE) as usize;
    let status = tokio::task::spawn_blocking(move || {
        let mut stream = raw::connect(addr);
        stream.write_all(b"POST /upload HTTP/1.1\r\nhost: app\r\ntransfer-encoding: chunked\r\n\r\n").unwrap();
        let chunk = [b'x'; 4096];
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk.len());
            write!(stream, "{n:x}\r\n").unwrap();
            stream.write_all(&chunk[..n]).unwrap();
            stream.write_all(b"\r\n").unwrap();
            left -= n;
        }
        stream.write_all(b"0\r\n\r\n").unwrap();
        raw::response(&mut stream)
    })
    .await
    .unwrap();
    assert_eq!(status, 200);
    let (took, received) = timed.recv_timeout(Duration::from_secs(5)).expect("the upstream's timing");
    assert_eq!(received, total, "the whole body went upstream");
    check_pace("HTTP/1.1 chunked", total, took);
    let charged = sidecar.metric("sluice_sidecar_admitted_cost_total{resource=\"uploads\"}");
    assert_eq!(charged, Some(total as f64), "every byte is counted");
}

#[tokio::test]
async fn a_grpc_client_stream_over_http2_is_paced_to_the_rate() {
    let upstream = UpstreamProcess::start(None);
    let (sidecar, addr) = paced(upstream.addr());
    // 2 s of the rate after the bucket's content, in messages of 4000 bytes; gRPC sends no
    // length, so the stream is metered as it goes.
    let message = EchoRequest { message: "x".repeat(4000), ..Default::default() };
    let count = ((BURST + 2.0 * RATE) / message.encoded_len() as f64).ceil() as usize;
    // Each message goes as a 5-byte prefix and its encoding, which are what DATA frames carry.
    let total = count * (5 + message.encoded_len());
    let mut client = EchoClient::connect(format!("http://{addr}")).await.unwrap();
    let start = Instant::now();
    let reply = client.client_stream(tokio_stream::iter(vec![message; count])).await.expect("the call").into_inner();
    let took = start.elapsed();
    assert_eq!((reply.index as usize, reply.message.len()), (count, count * 4000));
    check_pace("gRPC client stream", total, took);
    let charged = sidecar.metric("sluice_sidecar_admitted_cost_total{resource=\"uploads\"}");
    assert_eq!(charged, Some(total as f64), "every byte is counted");
}

#[tokio::test]
async fn a_response_leaves_bounded_debt_that_later_requests_wait_out() {
    // 1000 bytes a second; a response's bytes may leave at most 2000 of debt (2 s to repay).
    let downloads = || charging_bytes("downloads", Body::Response).max_cost(2000.0);
    let (_upstream, sidecar, addr) = standalone(
        [byte_rate("downloads", 1000.0, 1000.0)],
        [delaying(downloads().matching(Match::default().header("x-wait", "yes")), Duration::from_secs(5)), downloads()],
    );
    let mut charged = 0;
    for (protocol, client) in [("HTTP/1.1", http1()), ("HTTP/2", h2c())] {
        // The echo of 20 KB, 20 s of the rate: admitted on an empty debt, charged as it flows.
        let big = post(&client, &format!("http://{addr}/echo"), 20_000).await;
        assert_eq!(big.status, 200, "{protocol}");
        assert!(big.body.len() > 20_000, "{protocol}: {}", big.body.len());
        charged += big.body.len();
        let url = format!("http://{addr}/");
        let refused = get(&client, &url, None).await;
        assert_eq!(refused.status, 429, "{protocol}: {}", refused.body);
        assert_eq!(refused.headers["retry-after"], "2", "{protocol}: the debt is bounded at 2000 bytes");
        let start = Instant::now();
        let waited = get(&client, &url, Some(("x-wait", "yes"))).await;
        let waited_for = start.elapsed();
        assert_eq!(waited.status, 200, "{protocol}");
        assert!(
            waited_for > Duration::from_millis(1700) && waited_for < Duration::from_millis(2800),
            "{protocol}: waited {waited_for:?} for 2000 bytes of debt"
        );
        charged += waited.body.len();
    }
    let counted = sidecar.metric("sluice_sidecar_admitted_cost_total{resource=\"downloads\"}");
    assert_eq!(counted, Some(charged as f64), "every byte that flowed back is counted");
}

#[tokio::test]
async fn a_paced_body_whose_turn_is_beyond_max_wait_is_refused() {
    // Pieces of at most the burst, 5000 bytes, which take 5 s to earn: past max_wait.
    let (_upstream, _sidecar, addr) = standalone(
        [byte_rate("uploads", 1000.0, 5000.0)],
        [delaying(charging_bytes("uploads", Body::Request).name("paced"), Duration::from_secs(1))],
    );
    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = raw::connect(addr);
        let chunk = [b'x'; 20_000];
        stream.write_all(b"POST /echo HTTP/1.1\r\nhost: app\r\ntransfer-encoding: chunked\r\n\r\n").unwrap();
        write!(stream, "{:x}\r\n", chunk.len()).unwrap();
        stream.write_all(&chunk).unwrap();
        stream.write_all(b"\r\n0\r\n\r\n").unwrap();
        raw::read_all(&mut stream)
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    // Up to 5000 bytes short, as the body was read in pieces.
    let retry_after: u64 =
        answer.split("retry-after: ").nth(1).and_then(|v| v.split("\r\n").next()?.parse().ok()).unwrap();
    assert!((2..=5).contains(&retry_after), "{answer}");
    assert!(answer.contains("resource \"uploads\" is over its capacity (rule \"paced\")"), "{answer}");

    // Over HTTP/2 the upstream's stream is reset; the call is answered as a refused one.
    let mut client = EchoClient::connect(format!("http://{addr}")).await.unwrap();
    let messages = vec![EchoRequest { message: "x".repeat(4000), ..Default::default() }; 5];
    let status = client.client_stream(tokio_stream::iter(messages)).await.expect_err("cut off");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
}

#[tokio::test]
async fn a_streamed_body_in_reject_mode_passes_and_leaves_bounded_debt() {
    // 1000 bytes a second; a body streamed past the bucket leaves at most 3000 of debt.
    let (_upstream, _sidecar, addr) =
        standalone([byte_rate("uploads", 1000.0, 1000.0)], [charging_bytes("uploads", Body::Request).max_cost(3000.0)]);
    let upload = move || {
        let mut stream = raw::connect(addr);
        stream
            .write_all(b"POST /echo HTTP/1.1\r\nhost: app\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n")
            .unwrap();
        stream.write_all(format!("4e20\r\n{}\r\n0\r\n\r\n", "x".repeat(20_000)).as_bytes()).unwrap();
        raw::read_all(&mut stream)
    };
    let start = Instant::now();
    let answer = tokio::task::spawn_blocking(upload).await.unwrap();
    // Admitted on a bucket not in debt, and never held back: 20 s of the rate in no time.
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(&"x".repeat(20_000)), "the whole body went upstream");
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    let refused = tokio::task::spawn_blocking(upload).await.unwrap();
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(refused.contains("retry-after: 3\r\n"), "the debt is bounded at 3000 bytes: {refused}");
}
