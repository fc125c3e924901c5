//! The sidecar's data path in-process: its stack served by `sluice_sidecar::embed` on the test's
//! own runtime, in front of the test upstream served on it too. No binary is spawned, so each case
//! takes milliseconds and a failure points at the data path rather than at a process; the same
//! requests through the real binary are in `sidecar_proxy.rs` and `sidecar_limits.rs`.

use std::{net::SocketAddr, time::Duration};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use sluice_sidecar::embed::Embedded;
use sluice_tests::{
    config::{ConfigFile, Kind, Listener, OnLimit, Per, Resource, Rule, SidecarConfig, Upstream},
    http::{Answer, HttpClient, h2c, http1, send},
    upstream::{
        self,
        echo::{EchoRequest, echo_client::EchoClient},
    },
    wait::eventually,
};
use tokio::net::TcpListener;
use tonic::Code;

/// The test upstream, served on this runtime: its address.
async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port for the upstream");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(upstream::serve(listener, None));
    addr
}

/// A listener on a port the system picks.
fn listener(name: &str) -> Listener {
    Listener::new(name, ([127, 0, 0, 1], 0).into())
}

/// The sidecar of `config`, serving until dropped, and where its first listener listens.
async fn start(config: &SidecarConfig) -> (Embedded, SocketAddr) {
    let sidecar = Embedded::start(&config.yaml()).await.unwrap_or_else(|e| panic!("{e}:\n{}", config.yaml()));
    let listen = sidecar.listeners[0];
    (sidecar, listen)
}

/// A sidecar whose `listener` sends everything to a fresh upstream, charging `resource` by `rule`.
async fn proxy(listener: Listener, resource: Resource, rule: Rule) -> (Embedded, SocketAddr) {
    let upstream = Upstream::app(upstream().await);
    start(&SidecarConfig::proxy(listener, upstream).resource(resource).rule(rule)).await
}

/// Far above any load here.
fn unlimited() -> Resource {
    Resource::new("everything").capacity(1e6)
}

async fn get(client: &HttpClient, url: &str, headers: &[(&str, &str)]) -> Answer {
    let mut request = Request::get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::default()).expect("a valid request");
    send(client, request, Duration::from_secs(10)).await.unwrap_or_else(|| panic!("no answer to GET {url}"))
}

#[tokio::test]
async fn requests_pass_through_over_http1_and_h2c() {
    let (_sidecar, listen) = proxy(listener("app"), unlimited(), Rule::charging("everything")).await;
    for (client, version) in [(http1(), "HTTP/1.1"), (h2c(), "HTTP/2.0")] {
        let post = Request::post(format!("http://{listen}/echo/orders?id=7&x=%20"))
            .header("x-custom", "one")
            .body(Full::from("hello body"))
            .unwrap();
        let answer = send(&client, post, Duration::from_secs(10)).await.expect("an answer");
        assert_eq!(answer.status, 200, "{version}: {}", answer.body);
        let seen: serde_json::Value = serde_json::from_str(&answer.body).expect("the upstream's echo");
        assert_eq!(seen["version"], version, "the caller's protocol goes upstream");
        assert_eq!(
            (&seen["method"], &seen["uri"], &seen["body"]),
            (&"POST".into(), &"/echo/orders?id=7&x=%20".into(), &"hello body".into())
        );
        assert!(seen["headers"].as_array().unwrap().contains(&serde_json::json!(["x-custom", "one"])), "{seen}");
    }
    // A body streamed back and trailers, over HTTP/2.
    let response = h2c().request(Request::get(format!("http://{listen}/trailers")).body(Full::default()).unwrap());
    let collected = response.await.unwrap().into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().and_then(|t| t.get("x-trailer")).map(|v| v.to_str().unwrap()), Some("done"));
    assert_eq!(collected.to_bytes(), "with trailers");
}

#[tokio::test]
async fn a_rate_rule_refuses_with_429_retry_after_and_ratelimit_headers() {
    let tiny = Resource::new("tiny").capacity(1.0).burst(2.0);
    let (_sidecar, listen) =
        proxy(listener("app"), tiny, Rule::charging("tiny").name("reads").on_limit(OnLimit::Reject)).await;
    let (client, url) = (http1(), format!("http://{listen}/echo"));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(get(&client, &url, &[]).await);
    }
    let codes: Vec<u16> = statuses.iter().map(|a| a.status.as_u16()).collect();
    assert_eq!(codes, [200, 200, 429], "the burst of 2 passes, the next is refused");
    let refused = &statuses[2];
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(refused.headers["ratelimit-policy"], "\"tiny\";q=1;w=1");
    assert!(refused.headers["ratelimit"].to_str().unwrap().starts_with("\"tiny\";r=0;t="), "{:?}", refused.headers);
    assert_eq!(
        refused.body.trim_end(),
        "rate limited by sluice: resource \"tiny\" is over its capacity (rule \"reads\")"
    );
}

