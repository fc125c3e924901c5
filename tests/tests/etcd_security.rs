//! etcd as a real control plane, end to end: a real etcd 3.4 over TLS that takes only client
//! certificates of its CA (`--client-cert-auth`), then with user/password auth on as well; real
//! `sluice-server` replicas elect their master there and read their configuration from a key.
//! A wrong CA, certificate or password stops a start with one line; a rotated client certificate
//! is used without a restart; an expired auth token is renewed.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use sluice_proto::DiscoveryRequest;
use sluice_tests::{
    config::{Algorithm, ConfigFile, ServerConfig, Template},
    etcd::Etcd,
    harness::{self, Server},
    pki,
    wait::{eventually, lazily},
};
use tempfile::TempDir;

const KEY: &str = "/sluice/test/config";
const ELECTION: &str = "/sluice/test/election";

fn config(capacity: f64) -> String {
    ServerConfig::new().template(Template::catch_all(capacity, Algorithm::fair_share(30, 1))).yaml()
}

/// The client files a server is started with: etcd's CA, and a client certificate etcd takes.
struct Files {
    dir: TempDir,
}

impl Files {
    fn new(etcd: &Etcd) -> Files {
        let files = Files { dir: tempfile::tempdir().unwrap() };
        std::fs::copy(etcd.ca_file(), files.path("ca.pem")).unwrap();
        files.issue(etcd);
        files
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A new client certificate from the CA etcd takes them from now, in place of the old.
    fn issue(&self, etcd: &Etcd) {
        let (cert, key) = etcd.client_cert();
        std::fs::write(self.path("client.pem"), cert).unwrap();
        std::fs::write(self.path("client.key"), key).unwrap();
    }

    fn args(&self, etcd: &Etcd) -> Vec<String> {
        let path = |name: &str| self.path(name).display().to_string();
        vec![
            "--etcd-endpoints".into(),
            etcd.endpoint(),
            "--etcd-cacert".into(),
            path("ca.pem"),
            "--etcd-cert".into(),
            path("client.pem"),
            "--etcd-key".into(),
            path("client.key"),
        ]
    }
}

/// A replica on `etcd` with `files`, its configuration from [`KEY`], and `more` flags.
fn replica(etcd: &Etcd, files: &Files, more: &[&str]) -> Server {
    Server::launch()
        .args(files.args(etcd))
        .args(["--election-key", ELECTION, "--etcd-lease-ttl", "2", "--config-poll-interval", "200ms"])
        .args(["--config", &format!("etcd:{KEY}")])
        .args(more.iter().copied())
        .start()
}

async fn is_master(server: &Server) -> bool {
    server.client().await.discovery(DiscoveryRequest {}).await.expect("Discovery").into_inner().is_master
}

fn capacity(server: &Server) -> f64 {
    let (code, body) = server.get("/debug/status.json");
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    status["templates"][0]["capacity"].as_f64().expect("a template")
}

/// Puts a configuration of `capacity` and waits until `servers` have it in force.
async fn follow(etcd: &Etcd, servers: &[&Server], capacity_now: f64) -> Duration {
    etcd.put(KEY, &config(capacity_now)).await;
    eventually(format!("the servers follow the key to {capacity_now}"), async || {
        servers.iter().all(|s| capacity(s) == capacity_now)
    })
    .await
}

/// Exactly one of two replicas is the master.
async fn one_master(a: &Server, b: &Server) -> Duration {
    eventually("one master", async || is_master(a).await != is_master(b).await).await
}

#[tokio::test]
async fn election_and_configuration_over_tls_with_a_client_certificate() {
    let etcd = Etcd::start_tls(&[]);
    etcd.put(KEY, &config(100.0)).await;
    let files = Files::new(&etcd);
    let (a, b) = (replica(&etcd, &files, &[]), replica(&etcd, &files, &[]));
    one_master(&a, &b).await;
    assert_eq!((capacity(&a), capacity(&b)), (100.0, 100.0));
    let took = follow(&etcd, &[&a, &b], 200.0).await;
    println!("over TLS, 2 servers followed the key in {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[tokio::test]
async fn election_and_configuration_with_a_user_and_an_expiring_token() {
    // Tokens expire after a second idle, so that every later call meets an expired one.
    let mut etcd = Etcd::start_tls(&["--auth-token-ttl", "1"]);
    etcd.enable_auth("sluice", "s3cret", "/sluice/").await;
    etcd.put(KEY, &config(100.0)).await;
    let files = Files::new(&etcd);
    let user = ["--etcd-user", "sluice:s3cret"];
    let (mut a, b) = (replica(&etcd, &files, &user), replica(&etcd, &files, &user));
    one_master(&a, &b).await;
    let took = follow(&etcd, &[&a, &b], 200.0).await;
    assert!(took < Duration::from_secs(1), "{took:?}");

    // The token each server got has expired: a read of the key (SIGHUP) authenticates again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    b.signal("HUP");
    eventually(lazily(|| format!("the key read again with a new token:\n{}", b.logs())), async || {
        b.metric("sluice_server_config_reloads_total{result=\"success\"}") == Some(2.0)
    })
    .await;
    assert!(b.logs().contains("etcd refused the auth token: authenticating again"), "{}", b.logs());
    assert!(!b.logs().contains("configuration watch on etcd broke"), "{}", b.logs());
    assert!(!b.logs().contains("s3cret"), "the password is never logged");

    // The master's resignation, long after its token expired, still hands over at once.
    if !is_master(&a).await {
        panic!("a, started first, leads");
    }
    a.signal("TERM");
    let took = eventually("b takes over", async || is_master(&b).await).await;
    println!("takeover after SIGTERM with an expired token took {took:?}");
    assert!(took < Duration::from_millis(1500), "{took:?}: not at once; a's log:\n{}", a.logs());
    assert_eq!(a.wait_exit(Duration::from_secs(15)), Some(0));
    assert!(a.logs().contains("authenticating again"), "{}", a.logs());
}

#[tokio::test]
async fn a_user_given_before_etcd_turns_auth_on_is_used_once_it_does() {
    let mut etcd = Etcd::start();
    etcd.put(KEY, &config(100.0)).await;
    let server = Server::launch()
        .args(["--etcd-endpoints", &etcd.endpoint(), "--etcd-user", "sluice:s3cret", "--election-key", ELECTION])
        .args(["--config", &format!("etcd:{KEY}")])
        .start();
    eventually("master", async || is_master(&server).await).await;
    etcd.enable_auth("sluice", "s3cret", "/sluice/").await;
    // The connection has no token: its next read authenticates.
    server.signal("HUP");
    eventually(lazily(|| format!("the key read with a token:\n{}", server.logs())), async || {
        server.metric("sluice_server_config_reloads_total{result=\"success\"}") == Some(1.0)
    })
    .await;
    assert!(server.logs().contains("authenticating again"), "{}", server.logs());
    let took = follow(&etcd, &[&server], 200.0).await;
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[tokio::test]
async fn a_rotated_client_certificate_is_used_without_a_restart() {
    let mut etcd = Etcd::start_tls(&[]);
    etcd.put(KEY, &config(100.0)).await;
    let files = Files::new(&etcd);
    let server = replica(&etcd, &files, &[]);
    eventually("master", async || is_master(&server).await).await;

    // etcd now takes client certificates of a new CA only: the server's is refused.
    etcd.stop("TERM");
    etcd.trust_new_clients_ca();
    etcd.restart();
    // A change the server cannot see yet.
    etcd.put(KEY, &config(200.0)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!is_master(&server).await, "the old certificate is refused:\n{}", server.logs());
    assert_eq!(capacity(&server), 100.0, "the configuration in force stays");

    // The files rotate in place: the next connection presents the new certificate, and the key,
    // read again, brings the change made meanwhile.
    files.issue(&etcd);
    let took =
        eventually(lazily(|| format!("master again:\n{}", server.logs())), async || is_master(&server).await).await;
    println!("master again {took:?} after the client certificate rotated");
    assert!(server.logs().contains("TLS files changed"), "{}", server.logs());
    eventually("the change made while disconnected", async || capacity(&server) == 200.0).await;
    let took = follow(&etcd, &[&server], 300.0).await;
    println!("and following the key again {took:?} later");
}

/// Starts a server that should not start, with `env` set, and returns its output.
fn refused(args: &[String], env: &[(&str, &str)]) -> Output {
    let child = Command::new(harness::binary("sluice-server"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert_ne!(output.status.code(), Some(0), "{args:?} started");
    output
}

/// The one line a refused start says.
fn one_line(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    stderr
}

fn with(files: &Files, etcd: &Etcd, more: &[&str]) -> Vec<String> {
    let mut args = files.args(etcd);
    args.extend(["--grpc-addr".into(), "127.0.0.1:0".into(), "--admin-addr".into(), "127.0.0.1:0".into()]);
    args.extend(more.iter().map(|a| a.to_string()));
    args
}

#[tokio::test]
async fn a_wrong_ca_certificate_or_password_is_one_line_at_start() {
    let mut etcd = Etcd::start_tls(&[]);
    etcd.enable_auth("sluice", "s3cret", "/sluice/").await;
    etcd.put(KEY, &config(100.0)).await;
    let files = Files::new(&etcd);
    let config = format!("etcd:{KEY}");
    let user = "sluice:s3cret";
    // The election alone, and with the configuration from etcd.
    for source in [&[][..], &["--config", &config]] {
        let mut args = source.to_vec();
        args.extend(["--etcd-user", user]);

        // A CA that did not sign etcd's certificate.
        let other = files.path("other-ca.pem");
        std::fs::write(&other, pki::ca().pem()).unwrap();
        let mut wrong_ca = with(&files, &etcd, &args);
        let at = wrong_ca.iter().position(|a| a == "--etcd-cacert").unwrap();
        wrong_ca[at + 1] = other.display().to_string();
        let line = one_line(&refused(&wrong_ca, &[]));
        println!("wrong CA: {line}");
        assert!(line.contains("invalid peer certificate"), "{line}");

        // A client certificate etcd does not take.
        let stranger = tempfile::tempdir().unwrap();
        let (cert, key) = pki::leaf(&pki::ca(), &["stranger"]);
        let (cert_path, key_path) = (stranger.path().join("c.pem"), stranger.path().join("c.key"));
        std::fs::write(&cert_path, cert).unwrap();
        std::fs::write(&key_path, key).unwrap();
        let mut wrong_cert = with(&files, &etcd, &args);
        replace(&mut wrong_cert, "--etcd-cert", &cert_path);
        replace(&mut wrong_cert, "--etcd-key", &key_path);
        let line = one_line(&refused(&wrong_cert, &[]));
        println!("client certificate refused: {line}");
        assert!(line.contains("as when etcd does not take the client certificate, --etcd-cert"), "{line}");

        // A wrong password, given in the environment.
        let no_user = with(&files, &etcd, source);
        let line = one_line(&refused(&no_user, &[("SLUICE_ETCD_USER", "sluice:wrong")]));
        println!("wrong password: {line}");
        assert!(line.contains("authenticating to etcd as sluice") && line.contains("authentication failed"), "{line}");
        assert!(!line.contains("wrong"), "the password is not shown: {line}");

        // No user at all, with auth on: the key cannot be read.
        let line = one_line(&refused(&no_user, &[]));
        println!("no user: {line}");
    }
}

fn replace(args: &mut [String], flag: &str, path: &Path) {
    let at = args.iter().position(|a| a == flag).unwrap();
    args[at + 1] = path.display().to_string();
}

#[test]
fn tls_flags_need_https_endpoints_of_one_scheme() {
    for args in [
        &["--etcd-endpoints", "http://127.0.0.1:2379", "--etcd-cacert", "/dev/null"][..],
        &["--etcd-endpoints", "http://127.0.0.1:2379,https://127.0.0.1:2380"],
        &["--etcd-endpoints", "https://127.0.0.1:2379", "--etcd-cacert", "/nonexistent.pem"],
        &["--etcd-endpoints", "https://127.0.0.1:2379", "--etcd-cert", "/dev/null"],
        &["--etcd-cacert", "/dev/null"],
        &["--etcd-endpoints", "http://127.0.0.1:2379", "--etcd-user", "nopassword"],
        &["--etcd-endpoints", "http://127.0.0.1:2379", "--etcd-user", ":password"],
    ] {
        let output = harness::run("sluice-server", args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
}
