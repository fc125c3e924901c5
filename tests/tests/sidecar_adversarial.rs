//! The attacks the sidecar holds against, kept holding: request smuggling (Content-Length and
//! Transfer-Encoding games, obfuscated codings, bad chunking, folded and control-laden heads),
//! response framing games and pool poisoning by an upstream, HTTP/2 floods (rapid reset,
//! CONTINUATION, HPACK bombs), open-proxy tricks and a trickled head. Raw sockets on both sides:
//! each case asserts the answer, whether the connection closed and the exact bytes the upstream
//! received.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use sluice_tests::{
    config::{Listener, Resource, Rule, SidecarConfig, Upstream},
    harness::{Sidecar, free_port, standalone_sidecar},
    raw::{Connection, RawUpstream, connect, read_all, response},
    upstream::UpstreamProcess,
    wait::{eventually_blocking, lazily},
};

/// A standalone sidecar on `listener` in front of `upstream`, every request charged to a
/// resource far above any test load.
fn start(upstream: SocketAddr, listener: Listener) -> (Sidecar, SocketAddr) {
    standalone_sidecar(listener, Upstream::app(upstream), unlimited(), Rule::charging("r"))
}

fn unlimited() -> Resource {
    Resource::new("r").capacity(1e6)
}

/// Answers every request 200 `ok`, keeping the connection; reads request bodies only as far as
/// the heads show (the tests that need bodies read the record).
fn answer_ok(mut connection: Connection) {
    while connection.read_head().is_some() {
        if connection.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").is_err() {
            return;
        }
    }
}

/// Sends `request` on a new connection; everything that came back before the sidecar closed it.
fn exchange(listen: SocketAddr, request: &[u8]) -> String {
    let mut stream = connect(listen);
    stream.write_all(request).unwrap();
    read_all(&mut stream)
}

