//! TLS and mTLS on the gRPC listener, from a sidecar, and the checks of the files at start-up,
//! with certificates generated for the test.

use std::{
    io::Read,
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use rcgen::{CertificateParams, KeyPair};
use sluice_proto::{DiscoveryRequest, capacity_client::CapacityClient};
use sluice_tests::{
    harness::{self, Server, Sidecar, free_port, http_get},
    upstream::UpstreamProcess,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
}

impl Pki {
    /// A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA,
    /// in files; and a file that is not PEM.
    fn new() -> Pki {
        let ca = sluice_tests::pki::ca();
        let leaf = |names: Vec<String>| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names).unwrap().signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()]);
        let (client_cert_pem, client_key_pem) = leaf(vec!["client.sluice.test".into()]);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("server.pem"), server_cert).unwrap();
        std::fs::write(dir.path().join("server.key"), server_key).unwrap();
        std::fs::write(dir.path().join("client.pem"), &client_cert_pem).unwrap();
        std::fs::write(dir.path().join("client.key"), &client_key_pem).unwrap();
        std::fs::write(dir.path().join("not-pem.txt"), "a certificate, honestly\n").unwrap();
        Pki { ca_pem: ca.pem(), client_cert_pem, client_key_pem, dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }

    fn server(&self, mutual: bool) -> Server {
        let mut builder = Server::builder()
            .arg("--tls-cert")
            .arg(self.path("server.pem"))
            .arg("--tls-key")
            .arg(self.path("server.key"));
        if mutual {
            builder = builder.arg("--tls-client-ca").arg(self.path("ca.pem"));
        }
        builder.start()
    }

    fn tls(&self, with_client_cert: bool) -> ClientTlsConfig {
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem)).domain_name("127.0.0.1");
        if with_client_cert {
            tls.identity(Identity::from_pem(&self.client_cert_pem, &self.client_key_pem))
        } else {
            tls
        }
    }
}

async fn discovery(url: String, tls: Option<ClientTlsConfig>) -> Result<bool, String> {
    let mut endpoint = Channel::from_shared(url).unwrap();
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).map_err(|e| e.to_string())?;
    }
    let channel = endpoint.connect().await.map_err(|e| format!("connect: {e}"))?;
    let response = CapacityClient::new(channel).discovery(DiscoveryRequest {}).await.map_err(|e| e.to_string())?;
    Ok(response.into_inner().is_master)
}

