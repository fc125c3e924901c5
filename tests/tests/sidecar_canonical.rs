//! One request, one reading, whichever protocol carries it: the same logical request sent to the
//! real sidecar over HTTP/1.1 (raw bytes: header names in any case, values padded with optional
//! whitespace) and over HTTP/2 (hyper's client), each in a spelling of its own (escapes of
//! either hex case or none, `+` or `%20`, dot segments, a host's case, port and trailing dot),
//! is charged to the same rule, resource and key, and that key is the one its value names.
//! Every resource holds 0 at once, so each charged request is refused with its resource and rule
//! in the answer. Malformed HTTP/2 fields, and attributes given twice with different values, are
//! refused over both.

use std::{io::Write, net::SocketAddr, time::Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use sluice_tests::{
    harness::{Sidecar, free_port},
    raw::{connect, read_all},
    upstream::UpstreamProcess,
};

/// Every resource refuses at once: a charged request names its resource (a key's id) and rule.
fn config(listen: SocketAddr, upstream: SocketAddr) -> String {
    let keyed = |id: &str, per: &str| {
        format!("  - {{id: {id}, kind: concurrency, capacity: 0, per: {per}, max_keys: 10000}}\n")
    };
    format!(
        "listeners:\n  - {{name: app, address: {listen}, upstream: app}}\n\
         upstreams:\n  - {{name: app, url: http://{upstream}}}\n\
         resources:\n{}{}{}{}{}  - {{id: cafe, kind: concurrency, capacity: 0}}\n\
         rules:\n\
           - {{name: seg, resource: seg, match: {{path: {{prefix: /s/}}}}}}\n\
           - {{name: q, resource: q, match: {{path: {{exact: /q}}}}}}\n\
           - {{name: tier, resource: tenant, match: {{headers: [{{name: x-tier, value: gold}}]}}}}\n\
           - {{name: grpc, resource: method, match: {{grpc: {{service: pkg.Svc}}}}}}\n\
           - {{name: cafe, resource: cafe, match: {{path: {{exact: \"/caf%C3%A9\"}}}}}}\n\
           - {{name: host, resource: host, match: {{path: {{prefix: /h/}}}}}}\n",
        keyed("seg", "{path_segment: 1}"),
        keyed("q", "{query: t}"),
        keyed("tenant", "{header: x-tenant}"),
        keyed("host", "host"),
        keyed("method", "{grpc: method}"),
    )
}

/// A request as its sender means it, before any spelling.
#[derive(Clone, Debug)]
enum Logical {
    /// `/s/<value>/end`.
    Segment(Vec<Piece>),
    /// `/q?t=<value>`, among other parameters.
    Query(Vec<Piece>),
    /// `x-tier: gold`, `x-tenant: <value>`.
    Tenant(String),
    /// A gRPC call of `pkg.Svc/<method>`.
    Grpc(String),
    /// `/café`, which a rule names escaped.
    Cafe,
    /// `/h/x` to the host named.
    Host(String),
    /// A path no rule matches: the upstream answers.
    Unmatched,
}

/// A piece of a value: a character (which a spelling may write raw, as UTF-8) or a byte that
/// is not UTF-8 on its own (always escaped).
#[derive(Clone, Debug)]
enum Piece {
    Char(char),
    Byte(u8),
}

fn pieces() -> impl Strategy<Value = Vec<Piece>> {
    let chars = prop_oneof![
        prop::char::range('a', 'z'),
        prop::char::range('A', 'Z'),
        prop::char::range('0', '9'),
        prop::sample::select(vec!['-', '.', '_', '~', '!', '$', '\'', '(', ')', '*', ',', ';', ':', '@', '+', '=']),
        prop::sample::select(vec![' ', '/', '?', '#', '%', '&', '"', 'é', '中', '😀']),
    ];
    let piece = prop_oneof![4 => chars.prop_map(Piece::Char), 1 => (0x80u8..=0xFF).prop_map(Piece::Byte)];
    prop::collection::vec(piece, 1..8)
        .prop_filter("not a dot segment", |p| !matches!(bytes(p).as_slice(), b"." | b".."))
}

fn logical() -> impl Strategy<Value = Logical> {
    prop_oneof![
        pieces().prop_map(Logical::Segment),
        pieces().prop_map(Logical::Query),
        "[!-~]([ !-~]{0,10}[!-~])?".prop_map(Logical::Tenant),
        "[A-Za-z][A-Za-z0-9_]{0,10}".prop_map(Logical::Grpc),
        Just(Logical::Cafe),
        "[a-z0-9-]{1,8}(\\.[a-z0-9-]{1,8}){0,2}".prop_map(Logical::Host),
        Just(Logical::Unmatched),
    ]
}

fn bytes(pieces: &[Piece]) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Char(c) => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            Piece::Byte(b) => out.push(*b),
        }
    }
    out
}

