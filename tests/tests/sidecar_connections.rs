//! The sidecar's protection of its listeners (SPEC §4.1): a slow request head and an idle
//! connection are closed, an oversized head is refused, and connections beyond
//! `max_connections` wait for a slot. Raw TCP, so that the client does exactly what each case
//! needs. Times are asserted to an order of magnitude only.

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use sluice_tests::{
    config::{Listener, OnLimit, Resource, Rule, Upstream},
    harness::{Sidecar, standalone_sidecar},
    raw::{closed_after, connect, read_all, read_head, response},
    upstream::UpstreamProcess,
};

/// A standalone sidecar on `listener` (its limits set as a test needs), forwarding to a test
/// upstream with a rule far above any test load.
fn sidecar(upstream: SocketAddr, listener: Listener) -> (Sidecar, SocketAddr) {
    standalone_sidecar(listener, Upstream::app(upstream), Resource::new("everything").capacity(1e6), everything())
}

/// A standalone sidecar that limits every request to `rate` a second with a burst of 2, and
/// does `on_limit` beyond it (with `max_wait`, delaying).
fn limited_sidecar(upstream: SocketAddr, rate: f64, on_limit: Rule) -> (Sidecar, SocketAddr) {
    let limited = Resource::new("everything").capacity(rate).burst(2.0);
    standalone_sidecar(Listener::app(), Upstream::app(upstream), limited, on_limit)
}

fn everything() -> Rule {
    Rule::charging("everything")
}

const GET: &[u8] = b"GET /echo HTTP/1.1\r\nhost: app\r\n\r\n";

/// Sends [`GET`] on `stream` and returns the answer's status code.
fn get(stream: &mut TcpStream) -> u16 {
    stream.write_all(GET).unwrap();
    response(stream)
}

/// Reads until the sidecar closes `stream`, which must be after a 408 sent about a second (a
/// 1 s timeout) from now.
fn answered_408_about_a_second_later(stream: &mut TcpStream) {
    let start = Instant::now();
    let answer = read_all(stream);
    let after = start.elapsed();
    assert!(after >= Duration::from_millis(500) && after < Duration::from_secs(10), "closed after {after:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
}

#[test]
fn a_request_head_that_does_not_arrive_in_time_closes_the_connection() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(upstream.addr(), Listener::app().header_read_timeout(Duration::from_secs(1)));
    let mut stream = connect(listen);
    stream.write_all(b"GET /echo HTTP/1.1\r\nhost: app\r\n").unwrap();
    answered_408_about_a_second_later(&mut stream);
}

#[test]
fn an_idle_keep_alive_connection_is_closed() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(upstream.addr(), Listener::app().idle_timeout(Duration::from_secs(1)));
    let mut stream = connect(listen);
    assert_eq!(get(&mut stream), 200);
    let after = closed_after(&mut stream);
    assert!(after >= Duration::from_millis(500) && after < Duration::from_secs(10), "closed after {after:?}");
}

#[test]
fn an_oversized_request_head_is_refused() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(upstream.addr(), Listener::app().max_header_bytes(4096));
    let mut stream = connect(listen);
    // 4 MiB: more than the socket buffers hold, so the sidecar must read what it refuses.
    let big = format!("GET /echo HTTP/1.1\r\nhost: app\r\nx-big: {}\r\n\r\n", "a".repeat(4 << 20));
    // The sidecar answers once the head passes the limit, then drains the rest (a lingering
    // close): the whole head goes out, and the 431 arrives instead of a reset.
    stream.write_all(big.as_bytes()).expect("the sidecar takes the whole head");
    let answer = read_all(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    // A head over the limit that arrives whole, in one read, is refused too.
    let mut stream = connect(listen);
    let over = format!("GET /echo HTTP/1.1\r\nhost: app\r\nx-big: {}\r\n\r\n", "a".repeat(6000));
    stream.write_all(over.as_bytes()).unwrap();
    let answer = read_all(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    // A head within the limit on a new connection still passes.
    assert_eq!(get(&mut connect(listen)), 200);
}

#[test]
fn a_request_body_that_stops_arriving_is_answered_and_closed() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(upstream.addr(), Listener::app().idle_timeout(Duration::from_secs(1)));
    let mut stream = connect(listen);
    // Two of ten bytes, then nothing: the upstream exchange waits for the rest.
    stream.write_all(b"POST /echo HTTP/1.1\r\nhost: app\r\ncontent-length: 10\r\n\r\nab").unwrap();
    answered_408_about_a_second_later(&mut stream);
    // A body that keeps coming, however slowly, is not cut.
    let mut stream = connect(listen);
    stream.write_all(b"POST /echo HTTP/1.1\r\nhost: app\r\ncontent-length: 3\r\n\r\n").unwrap();
    for byte in [b"a", b"b", b"c"] {
        thread::sleep(Duration::from_millis(700));
        stream.write_all(byte).unwrap();
    }
    assert_eq!(response(&mut stream), 200);
}