#[tokio::test]
async fn a_refused_grpc_call_is_answered_trailers_only_with_resource_exhausted() {
    let none = Resource::new("none").kind(Kind::Concurrency).capacity(0.0);
    let (_sidecar, listen) = proxy(listener("app"), none, Rule::charging("none")).await;
    // Its whole answer is one HEADERS frame: status 200, grpc-status 8, no body, no trailers.
    let call = Request::post(format!("http://{listen}/sluice.test.Echo/Unary"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::from(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap();
    let response = h2c().request(call).await.expect("an answer");
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    assert_eq!(headers["grpc-status"], "8", "{headers:?}");
    assert_eq!(headers["content-type"], "application/grpc");
    assert!(headers["grpc-message"].to_str().unwrap().contains("none"), "{headers:?}");
    let body = response.into_body().collect().await.expect("the end of the stream");
    assert!(body.trailers().is_none(), "trailers-only: the status is in the head");
    assert!(body.to_bytes().is_empty());
    // As a gRPC client sees it.
    let mut client = EchoClient::connect(format!("http://{listen}")).await.unwrap();
    let status = client.unary(EchoRequest::default()).await.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("resource \"none\""), "{}", status.message());
}

#[tokio::test]
async fn a_routing_listener_forwards_by_host_and_answers_an_unknown_host_404() {
    let upstream = upstream().await;
    let config = SidecarConfig::new()
        .listener(listener("edge"))
        .upstream(Upstream::new("api", format!("http://{upstream}")).hosts(&["api.example.test"]))
        .resource(unlimited())
        .rule(Rule::charging("everything"));
    let (_sidecar, listen) = start(&config).await;
    let (client, url) = (http1(), format!("http://{listen}/echo"));
    let routed = get(&client, &url, &[("host", "API.example.test:80")]).await;
    assert_eq!(routed.status, 200, "{}", routed.body);
    let seen: serde_json::Value = serde_json::from_str(&routed.body).unwrap();
    assert!(seen["headers"].as_array().unwrap().contains(&serde_json::json!(["host", upstream.to_string()])), "{seen}");
    let unknown = get(&client, &url, &[("host", "evil.example.test")]).await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.body.contains("no upstream is configured for host \"evil.example.test\""), "{}", unknown.body);
}

#[tokio::test]
async fn requests_beyond_max_requests_are_shed_with_503() {
    let (_sidecar, listen) = proxy(listener("app").max_requests(1), unlimited(), Rule::charging("everything")).await;
    let slow = tokio::spawn(async move { get(&http1(), &format!("http://{listen}/slow?ms=2000"), &[]).await.status });
    // While the slow one is in flight, the listener has no room for another.
    let client = http1();
    let url = format!("http://{listen}/echo");
    eventually("a request shed beside the slow one", async || get(&client, &url, &[]).await.status == 503).await;
    assert_eq!(slow.await.unwrap(), 200, "the request in flight is served");
    assert_eq!(get(&client, &url, &[]).await.status, 200, "room again once it ended");
}

#[tokio::test]
async fn a_keyed_resource_holds_a_key_per_tenant() {
    // One request per key, then nothing for 100 s.
    let keyed = Resource::new("per-tenant").capacity(0.01).burst(1.0).per(Per::Header("x-tenant".into()));
    let (_sidecar, listen) =
        proxy(listener("app"), keyed, Rule::charging("per-tenant").on_limit(OnLimit::Reject)).await;
    let (client, url) = (http1(), format!("http://{listen}/echo"));
    let call = async |tenant: Option<&str>| match tenant {
        Some(tenant) => get(&client, &url, &[("x-tenant", tenant)]).await,
        None => get(&client, &url, &[]).await,
    };
    assert_eq!(call(Some("acme")).await.status, 200);
    let refused = call(Some("acme")).await;
    assert_eq!(refused.status, 429, "acme's bucket is empty");
    assert!(refused.body.contains("resource \"per-tenant/acme\""), "{}", refused.body);
    assert_eq!(call(Some("globex")).await.status, 200, "globex has its own");
    assert_eq!(call(Some("a b/c")).await.status, 200, "a value unsafe in an id has a key of its own");
    assert!(call(Some("a b/c")).await.body.contains("resource \"per-tenant/a%20b%2Fc\""));
    // Requests without the header share one key.
    assert_eq!(call(None).await.status, 200);
    let missing = call(None).await;
    assert_eq!(missing.status, 429);
    assert!(missing.body.contains("resource \"per-tenant/!missing\""), "{}", missing.body);
}
