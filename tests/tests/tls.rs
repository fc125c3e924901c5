//! TLS and mTLS on the gRPC listener, from a sidecar, and the checks of the files at start-up,
//! with certificates generated for the test.

use std::{
    io::Read,
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    time::{Duration, Instant},
};

use sluice_proto::{DiscoveryRequest, capacity_client::CapacityClient};
use sluice_tests::{
    config::{ConfigFile, Kind, Listener, Resource, Rule, ServerTls, SidecarConfig, Upstream},
    harness::{self, Server, Sidecar, http_get},
    upstream::UpstreamProcess,
    wait::{eventually, eventually_blocking, lazily},
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
        let (server_cert, server_key) = sluice_tests::pki::leaf(&ca, &["127.0.0.1", "localhost"]);
        let (client_cert_pem, client_key_pem) = sluice_tests::pki::leaf(&ca, &["client.sluice.test"]);
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
        let mut launch =
            Server::launch().args(["--tls-cert", &self.path("server.pem"), "--tls-key", &self.path("server.key")]);
        if mutual {
            launch = launch.args(["--tls-client-ca", &self.path("ca.pem")]);
        }
        launch.start()
    }

    /// A sidecar's TLS toward a server of this PKI, with its client certificate, trusting `ca`.
    fn client_tls(&self, ca: impl Into<PathBuf>) -> ServerTls {
        ServerTls {
            ca: Some(ca.into()),
            cert: Some(self.path("client.pem").into()),
            key: Some(self.path("client.key").into()),
            server_name: Some("localhost".into()),
        }
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

/// A sidecar config on `listener` whose one rule leases `orders` from `server` over `tls`, in
/// front of `upstream`.
fn sidecar_config(listener: Listener, upstream: SocketAddr, server: SocketAddr, tls: ServerTls) -> SidecarConfig {
    SidecarConfig::proxy(listener, Upstream::app(upstream))
        .leasing_from([server])
        .server_tls(tls)
        .resource(Resource::new("orders").kind(Kind::Rate))
        .rule(Rule::charging("orders"))
}

/// Whether `done` holds; if not, a request through the sidecar on `listen`, which its fallback
/// admits while it has no lease: traffic makes it ask for one.
fn or_traffic(done: bool, listen: SocketAddr) -> bool {
    if !done {
        assert_eq!(http_get(listen, "/").map(|(status, _)| status).ok(), Some(200));
    }
    done
}

#[test]
fn a_sidecar_leases_over_mtls() {
    let pki = Pki::new();
    let server = pki.server(true);
    let upstream = UpstreamProcess::start(None);
    let config = sidecar_config(Listener::app(), upstream.addr(), server.grpc, pki.client_tls(pki.path("ca.pem")));
    let sidecar = Sidecar::launch(&config).start();
    let leased = r#"sluice_sidecar_mode{resource="orders",mode="leased"}"#;
    eventually_blocking(lazily(|| format!("no lease over mTLS; log:\n{}", sidecar.logs())), || {
        or_traffic(sidecar.metric(leased) == Some(1.0), sidecar.listen())
    });
}

#[test]
fn tls_files_that_cannot_work_stop_both_binaries_at_start() {
    let pki = Pki::new();
    let p = |name| pki.path(name);
    let any: SocketAddr = ([127, 0, 0, 1], 1).into();
    let sidecar = |tls: ServerTls| {
        let path = pki.dir.path().join("sidecar.yaml");
        std::fs::write(&path, sidecar_config(Listener::new("app", any), any, any, tls).yaml()).unwrap();
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
        (
            sidecar(ServerTls {
                ca: Some(p("ca.pem").into()),
                cert: Some(p("server.pem").into()),
                key: Some(p("client.key").into()),
                server_name: None,
            }),
            mismatch,
        ),
        (
            sidecar(ServerTls { ca: Some(p("not-pem.txt").into()), ..ServerTls::default() }),
            format!("{} is not PEM", p("not-pem.txt")),
        ),
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
    let server = Server::launch()
        .args(["--tls-cert", &path("cert.pem"), "--tls-key", &path("key.pem")])
        .args(["--tls-client-ca", &path("client-ca.pem"), "--config-poll-interval", "100ms"])
        .start();
    let url = format!("https://{}", server.grpc);
    assert_eq!(discovery(url.clone(), Some(old.tls(true))).await, Ok(true));
    assert!(discovery(url.clone(), Some(new.tls(true))).await.is_err(), "the new CA is not in force yet");

    install(&new, dir.path(), &files);
    let why = lazily(|| format!("the new files are not in use; log:\n{}", server.logs()));
    eventually(why, async || discovery(url.clone(), Some(new.tls(true))).await.is_ok()).await;
    assert!(discovery(url.clone(), Some(old.tls(true))).await.is_err(), "the old CA's certificates are out");

    // A file that cannot work is reported, and the files in force stay.
    std::fs::write(dir.path().join("key.pem"), old.client_key_pem.as_bytes()).unwrap();
    let why = lazily(|| format!("a key that is not the certificate's went unreported; log:\n{}", server.logs()));
    eventually(why, async || server.logs().contains("TLS files rejected")).await;
    assert!(server.logs().contains("do not go together"), "the log says why:\n{}", server.logs());
    assert_eq!(discovery(url, Some(new.tls(true))).await, Ok(true));
}

#[test]
fn a_sidecar_takes_rotated_server_tls_files_at_once_without_a_restart() {
    let (pki, other) = (Pki::new(), Pki::new());
    let server = pki.server(true);
    let upstream = UpstreamProcess::start(None);
    // The sidecar starts trusting a CA that did not sign the server's certificate.
    let dir = tempfile::tempdir().unwrap();
    install(&other, dir.path(), &[("ca.pem", "ca.pem")]);
    let config =
        sidecar_config(Listener::app(), upstream.addr(), server.grpc, pki.client_tls(dir.path().join("ca.pem")));
    let sidecar = Sidecar::launch(&config).args(["--config-poll-interval", "100ms"]).start();
    let listen = sidecar.listen();
    let failed = r#"sluice_sidecar_capacity_rpcs_total{method="Discovery",result="error"}"#;
    let leased = r#"sluice_sidecar_mode{resource="orders",mode="leased"}"#;
    // After the fifth failure in a row the sidecar backs off for 8–16 s (BACKOFF_BASE · 2⁴ with
    // equal jitter).
    eventually_blocking(lazily(|| format!("no failed Discovery with the wrong CA; log:\n{}", sidecar.logs())), || {
        or_traffic(sidecar.metric(failed).is_some_and(|n| n >= 5.0), listen)
    });
    assert_ne!(sidecar.metric(leased), Some(1.0), "no lease through a CA that does not sign the server");

    // New files end the backoff: the sidecar asks as soon as it has them (two polls, 0.2 s),
    // not 8 s or more later.
    install(&pki, dir.path(), &[("ca.pem", "ca.pem")]);
    let why = lazily(|| format!("no lease after the CA was replaced; log:\n{}", sidecar.logs()));
    let took = eventually_blocking(why, || or_traffic(sidecar.metric(leased) == Some(1.0), listen));
    assert!(took < Duration::from_secs(5), "a lease only {took:?} after the CA was replaced; log:\n{}", sidecar.logs());
    assert!(sidecar.logs().contains("TLS files changed"), "the rotation is logged:\n{}", sidecar.logs());
}