#[test]
fn smuggling_attempts_are_refused_and_the_connection_closed() {
    let upstream = RawUpstream::start(answer_ok);
    let (_sidecar, listen) = start(upstream.addr(), Listener::app());
    // Each carries a second request after the framing the attacker hopes a peer will believe.
    const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nhost: app\r\n\r\n";
    for (framing, status) in [
        // TE.CL: Transfer-Encoding first, then a Content-Length that would end the body early.
        ("transfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n0\r\n\r\n", 400),
        ("transfer-encoding: chunked, identity\r\n\r\n0\r\n\r\n", 400),
        ("transfer-encoding: xchunked\r\n\r\n0\r\n\r\n", 400),
        ("transfer-encoding: identity\r\n\r\n", 400),
        ("transfer-encoding: \x0bchunked\r\n\r\n0\r\n\r\n", 400),
        ("transfer-encoding : chunked\r\n\r\n0\r\n\r\n", 400),
        ("transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        // obs-fold (RFC 9112 §5.2): a peer unfolding it would see `identity chunked`.
        ("transfer-encoding: identity\r\n chunked\r\n\r\n0\r\n\r\n", 400),
        ("x-a: b\r\n\ttransfer-encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        ("content-length: 3, 4\r\n\r\nabcd", 400),
        ("content-length: 3\r\ncontent-length: 3 \r\ncontent-length: 03\r\ncontent-length: +3\r\n\r\nabc", 400),
        ("content-length: 0x3\r\n\r\nabc", 400),
        ("content-length: 99999999999999999999999\r\n\r\n", 400),
        ("x-nul: a\0b\r\ncontent-length: 3\r\n\r\nabc", 400),
        ("x-ctl: a\x7fb\r\ncontent-length: 3\r\n\r\nabc", 400),
        ("x-cr: a\rcontent-length: 3\r\n\r\nabc", 400),
        ("transfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
    ] {
        let request = format!("POST /p HTTP/1.1\r\nhost: app\r\n{framing}{SMUGGLED}");
        let answer = exchange(listen, request.as_bytes());
        assert!(answer.starts_with(&format!("HTTP/1.1 {status} ")), "{framing:?}: {answer:?}");
        assert!(answer.contains("connection: close"), "{framing:?}: {answer:?}");
        assert_eq!(answer.matches("HTTP/1.1").count(), 1, "one answer only: {framing:?}: {answer:?}");
    }
    // RFC 9112 §6.1: Transfer-Encoding in HTTP/1.0 is faulty framing.
    let answer = exchange(
        listen,
        format!("POST /p HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n{SMUGGLED}").as_bytes(),
    );
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer:?}");
    assert_eq!(upstream.received().concat(), "", "nothing of any of them reached the upstream");
}

#[test]
fn bad_chunking_ends_the_request_without_smuggling_anything() {
    let upstream = RawUpstream::start(|mut connection| {
        // Takes the head, then waits for the body that never ends well.
        if connection.read_head().is_some() {
            let mut rest = [0u8; 1024];
            let _ = connection.read(&mut rest);
            thread::sleep(Duration::from_millis(500));
        }
    });
    let (_sidecar, listen) = start(upstream.addr(), Listener::app());
    for body in [
        // A chunk size that overflows 64 bits: read modulo 2^64 it would be 15.
        "1000000000000000f\r\nGET /smuggled HTTP/1.1\r\nhost: app\r\n\r\n",
        "-5\r\nhello\r\n0\r\n\r\n",
        " 5\r\nhello\r\n0\r\n\r\n",
        "5\nhello\r\n0\r\n\r\n",
        // A bare LF in a chunk extension: a peer that ends lines at LF reads the chunk's data
        // from `GET` on, one that ends them at CRLF from `hello`.
        "5;x\nGET /smuggled HTTP/1.1\r\nhello\r\n0\r\n\r\n",
        "5;x\0y\r\nhello\r\n0\r\n\r\n",
        "5\r\nhello\r\n0\r\nbad\ntrailer\r\n\r\n",
    ] {
        let request = format!("POST /chunked HTTP/1.1\r\nhost: app\r\ntransfer-encoding: chunked\r\n\r\n{body}");
        let answer = exchange(listen, request.as_bytes());
        assert!(answer.starts_with("HTTP/1.1 400 ") && answer.contains("malformed request"), "{body:?}: {answer:?}");
        assert!(answer.contains("connection: close"), "{body:?}: {answer:?}");
    }
    // A connection may have been opened for a request whose body failed before its head went
    // out: it received nothing.
    for received in upstream.received().iter().filter(|r| !r.is_empty()) {
        assert!(received.starts_with("POST /chunked HTTP/1.1\r\n"), "{received:?}");
        assert!(!received.contains("smuggled") && !received.contains("0\r\n\r\n"), "an end reached it: {received:?}");
    }
}

#[test]
fn lenient_framing_reaches_the_upstream_normalised() {
    let upstream = RawUpstream::start(|mut connection| {
        while let Some(head) = connection.read_head() {
            // Chunked bodies are short here: wait for their last chunk.
            if head.contains("transfer-encoding: chunked") {
                let mut body = Vec::new();
                let mut buf = [0u8; 256];
                while !body.ends_with(b"0\r\n\r\n") {
                    match connection.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => body.extend_from_slice(&buf[..n]),
                    }
                }
            }
            if connection.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").is_err() {
                return;
            }
        }
    });
    let (_sidecar, listen) = start(upstream.addr(), Listener::app());
    let at = upstream.addr();
    for (request, forwarded) in [
        // A coding's name is case-insensitive, whitespace around it optional; chunk extensions,
        // trailers and the client's chunk sizes do not pass: the body is chunked anew.
        (
            "POST /a HTTP/1.1\r\nhost: app\r\ntransfer-encoding:\tChunKed \r\n\r\n\
             3;ext=\"v\"\r\nabc\r\n002\r\nde\r\n0\r\nx-trailer: t\r\n\r\n"
                .to_owned(),
            format!(
                "POST /a HTTP/1.1\r\nhost: {at}\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            ),
        ),
        // Repeats of one length are one length; bare LF line ends (RFC 9112 §2.2) become CRLF.
        (
            "POST /b HTTP/1.1\nhost: app\ncontent-length: 3, 3\ncontent-length: 3\n\nabc".to_owned(),
            format!("POST /b HTTP/1.1\r\nhost: {at}\r\ncontent-length: 3\r\n\r\nabc"),
        ),
    ] {
        let before = upstream.received().concat().len();
        let mut stream = connect(listen);
        stream.write_all(request.as_bytes()).unwrap();
        assert_eq!(response(&mut stream), 200, "{request:?}");
        // The upstream answers a body of known length before it reads it: wait for its bytes.
        let received = || upstream.received().concat();
        let why = lazily(|| format!("{request:?}: the upstream received {:?}", &received()[before..]));
        eventually_blocking(why, || received().len() >= before + forwarded.len());
        assert_eq!(&received()[before..], forwarded, "{request:?}");
    }
}

/// An upstream whose answer to each request is given by `answer(path)`, on the connection the
/// request came on; it counts the connections it accepted.
fn scripted_upstream(answer: fn(&str) -> &'static [u8]) -> (RawUpstream, Arc<AtomicUsize>) {
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    let upstream = RawUpstream::start(move |mut connection| {
        counted.fetch_add(1, Ordering::SeqCst);
        while let Some(head) = connection.read_head() {
            let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
            let bytes = answer(&path);
            // `|` splits an answer into writes 300 ms apart: the tail arrives after the
            // response the head ends has been passed on.
            for (i, piece) in bytes.split(|&b| b == b'|').enumerate() {
                if i > 0 {
                    thread::sleep(Duration::from_millis(300));
                }
                if connection.write(piece).is_err() {
                    return;
                }
            }
            if path == "/short" {
                return;
            }
        }
    });
    (upstream, connections)
}

fn framing_games(path: &str) -> &'static [u8] {
    match path {
        "/cl-te" => b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nPOISONED",
        "/short" => b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello",
        // A second answer nobody asked for, right behind the first or a moment later.
        "/extra" => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nPOISONED",
        "/extra-later" => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok|HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nPOISONED",
        "/204-body" => b"HTTP/1.1 204 No Content\r\ncontent-length: 8\r\n\r\nPOISONED",
        _ => b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nclean",
    }
}