/// How a key names a value: unreserved bytes as they are, the rest `%XX` in upper case.
fn key_of(value: &[u8]) -> String {
    value
        .iter()
        .map(|&b| match b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            true => char::from(b).to_string(),
            false => format!("%{b:02X}"),
        })
        .collect()
}

/// What the sidecar must answer: the refusal naming resource and rule, or the upstream's.
fn expected(request: &Logical) -> String {
    let refused = |resource: String, rule: &str| {
        format!("rate limited by sluice: resource {resource:?} is over its capacity (rule {rule:?})")
    };
    match request {
        Logical::Segment(v) => refused(format!("seg/{}", key_of(&bytes(v))), "seg"),
        Logical::Query(v) => refused(format!("q/{}", key_of(&bytes(v))), "q"),
        Logical::Tenant(v) => refused(format!("tenant/{}", key_of(v.as_bytes())), "tier"),
        Logical::Grpc(m) => refused(format!("method/{m}"), "grpc"),
        Logical::Cafe => refused("cafe".into(), "cafe"),
        Logical::Host(h) => refused(format!("host/{}", key_of(h.as_bytes())), "host"),
        Logical::Unmatched => "404 not found".into(),
    }
}

/// Random choices a spelling is made of.
#[derive(Clone, Debug)]
struct Spelling {
    choices: Vec<bool>,
    noise: u8,
}

fn spelling() -> impl Strategy<Value = Spelling> {
    (prop::collection::vec(any::<bool>(), 1..40), any::<u8>()).prop_map(|(choices, noise)| Spelling { choices, noise })
}

/// A message as sent: request target, authority and headers, before the protocol frames them.
struct Spelled {
    target: String,
    authority: String,
    headers: Vec<(String, String)>,
}

impl Spelling {
    fn spell(&self, request: &Logical) -> Spelled {
        let mut choices = self.choices.iter().copied().cycle();
        let mut headers = Vec::new();
        let mut authority = "app.test".to_owned();
        let target = match request {
            Logical::Segment(v) => {
                let lead = ["/s/", "//s/", "/./s/", "/x/../s/", "/s/./", "/s//"][usize::from(self.noise % 6)];
                format!("{lead}{}/end", value(v, false, &mut choices))
            }
            Logical::Query(v) => {
                let mut query = Vec::new();
                if self.noise & 1 != 0 {
                    query.push("a=1".to_owned());
                }
                query.push(format!("t={}", value(v, true, &mut choices)));
                if self.noise & 2 != 0 {
                    query.push("x=%41&b".to_owned());
                }
                format!("/q?{}", query.join("&"))
            }
            Logical::Tenant(v) => {
                headers.push(("x-tier".into(), "gold".into()));
                headers.push(("x-tenant".into(), v.clone()));
                "/t".into()
            }
            Logical::Grpc(m) => {
                headers.push(("content-type".into(), "application/grpc".into()));
                let m: String = m
                    .bytes()
                    .map(|b| if choices.next().unwrap() { escape(b, &mut choices) } else { char::from(b).into() })
                    .collect();
                format!("/pkg.Svc/{m}")
            }
            Logical::Cafe => ["/caf%C3%A9", "/caf%c3%a9", "/caf%C3%a9", "/café", "/%63af%c3%A9", "/x/../caf%c3%A9"]
                [usize::from(self.noise % 6)]
            .into(),
            Logical::Host(h) => {
                let name: String =
                    h.chars().map(|c| if choices.next().unwrap() { c.to_ascii_uppercase() } else { c }).collect();
                let dot = if self.noise & 1 != 0 { "." } else { "" };
                let port = if self.noise & 2 != 0 { ":8080" } else { "" };
                authority = format!("{name}{dot}{port}");
                "/h/x".into()
            }
            Logical::Unmatched => "/nothing/here".into(),
        };
        Spelled { target, authority, headers }
    }
}

