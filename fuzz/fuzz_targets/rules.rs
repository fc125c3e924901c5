//! The rule matcher: requests built from the input are classified without a panic against rules
//! of every kind (exact, prefix and glob paths, hosts, methods, gRPC services, headers, declared
//! costs); path normalization is idempotent, and a request is charged as its normalized path is.
#![no_main]
#![forbid(unsafe_code)]

use std::sync::LazyLock;

use http::{Method, Request, Uri};
use libfuzzer_sys::fuzz_target;
use sluice_sidecar::{
    canonical::{escapes_valid, path as normalized},
    config,
    enforce::Costed,
    plan::Plan,
};

const CONFIG: &str = "
listeners: [{name: l, address: '127.0.0.1:1', upstream: u}]
upstreams: [{name: u, url: 'http://127.0.0.1:2'}]
resources:
  - {id: r, kind: rate, capacity: 10}
rules:
  - {name: exact, resource: r, match: {path: {exact: '/api/./v1/%61'}, methods: [GET, HEAD]}}
  - {name: prefix, resource: r, match: {path: {prefix: '/static/'}, host: '*.example.com'}}
  - {name: glob, resource: r, match: {path: {glob: '/u/*/items/**'}}}
  - {name: grpc, resource: r, match: {grpc: {service: pkg.Svc, method: Get}}}
  - {name: header, resource: r, match: {headers: [{name: x-tenant, value: gold}]}, cost: {header: x-cost, default: 2}}
  - {name: rest, resource: r}
";

static PLAN: LazyLock<Plan> =
    LazyLock::new(|| Plan::build(config::parse(CONFIG).expect("valid"), None, None).expect("plan"));

const METHODS: [Method; 5] = [Method::GET, Method::HEAD, Method::POST, Method::DELETE, Method::OPTIONS];

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let mut fields = text.split('\u{0}');
    let (path, host, cost) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""), fields.next().unwrap_or(""));

    // Idempotent, but for a malformed escape that a decoded one completes (`%6%61` is `%6a`
    // once decoded, as an upstream decoding once reads it too): the checks below hold for
    // well-escaped paths.
    if !escapes_valid(path) {
        return;
    }
    let once = normalized(path);
    assert_eq!(normalized(&once), once, "normalization is idempotent");

    let request = |uri: Uri| {
        let mut b = Request::builder().method(METHODS[usize::from(flags % 5)].clone()).uri(uri);
        b = b.header("host", host);
        if flags & 8 != 0 {
            b = b.header("content-type", "application/grpc");
        }
        if flags & 16 != 0 {
            b = b.header("x-tenant", "gold").header("x-cost", cost);
        }
        b.body(()).ok()
    };
    let Some(raw) = path.parse().ok().and_then(request) else { return };
    let rules = &PLAN.listeners[0].rules;
    let charged = rules.classify(&raw).expect("one value per header").expect("the last rule matches everything");
    if let Costed::Declared(c) = charged.cost {
        assert!(c.is_finite() && c >= 0.0, "declared cost {c}");
    }
    // Charged by its normalized path: the same rule for the request rewritten to it (its
    // scheme and authority, if it has them, kept: they name the host).
    let target = raw.uri().path();
    let normal = normalized(target);
    let query = raw.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
    let mut parts = raw.uri().clone().into_parts();
    parts.path_and_query = format!("{normal}{query}").parse().ok();
    let Some(rewritten) = Uri::from_parts(parts).ok().and_then(request) else { return };
    let again = rules.classify(&rewritten).expect("one value per header").expect("the last rule matches everything");
    assert_eq!(again.charge.rule, charged.charge.rule, "{:?} normalized {normal:?}", raw.uri());
});
