//! A real Kubernetes control plane without nodes, for the webhook's end-to-end tests: etcd, a
//! `kube-apiserver` and a `kube-controller-manager` (Deployments, ReplicaSets, ServiceAccounts) on loopback,
//! built from Debian's source package by `tests/kube/build.sh` into `target/kube/bin`. No kubelet
//! runs, so pods are admitted and stored but never started (and no pod network exists).
//!
//! The tests talk to the API server over HTTPS with a static token (`system:masters`), with the
//! serving certificate made here for 127.0.0.1.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rcgen::{CertificateParams, KeyPair};
use serde_json::Value;
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio_rustls::{
    TlsConnector,
    rustls::{
        ClientConfig, RootCertStore,
        pki_types::{CertificateDer, ServerName, pem::PemObject},
    },
};

use crate::{etcd::Etcd, harness::free_port, kube::repo};

/// How long the API server may take to answer `/readyz` (about 6 s on 2 cores).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The static token of the tests' user, in `system:masters`.
const TOKEN: &str = "sluice-test-admin";

/// Where `tests/kube/build.sh` puts the binaries.
pub fn binaries() -> PathBuf {
    repo().join("target/kube/bin")
}

/// Whether the binaries are built; `make test-kube` builds them first.
pub fn built() -> bool {
    ["kube-apiserver", "kube-controller-manager"].iter().all(|b| binaries().join(b).is_file())
}

pub struct ApiServer {
    apiserver: Child,
    controllers: Child,
    address: SocketAddr,
    ca: String,
    dir: TempDir,
    _etcd: Etcd,
}

impl ApiServer {
    /// Starts etcd, the API server and the controllers, and waits until the API server is ready
    /// and the `default` namespace has its ServiceAccount (pods need one to be admitted).
    pub fn start() -> ApiServer {
        let etcd = Etcd::start();
        let dir = tempfile::tempdir().expect("temporary directory");
        let ca = crate::pki::ca();
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("parameters");
        params.subject_alt_names.push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
        let cert = params.signed_by(&key, &ca).expect("serving certificate");
        let accounts = KeyPair::generate().expect("service account key");
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            fs::write(&path, text).expect("write");
            path.display().to_string()
        };
        let (tls_cert, tls_key) = (file("apiserver.crt", &cert.pem()), file("apiserver.key", &key.serialize_pem()));
        let accounts_key = file("accounts.key", &accounts.serialize_pem());
        // Verifying takes the public key: 1.20 reads no PKCS#8 EC key there.
        let accounts_public = file("accounts.pub", &accounts.public_key_pem());
        let tokens = file("tokens.csv", &format!("{TOKEN},sluice-test,1,\"system:masters\"\n"));
        let address: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let ca_file = file("ca.crt", &ca.pem());
        let kubeconfig = file("kubeconfig", &kubeconfig(address, &ca_file));
        let apiserver = start(
            dir.path(),
            "kube-apiserver",
            &[
                &format!("--etcd-servers={}", etcd.endpoint()),
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                &format!("--secure-port={}", address.port()),
                "--insecure-port=0",
                &format!("--tls-cert-file={tls_cert}"),
                &format!("--tls-private-key-file={tls_key}"),
                &format!("--token-auth-file={tokens}"),
                &format!("--service-account-key-file={accounts_public}"),
                &format!("--service-account-signing-key-file={accounts_key}"),
                "--service-account-issuer=https://kubernetes.default.svc",
                "--service-cluster-ip-range=10.96.0.0/24",
                "--authorization-mode=RBAC",
            ],
        );
        let controllers = start(
            dir.path(),
            "kube-controller-manager",
            &[
                &format!("--kubeconfig={kubeconfig}"),
                "--controllers=deployment,replicaset,serviceaccount,serviceaccount-token",
                &format!("--service-account-private-key-file={accounts_key}"),
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                &format!("--secure-port={}", free_port()),
                "--port=0",
            ],
        );
        let mut server = ApiServer { apiserver, controllers, address, ca: ca.pem(), dir, _etcd: etcd };
        server.wait_ready();
        server
    }

    /// The API server's URL.
    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    /// The CA of its serving certificate, as PEM.
    pub fn ca(&self) -> &str {
        &self.ca
    }

    pub fn logs(&self) -> String {
        ["kube-apiserver.log", "kube-controller-manager.log"]
            .map(|name| {
                let text = fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                format!("--- {name} (last lines)\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .join("\n")
    }

    /// One request: its status and JSON body (`Value::Null` when it has none).
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime
            .block_on(https(self.address, &self.ca, method, path, body, Some(TOKEN)))
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", self.logs()))
    }

    /// Creates an object at `path` (a collection); panics unless the API server stored it.
    pub fn create(&self, path: &str, object: &Value) -> Value {
        let (status, answer) = self.request("POST", path, Some(object));
        assert_eq!(status, 201, "POST {path}: {answer}");
        answer
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        loop {
            let exited = [&mut self.apiserver, &mut self.controllers].map(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited.into_iter().flatten().next() {
                panic!("the control plane exited during start-up with {status}\n{}", self.logs());
            }
            let ready = runtime.block_on(https(self.address, &self.ca, "GET", "/readyz", None, Some(TOKEN)));
            let account = "/api/v1/namespaces/default/serviceaccounts/default";
            let account = runtime.block_on(https(self.address, &self.ca, "GET", account, None, Some(TOKEN)));
            if matches!((ready, account), (Ok((200, _)), Ok((200, _)))) {
                return;
            }
            assert!(Instant::now() < deadline, "the API server is not ready after {START_TIMEOUT:?}\n{}", self.logs());
            thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        for child in [&mut self.controllers, &mut self.apiserver] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts one of the built binaries with `args`, its log in `dir` under the binary's name
/// (`kube-apiserver.log`).
fn start(dir: &Path, binary: &str, args: &[&str]) -> Child {
    let log = fs::File::create(dir.join(format!("{binary}.log"))).expect("log file");
    Command::new(binaries().join(binary))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("{binary} ({e}): tests/kube/build.sh builds it"))
}

/// The controllers' kubeconfig: the tests' user, the CA in the file `ca`.
fn kubeconfig(address: SocketAddr, ca: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: https://{address}\n    \
         certificate-authority: {ca}\nusers:\n- name: test\n  user:\n    token: {TOKEN}\ncontexts:\n- name: test\n  \
         context: {{cluster: test, user: test}}\ncurrent-context: test\n"
    )
}

/// One HTTPS request to `address` (whose certificate `ca` signed, for 127.0.0.1), with `token`
/// as a bearer token: its status and JSON body (`Value::Null` when it has none), or for a body
/// that is not JSON, the text as a `Value::String`.
pub async fn https(
    address: SocketAddr,
    ca: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> Result<(u16, Value), String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let config = ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    let stream = TcpStream::connect(address).await.map_err(|e| e.to_string())?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").expect("an address"), stream)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", address.to_string())
        .header("content-type", "application/json")
        .header("accept", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request.body(Full::new(body)).map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(Duration::from_secs(30), sender.send_request(request))
        .await
        .map_err(|_| "no answer within 30 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    Ok((status, value))
}
