//! Keys cannot be dodged by spelling: every spelling of one value that an upstream reads alike
//! (escapes of either hex case or none, `+` or `%20` in a query, dot segments and repeated
//! slashes, a host's case, port and trailing dot, escaped gRPC names) lands on one key, and
//! values an upstream reads differently (non-UTF-8 ones included) land on different keys.

use std::sync::LazyLock;

use http::Request;
use proptest::prelude::*;
use sluice_sidecar::{config, plan::Plan};
use sluice_tests::{
    config::{ConfigFile, GrpcPart, Listener, Match, PathMatch, Per, Resource, Rule, SidecarConfig, Upstream},
    spelling::{
        Piece, bytes, choices, grpc_name, host, key_of, pieces, query_path, segment_path, segment_value, value,
    },
};

/// One keyed resource per attribute; the addresses are never used, requests are only classified.
static PLAN: LazyLock<Plan> = LazyLock::new(|| {
    let keyed = |id: &str, per: Per| Resource::new(id).capacity(1.0).per(per).max_keys(10_000);
    let config =
        SidecarConfig::proxy(Listener::new("l", ([127, 0, 0, 1], 1).into()), Upstream::new("u", "http://127.0.0.1:2"))
            .resource(keyed("seg", Per::PathSegment(1)))
            .resource(keyed("q", Per::Query("t".into())))
            .resource(keyed("host", Per::Host))
            .resource(keyed("method", Per::Grpc(GrpcPart::Method)))
            .rule(Rule::charging("seg").name("seg").matching(Match::default().path(PathMatch::Prefix("/s/".into()))))
            .rule(Rule::charging("q").name("q").matching(Match::default().path(PathMatch::Exact("/q".into()))))
            .rule(Rule::charging("method").name("grpc").matching(Match::default().grpc("pkg.Svc", None)))
            .rule(Rule::charging("host").name("host"));
    Plan::build(config::parse(&config.yaml()).expect("valid"), None, None).expect("plan")
});

/// The id of the key `req` is charged to.
fn key(req: Request<()>) -> String {
    let charged = PLAN.listeners[0].rules.classify(&req).expect("one reading").expect("a rule matches");
    charged.gates()[0].id.to_string()
}

/// One spelling of `pieces` in a path segment or a query value (`query`), as `choices` say.
fn spell(pieces: &[Piece], query: bool, choices: &[bool]) -> String {
    value(pieces, query, &mut choices.iter().copied().cycle())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_spelling_of_a_path_segment_is_one_key(
        value in segment_value(), a in choices(), b in choices(), noise_a: u8, noise_b: u8,
    ) {
        let get = |choices: &[bool], noise: u8| {
            Request::get(segment_path(&spell(&value, false, choices), noise)).body(()).unwrap()
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
            Request::get(segment_path(&spell(value, false, choices), 0)).body(()).unwrap()
        };
        prop_assert_ne!(key(get(&x, &a)), key(get(&y, &b)));
    }

    #[test]
    fn every_spelling_of_a_query_value_is_one_key(
        value in pieces(), a in choices(), b in choices(), before: bool, after: bool,
    ) {
        let get = |choices: &[bool]| Request::get(query_path(&spell(&value, true, choices), before, after)).body(()).unwrap();
        let expected = format!("q/{}", key_of(&bytes(&value)));
        prop_assert_eq!(key(get(&a)), expected.clone());
        prop_assert_eq!(key(get(&b)), expected);
    }

    #[test]
    fn different_query_values_are_different_keys(x in pieces(), y in pieces(), a in choices(), b in choices()) {
        prop_assume!(bytes(&x) != bytes(&y));
        let get = |value: &[Piece], choices: &[bool]| {
            Request::get(query_path(&spell(value, true, choices), false, false)).body(()).unwrap()
        };
        prop_assert_ne!(key(get(&x, &a)), key(get(&y, &b)));
    }

    #[test]
    fn every_spelling_of_a_host_is_one_key(
        name in "[a-z0-9-]{1,8}(\\.[a-z0-9-]{1,8}){0,2}", case in choices(), port in proptest::option::of(1u16..),
        dot: bool,
    ) {
        let host = host(&name, &mut case.iter().copied().cycle(), dot, port);
        let by_header = Request::get("/").header("host", &host).body(()).unwrap();
        let by_authority = Request::get(format!("http://{host}/")).body(()).unwrap();
        let expected = format!("host/{}", key_of(name.as_bytes()));
        prop_assert_eq!(key(by_header), expected.clone());
        prop_assert_eq!(key(by_authority), expected);
    }

    #[test]
    fn every_spelling_of_a_grpc_method_is_one_key(method in "[A-Za-z][A-Za-z0-9_]{0,12}", escapes in choices()) {
        let spelled = grpc_name(&method, &mut escapes.iter().copied().cycle());
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