/// `GET path` on a connection of its own: the whole answer.
fn get(listen: SocketAddr, path: &str) -> String {
    exchange(listen, format!("GET {path} HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n").as_bytes())
}

#[test]
fn an_upstream_cannot_poison_the_pool_or_split_a_response() {
    let (upstream, connections) = scripted_upstream(framing_games);
    let (_sidecar, listen) = start(upstream.addr(), Listener::app());
    assert!(get(listen, "/").ends_with("clean"));
    assert_eq!(connections.load(Ordering::SeqCst), 1);

    // Both lengths: refused (what response splitting looks like), and its connection dropped.
    assert!(get(listen, "/cl-te").starts_with("HTTP/1.1 502 "));
    // Bytes behind a response, or a body behind a 204: the answer passes, its connection does
    // not go back to the pool, and the next request is answered by the upstream, not by them.
    for path in ["/extra", "/extra-later", "/204-body"] {
        let answer = get(listen, path);
        assert!(answer.starts_with("HTTP/1.1 20") && !answer.contains("POISONED"), "{path}: {answer:?}");
        // Past the tail of `/extra-later`.
        thread::sleep(Duration::from_millis(600));
        let next = get(listen, "/");
        assert!(next.starts_with("HTTP/1.1 200 ") && next.ends_with("clean"), "after {path}: {next:?}");
    }
    // A body cut short: the client sees the connection end before the length it was promised.
    let mut stream = connect(listen);
    stream.write_all(b"GET /short HTTP/1.1\r\nhost: app\r\n\r\n").unwrap();
    let answer = read_all(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 200 ") && answer.ends_with("\r\n\r\nhello"), "{answer:?}");
    assert!(get(listen, "/").ends_with("clean"));
    // One connection to begin with, one after each of the five that could not be reused.
    assert_eq!(connections.load(Ordering::SeqCst), 6, "{:?}", upstream.received());
}

#[test]
fn absolute_form_targets_do_not_open_a_proxy() {
    let upstream = RawUpstream::start(answer_ok);
    let (_sidecar, listen) = start(upstream.addr(), Listener::app());
    // A listener with one upstream sends everything there, in origin form, with its own Host.
    let answer = exchange(
        listen,
        b"GET http://evil.example:8080/x?q=1 HTTP/1.1\r\nhost: evil.example\r\nconnection: close\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
    let at = upstream.addr();
    // `connection` is hop-by-hop: it stays here.
    assert_eq!(upstream.received().concat(), format!("GET /x?q=1 HTTP/1.1\r\nhost: {at}\r\n\r\n"));

    // A listener routing by host routes by the target's authority (RFC 9112 §3.2.2), not by the
    // Host field beside it: an unknown one is answered here, never dialled.
    let routed = RawUpstream::start(answer_ok);
    let config = SidecarConfig::new()
        .listener(Listener::new("edge", ([127, 0, 0, 1], free_port()).into()))
        .upstream(Upstream::new("api", format!("http://{}", routed.addr())).hosts(&["api.test"]))
        .resource(unlimited())
        .rule(Rule::charging("r"));
    let edge = Sidecar::launch(&config).start();
    let listen2 = edge.listen();
    for request in [
        &b"GET http://evil.example/ HTTP/1.1\r\nhost: api.test\r\n\r\n"[..],
        b"GET http://127.0.0.1:1/ HTTP/1.1\r\nhost: api.test\r\n\r\n",
        b"CONNECT api.test:80 HTTP/1.1\r\nhost: api.test:80\r\n\r\n",
    ] {
        let mut stream = connect(listen2);
        stream.write_all(request).unwrap();
        let status = response(&mut stream);
        assert!([404, 501].contains(&status), "{:?}: {status}", String::from_utf8_lossy(request));
    }
    assert_eq!(routed.received().concat(), "", "nothing was forwarded");
    let answer =
        exchange(listen2, b"GET http://api.test/ok HTTP/1.1\r\nhost: evil.example\r\nconnection: close\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
    assert!(routed.received().concat().starts_with("GET /ok HTTP/1.1\r\n"));
}

#[test]
fn a_path_with_a_stray_percent_sign_is_refused_not_forwarded() {
    let upstream = RawUpstream::start(answer_ok);
    let (_sidecar, listen) = start(upstream.addr(), Listener::app());
    // `%2%65` reads `%2e` decoded once and `.` decoded twice: the rules cannot know which the
    // upstream will see.
    for path in ["/%2%65", "/api/%2%65%2%65/admin", "/a%", "/%zz"] {
        let request = format!("GET {path} HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n");
        let answer = exchange(listen, request.as_bytes());
        assert!(answer.starts_with("HTTP/1.1 400 ") && answer.contains("stray %"), "{path}: {answer:?}");
    }
    assert_eq!(upstream.received().concat(), "", "nothing was forwarded");
    // Whole escapes go upstream as they came.
    let answer = exchange(listen, b"GET /a%2Fb%7e HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
    assert!(upstream.received().concat().starts_with("GET /a%2Fb%7e HTTP/1.1\r\n"));
}

#[test]
fn a_head_trickled_byte_by_byte_is_cut_at_the_header_read_timeout() {
    let upstream = RawUpstream::start(answer_ok);
    let (_sidecar, listen) = start(upstream.addr(), Listener::app().header_read_timeout(Duration::from_secs(1)));
    let mut stream = connect(listen);
    let start = Instant::now();
    // A byte every 50 ms, for ever: each read is fresh, the head never ends.
    let mut writer = stream.try_clone().unwrap();
    let trickle = thread::spawn(move || {
        let head = b"GET / HTTP/1.1\r\nhost: app\r\n".iter().chain(std::iter::repeat(&b'x'));
        let mut sent = 0;
        for &b in head.take(400) {
            if writer.write_all(&[b]).is_err() {
                break;
            }
            sent += 1;
            thread::sleep(Duration::from_millis(50));
        }
        sent
    });
    let answer = read_all(&mut stream);
    let after = start.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert!(after >= Duration::from_millis(900) && after < Duration::from_secs(5), "cut after {after:?}");
    let sent = trickle.join().unwrap();
    assert!(sent < 120, "the sidecar kept taking bytes: {sent}");
    assert_eq!(upstream.received().concat(), "");
}

// ---- HTTP/2, frame by frame ---------------------------------------------------------------------

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ENHANCE_YOUR_CALM: u32 = 0xb;

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// An HPACK string literal, not Huffman-coded, its length in a 7-bit prefix.
fn hpack_string(out: &mut Vec<u8>, s: &[u8]) {
    hpack_int(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

fn hpack_int(out: &mut Vec<u8>, first: u8, prefix: u32, mut n: usize) {
    let max = (1usize << prefix) - 1;
    if n < max {
        out.push(first | n as u8);
        return;
    }
    out.push(first | max as u8);
    n -= max;
    while n >= 128 {
        out.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    out.push(n as u8);
}

/// `GET /` for `app` (static table entries, the authority a literal).
fn get_block() -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x84, 0x01];
    hpack_string(&mut block, b"app");
    block
}

/// A client connection past the preface and its (empty) SETTINGS.
fn h2(listen: SocketAddr) -> TcpStream {
    let mut stream = connect(listen);
    let mut out = PREFACE.to_vec();
    frame(&mut out, SETTINGS, 0, 0, &[]);
    stream.write_all(&out).unwrap();
    stream
}

/// The frames the sidecar sends until it closes the connection or sends GOAWAY: (type, flags,
/// stream, payload) each.
fn frames_until_goaway(stream: &mut TcpStream) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut frames = Vec::new();
    let mut header = [0u8; 9];
    while stream.read_exact(&mut header).is_ok() {
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; length];
        if stream.read_exact(&mut payload).is_err() {
            break;
        }
        let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let goaway = header[3] == GOAWAY;
        frames.push((header[3], header[4], id, payload));
        if goaway {
            break;
        }
    }
    frames
}

fn goaway_code(frames: &[(u8, u8, u32, Vec<u8>)]) -> Option<u32> {
    frames.iter().find(|f| f.0 == GOAWAY).map(|f| u32::from_be_bytes(f.3[4..8].try_into().unwrap()))
}

/// After an attack the sidecar still answers a plain HTTP/2 request on a new connection.
fn still_serves(listen: SocketAddr) {
    let mut stream = h2(listen);
    let mut out = Vec::new();
    frame(&mut out, HEADERS, END_HEADERS | END_STREAM, 1, &get_block());
    stream.write_all(&out).unwrap();
    let mut header = [0u8; 9];
    loop {
        stream.read_exact(&mut header).expect("an answer");
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; length];
        stream.read_exact(&mut payload).unwrap();
        if header[3] == HEADERS {
            // :status 200 is entry 8 of HPACK's static table.
            assert_eq!(payload.first(), Some(&0x88), "{payload:?}");
            return;
        }
    }
}

#[test]
fn http2_rapid_reset_is_answered_with_goaway() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = start(upstream.addr(), Listener::app());
    let mut stream = h2(listen);
    let mut out = Vec::new();
    for i in 0..5000u32 {
        let id = 2 * i + 1;
        frame(&mut out, HEADERS, END_HEADERS | END_STREAM, id, &get_block());
        frame(&mut out, RST_STREAM, 0, id, &8u32.to_be_bytes());
    }
    // The sidecar may stop reading halfway: what it did not take is no matter.
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        thread::spawn(move || stream.write_all(&out).is_ok())
    };
    let start = Instant::now();
    let frames = frames_until_goaway(&mut stream);
    assert_eq!(goaway_code(&frames), Some(ENHANCE_YOUR_CALM), "{:?}", frames.iter().map(|f| f.0).collect::<Vec<_>>());
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
    let _ = writer.join();
    still_serves(listen);
}