/// `pieces` in a path segment or a query value (`query`): a character that may be written raw
/// is, or is escaped, as `choices` says; escapes' hex digits in the case it says.
fn value(pieces: &[Piece], query: bool, choices: &mut impl Iterator<Item = bool>) -> String {
    let mut out = String::new();
    for piece in pieces {
        match *piece {
            Piece::Char(' ') if query && choices.next().unwrap() => out.push('+'),
            Piece::Char(c) if raw(c, query) && choices.next().unwrap() => out.push(c),
            Piece::Char(c) => c.encode_utf8(&mut [0; 4]).bytes().for_each(|b| out.push_str(&escape(b, choices))),
            Piece::Byte(b) => out.push_str(&escape(b, choices)),
        }
    }
    out
}

fn raw(c: char, query: bool) -> bool {
    match c {
        '/' | '?' | '#' | '%' | ' ' | '"' => false,
        '&' | '=' | '+' => !query,
        _ => true,
    }
}

fn escape(b: u8, case: &mut impl Iterator<Item = bool>) -> String {
    format!("%{b:02X}").chars().map(|c| if case.next().unwrap() { c.to_ascii_lowercase() } else { c }).collect()
}

/// Sends `spelled` over HTTP/1.1 as raw bytes: header names in the case `choices` says, values
/// padded with optional whitespace. The answer as [`answer`] reads it.
fn over_http1(sidecar: SocketAddr, spelled: &Spelled, pad: &[bool]) -> String {
    let choice = |i: usize| pad[i % pad.len()];
    let ows = |i: usize| ["", " ", "\t", " \t "][usize::from(choice(2 * i)) + 2 * usize::from(choice(2 * i + 1))];
    let mut head = format!("GET {} HTTP/1.1\r\nHost:{}{}{}\r\n", spelled.target, ows(0), spelled.authority, ows(1));
    for (i, (name, value)) in spelled.headers.iter().enumerate() {
        let name: String =
            name.char_indices().map(|(j, c)| if choice(i + j) { c.to_ascii_uppercase() } else { c }).collect();
        head.push_str(&format!("{name}:{}{value}{}\r\n", ows(2 * i + 2), ows(2 * i + 3)));
    }
    head.push_str("Connection: close\r\n\r\n");
    let mut stream = connect(sidecar);
    stream.write_all(head.as_bytes()).unwrap();
    let text = read_all(&mut stream);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no response to {head:?}: {text:?}"));
    let status: u16 = head[9..12].parse().unwrap();
    let grpc_message = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("grpc-message").then(|| value.trim().to_owned())
    });
    answer(status, grpc_message, body)
}

/// Sends `spelled` over HTTP/2 on `sender`'s connection.
async fn over_http2(sender: &mut SendRequest<Empty<Bytes>>, spelled: &Spelled) -> String {
    let mut request = Request::get(format!("http://{}{}", spelled.authority, spelled.target));
    for (name, value) in &spelled.headers {
        request = request.header(name, value);
    }
    let response = sender.send_request(request.body(Empty::new()).unwrap()).await.expect("an HTTP/2 response");
    let status = response.status().as_u16();
    let grpc_message = response.headers().get("grpc-message").map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.expect("a body").to_bytes();
    answer(status, grpc_message, &String::from_utf8_lossy(&body))
}

/// A refusal's message (a gRPC caller's decoded from `grpc-message`), else status and body.
fn answer(status: u16, grpc_message: Option<String>, body: &str) -> String {
    match grpc_message {
        Some(message) => String::from_utf8(percent_decoded(&message)).unwrap(),
        None if status == 429 => body.trim_end().to_owned(),
        None => format!("{status} {}", body.trim_end()),
    }
}

