//! The sidecar as a transparent proxy (SPEC §4.1): HTTP/1.1, h2c and gRPC pass through
//! unchanged, TLS is originated toward https:// upstreams, and requests for hosts nobody
//! configured are answered by the sidecar, never forwarded.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use sluice_tests::{
    config::{Listener, Resource, Rule, SidecarConfig, Upstream},
    harness::{Sidecar, free_port, standalone_sidecar},
    http::{HttpClient, get, h2c, http1},
    upstream::{
        UpstreamProcess,
        echo::{EchoRequest, echo_client::EchoClient},
    },
    wait::{eventually, lazily},
};
use tokio_stream::StreamExt;
use tonic::Code;

/// A standalone sidecar whose `listener` forwards to `upstream`, with a rule far above any test
/// load so that nothing is limited.
fn sidecar_with(listener: Listener, upstream: Upstream) -> (Sidecar, SocketAddr) {
    standalone_sidecar(listener, upstream, Resource::new("everything").capacity(1e6), Rule::charging("everything"))
}

/// [`sidecar_with`] the listener `app` in front of the test upstream at `upstream`.
fn sidecar(upstream: &UpstreamProcess) -> (Sidecar, SocketAddr) {
    sidecar_with(Listener::app(), Upstream::app(upstream.addr()))
}

/// [`sidecar_with`] the listener `app` in front of an https:// upstream on `port` of localhost,
/// trusting `ca` when given.
fn tls_sidecar(port: u16, ca: Option<&Path>) -> (Sidecar, SocketAddr) {
    let upstream = Upstream::new("app", format!("https://localhost:{port}"));
    sidecar_with(
        Listener::app(),
        match ca {
            Some(ca) => upstream.ca(ca),
            None => upstream,
        },
    )
}

async fn echo(client: &HttpClient, request: http::Request<Full<Bytes>>) -> serde_json::Value {
    let response = client.request(request).await.expect("response");
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.expect("body").to_bytes();
    serde_json::from_slice(&body).expect("JSON echo")
}

fn has_header(echo: &serde_json::Value, name: &str, value: &str) -> bool {
    echo["headers"].as_array().expect("headers").contains(&serde_json::json!([name, value]))
}

#[tokio::test]
async fn http1_passes_through_unchanged() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(&upstream);
    let client = http1();

    let post = http::Request::post(format!("http://{listen}/echo/orders?id=7&x=%20"))
        .header("x-custom", "one")
        .header("authorization", "Bearer t")
        .body(Full::from("hello body"))
        .unwrap();
    let seen = echo(&client, post).await;
    assert_eq!(seen["method"], "POST");
    assert_eq!(seen["uri"], "/echo/orders?id=7&x=%20");
    assert_eq!(seen["version"], "HTTP/1.1");
    assert_eq!(seen["body"], "hello body");
    assert!(has_header(&seen, "x-custom", "one") && has_header(&seen, "authorization", "Bearer t"), "{seen}");
    // The Host header names the upstream, as the application addressed the sidecar.
    assert!(has_header(&seen, "host", &upstream.addr().to_string()), "{seen}");

    let response =
        client.request(http::Request::get(format!("http://{listen}/status/503")).body(Full::default()).unwrap());
    let response = response.await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["x-upstream-status"], "503");
    assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "status 503");

    let stream = client.request(
        http::Request::get(format!("http://{listen}/stream?chunks=4&delay_ms=20")).body(Full::default()).unwrap(),
    );
    let body = stream.await.unwrap().into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "chunk 0\nchunk 1\nchunk 2\nchunk 3\n");
}

#[tokio::test]
async fn h2c_passes_through_with_trailers() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(&upstream);
    let client = h2c();

    let put = http::Request::put(format!("http://{listen}/echo?h2=1"))
        .header("x-h2", "yes")
        .body(Full::from("over h2"))
        .unwrap();
    let seen = echo(&client, put).await;
    assert_eq!(seen["version"], "HTTP/2.0", "HTTP/2 from the application stays HTTP/2 upstream");
    assert_eq!(seen["body"], "over h2");
    assert!(has_header(&seen, "x-h2", "yes"), "{seen}");

    let response =
        client.request(http::Request::get(format!("http://{listen}/trailers")).body(Full::default()).unwrap());
    let collected = response.await.unwrap().into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().and_then(|t| t.get("x-trailer")).map(|v| v.to_str().unwrap()), Some("done"));
    assert_eq!(collected.to_bytes(), "with trailers");
}