#[test]
fn connections_beyond_the_limit_wait_for_a_slot() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(upstream.addr(), Listener::app().max_connections(1));
    let mut first = connect(listen);
    assert_eq!(get(&mut first), 200);
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

#[test]
fn ambiguous_request_framing_is_refused() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(upstream.addr(), Listener::app());
    for request in [
        "POST /echo HTTP/1.1\r\nhost: app\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        "POST /echo HTTP/1.1\r\nhost: app\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd",
        "POST /echo HTTP/1.1\r\nhost: app\r\ncontent-length: -3\r\n\r\nabc",
        "POST /echo HTTP/1.1\r\nhost: app\r\ntransfer-encoding: gzip\r\n\r\nabc",
        "POST /echo HTTP/1.1\r\nhost: app\r\ntransfer-encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
        "GET /echo HTTP/1.1\r\n\r\n",
    ] {
        let mut stream = connect(listen);
        stream.write_all(request.as_bytes()).unwrap();
        let answer = read_all(&mut stream);
        assert!(answer.starts_with("HTTP/1.1 400"), "{request:?} got {answer:?}");
        assert!(answer.contains("malformed request"), "{answer}");
    }
}

#[test]
fn a_declared_content_length_is_forwarded_as_one_number() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(upstream.addr(), Listener::app());
    let mut stream = connect(listen);
    let request = "POST /echo HTTP/1.1\r\nhost: app\r\ncontent-length: 5, 5\r\ncontent-length: 5\r\n\
                   connection: close\r\n\r\nhello";
    stream.write_all(request.as_bytes()).unwrap();
    let answer = read_all(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#"["content-length","5"]"#), "{answer}");
    assert_eq!(answer.matches("content-length").count(), 2, "one in the echo, one on the answer: {answer}");
    assert!(answer.contains(r#""body":"hello""#), "{answer}");

    // A declared empty body keeps its length, whatever the method.
    let mut stream = connect(listen);
    let request = "DELETE /echo HTTP/1.1\r\nhost: app\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).unwrap();
    let answer = read_all(&mut stream);
    assert!(answer.contains(r#"["content-length","0"]"#), "{answer}");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(upstream.addr(), Listener::app());
    let mut stream = connect(listen);
    let requests = "GET /status/201 HTTP/1.1\r\nhost: app\r\n\r\n\
                    POST /echo HTTP/1.1\r\nhost: app\r\ncontent-length: 5\r\n\r\nhello\
                    GET /status/202 HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n";
    stream.write_all(requests.as_bytes()).unwrap();
    let answer = read_all(&mut stream);
    let statuses: Vec<&str> = answer.match_indices("HTTP/1.1 ").map(|(i, _)| &answer[i + 9..i + 12]).collect();
    assert_eq!(statuses, ["201", "200", "202"], "{answer}");
    assert!(answer.contains(r#""body":"hello""#), "{answer}");
}

#[test]
fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(upstream.addr(), Listener::app());
    let mut stream = connect(listen);
    stream
        .write_all(b"PUT /echo HTTP/1.1\r\nhost: app\r\ncontent-length: 4\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut interim = [0u8; 25];
    stream.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"data").unwrap();
    let answer = read_all(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 200") && answer.contains(r#""body":"data""#), "{answer}");
}

#[test]
fn http_1_0_clients_get_keep_alive_only_when_they_ask() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(upstream.addr(), Listener::app());
    let mut stream = connect(listen);
    stream.write_all(b"GET /stream?chunks=2 HTTP/1.0\r\nconnection: keep-alive\r\n\r\n").unwrap();
    // A body of unknown length cannot be delimited for HTTP/1.0 but by closing.
    let answer = read_all(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("chunk 0\nchunk 1\n"), "{answer}");
    assert!(answer.contains("connection: close") && !answer.contains("chunked"), "{answer}");

    let mut stream = connect(listen);
    stream.write_all(b"GET /status/200 HTTP/1.0\r\nconnection: keep-alive\r\n\r\n").unwrap();
    assert_eq!(response(&mut stream), 200);
    stream.write_all(b"GET /status/204 HTTP/1.0\r\n\r\n").unwrap();
    let answer = read_all(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
}

#[test]
fn large_bodies_stream_both_ways() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(upstream.addr(), Listener::app());
    let mut stream = connect(listen);
    // 4 MB sent chunked in 64 KiB pieces; the echo sends it back with a length. The `Expect` goes
    // upstream too, whose 100 Continue then arrives while the body is on its way: it is no answer
    // that would end the body.
    let piece = "x".repeat(64 * 1024);
    let head = "POST /echo HTTP/1.1\r\nhost: app\r\ntransfer-encoding: chunked\r\nexpect: 100-continue\r\n\
                connection: close\r\n\r\n";
    stream.write_all(head.as_bytes()).unwrap();
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..64 {
                stream.write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes()).unwrap();
            }
            stream.write_all(b"0\r\n\r\n").unwrap();
        })
    };
    let answer = read_all(&mut stream);
    writer.join().unwrap();
    let answer = answer.strip_prefix("HTTP/1.1 100 Continue\r\n\r\n").unwrap_or(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{}", &answer[..answer.len().min(200)]);
    assert!(answer.contains(r#"["expect","100-continue"]"#), "the upstream was asked to continue");
    let body = answer.split_once(r#""body":""#).and_then(|(_, rest)| rest.split('"').next()).unwrap_or("");
    assert_eq!(body.matches('x').count(), 64 * 64 * 1024);
}

/// An upstream that refuses uploads the way many do: it reads a request's head and answers 413
/// at once, reading none of the body, then closes (`/refuse`: the unread body makes that a
/// reset) or holds the connection open without reading (`/refuse-and-hold`). `/gzip` is
/// answered with a gzip transfer coding under chunked, which nothing asked for, `/204` with a
/// 204 that carries a Content-Length; any other request 200. Each response closes its
/// connection.
fn refusing_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let head = read_head(&mut stream).unwrap_or_default();
            if head.starts_with(b"POST /refuse") {
                let refusal =
                    "HTTP/1.1 413 Payload Too Large\r\ncontent-length: 10\r\nconnection: close\r\n\r\ntoo large\n";
                let _ = stream.write_all(refusal.as_bytes());
                if head.starts_with(b"POST /refuse-and-hold") {
                    held.push(stream);
                }
            } else if head.starts_with(b"GET /204") {
                let _ = stream.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            } else if head.starts_with(b"GET /gzip") {
                let coded = "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\nconnection: close\r\n\r\n\
                             3\r\nabc\r\n0\r\n\r\n";
                let _ = stream.write_all(coded.as_bytes());
            } else {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n");
            }
        }
    });
    addr
}

#[test]
fn an_upstream_refusing_a_body_it_has_not_read_is_answered_through() {
    let (_sidecar, listen) = sidecar(refusing_upstream(), Listener::app());
    // 16 MB: far more than the socket buffers between the sidecar and the upstream hold.
    const SIZE: usize = 16 << 20;
    for (path, framing) in
        [("/refuse", format!("content-length: {SIZE}")), ("/refuse-and-hold", "transfer-encoding: chunked".to_owned())]
    {
        let mut stream = connect(listen);
        stream.write_all(format!("POST {path} HTTP/1.1\r\nhost: app\r\n{framing}\r\n\r\n").as_bytes()).unwrap();
        let writer = {
            let mut stream = stream.try_clone().unwrap();
            let chunked = framing.contains("chunked");
            thread::spawn(move || {
                let piece = vec![b'x'; 64 * 1024];
                // The sidecar stops taking the body once refused: writing then fails.
                for _ in 0..SIZE / piece.len() {
                    let sent = if chunked {
                        stream
                            .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                            .and_then(|()| stream.write_all(&piece))
                            .and_then(|()| stream.write_all(b"\r\n"))
                    } else {
                        stream.write_all(&piece)
                    };
                    if sent.is_err() {
                        return;
                    }
                }
                if chunked {
                    let _ = stream.write_all(b"0\r\n\r\n");
                }
            })
        };
        let answer = read_all(&mut stream);
        writer.join().unwrap();
        assert!(answer.starts_with("HTTP/1.1 413") && answer.ends_with("too large\n"), "{path}: {answer:?}");
        // The rest of the body was not read: the connection cannot carry another request.
        assert!(answer.contains("connection: close"), "{path}: {answer:?}");
        // The sidecar goes on serving.
        assert_eq!(get(&mut connect(listen)), 200, "after {path}");
    }
}

#[test]
fn a_malformed_chunked_request_body_is_refused_as_the_requests_fault() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(upstream.addr(), Listener::app());
    // A chunk-size line that is no number; chunk data longer than its size.
    for body in ["5\r\nhello\r\nzz\r\n\r\n", "5\r\nhelloXX\r\n0\r\n\r\n"] {
        let mut stream = connect(listen);
        let request = format!("POST /echo HTTP/1.1\r\nhost: app\r\ntransfer-encoding: chunked\r\n\r\n{body}");
        stream.write_all(request.as_bytes()).unwrap();
        let answer = read_all(&mut stream);
        assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("malformed request"), "{body:?}: {answer:?}");
        assert!(answer.contains("connection: close"), "{answer}");
    }
    assert_eq!(get(&mut connect(listen)), 200);
}

