//! The data path's memory budget (docs/sidecar.md, Memory budget) against the worst a caller
//! can send for 30 s: heads of the largest size left unfinished, requests in flight with the
//! largest heads and bodies that never end, HTTP/2 streams with the largest header lists and
//! bodies, responses the caller never reads, more connections than the listener takes and more
//! requests than it lets in flight. The sidecar's memory above what it held before the load
//! stays within `max_connections` × [`PER_CONNECTION`] + `max_requests` × [`PER_REQUEST`], and
//! it still answers an ordinary request.

use std::{
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::Request;
use http_body_util::{Empty, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_tests::{
    config::{Listener, Resource, Rule, Upstream},
    connections::rss_bytes,
    harness::standalone_sidecar,
    http::{get, http1},
    upstream::UpstreamProcess,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// The budget's terms as docs/sidecar.md gives them, for the listener's defaults'
/// `max_header_bytes` (32 KiB).
const PER_CONNECTION: u64 = 100 * 1024;
const PER_REQUEST: u64 = 150 * 1024;

const MAX_CONNECTIONS: u64 = 300;
const MAX_REQUESTS: u64 = 200;
const LOAD: Duration = Duration::from_secs(30);

/// A head of about 31 KiB: the most under the default `max_header_bytes`.
fn padding() -> String {
    (0..30).map(|i| format!("x-pad-{i}: {}\r\n", "p".repeat(1000))).collect()
}

/// Connections that send most of the largest head and never finish it, again when dropped.
async fn unfinished_heads(sidecar: SocketAddr, stop: Arc<AtomicBool>) {
    let head = format!("GET / HTTP/1.1\r\nHost: app\r\n{}", padding());
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut stream) = TcpStream::connect(sidecar).await else { continue };
        if stream.write_all(head.as_bytes()).await.is_ok() {
            let mut buf = [0; 1024];
            let _ = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await;
        }
    }
}

/// HTTP/1.1 requests with the largest head and an endless body, to an upstream that answers
/// in 3 s without reading it.
async fn endless_uploads(sidecar: SocketAddr, stop: Arc<AtomicBool>) {
    let head = format!("POST /slow?ms=3000 HTTP/1.1\r\nHost: app\r\nContent-Length: 1000000000\r\n{}\r\n", padding());
    let chunk = vec![b'b'; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let Ok(stream) = TcpStream::connect(sidecar).await else { continue };
        let (mut read, mut write) = stream.into_split();
        let upload = async {
            write.write_all(head.as_bytes()).await?;
            loop {
                write.write_all(&chunk).await?;
            }
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        };
        let mut buf = vec![0; 16 * 1024];
        tokio::select! {
            _ = upload => {}
            _ = read.read(&mut buf) => {}
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

type Sender<B> = hyper::client::conn::http2::SendRequest<B>;

async fn http2<B>(sidecar: SocketAddr) -> Option<Sender<B>>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(sidecar).await.ok()?;
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.ok()?;
    tokio::spawn(connection);
    Some(sender)
}

/// HTTP/2 streams with the largest header lists and endless bodies, `streams` at once on one
/// connection, again as they end.
async fn http2_uploads(sidecar: SocketAddr, streams: usize, stop: Arc<AtomicBool>) {
    let pads: Vec<(String, String)> = (0..30).map(|i| (format!("x-pad-{i}"), "p".repeat(1000))).collect();
    while !stop.load(Ordering::Relaxed) {
        let Some(sender) = http2(sidecar).await else { continue };
        let calls = (0..streams).map(|_| {
            let (mut sender, pads, stop) = (sender.clone(), pads.clone(), stop.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let chunks = futures_util::stream::repeat_with(|| {
                        Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(&[b'b'; 16 * 1024])))
                    });
                    let mut request = Request::post(format!("http://app{}", "/slow?ms=3000"));
                    for (name, value) in &pads {
                        request = request.header(name, value);
                    }
                    let Ok(request) = request.body(StreamBody::new(chunks)) else { return };
                    if sender.ready().await.is_err() {
                        return;
                    }
                    let answer = tokio::time::timeout(Duration::from_secs(5), sender.send_request(request)).await;
                    if !matches!(answer, Ok(Ok(_))) {
                        return;
                    }
                }
            }
        });
        futures_util::future::join_all(calls).await;
    }
}

