//! A real single-member etcd for the election and configuration tests: the `etcd` binary of
//! Debian's `etcd-server` package on free loopback ports, with a data directory of its own,
//! plaintext or over TLS with client certificates (`--client-cert-auth`), optionally with
//! user/password auth turned on through etcd's own Auth API. It can be stopped and started again
//! on the same ports and data, and is killed when dropped. The harness writes keys over its own
//! connection, as etcd's root user once auth is on.

use std::{
    fs,
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use rcgen::{CertifiedIssuer, KeyPair};
use sluice_etcd::{
    authpb::{Permission, permission::Type},
    etcdserverpb::{
        AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
        AuthUserGrantRoleRequest, AuthenticateRequest, DeleteRangeRequest, PutRequest, auth_client::AuthClient,
        kv_client::KvClient,
    },
};
use tempfile::TempDir;
use tonic::{
    Request, Status,
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};

use crate::{
    harness::{free_port, http_get},
    pki,
};

/// The root user's password once auth is on.
const ROOT_PASSWORD: &str = "root-secret";

/// How long etcd may take to answer its health check (it usually needs well under a second).
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// How long etcd may take to exit once signalled.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Etcd {
    child: Option<Child>,
    client: SocketAddr,
    peer: SocketAddr,
    dir: TempDir,
    /// With TLS: the CA that signs the client certificates etcd takes.
    clients_ca: Option<CertifiedIssuer<'static, KeyPair>>,
    /// More flags for etcd.
    extra: Vec<String>,
    /// Whether auth is on: the harness's own calls then authenticate as root.
    auth: bool,
}

impl Etcd {
    /// Starts a plaintext etcd and waits until it reports itself healthy.
    pub fn start() -> Etcd {
        Etcd::launch(false, &[])
    }

    /// Starts etcd on `https://` with client certificate auth (`--client-cert-auth`), and `extra`
    /// flags: its certificate is signed by [`Etcd::ca_file`], and it takes client certificates
    /// from [`Etcd::client_cert`].
    pub fn start_tls(extra: &[&str]) -> Etcd {
        Etcd::launch(true, extra)
    }

    fn launch(tls: bool, extra: &[&str]) -> Etcd {
        let mut etcd = Etcd {
            child: None,
            client: ([127, 0, 0, 1], free_port()).into(),
            peer: ([127, 0, 0, 1], free_port()).into(),
            dir: tempfile::tempdir().expect("temporary directory"),
            clients_ca: None,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            auth: false,
        };
        if tls {
            let ca = pki::ca();
            let (cert, key) = pki::leaf(&ca, &["127.0.0.1", "localhost"]);
            etcd.write("ca.pem", &ca.pem());
            etcd.write("server.pem", &cert);
            etcd.write("server.key", &key);
            etcd.trust_new_clients_ca();
        }
        etcd.restart();
        etcd
    }

    fn write(&self, name: &str, text: &str) {
        fs::write(self.dir.path().join(name), text).expect("write a TLS file");
    }

    /// A new CA for client certificates, the only one etcd takes them from once it (re)starts;
    /// the harness's own certificate is issued anew by it.
    pub fn trust_new_clients_ca(&mut self) {
        let ca = pki::ca();
        self.write("clients-ca.pem", &ca.pem());
        let (cert, key) = pki::leaf(&ca, &["harness"]);
        self.write("harness.pem", &cert);
        self.write("harness.key", &key);
        self.clients_ca = Some(ca);
    }

    /// A client certificate and key (PEM) that etcd takes, as it stands.
    pub fn client_cert(&self) -> (String, String) {
        pki::leaf(self.clients_ca.as_ref().expect("etcd over TLS"), &["sluice-server"])
    }