/// A request refused before its body was read (a 429 here) is answered even to an application
/// that writes its whole body before reading anything: the sidecar closes its side and drains
/// what still comes, where closing with unread data would send a reset that can destroy the
/// answer before the application reads it. A small body that came with its head is skipped
/// instead, and the connection stays open.
#[test]
fn a_rejected_request_is_answered_to_a_client_that_sends_its_whole_body_first() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = limited_sidecar(upstream.addr(), 0.01, everything().on_limit(OnLimit::Reject));
    // The burst of 2 passes; at 0.01 a second, nothing more does for the rest of the test.
    let mut stream = connect(listen);
    for _ in 0..2 {
        assert_eq!(get(&mut stream), 200);
    }
    const SIZE: usize = 8 << 20;
    let mut stream = connect(listen);
    stream.write_all(format!("POST /echo HTTP/1.1\r\nhost: app\r\ncontent-length: {SIZE}\r\n\r\n").as_bytes()).unwrap();
    stream.write_all(&vec![b'x'; SIZE]).expect("the sidecar takes the whole body");
    let answer = read_all(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer:?}");
    assert!(answer.contains("connection: close"), "{answer:?}");
    // A small body arrives with its head: it is skipped, and the connection serves the next
    // request (refused too, as the limit is spent).
    let mut stream = connect(listen);
    stream.write_all(b"POST /echo HTTP/1.1\r\nhost: app\r\ncontent-length: 5\r\n\r\nhello").unwrap();
    assert_eq!(response(&mut stream), 429);
    assert_eq!(get(&mut stream), 429);
}