#[test]
fn http2_continuation_flood_is_cut_off() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = start(upstream.addr(), Listener::app().max_header_bytes(16384));
    let mut stream = h2(listen);
    let mut out = Vec::new();
    frame(&mut out, HEADERS, END_STREAM, 1, &get_block());
    // Header blocks of CONTINUATION frames that never say END_HEADERS, 16 MiB in all: far more
    // than the sidecar would hold for a head.
    let mut block = Vec::new();
    for i in 0..300 {
        block.push(0x00);
        hpack_string(&mut block, format!("x-flood-{i}").as_bytes());
        hpack_string(&mut block, &[b'v'; 40]);
    }
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        thread::spawn(move || {
            stream.write_all(&out).unwrap();
            let mut continuation = Vec::new();
            frame(&mut continuation, CONTINUATION, 0, 1, &block);
            let mut sent = 0;
            while sent < 16 << 20 && stream.write_all(&continuation).is_ok() {
                sent += continuation.len();
            }
            sent
        })
    };
    let frames = frames_until_goaway(&mut stream);
    assert_eq!(goaway_code(&frames), Some(ENHANCE_YOUR_CALM), "{:?}", frames.iter().map(|f| f.0).collect::<Vec<_>>());
    drop(stream);
    let sent = writer.join().unwrap();
    assert!(sent < 16 << 20, "the sidecar took all {sent} bytes of the flood");
    still_serves(listen);
}