/// HTTP/2 streams of long responses that are never read, held until the load ends.
async fn unread_responses(sidecar: SocketAddr, streams: usize, stop: Arc<AtomicBool>) {
    let Some(sender) = http2::<Empty<Bytes>>(sidecar).await else { return };
    let mut held = Vec::new();
    for _ in 0..streams {
        let mut sender = sender.clone();
        let request = Request::get("http://app/stream?chunks=1000000").body(Empty::new()).unwrap();
        if sender.ready().await.is_ok()
            && let Ok(Ok(response)) = tokio::time::timeout(Duration::from_secs(5), sender.send_request(request)).await
        {
            held.push(response);
        }
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(held);
}

/// Connections opened and left silent: with the others, more than `max_connections`.
async fn silent_connections(sidecar: SocketAddr, count: usize, stop: Arc<AtomicBool>) {
    let mut open = Vec::new();
    for _ in 0..count {
        if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(sidecar)).await {
            open.push(stream);
        }
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worst_a_caller_sends_for_30_s_stays_within_the_data_paths_budget() {
    let upstream = UpstreamProcess::start(None);
    let listener = Listener::app().max_connections(MAX_CONNECTIONS as usize).max_requests(MAX_REQUESTS as usize);
    let everything = Resource::new("everything").capacity(f64::INFINITY);
    let (sidecar, listen) =
        standalone_sidecar(listener, Upstream::app(upstream.addr()), everything, Rule::charging("everything"));
    // Warm: the first requests allocate what every later one reuses.
    let client = http1();
    assert_eq!(get(&client, &format!("http://{listen}/")).await.status, 200);
    let before = rss_bytes(sidecar.pid()).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    let spawn = |load: &mut Vec<_>, task| load.push(tokio::spawn(task));
    // The requests in flight first, then the heads that take the connections left, then more
    // connections than the listener takes.
    for _ in 0..60 {
        spawn(&mut load, Box::pin(endless_uploads(listen, stop.clone())) as Pin<Box<dyn Future<Output = ()> + Send>>);
    }
    for _ in 0..10 {
        spawn(&mut load, Box::pin(http2_uploads(listen, 15, stop.clone())));
    }
    for _ in 0..2 {
        spawn(&mut load, Box::pin(unread_responses(listen, 20, stop.clone())));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for _ in 0..150 {
        spawn(&mut load, Box::pin(unfinished_heads(listen, stop.clone())));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    spawn(&mut load, Box::pin(silent_connections(listen, 100, stop.clone())));

    let peak = Arc::new(AtomicU64::new(before));
    let started = Instant::now();
    while started.elapsed() < LOAD {
        tokio::time::sleep(Duration::from_millis(250)).await;
        peak.fetch_max(rss_bytes(sidecar.pid()).unwrap(), Ordering::Relaxed);
    }
    let shed = sidecar.metric("sluice_sidecar_requests_shed_total{listener=\"app\"}").unwrap_or(0.0);
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.abort();
    }

    let grown = peak.load(Ordering::Relaxed).saturating_sub(before);
    let budget = MAX_CONNECTIONS * PER_CONNECTION + MAX_REQUESTS * PER_REQUEST;
    eprintln!(
        "RSS {:.1} MB before, peak {:.1} MB: grew {:.1} MB of a {:.1} MB budget; {shed} requests shed",
        before as f64 / 1e6,
        peak.load(Ordering::Relaxed) as f64 / 1e6,
        grown as f64 / 1e6,
        budget as f64 / 1e6
    );
    assert!(grown <= budget, "grew {grown} bytes, over the budget of {budget}");
    assert!(shed > 0.0, "more requests were sent than max_requests lets in flight");
    // Still serving once the load is gone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let answer = get(&http1(), &format!("http://{listen}/")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
}