/// An upstream that answers every request 200 on its own connection and counts them.
fn counting_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let counted = counted.clone();
            thread::spawn(move || {
                // The sidecar sends bodiless GETs, one at a time.
                while read_head(&mut stream).is_some() {
                    counted.fetch_add(1, Ordering::SeqCst);
                    if stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n").is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, count)
}

#[test]
fn transfer_codings_other_than_chunked_and_connect_are_not_implemented() {
    let (upstream, count) = counting_upstream();
    let (_sidecar, listen) = sidecar(upstream, Listener::app());
    for request in [
        "POST /echo HTTP/1.1\r\nhost: app\r\ntransfer-encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "CONNECT elsewhere.example:443 HTTP/1.1\r\nhost: elsewhere.example:443\r\n\r\n",
    ] {
        let mut stream = connect(listen);
        stream.write_all(request.as_bytes()).unwrap();
        assert_eq!(response(&mut stream), 501, "{request:?}");
    }
    assert_eq!(count.load(Ordering::SeqCst), 0, "nothing reached the upstream");
    // An upstream's answer in a coding the sidecar would drop is not passed on as if plain.
    let (_sidecar, listen) = sidecar(refusing_upstream(), Listener::app());
    let mut stream = connect(listen);
    stream.write_all(b"GET /gzip HTTP/1.1\r\nhost: app\r\n\r\n").unwrap();
    assert_eq!(response(&mut stream), 502);
}

#[test]
fn a_204_goes_on_without_a_content_length() {
    let (_sidecar, listen) = sidecar(refusing_upstream(), Listener::app());
    let mut stream = connect(listen);
    stream.write_all(b"GET /204 HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n").unwrap();
    let answer = read_all(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    assert!(!answer.to_ascii_lowercase().contains("content-length"), "RFC 9110 §8.6: {answer}");
}

/// A request waiting in a limit's queue is dropped when the application closes its connection:
/// it never reaches the upstream, and the capacity it would have taken stays for others.
#[test]
fn a_queued_request_whose_client_went_away_is_not_forwarded() {
    let (upstream, forwarded) = counting_upstream();
    let (_sidecar, listen) =
        limited_sidecar(upstream, 1.0, everything().on_limit(OnLimit::Delay).max_wait(Duration::from_secs(10)));
    let mut stream = connect(listen);
    for _ in 0..2 {
        assert_eq!(get(&mut stream), 200);
    }
    assert_eq!(forwarded.load(Ordering::SeqCst), 2);
    // The burst is spent: the next request waits about a second for its token. Its client
    // leaves at once.
    let mut leaving = connect(listen);
    leaving.write_all(GET).unwrap();
    drop(leaving);
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(forwarded.load(Ordering::SeqCst), 2, "the abandoned request was forwarded");
    // Its token is still there for the next request.
    assert_eq!(get(&mut stream), 200);
    assert_eq!(forwarded.load(Ordering::SeqCst), 3);
}