fn percent_decoded(text: &str) -> Vec<u8> {
    let (bytes, mut out, mut i) = (text.as_bytes(), Vec::new(), 0);
    while i < bytes.len() {
        match (bytes[i], text.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

async fn http2(sidecar: SocketAddr) -> SendRequest<Empty<Bytes>> {
    let stream = tokio::net::TcpStream::connect(sidecar).await.unwrap();
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    sender
}

fn start() -> (UpstreamProcess, Sidecar, SocketAddr) {
    let upstream = UpstreamProcess::start(None);
    let listen: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let sidecar = Sidecar::builder().config(&config(listen, upstream.addr())).start_sidecar();
    (upstream, sidecar, listen)
}

#[test]
fn one_logical_request_is_one_rule_resource_and_key_over_http1_and_http2() {
    let (_upstream, _sidecar, listen) = start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let sender = runtime.block_on(http2(listen));
    let cases = (logical(), spelling(), spelling());
    let started = Instant::now();
    let mut runner = TestRunner::new(Config { cases: 1000, failure_persistence: None, ..Config::default() });
    runner
        .run(&cases, |(request, first, second)| {
            let mut sender = sender.clone();
            let expected = expected(&request);
            let h1 = over_http1(listen, &first.spell(&request), &second.choices);
            let h2 = runtime.block_on(over_http2(&mut sender, &second.spell(&request)));
            prop_assert_eq!(&h1, &expected, "HTTP/1.1, {:?}", request);
            prop_assert_eq!(&h2, &expected, "HTTP/2, {:?}", request);
            Ok::<(), TestCaseError>(())
        })
        .unwrap();
    eprintln!("1000 logical requests, each over both protocols, in {:?}", started.elapsed());
}

#[test]
fn malformed_http2_fields_and_values_given_twice_are_refused_over_both_protocols() {
    let (_upstream, _sidecar, listen) = start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut sender = runtime.block_on(http2(listen));
    let tenant = |headers: &[(&str, &str)], authority: &str| Spelled {
        target: "/t".into(),
        authority: authority.into(),
        headers: [("x-tier", "gold")].iter().chain(headers).map(|(n, v)| (n.to_string(), v.to_string())).collect(),
    };
    let acme = "rate limited by sluice: resource \"tenant/acme\" is over its capacity (rule \"tier\")";
    let malformed = |why: &str| format!("400 sluice: malformed request: {why}");

    // Padding is optional whitespace over HTTP/1.1 and malformed over HTTP/2 (RFC 9113 §8.2.1).
    let padded = tenant(&[("x-tenant", " acme ")], "app.test");
    assert_eq!(over_http1(listen, &padded, &[false]), acme);
    assert_eq!(
        runtime.block_on(over_http2(&mut sender, &padded)),
        malformed("the value of header x-tenant begins or ends with whitespace")
    );
    let tab = tenant(&[("x-tenant", "acme\t")], "app.test");
    assert!(runtime.block_on(over_http2(&mut sender, &tab)).starts_with("400 "));

    // A tenant named twice has no single reading: upstreams take the first, the last or both.
    let twice = tenant(&[("x-tenant", "acme"), ("x-tenant", "globex")], "app.test");
    let refused = malformed("header x-tenant is given more than once, with different values");
    assert_eq!(over_http1(listen, &twice, &[false]), refused);
    assert_eq!(runtime.block_on(over_http2(&mut sender, &twice)), refused);
    let same = tenant(&[("x-tenant", "acme"), ("x-tenant", "acme")], "app.test");
    assert_eq!(over_http1(listen, &same, &[false]), acme, "the same value twice is one value");
    assert_eq!(runtime.block_on(over_http2(&mut sender, &same)), acme);
    let query = Spelled { target: "/q?t=acme&t=globex".into(), authority: "app.test".into(), headers: Vec::new() };
    let refused = malformed("query parameter \"t\" is given more than once, with different values");
    assert_eq!(over_http1(listen, &query, &[false]), refused);
    assert_eq!(runtime.block_on(over_http2(&mut sender, &query)), refused);

    // A Host header beside a different :authority (RFC 9113 §8.3.1).
    let two_hosts =
        Spelled { target: "/h/x".into(), authority: "a.test".into(), headers: vec![("host".into(), "b.test".into())] };
    assert_eq!(
        runtime.block_on(over_http2(&mut sender, &two_hosts)),
        malformed("the Host header and :authority differ")
    );
    let same_host =
        Spelled { target: "/h/x".into(), authority: "a.test".into(), headers: vec![("host".into(), "A.test".into())] };
    assert!(runtime.block_on(over_http2(&mut sender, &same_host)).contains("\"host/a.test\""));
    // The connection served every refusal and is still open.
    let again = runtime.block_on(over_http2(&mut sender, &tenant(&[("x-tenant", "acme")], "app.test")));
    assert_eq!(again, acme);
}