#[tokio::test]
async fn http2_calls_and_quiet_streams_are_not_idle() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) =
        sidecar_with(Listener::app().idle_timeout(Duration::from_secs(1)), Upstream::app(upstream.addr()));
    let client = h2c();
    // Nothing crosses the connection for longer than the idle timeout while each is open.
    let slow = get(&client, &format!("http://{listen}/slow?ms=2500")).await;
    assert_eq!((slow.status.as_u16(), slow.body.as_str()), (200, "slow"));
    let stream = get(&client, &format!("http://{listen}/stream?chunks=3&delay_ms=1500")).await;
    assert_eq!(stream.body, "chunk 0\nchunk 1\nchunk 2\n");
}

#[tokio::test]
async fn long_http2_streams_do_not_hold_up_other_requests() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(&upstream);
    // 250 long requests, more than the upstream lets one connection carry at once (200), from
    // two application connections.
    let done = Arc::new(AtomicUsize::new(0));
    let mut long = Vec::new();
    for client in [h2c(), h2c()] {
        for _ in 0..125 {
            let (client, done, url) = (client.clone(), done.clone(), format!("http://{listen}/slow?ms=8000"));
            long.push(tokio::spawn(async move {
                let answer = get(&client, &url).await;
                done.fetch_add(1, Ordering::SeqCst);
                answer.status
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let quick = get(&h2c(), &format!("http://{listen}/slow?ms=0")).await;
    assert_eq!(quick.status, 200);
    assert_eq!(done.load(Ordering::SeqCst), 0, "answered while every long request was still open");
    for request in long {
        assert_eq!(request.await.unwrap(), 200);
    }
}

#[tokio::test]
async fn big_response_heads_pass_from_http2_upstreams() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(&upstream);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .http2_max_header_list_size(1 << 20)
        .build_http::<Full<Bytes>>();
    // 40 KB: above h2's 16 KiB default, within the sidecar's 64 KiB for any upstream.
    let big = get(&client, &format!("http://{listen}/big-head?bytes=40960")).await;
    assert_eq!(big.status, 200);
    assert_eq!(big.headers.keys().filter(|name| name.as_str().starts_with("x-big-")).count(), 40);
}

#[tokio::test]
async fn grpc_unary_and_streaming_pass_through() {
    let upstream = UpstreamProcess::start(None);
    let (_sidecar, listen) = sidecar(&upstream);
    let mut client = EchoClient::connect(format!("http://{listen}")).await.expect("connect through the sidecar");

    let mut call = tonic::Request::new(EchoRequest { message: "ping".into(), ..Default::default() });
    call.metadata_mut().insert("x-request-id", "r-1".parse().unwrap());
    let reply = client.unary(call).await.expect("unary");
    assert_eq!(reply.get_ref().message, "ping");
    assert_eq!(reply.metadata().get("x-request-id").unwrap(), "r-1", "metadata comes back");

    let failing =
        EchoRequest { fail_code: Code::FailedPrecondition as i32, fail_message: "nope".into(), ..Default::default() };
    let status = client.unary(failing).await.expect_err("the upstream's status passes through");
    assert_eq!((status.code(), status.message()), (Code::FailedPrecondition, "nope"));

    let stream = client.server_stream(EchoRequest { message: "s".into(), count: 50, ..Default::default() });
    let replies: Vec<_> = stream.await.expect("stream").into_inner().collect().await;
    let indices: Vec<u32> = replies.into_iter().map(|r| r.expect("message").index).collect();
    assert_eq!(indices, (0..50).collect::<Vec<_>>());

    let messages = tokio_stream::iter((0..5).map(|i| EchoRequest { message: i.to_string(), ..Default::default() }));
    let reply = client.client_stream(messages).await.expect("client stream");
    assert_eq!((reply.get_ref().message.as_str(), reply.get_ref().index), ("01234", 5));
}

#[tokio::test]
async fn originates_tls_to_https_upstreams() {
    let dir = tempfile::tempdir().unwrap();
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key, ca_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"), dir.path().join("ca.pem"));
    std::fs::write(&cert, ca.cert.pem()).unwrap();
    std::fs::write(&key, ca.signing_key.serialize_pem()).unwrap();
    std::fs::write(&ca_path, ca.cert.pem()).unwrap();
    let upstream = UpstreamProcess::start(Some((&cert, &key)));
    let (_sidecar, listen) = tls_sidecar(upstream.addr().port(), Some(&ca_path));

    let seen =
        echo(&http1(), http::Request::get(format!("http://{listen}/echo/tls")).body(Full::default()).unwrap()).await;
    assert_eq!(seen["uri"], "/echo/tls");
    let seen =
        echo(&h2c(), http::Request::get(format!("http://{listen}/echo/tls2")).body(Full::default()).unwrap()).await;
    assert_eq!(seen["version"], "HTTP/2.0", "ALPN negotiates h2 for HTTP/2 callers");

    let mut grpc = EchoClient::connect(format!("http://{listen}")).await.unwrap();
    let reply =
        grpc.unary(EchoRequest { message: "secure".into(), ..Default::default() }).await.expect("gRPC over TLS");
    assert_eq!(reply.get_ref().message, "secure");

    // Without the CA the upstream's certificate is not trusted: 502, never plaintext.
    let (_untrusting, listen) = tls_sidecar(upstream.addr().port(), None);
    let response = http1().request(http::Request::get(format!("http://{listen}/echo")).body(Full::default()).unwrap());
    assert_eq!(response.await.unwrap().status(), 502);

    // Upstreams that speak only HTTP/1.1 over TLS, refusing h2 or ignoring ALPN: HTTP/2 callers
    // get a 502 that says why.
    for alpn in ["http/1.1", ""] {
        let args = [cert.as_os_str(), key.as_os_str(), alpn.as_ref()];
        let old_school = UpstreamProcess::launch(
            &sluice_tests::harness::binary("sluice-upstream"),
            &["--tls-cert".as_ref(), args[0], "--tls-key".as_ref(), args[1], "--tls-alpn".as_ref(), args[2]],
        )
        .unwrap();
        let (_sidecar, listen) = tls_sidecar(old_school.addr().port(), Some(&ca_path));
        let seen =
            echo(&http1(), http::Request::get(format!("http://{listen}/echo/old")).body(Full::default()).unwrap())
                .await;
        assert_eq!(seen["uri"], "/echo/old");
        let response =
            h2c().request(http::Request::get(format!("http://{listen}/echo")).body(Full::default()).unwrap());
        let response = response.await.unwrap();
        assert_eq!(response.status(), 502);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("did not agree to HTTP/2"), "ALPN {alpn:?}: {body:?}");
    }
}

#[tokio::test]
async fn an_upstream_ca_bundle_rotated_on_disk_is_trusted_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (serving, other) = (
        rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap(),
        rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap(),
    );
    let (cert, key, ca_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"), dir.path().join("ca.pem"));
    std::fs::write(&cert, serving.cert.pem()).unwrap();
    std::fs::write(&key, serving.signing_key.serialize_pem()).unwrap();
    // The sidecar starts trusting a certificate the upstream does not use.
    std::fs::write(&ca_path, other.cert.pem()).unwrap();
    let upstream = UpstreamProcess::start(Some((&cert, &key)));
    let (sidecar, listen) = tls_sidecar(upstream.addr().port(), Some(&ca_path));
    let status = || async {
        let request = http::Request::get(format!("http://{listen}/echo")).body(Full::default()).unwrap();
        http1().request(request).await.unwrap().status()
    };
    assert_eq!(status().await, 502, "not trusted yet");

    // The configuration file is being edited (a rejected state, not YAML: written by hand, as no
    // configuration the kit builds can be) while the bundle rotates: the rotation does not wait for it.
    sidecar.write_raw_config("listeners: [");
    std::fs::write(&ca_path, serving.cert.pem()).unwrap();
    let why = lazily(|| format!("the new CA bundle is not in use; log:\n{}", sidecar.logs()));
    eventually(why, async || status().await == 200).await;
    assert!(sidecar.logs().contains("CA bundle changed"), "the rotation is logged:\n{}", sidecar.logs());
    assert!(sidecar.logs().contains("configuration rejected"), "the edit was seen:\n{}", sidecar.logs());
}

#[tokio::test]
async fn unconfigured_hosts_are_not_forwarded() {
    let upstream = UpstreamProcess::start(None);
    let config = SidecarConfig::new()
        .listener(Listener::new("edge", ([127, 0, 0, 1], free_port()).into()))
        .upstream(Upstream::new("api", format!("http://{}", upstream.addr())).hosts(&["api.example.test"]))
        .resource(Resource::new("everything").capacity(1e6))
        .rule(Rule::charging("everything"));
    let sidecar = Sidecar::launch(&config).start();
    let listen = sidecar.listen();
    let client = http1();
    let get = |host: &str| {
        http::Request::get(format!("http://{listen}/echo")).header("host", host).body(Full::default()).unwrap()
    };

    let seen = echo(&client, get("API.example.test:80")).await;
    assert!(has_header(&seen, "host", &upstream.addr().to_string()), "routed by Host: {seen}");

    let refused = client.request(get("evil.example.test")).await.unwrap();
    assert_eq!(refused.status(), 404);
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("no upstream is configured for host \"evil.example.test\""));
}
