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
    config::{GrpcPart, Kind, Listener, Match, PathMatch, Per, Resource, Rule, SidecarConfig, Upstream},
    harness::Sidecar,
    raw::{connect, read_all},
    spelling::{
        Piece, bytes, choices, grpc_name, host, key_of, pieces, query_path, segment_path, segment_value, value,
    },
    upstream::UpstreamProcess,
};

/// Every resource refuses at once: a charged request names its resource (a key's id) and rule.
fn config(upstream: SocketAddr) -> SidecarConfig {
    let refusing = |id: &str| Resource::new(id).kind(Kind::Concurrency).capacity(0.0);
    let keyed = |id: &str, per: Per| refusing(id).per(per).max_keys(10_000);
    let path = |path: PathMatch| Match::default().path(path);
    SidecarConfig::proxy(Listener::app(), Upstream::app(upstream))
        .resource(keyed("seg", Per::PathSegment(1)))
        .resource(keyed("q", Per::Query("t".into())))
        .resource(keyed("tenant", Per::Header("x-tenant".into())))
        .resource(keyed("host", Per::Host))
        .resource(keyed("method", Per::Grpc(GrpcPart::Method)))
        .resource(refusing("cafe"))
        .rule(Rule::charging("seg").name("seg").matching(path(PathMatch::Prefix("/s/".into()))))
        .rule(Rule::charging("q").name("q").matching(path(PathMatch::Exact("/q".into()))))
        .rule(Rule::charging("tenant").name("tier").matching(Match::default().header("x-tier", "gold")))
        .rule(Rule::charging("method").name("grpc").matching(Match::default().grpc("pkg.Svc", None)))
        .rule(Rule::charging("cafe").name("cafe").matching(path(PathMatch::Exact("/caf%C3%A9".into()))))
        .rule(Rule::charging("host").name("host").matching(path(PathMatch::Prefix("/h/".into()))))
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

fn logical() -> impl Strategy<Value = Logical> {
    prop_oneof![
        segment_value().prop_map(Logical::Segment),
        pieces().prop_map(Logical::Query),
        "[!-~]([ !-~]{0,10}[!-~])?".prop_map(Logical::Tenant),
        "[A-Za-z][A-Za-z0-9_]{0,10}".prop_map(Logical::Grpc),
        Just(Logical::Cafe),
        "[a-z0-9-]{1,8}(\\.[a-z0-9-]{1,8}){0,2}".prop_map(Logical::Host),
        Just(Logical::Unmatched),
    ]
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
    (choices(), any::<u8>()).prop_map(|(choices, noise)| Spelling { choices, noise })
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
            Logical::Segment(v) => segment_path(&value(v, false, &mut choices), self.noise),
            Logical::Query(v) => query_path(&value(v, true, &mut choices), self.noise & 1 != 0, self.noise & 2 != 0),
            Logical::Tenant(v) => {
                headers.push(("x-tier".into(), "gold".into()));
                headers.push(("x-tenant".into(), v.clone()));
                "/t".into()
            }
            Logical::Grpc(m) => {
                headers.push(("content-type".into(), "application/grpc".into()));
                format!("/pkg.Svc/{}", grpc_name(m, &mut choices))
            }
            Logical::Cafe => ["/caf%C3%A9", "/caf%c3%a9", "/caf%C3%a9", "/café", "/%63af%c3%A9", "/x/../caf%c3%A9"]
                [usize::from(self.noise % 6)]
            .into(),
            Logical::Host(h) => {
                authority = host(h, &mut choices, self.noise & 1 != 0, (self.noise & 2 != 0).then_some(8080));
                "/h/x".into()
            }
            Logical::Unmatched => "/nothing/here".into(),
        };
        Spelled { target, authority, headers }
    }
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
    let sidecar = Sidecar::launch(&config(upstream.addr())).start();
    let listen = sidecar.listen();
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