#[tokio::test]
async fn tls_serves_only_tls_clients() {
    let pki = Pki::new();
    let server = pki.server(false);
    assert_eq!(discovery(format!("https://{}", server.grpc), Some(pki.tls(false))).await, Ok(true));
    assert!(discovery(format!("http://{}", server.grpc), None).await.is_err(), "plaintext is refused");
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_from_the_ca() {
    let pki = Pki::new();
    let server = pki.server(true);
    assert_eq!(discovery(format!("https://{}", server.grpc), Some(pki.tls(true))).await, Ok(true));
    assert!(
        discovery(format!("https://{}", server.grpc), Some(pki.tls(false))).await.is_err(),
        "no client certificate, no service"
    );
}

/// A sidecar config whose one rule leases `orders` from `server` over TLS set by `tls` (the
/// YAML mapping's body), in front of `upstream`.
fn sidecar_config(listen: SocketAddr, upstream: SocketAddr, server: SocketAddr, tls: &str) -> String {
    format!(
        "server:\n  addresses: [\"{server}\"]\n  tls: {{{tls}}}\n\
         listeners:\n  - name: app\n    address: {listen}\n    upstream: app\n\
         upstreams:\n  - name: app\n    url: http://{upstream}\n\
         resources:\n  - id: orders\n    kind: rate\n\
         rules:\n  - resource: orders\n"
    )
}

#[test]
fn a_sidecar_leases_over_mtls() {
    let pki = Pki::new();
    let server = pki.server(true);
    let upstream = UpstreamProcess::start(None);
    let listen: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let tls = format!(
        "ca: {}, cert: {}, key: {}, server_name: localhost",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key")
    );
    let sidecar =
        Sidecar::builder().config(&sidecar_config(listen, upstream.addr(), server.grpc, &tls)).start_sidecar();
    let leased = r#"sluice_sidecar_mode{resource="orders",mode="leased"}"#;
    let deadline = Instant::now() + Duration::from_secs(10);
    while sidecar.metric(leased) != Some(1.0) {
        assert!(Instant::now() < deadline, "no lease over mTLS; log:\n{}", sidecar.logs());
        assert_eq!(http_get(listen, "/").map(|(status, _)| status).ok(), Some(200));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn tls_files_that_cannot_work_stop_both_binaries_at_start() {
    let pki = Pki::new();
    let p = |name| pki.path(name);
    let any: SocketAddr = ([127, 0, 0, 1], 1).into();
    let sidecar = |tls: String| {
        let path = pki.dir.path().join("sidecar.yaml");
        std::fs::write(&path, sidecar_config(any, any, any, &tls)).unwrap();
        harness::run("sluice-sidecar", &["--config", path.to_str().unwrap(), "--admin-addr", "127.0.0.1:0"])
    };
    let local = ["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"];
    let server = |args: &[&str]| harness::run("sluice-server", &[&local[..], args].concat());
    let mismatch = format!("{} and {} do not go together", p("server.pem"), p("client.key"));
    let cases = [
        (server(&["--tls-cert", &p("server.pem"), "--tls-key", &p("client.key")]), mismatch.clone()),
        (
            server(&["--tls-cert", &p("server.pem"), "--tls-key", &p("server.pem")]),
            format!("{}: no private key", p("server.pem")),
        ),
        (
            server(&["--tls-cert", &p("server.key"), "--tls-key", &p("server.key")]),
            format!("{}: no certificate", p("server.key")),
        ),
        (
            server(&[
                "--tls-cert",
                &p("server.pem"),
                "--tls-key",
                &p("server.key"),
                "--tls-client-ca",
                &p("not-pem.txt"),
            ]),
            format!("{} is not PEM", p("not-pem.txt")),
        ),
        (
            server(&[
                "--parent",
                "127.0.0.1:1",
                "--parent-tls-ca",
                &p("ca.pem"),
                "--parent-tls-cert",
                &p("server.pem"),
                "--parent-tls-key",
                &p("client.key"),
            ]),
            mismatch.clone(),
        ),
        (sidecar(format!("ca: {}, cert: {}, key: {}", p("ca.pem"), p("server.pem"), p("client.key"))), mismatch),
        (sidecar(format!("ca: {}", p("not-pem.txt"))), format!("{} is not PEM", p("not-pem.txt"))),
    ];
    for (out, why) in cases {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{why}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr:?}");
        assert!(stderr.contains(&why), "{stderr:?} should say {why:?}");
    }
}

#[test]
fn a_tls_handshake_that_never_comes_is_cut_off() {
    let pki = Pki::new();
    let server = pki.server(false);
    let mut idle = TcpStream::connect(server.grpc).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let opened = Instant::now();
    match idle.read(&mut [0; 64]) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the connection should be closed, got {other:?}"),
    }
    // The handshake timeout is 10 s; a minute would mean there is none.
    assert!(opened.elapsed() < Duration::from_secs(55), "cut off after {:?}", opened.elapsed());
}

/// Copies `pki`'s files into `dir` under the names given, as a certificate manager replacing
/// them in place would.
fn install(pki: &Pki, dir: &std::path::Path, files: &[(&str, &str)]) {
    for (from, to) in files {
        std::fs::copy(pki.path(from), dir.join(to)).unwrap();
    }
}

#[tokio::test]
async fn the_grpc_listener_takes_rotated_certificates_without_a_restart() {
    let (old, new) = (Pki::new(), Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let files = [("server.pem", "cert.pem"), ("server.key", "key.pem"), ("ca.pem", "client-ca.pem")];
    install(&old, dir.path(), &files);
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let server = Server::builder()
        .args(["--tls-cert", &path("cert.pem"), "--tls-key", &path("key.pem")])
        .args(["--tls-client-ca", &path("client-ca.pem"), "--config-poll-interval", "100ms"])
        .start();
    let url = format!("https://{}", server.grpc);
    assert_eq!(discovery(url.clone(), Some(old.tls(true))).await, Ok(true));
    assert!(discovery(url.clone(), Some(new.tls(true))).await.is_err(), "the new CA is not in force yet");

    install(&new, dir.path(), &files);
    let deadline = Instant::now() + Duration::from_secs(10);
    while discovery(url.clone(), Some(new.tls(true))).await.is_err() {
        assert!(Instant::now() < deadline, "the new files are not in use; log:\n{}", server.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(discovery(url.clone(), Some(old.tls(true))).await.is_err(), "the old CA's certificates are out");

    // A file that cannot work is reported, and the files in force stay.
    std::fs::write(dir.path().join("key.pem"), old.client_key_pem.as_bytes()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.logs().contains("TLS files rejected") {
        assert!(
            Instant::now() < deadline,
            "a key that is not the certificate's went unreported; log:\n{}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(server.logs().contains("do not go together"), "the log says why:\n{}", server.logs());
    assert_eq!(discovery(url, Some(new.tls(true))).await, Ok(true));
}

#[test]
fn a_sidecar_takes_rotated_server_tls_files_at_once_without_a_restart() {
    let (pki, other) = (Pki::new(), Pki::new());
    let server = pki.server(true);
    let upstream = UpstreamProcess::start(None);
    let listen: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    // The sidecar starts trusting a CA that did not sign the server's certificate.
    let dir = tempfile::tempdir().unwrap();
    install(&other, dir.path(), &[("ca.pem", "ca.pem")]);
    let ca = dir.path().join("ca.pem");
    let tls = format!(
        "ca: {}, cert: {}, key: {}, server_name: localhost",
        ca.display(),
        pki.path("client.pem"),
        pki.path("client.key")
    );
    let sidecar = Sidecar::builder()
        .config(&sidecar_config(listen, upstream.addr(), server.grpc, &tls))
        .args(["--config-poll-interval", "100ms"])
        .start_sidecar();
    let failed = r#"sluice_sidecar_capacity_rpcs_total{method="Discovery",result="error"}"#;
    let leased = r#"sluice_sidecar_mode{resource="orders",mode="leased"}"#;
    // After the fifth failure in a row the sidecar backs off for 8–16 s (BACKOFF_BASE · 2⁴ with
    // equal jitter).
    let deadline = Instant::now() + Duration::from_secs(30);
    while sidecar.metric(failed).is_none_or(|n| n < 5.0) {
        assert!(Instant::now() < deadline, "no failed Discovery with the wrong CA; log:\n{}", sidecar.logs());
        // Traffic makes the sidecar ask for the resource; its fallback admits it meanwhile.
        assert_eq!(http_get(listen, "/").map(|(status, _)| status).ok(), Some(200));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_ne!(sidecar.metric(leased), Some(1.0), "no lease through a CA that does not sign the server");

    // New files end the backoff: the sidecar asks as soon as it has them (two polls, 0.2 s),
    // not 8 s or more later.
    install(&pki, dir.path(), &[("ca.pem", "ca.pem")]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while sidecar.metric(leased) != Some(1.0) {
        assert!(Instant::now() < deadline, "no lease soon after the CA was replaced; log:\n{}", sidecar.logs());
        assert_eq!(http_get(listen, "/").map(|(status, _)| status).ok(), Some(200));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(sidecar.logs().contains("TLS files changed"), "the rotation is logged:\n{}", sidecar.logs());
}