/// A header block naming one big dynamic-table entry `references` times.
fn hpack_bomb(references: usize) -> Vec<u8> {
    let mut block = get_block();
    block.push(0x40);
    hpack_string(&mut block, b"x-bomb");
    hpack_string(&mut block, &[b'b'; 4000]);
    block.extend(std::iter::repeat_n(0x80 | 62, references));
    block
}

#[test]
fn hpack_bombs_are_refused_and_a_big_one_closes_the_connection() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = start(upstream.addr(), Listener::app().max_header_bytes(16384));
    // 20 KB of headers from 4 KB on the wire, over the 16 KiB limit: that stream is answered
    // 431, and the next one on the connection is served.
    let mut stream = h2(listen);
    let mut out = Vec::new();
    frame(&mut out, HEADERS, END_HEADERS | END_STREAM, 1, &hpack_bomb(5));
    frame(&mut out, HEADERS, END_HEADERS | END_STREAM, 3, &get_block());
    stream.write_all(&out).unwrap();
    let mut answered = Vec::new();
    let mut header = [0u8; 9];
    while answered.len() < 2 {
        if let Err(e) = stream.read_exact(&mut header) {
            panic!("{e} before answers to both streams: {answered:?}");
        }
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; length];
        stream.read_exact(&mut payload).unwrap();
        let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        match header[3] {
            // The start of the header block: its first field, :status.
            HEADERS => answered.push((id, payload[..payload.len().min(if id == 1 { 4 } else { 1 })].to_vec())),
            RST_STREAM | GOAWAY => panic!("stream {id} reset or connection closed: {payload:?}; {answered:?}"),
            _ => {}
        }
    }
    answered.sort();
    // :status 431, no entry of HPACK's static table: a literal of the name at index 8 (0x48),
    // its value Huffman-coded in 3 bytes (0x83: "431" is 011010 011001 00001, then padding).
    // :status 200 is entry 8 itself (0x88).
    assert_eq!(answered, [(1, vec![0x48, 0x83, 0x69, 0x90]), (3, vec![0x88])], "{answered:?}");

    // 8 MB from 6 KB: h2 takes it for abuse and closes the connection before any answer.
    let mut stream = h2(listen);
    let mut out = Vec::new();
    frame(&mut out, HEADERS, END_HEADERS | END_STREAM, 1, &hpack_bomb(2000));
    stream.write_all(&out).unwrap();
    let frames = frames_until_goaway(&mut stream);
    assert!(frames.iter().all(|f| f.0 != HEADERS), "answered: {frames:?}");
    assert_eq!(goaway_code(&frames), Some(ENHANCE_YOUR_CALM));
    assert!(frames.last().unwrap().3.ends_with(b"header_list_way_too_large"));
    still_serves(listen);
}
