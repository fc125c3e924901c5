//! Keys cannot be dodged by spelling: every spelling of one value that an upstream reads alike
//! (escapes of either hex case or none, `+` or `%20` in a query, dot segments and repeated
//! slashes, a host's case, port and trailing dot, escaped gRPC names) lands on one key, and
//! values an upstream reads differently (non-UTF-8 ones included) land on different keys.

use std::sync::LazyLock;

use http::Request;
use proptest::prelude::*;
use sluice_sidecar::{config, plan::Plan};

const CONFIG: &str = "
listeners: [{name: l, address: '127.0.0.1:1', upstream: u}]
upstreams: [{name: u, url: 'http://127.0.0.1:2'}]
resources:
  - {id: seg, capacity: 1, per: {path_segment: 1}, max_keys: 10000}
  - {id: q, capacity: 1, per: {query: t}, max_keys: 10000}
  - {id: host, capacity: 1, per: host, max_keys: 10000}
  - {id: method, capacity: 1, per: {grpc: method}, max_keys: 10000}
rules:
  - {name: seg, resource: seg, match: {path: {prefix: /s/}}}
  - {name: q, resource: q, match: {path: {exact: /q}}}
  - {name: grpc, resource: method, match: {grpc: {service: pkg.Svc}}}
  - {name: host, resource: host}
";

static PLAN: LazyLock<Plan> =
    LazyLock::new(|| Plan::build(config::parse(CONFIG).expect("valid"), None, None).expect("plan"));

/// The id of the key `req` is charged to.
fn key(req: Request<()>) -> String {
    let charged = PLAN.listeners[0].rules.classify(&req).expect("one reading").expect("a rule matches");
    charged.gates()[0].id.to_string()
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
        prop::sample::select(vec![' ', '/', '?', '#', '%', '&', '"', '<', 'é', 'ß', '中', '😀']),
    ];
    let piece = prop_oneof![4 => chars.prop_map(Piece::Char), 1 => (0x80u8..=0xFF).prop_map(Piece::Byte)];
    prop::collection::vec(piece, 1..10)
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

/// `b` as `%XX`, each hex digit's case from `case`.
fn escape(b: u8, case: &mut impl Iterator<Item = bool>) -> String {
    format!("%{b:02X}").chars().map(|c| if case.next().unwrap_or(false) { c.to_ascii_lowercase() } else { c }).collect()
}

/// One spelling of `pieces` in a path segment or a query value (`query`): `choices` says,
/// piece by piece, whether a character that may be written raw is, and the case of escapes.
fn spell(pieces: &[Piece], query: bool, choices: &[bool]) -> String {
    let mut choices = choices.iter().copied().cycle();
    let mut out = String::new();
    for piece in pieces {
        match *piece {
            Piece::Char(' ') if query && choices.next().unwrap_or(false) => out.push('+'),
            Piece::Char(c) if raw(c, query) && choices.next().unwrap_or(false) => out.push(c),
            Piece::Char(c) => {
                for &b in c.encode_utf8(&mut [0; 4]).as_bytes() {
                    out.push_str(&escape(b, &mut choices));
                }
            }
            Piece::Byte(b) => out.push_str(&escape(b, &mut choices)),
        }
    }
    out
}

/// Whether `c` may stand unescaped in a path segment (or a query value).
fn raw(c: char, query: bool) -> bool {
    match c {
        '/' | '?' | '#' | '%' | ' ' | '"' | '<' => false,
        '&' | '=' | '+' => !query,
        _ => true,
    }
}

/// Values an upstream reads as a segment of its own: not a dot segment.
fn segment_value() -> impl Strategy<Value = Vec<Piece>> {
    pieces().prop_filter("not a dot segment", |p| !matches!(bytes(p).as_slice(), b"." | b".."))
}

/// A path leading to segment 1, with the dot segments and repeated slashes `noise` picks.
fn path_to(segment: &str, noise: u8) -> String {
    let lead = ["/s/", "//s/", "/./s/", "/x/../s/", "/s/./", "/s//"][usize::from(noise % 6)];
    format!("{lead}{segment}/end")
}

