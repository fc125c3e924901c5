//! The test tools themselves — the upstream, the relay, their flags — so that sidecar tests
//! failing through them point at the sidecar.

use std::{net::SocketAddr, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use rcgen::{CertifiedKey, generate_simple_self_signed};
use sluice_tests::{
    harness,
    upstream::{
        UpstreamProcess,
        echo::{EchoRequest, echo_client::EchoClient},
    },
};
use tokio_stream::StreamExt;
use tonic::{
    Code,
    transport::{Certificate, Channel, ClientTlsConfig},
};

async fn request(
    client: &Client<HttpConnector, Full<Bytes>>,
    request: http::Request<Full<Bytes>>,
) -> serde_json::Value {
    let response = client.request(request).await.expect("response");
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.expect("body").to_bytes();
    serde_json::from_slice(&body).expect("JSON")
}

#[tokio::test]
async fn echoes_http1_and_h2c() {
    let upstream = UpstreamProcess::start(None);
    let url = format!("http://{}/echo/a?b=c", upstream.addr());

    let http1 = Client::builder(TokioExecutor::new()).build_http();
    let post = http::Request::post(&url).header("x-one", "1").body(Full::from("hello")).unwrap();
    let echo = request(&http1, post).await;
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["uri"], "/echo/a?b=c");
    assert_eq!(echo["version"], "HTTP/1.1");
    assert_eq!(echo["body"], "hello");
    assert!(echo["headers"].as_array().unwrap().contains(&serde_json::json!(["x-one", "1"])));

    let h2c = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let echo = request(&h2c, http::Request::get(&url).body(Full::default()).unwrap()).await;
    assert_eq!(echo["version"], "HTTP/2.0");
}

async fn check_grpc(mut client: EchoClient<Channel>) {
    let mut call = tonic::Request::new(EchoRequest { message: "hi".into(), ..Default::default() });
    call.metadata_mut().insert("x-request-id", "42".parse().unwrap());
    let reply = client.unary(call).await.expect("unary");
    assert_eq!(reply.get_ref().message, "hi");
    assert_eq!(reply.metadata().get("x-request-id").unwrap(), "42");

    let failing = EchoRequest { fail_code: Code::NotFound as i32, fail_message: "gone".into(), ..Default::default() };
    let status = client.unary(failing).await.expect_err("fail_code fails the call");
    assert_eq!((status.code(), status.message()), (Code::NotFound, "gone"));

    let stream = client.server_stream(EchoRequest { message: "s".into(), count: 3, ..Default::default() });
    let replies: Vec<_> = stream.await.expect("stream").into_inner().collect().await;
    let indices: Vec<u32> = replies.into_iter().map(|reply| reply.expect("reply").index).collect();
    assert_eq!(indices, [0, 1, 2]);

    let messages = tokio_stream::iter(["a", "b"].map(|m| EchoRequest { message: m.into(), ..Default::default() }));
    let reply = client.client_stream(messages).await.expect("client stream").into_inner();
    assert_eq!((reply.message.as_str(), reply.index), ("ab", 2));
}

#[tokio::test]
async fn serves_grpc_in_process() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(sluice_tests::upstream::serve(listener, None));
    check_grpc(EchoClient::connect(format!("http://{addr}")).await.expect("connect")).await;
}

#[tokio::test]
async fn serves_grpc_over_tls() {
    let CertifiedKey { cert, signing_key } = generate_simple_self_signed(["127.0.0.1".to_owned()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, signing_key.serialize_pem()).unwrap();
    let upstream = UpstreamProcess::start(Some((&cert_path, &key_path)));

    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(cert.pem())).domain_name("127.0.0.1");
    let endpoint = Channel::from_shared(format!("https://{}", upstream.addr())).unwrap().tls_config(tls).unwrap();
    check_grpc(EchoClient::new(endpoint.connect().await.expect("connect over TLS"))).await;
}

#[test]
fn the_relay_passes_a_request_and_its_response_through() {
    let upstream = UpstreamProcess::start(None);
    let addr = SocketAddr::from(([127, 0, 0, 1], harness::free_port()));
    let mut relay = std::process::Command::new(harness::binary("sluice-relay"))
        .args(["--addr", &addr.to_string(), "--upstream", &upstream.addr().to_string()])
        .spawn()
        .expect("sluice-relay starts");
    let answer = (0..200).find_map(|_| {
        std::thread::sleep(Duration::from_millis(25));
        harness::http_get(addr, "/echo?relay=1").ok()
    });
    let _ = relay.kill();
    let _ = relay.wait();
    let (status, body) = answer.expect("the relay listens");
    assert_eq!(status, 200);
    assert!(body.contains("/echo?relay=1"), "the upstream's echo of the path: {body}");
}

#[test]
fn every_tool_rejects_a_bad_flag_in_one_line_with_code_64() {
    for tool in [
        "sluice-upstream",
        "sluice-relay",
        "sluice-loadgen",
        "sluice-bench-sidecar",
        "sluice-demo",
        "sluice-connections",
        "sluice-soak",
    ] {
        let out = harness::run(tool, &["--no-such-flag"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{tool}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{tool}: one line, got {stderr:?}");
        assert!(stderr.starts_with(&format!("{tool}: ")) && stderr.contains("--no-such-flag"), "{tool}: {stderr:?}");
    }
}