    /// The CA file that signs etcd's certificate, for `--etcd-cacert`.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn scheme(&self) -> &'static str {
        if self.clients_ca.is_some() { "https" } else { "http" }
    }

    /// The client URL, for `--etcd-endpoints`.
    pub fn endpoint(&self) -> String {
        format!("{}://{}", self.scheme(), self.client)
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// Starts etcd again (or for the first time) on the same ports and data directory.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "etcd is running");
        let (client, peer) = (self.endpoint(), format!("http://{}", self.peer));
        let log = fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("etcd.log")).expect("log");
        let started = self.logs().matches(READY).count();
        let mut command = Command::new("etcd");
        command
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .args(&self.extra);
        if self.clients_ca.is_some() {
            let file = |name: &str| self.dir.path().join(name);
            command
                .arg("--cert-file")
                .arg(file("server.pem"))
                .arg("--key-file")
                .arg(file("server.key"))
                .arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(file("clients-ca.pem"));
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd ({e}): apt-get install -y etcd-server"));
        self.child = Some(child);
        self.wait_healthy(started);
    }

    /// Sends a signal by name, by PID: "STOP" freezes etcd without closing its connections,
    /// "CONT" resumes it.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("etcd is running").id();
        let status = Command::new("kill").args(["-s", signal, &pid.to_string()]).status().expect("kill runs");
        assert!(status.success(), "kill -s {signal} etcd failed");
    }

    /// Sends a signal by name ("TERM", "KILL", ...) and waits until etcd has exited, so that its
    /// ports are free for a restart.
    pub fn stop(&mut self, signal: &str) {
        self.signal(signal);
        let mut child = self.child.take().expect("etcd is running");
        let deadline = Instant::now() + STOP_TIMEOUT;
        while child.try_wait().expect("wait for etcd").is_none() {
            assert!(Instant::now() < deadline, "etcd did not exit within {STOP_TIMEOUT:?} of SIG{signal}");
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for etcd's health check, or over TLS (where the harness has no HTTPS client) for the
    /// `started + 1`th line of the log that says it serves.
    fn wait_healthy(&mut self, started: usize) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let child = self.child.as_mut().expect("etcd is running");
            if let Some(status) = child.try_wait().expect("wait for etcd") {
                panic!("etcd exited during start-up with {status}; log:\n{}", self.logs());
            }
            let healthy = if self.clients_ca.is_some() {
                self.logs().matches(READY).count() > started
            } else {
                matches!(http_get(self.client, "/health"), Ok((200, body)) if body.contains("\"health\":\"true\""))
            };
            if healthy {
                return;
            }
            assert!(Instant::now() < deadline, "etcd not healthy after {START_TIMEOUT:?}; log:\n{}", self.logs());
            thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Etcd {
    /// The harness's own connection, as root once auth is on.
    async fn admin(&self) -> InterceptedService<Channel, Token> {
        let mut endpoint = Endpoint::from_shared(self.endpoint()).expect("endpoint");
        if self.clients_ca.is_some() {
            let read = |name: &str| fs::read(self.dir.path().join(name)).expect("a TLS file");
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(read("ca.pem")))
                .identity(Identity::from_pem(read("harness.pem"), read("harness.key")));
            endpoint = endpoint.tls_config(tls).expect("TLS settings");
        }
        let channel = endpoint.connect().await.expect("connect to etcd");
        let token = if self.auth {
            let request = AuthenticateRequest { name: "root".into(), password: ROOT_PASSWORD.into() };
            let answer = AuthClient::new(channel.clone()).authenticate(request).await.expect("authenticate as root");
            Some(answer.into_inner().token.parse().expect("an ASCII token"))
        } else {
            None
        };
        InterceptedService::new(channel, Token(token))
    }

    pub async fn put(&self, key: &str, value: &str) {
        let put = PutRequest { key: key.into(), value: value.into(), lease: 0 };
        KvClient::new(self.admin().await).put(put).await.expect("put");
    }

    pub async fn delete(&self, key: &str) {
        let delete = DeleteRangeRequest { key: key.into(), range_end: vec![] };
        KvClient::new(self.admin().await).delete_range(delete).await.expect("delete");
    }

    /// Turns user/password auth on: a root user, and `user` with `password`, allowed to read and
    /// write the keys under `prefix` only.
    pub async fn enable_auth(&mut self, user: &str, password: &str, prefix: &str) {
        let mut auth = AuthClient::new(self.admin().await);
        let add = |name: &str, password: &str| AuthUserAddRequest { name: name.into(), password: password.into() };
        auth.user_add(add("root", ROOT_PASSWORD)).await.expect("add root");
        auth.user_grant_role(AuthUserGrantRoleRequest { user: "root".into(), role: "root".into() })
            .await
            .expect("make root root");
        auth.role_add(AuthRoleAddRequest { name: user.into() }).await.expect("add a role");
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().expect("a prefix") += 1;
        let perm = Permission { perm_type: Type::Readwrite.into(), key: prefix.into(), range_end: end };
        auth.role_grant_permission(AuthRoleGrantPermissionRequest { name: user.into(), perm: Some(perm) })
            .await
            .expect("grant the prefix");
        auth.user_add(add(user, password)).await.expect("add the user");
        auth.user_grant_role(AuthUserGrantRoleRequest { user: user.into(), role: user.into() })
            .await
            .expect("grant the role");
        auth.auth_enable(AuthEnableRequest {}).await.expect("enable auth");
        self.auth = true;
    }
}

/// What etcd logs once it serves clients.
const READY: &str = "ready to serve client requests";

/// The root token the harness's calls carry once auth is on.
#[derive(Clone)]
pub struct Token(Option<MetadataValue<Ascii>>);

impl Interceptor for Token {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.0 {
            request.metadata_mut().insert("token", token.clone());
        }
        Ok(request)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