fn choices() -> impl Strategy<Value = Vec<bool>> {
    prop::collection::vec(any::<bool>(), 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_spelling_of_a_path_segment_is_one_key(
        value in segment_value(), a in choices(), b in choices(), noise_a: u8, noise_b: u8,
    ) {
        let get = |choices: &[bool], noise: u8| {
            Request::get(path_to(&spell(&value, false, choices), noise)).body(()).unwrap()
        };
        let expected = format!("seg/{}", key_of(&bytes(&value)));
        prop_assert_eq!(key(get(&a, noise_a)), expected.clone());
        prop_assert_eq!(key(get(&b, noise_b)), expected);
    }

    #[test]
    fn different_path_segments_are_different_keys(
        x in segment_value(), y in segment_value(), a in choices(), b in choices(),
    ) {
        prop_assume!(bytes(&x) != bytes(&y));
        let get = |value: &[Piece], choices: &[bool]| {
            Request::get(path_to(&spell(value, false, choices), 0)).body(()).unwrap()
        };
        prop_assert_ne!(key(get(&x, &a)), key(get(&y, &b)));
    }

    #[test]
    fn every_spelling_of_a_query_value_is_one_key(
        value in pieces(), a in choices(), b in choices(), before: bool, after: bool,
    ) {
        let get = |choices: &[bool]| {
            let mut query = Vec::new();
            if before { query.push("a=1".to_owned()); }
            query.push(format!("t={}", spell(&value, true, choices)));
            if after { query.push("x=%41&b".to_owned()); }
            Request::get(format!("/q?{}", query.join("&"))).body(()).unwrap()
        };
        let expected = format!("q/{}", key_of(&bytes(&value)));
        prop_assert_eq!(key(get(&a)), expected.clone());
        prop_assert_eq!(key(get(&b)), expected);
    }

    #[test]
    fn different_query_values_are_different_keys(x in pieces(), y in pieces(), a in choices(), b in choices()) {
        prop_assume!(bytes(&x) != bytes(&y));
        let get = |value: &[Piece], choices: &[bool]| {
            Request::get(format!("/q?t={}", spell(value, true, choices))).body(()).unwrap()
        };
        prop_assert_ne!(key(get(&x, &a)), key(get(&y, &b)));
    }

    #[test]
    fn every_spelling_of_a_host_is_one_key(
        name in "[a-z0-9-]{1,8}(\\.[a-z0-9-]{1,8}){0,2}", case in choices(), port in proptest::option::of(1u16..),
        dot: bool,
    ) {
        let mut cases = case.iter().cycle();
        let spelled: String =
            name.chars().map(|c| if *cases.next().unwrap() { c.to_ascii_uppercase() } else { c }).collect();
        let host = format!("{spelled}{}{}", if dot { "." } else { "" }, port.map(|p| format!(":{p}")).unwrap_or_default());
        let by_header = Request::get("/").header("host", &host).body(()).unwrap();
        let by_authority = Request::get(format!("http://{host}/")).body(()).unwrap();
        let expected = format!("host/{}", key_of(name.as_bytes()));
        prop_assert_eq!(key(by_header), expected.clone());
        prop_assert_eq!(key(by_authority), expected);
    }

    #[test]
    fn every_spelling_of_a_grpc_method_is_one_key(method in "[A-Za-z][A-Za-z0-9_]{0,12}", escapes in choices()) {
        let mut choices = escapes.iter().copied().cycle();
        let spelled: String = method
            .bytes()
            .map(|b| if choices.next().unwrap() { escape(b, &mut choices) } else { char::from(b).to_string() })
            .collect();
        let call = Request::post(format!("/pkg.Svc/{spelled}")).header("content-type", "application/grpc");
        prop_assert_eq!(key(call.body(()).unwrap()), format!("method/{method}"));
    }
}

#[test]
fn a_value_given_twice_differently_has_no_key() {
    let classify = |req: Request<()>| PLAN.listeners[0].rules.classify(&req).map(|c| c.is_some());
    assert_eq!(classify(Request::get("/q?t=a&t=a").body(()).unwrap()), Ok(true), "the same twice is one value");
    assert!(classify(Request::get("/q?t=a&t=b").body(()).unwrap()).is_err());
    assert!(classify(Request::get("/q?t=a%zz").body(()).unwrap()).is_err(), "a stray %");
}
