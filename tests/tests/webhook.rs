//! `sluice-sidecar webhook` end to end: real `AdmissionReview` requests over TLS to the running
//! binary. The pod its JSON Patch makes is the pod `sluice-sidecar inject` makes, and validates;
//! what it does not handle is allowed unchanged; rotated certificate files are taken without a
//! restart; and the certificate the chart generates serves it. Its memory stays within the
//! budget docs/kubernetes.md gives, under the worst clients can send; `inject` refuses nesting
//! that would take the YAML parser minutes at once; both refuse a bad `--config-map`.

use std::{
    fs, io,
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use base64::{Engine, engine::general_purpose::STANDARD};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{CertificateParams, KeyPair};
use serde_json::{Value, json};
use sluice_tests::{
    harness::{binary, free_port, run},
    kube::{chart, documents, find, render, run_with_input, tools_ready, validate},
    wait::{eventually, lazily},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::{sleep, timeout},
};
use tokio_rustls::{
    TlsConnector,
    client::TlsStream,
    rustls::{ClientConfig, RootCertStore, pki_types::ServerName},
};

/// The name the API server calls the webhook by (its Service's).
const HOST: &str = "sluice-injector.sluice.svc";

/// A CA and a certificate for [`HOST`] signed by it, as PEM.
struct Pki {
    ca: String,
    cert: String,
    key: String,
}

impl Pki {
    fn new() -> Pki {
        let ca = sluice_tests::pki::ca();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![HOST.to_owned()]).unwrap().signed_by(&key, &ca).unwrap();
        Pki { ca: ca.pem(), cert: cert.pem(), key: key.serialize_pem() }
    }

    fn install(&self, dir: &Path) {
        fs::write(dir.join("tls.crt"), &self.cert).unwrap();
        fs::write(dir.join("tls.key"), &self.key).unwrap();
    }
}

/// The webhook binary, killed when dropped.
struct Webhook {
    child: Child,
    addr: SocketAddr,
    log: std::path::PathBuf,
}

impl Webhook {
    /// Starts it with the certificate files in `dir` and `args`, and waits for `/healthz`.
    async fn start(dir: &Path, ca: &str, args: &[&str]) -> Webhook {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let log = dir.join("webhook.log");
        let child = Command::new(binary("sluice-sidecar"))
            .arg("webhook")
            .args(["--listen-addr", &addr.to_string()])
            .arg("--tls-cert")
            .arg(dir.join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("tls.key"))
            .args(["--poll-interval", "100ms"])
            .args(args)
            .stdin(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("the webhook starts");
        let webhook = Webhook { child, addr, log };
        let why = lazily(|| format!("the webhook is not up; log:\n{}", webhook.logs()));
        eventually(why, async || matches!(request(addr, ca, "GET", "/healthz", "").await, Ok((200, _)))).await;
        webhook
    }

    fn logs(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends an AdmissionReview and returns the one that comes back.
    async fn review(&self, ca: &str, review: &Value) -> Value {
        let (code, body) = request(self.addr, ca, "POST", "/mutate", &review.to_string()).await.expect("an answer");
        assert_eq!(code, 200, "{body}\nlog:\n{}", self.logs());
        serde_json::from_str(&body).expect("JSON")
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TLS connection to the webhook, trusting only `ca`, checking the name [`HOST`] and offering
/// `alpn`.
async fn connect(addr: SocketAddr, ca: &str, alpn: &[u8]) -> Result<TlsStream<TcpStream>, String> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca) {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let mut config = ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(HOST).unwrap(), stream)
        .await
        .map_err(|e| format!("TLS: {e}"))
}

/// One HTTPS request over a new connection.
async fn request(addr: SocketAddr, ca: &str, method: &str, path: &str, body: &str) -> Result<(u16, String), String> {
    let tls = connect(addr, ca, b"http/1.1").await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", HOST)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let code = response.status().as_u16();
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

fn certificates(pem: &str) -> Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    tokio_rustls::rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()).map(|c| c.unwrap()).collect()
}

/// A pod as a ReplicaSet creates it: with init containers, volumes and probes of its own.
fn pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "orders-7d9c5-",
            "namespace": "shop",
            "labels": {"app": "orders", "sluice.io/inject": "enabled"},
            "annotations": {"sluice.io/config": "orders-sidecar"}
        },
        "spec": {
            "initContainers": [{"name": "migrate", "image": "example.com/migrate:1"}],
            "containers": [{
                "name": "app",
                "image": "example.com/orders:1",
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
                "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]
            }],
            "volumes": [{"name": "cache", "emptyDir": {}}],
            "restartPolicy": "Always",
            "serviceAccountName": "default"
        }
    })
}

fn admission_review(uid: &str, operation: &str, object: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// The pod with the response's patch applied.
fn patched(pod: &Value, response: &Value) -> Value {
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = STANDARD.decode(response["patch"].as_str().expect("a patch")).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut pod = pod.clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    pod
}

/// `sluice-sidecar inject` on the pod, as JSON.
fn injected(pod: &Value, args: &[&str]) -> Value {
    let out =
        run_with_input(Command::new(binary("sluice-sidecar")).arg("inject").args(args).arg("-"), &pod.to_string());
    assert!(out.status.success(), "inject: {}", String::from_utf8_lossy(&out.stderr));
    documents(&String::from_utf8(out.stdout).unwrap()).remove(0)
}

#[tokio::test]
async fn the_webhooks_patch_makes_the_pod_inject_makes() {
    let (pki, dir) = (Pki::new(), tempfile::tempdir().unwrap());
    pki.install(dir.path());
    let settings =
        ["--image", "registry.example/sluice:1", "--server", "sluice-leaf.sluice.svc:7777", "--native", "true"];
    let webhook =
        Webhook::start(dir.path(), &pki.ca, &[&["--config-map", "default-sidecar"][..], &settings].concat()).await;

    let answer = webhook.review(&pki.ca, &admission_review("a1", "CREATE", pod())).await;
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["uid"], "a1");
    assert_eq!(answer["response"]["allowed"], true);
    let from_webhook = patched(&pod(), &answer["response"]);
    let from_inject = injected(&pod(), &[&["--config-map", "orders-sidecar"][..], &settings].concat());
    assert_eq!(from_webhook, from_inject);
    let spec = &from_webhook["spec"];
    assert_eq!(spec["initContainers"][0]["name"], "sluice-sidecar");
    assert_eq!(spec["initContainers"][1]["name"], "migrate");
    assert_eq!(spec["containers"], pod()["spec"]["containers"]);
    if tools_ready("the patched pod's validation") {
        validate(&from_webhook.to_string()).expect("the patched pod validates");
    }

    // Without the annotation: the webhook's own --config-map.
    let mut plain = pod();
    plain["metadata"]["annotations"] = json!({});
    let answer = webhook.review(&pki.ca, &admission_review("a2", "CREATE", plain.clone())).await;
    let volumes = patched(&plain, &answer["response"])["spec"]["volumes"].clone();
    assert_eq!(volumes[1]["configMap"]["name"], "default-sidecar");

    // An injected pod is left alone, and so is a request it cannot handle: allowed, unchanged.
    for (uid, operation, object) in [("a3", "CREATE", from_webhook.clone()), ("a4", "UPDATE", pod())] {
        let answer = webhook.review(&pki.ca, &admission_review(uid, operation, object)).await;
        assert_eq!(answer["response"]["uid"], uid);
        assert_eq!(answer["response"]["allowed"], true);
        assert!(answer["response"].get("patch").is_none(), "{answer}");
    }
    let logs = webhook.logs();
    assert!(logs.contains("already injected"), "{logs}");
    assert!(logs.contains("request not handled: allowed unchanged") && logs.contains("UPDATE"), "{logs}");
    // Not an AdmissionReview: a 400, and the API server's failure policy (Ignore) applies.
    let (code, _) = request(webhook.addr, &pki.ca, "POST", "/mutate", "{\"kind\": \"Pod\"}").await.unwrap();
    assert_eq!(code, 400);
}

#[tokio::test]
async fn the_webhook_takes_rotated_certificates_without_a_restart() {
    let (old, new, dir) = (Pki::new(), Pki::new(), tempfile::tempdir().unwrap());
    old.install(dir.path());
    let webhook = Webhook::start(dir.path(), &old.ca, &["--config-map", "c"]).await;
    assert!(request(webhook.addr, &new.ca, "GET", "/healthz", "").await.is_err(), "the new CA is not in force yet");
    new.install(dir.path());
    let why = lazily(|| format!("the new files are not in use; log:\n{}", webhook.logs()));
    eventually(why, async || request(webhook.addr, &new.ca, "GET", "/healthz", "").await.is_ok()).await;
    assert!(request(webhook.addr, &old.ca, "GET", "/healthz", "").await.is_err(), "the old certificate is out");
    let answer = webhook.review(&new.ca, &admission_review("r1", "CREATE", pod())).await;
    assert!(answer["response"]["patch"].is_string());
}

#[tokio::test]
async fn the_certificate_the_chart_generates_serves_the_webhook() {
    if !tools_ready("the chart certificate test") {
        return;
    }
    let set = ["--set", "injector.enabled=true", "--set", "injector.certificate.source=generate"];
    let objects = documents(&render(&chart(), &set).unwrap());
    let secret = &find(&objects, "Secret", "sluice-injector-tls")["data"];
    let decode = |key: &str| String::from_utf8(STANDARD.decode(secret[key].as_str().unwrap()).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("tls.crt"), decode("tls.crt")).unwrap();
    fs::write(dir.path().join("tls.key"), decode("tls.key")).unwrap();
    // The API server trusts the configuration's caBundle and calls the Service's name.
    let configuration = find(&objects, "MutatingWebhookConfiguration", "sluice-injector");
    let bundle = configuration["webhooks"][0]["clientConfig"]["caBundle"].as_str().unwrap();
    let ca = String::from_utf8(STANDARD.decode(bundle).unwrap()).unwrap();
    let webhook = Webhook::start(dir.path(), &ca, &["--config-map", "c"]).await;
    let answer = webhook.review(&ca, &admission_review("c1", "CREATE", pod())).await;
    assert!(answer["response"]["patch"].is_string());
}

/// A field of /proc/PID/status, in bytes (VmRSS: resident now; VmHWM: the most since the last
/// [`reset_peak`]).
fn memory(pid: u32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("the webhook runs");
    let kb = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).expect(field);
    kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024
}

/// Makes VmHWM the resident size now.
fn reset_peak(pid: u32) {
    fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("clear_refs");
}

/// An AdmissionReview of `bytes`, give or take a hundred: a pod of the API server's largest,
/// its weight in environment variables, each a small JSON object, as a large pod has them.
fn large_review(bytes: usize) -> String {
    let mut object = pod();
    let base = admission_review("large", "CREATE", object.clone()).to_string().len();
    let entry = |i: usize| json!({"name": format!("VAR_{i:07}"), "value": "v"});
    let each = entry(0).to_string().len() + 1;
    object["spec"]["containers"][0]["env"] = (0..bytes.saturating_sub(base + 20) / each).map(entry).collect();
    admission_review("large", "CREATE", object).to_string()
}

/// An AdmissionReview of `bytes` with a field nobody reads nested as deep as it goes: what costs
/// the parser most beside the body (a byte per level).
fn deep_review(bytes: usize) -> String {
    let review = admission_review("deep", "CREATE", pod()).to_string();
    let depth = bytes.saturating_sub(review.len() + 12) / 2;
    format!("{{\"deep\":{}{},{}", "[".repeat(depth), "]".repeat(depth), &review[1..])
}

/// The webhook's memory budget, from its section of docs/kubernetes.md (its "total" row).
fn documented_budget() -> u64 {
    let docs = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/kubernetes.md")).unwrap();
    let section = &docs[docs.find("## Memory budget: the webhook").expect("the section")..];
    let total = section.lines().find(|l| l.starts_with("| **total**")).expect("a total row");
    let mib = total.rsplit("**").nth(1).and_then(|cell| cell.strip_suffix(" MiB")).expect("**N MiB**");
    mib.parse::<u64>().expect("a number of MiB") << 20
}

/// The largest review the webhook takes (`MAX_REVIEW_BYTES`).
const MAX_REVIEW: usize = 4 << 20;

#[tokio::test]
async fn a_large_review_costs_about_its_size_at_the_peak() {
    let (pki, dir) = (Pki::new(), tempfile::tempdir().unwrap());
    pki.install(dir.path());
    let webhook = Webhook::start(dir.path(), &pki.ca, &["--config-map", "c"]).await;
    let pid = webhook.child.id();
    for (what, review) in [("a 3 MiB pod", large_review(3 << 20)), ("deep nesting", deep_review(MAX_REVIEW - 64))] {
        let before = memory(pid, "VmRSS");
        reset_peak(pid);
        let (code, answer) = request(webhook.addr, &pki.ca, "POST", "/mutate", &review).await.unwrap();
        let peak = memory(pid, "VmHWM").saturating_sub(before);
        eprintln!("{what}: review {} bytes, peak {peak} bytes above the {before} before", review.len());
        assert_eq!(code, 200, "{what}: {answer}\n{}", webhook.logs());
        let answer: Value = serde_json::from_str(&answer).unwrap();
        let object = serde_json::from_str::<Value>(&review).map(|r| r["request"]["object"].clone());
        if let Ok(object) = object {
            // Compared whole, but not printed: a few MiB.
            let same = patched(&object, &answer["response"]) == injected(&object, &["--config-map", "orders-sidecar"]);
            assert!(same, "{what}: the patched pod is not what inject makes");
        }
        // The body, what hyper and TLS buffer around it, and the parser's own.
        assert!(peak < 2 * review.len() as u64 + (1 << 20), "{what}: {peak} bytes at the peak for {}", review.len());
    }
}

/// With `--identity-issuer`, the webhook's pod is still inject's: the certificate's CSI volume
/// and the sidecar's TLS flags toward the servers.
#[tokio::test]
async fn with_an_identity_issuer_the_webhook_adds_the_certificate_volume_inject_adds() {
    let (pki, dir) = (Pki::new(), tempfile::tempdir().unwrap());
    pki.install(dir.path());
    let settings = [
        "--server",
        "sluice-leaf.sluice.svc:7777",
        "--native",
        "true",
        "--identity-issuer",
        "sluice-identity",
        "--identity-trust-domain",
        "prod.example",
    ];
    let webhook = Webhook::start(dir.path(), &pki.ca, &settings).await;
    let answer = webhook.review(&pki.ca, &admission_review("i1", "CREATE", pod())).await;
    let from_webhook = patched(&pod(), &answer["response"]);
    assert_eq!(from_webhook, injected(&pod(), &[&["--config-map", "orders-sidecar"][..], &settings].concat()));
    let volumes = from_webhook["spec"]["volumes"].as_array().unwrap();
    let csi = &volumes.iter().find(|v| v["name"] == "sluice-identity").expect("the identity volume")["csi"];
    assert_eq!(csi["driver"], "csi.cert-manager.io");
    assert_eq!(
        csi["volumeAttributes"]["csi.cert-manager.io/uri-sans"],
        "spiffe://prod.example/ns/${POD_NAMESPACE}/pod/${POD_NAME}"
    );
    let args = from_webhook["spec"]["initContainers"][0]["args"].as_array().unwrap();
    assert!(args.windows(2).any(|w| w == ["--server-tls-key", "/var/run/secrets/sluice.io/identity/tls.key"]));
    if tools_ready("the patched pod's validation") {
        validate(&from_webhook.to_string()).expect("the patched pod validates");
    }
}

#[test]
fn a_bad_identity_flag_exits_64_with_one_line() {
    for (flag, value, says) in [
        ("--identity-issuer", "Not_A_Name", "not an issuer's name"),
        ("--identity-issuer-kind", "clusterissuer", "not a kind"),
        ("--identity-trust-domain", "spiffe://x", "not a SPIFFE trust domain"),
    ] {
        let out = run("sluice-sidecar", &["inject", "--config-map", "c", flag, value, "-"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flag}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(flag) && stderr.contains(says), "{stderr}");
    }
}

#[test]
fn a_bad_config_map_exits_64_with_one_line() {
    let webhook = ["webhook", "--tls-cert", "c", "--tls-key", "k", "--config-map", "Not_A_Name"];
    for args in [&["inject", "--config-map", "Not_A_Name", "-"][..], &webhook] {
        let out = run("sluice-sidecar", args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("--config-map") && stderr.contains("not a ConfigMap name"), "{stderr}");
    }
}

#[test]
fn inject_refuses_deep_flow_nesting_at_once() {
    // 500 KB of `{a: {a: ...}}`: libyaml took minutes over it before its depth limit applied.
    let deep = format!("{}1{}\n", "{a: ".repeat(100_000), "}".repeat(100_000));
    let started = Instant::now();
    let out = run_with_input(Command::new(binary("sluice-sidecar")).args(["inject", "--config-map", "c", "-"]), &deep);
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim(), "sluice-sidecar: inject: -: line 1: [ ] and { } nested more than 128 deep");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    // As deep as the parser takes is still injected.
    let nested =
        format!("{{kind: Pod, spec: {{containers: []}}, metadata: {}1{}}}\n", "{a: ".repeat(100), "}".repeat(100));
    let out =
        run_with_input(Command::new(binary("sluice-sidecar")).args(["inject", "--config-map", "c", "-"]), &nested);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Reads what the webhook sends until it closes the connection or `within` passes; `None` if
/// it has not closed it by then.
async fn until_closed(tls: &mut TlsStream<TcpStream>, within: Duration) -> Option<String> {
    let mut got = Vec::new();
    let read = timeout(within, async {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = tls.read(&mut buf).await {
            got.extend_from_slice(&buf[..n]);
        }
    });
    read.await.ok().map(|()| String::from_utf8_lossy(&got).into_owned())
}

/// A request head for `/mutate` declaring `length` bytes of body, the connection to close after.
fn mutate_head(length: usize) -> String {
    format!(
        "POST /mutate HTTP/1.1\r\nhost: {HOST}\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\
         connection: close\r\n\r\n"
    )
}

#[tokio::test]
async fn the_webhook_bounds_bodies_connections_and_idle_time() {
    let (pki, dir) = (Pki::new(), tempfile::tempdir().unwrap());
    pki.install(dir.path());
    let webhook = Webhook::start(dir.path(), &pki.ca, &["--config-map", "c"]).await;
    let (addr, ca) = (webhook.addr, pki.ca.as_str());

    // A body declared too large is refused unread.
    let mut large = connect(addr, ca, b"http/1.1").await.unwrap();
    large.write_all(mutate_head(MAX_REVIEW + 1).as_bytes()).await.unwrap();
    let answer = until_closed(&mut large, Duration::from_secs(5)).await.expect("refused and closed");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // A connection silent after its handshake, and one whose body stops coming, are closed.
    let started = Instant::now();
    let mut silent = connect(addr, ca, b"h2").await.unwrap();
    let mut slow = connect(addr, ca, b"http/1.1").await.unwrap();
    slow.write_all(format!("{}{{\"apiVersion\"", mutate_head(1000)).as_bytes()).await.unwrap();
    // Up to the cap (64), connections are taken; past it, not until one of them goes.
    let mut held = Vec::new();
    for _ in 0..62 {
        held.push(connect(addr, ca, b"http/1.1").await.unwrap());
    }
    let ca_owned = pki.ca.clone();
    let waiting = tokio::spawn(async move { connect(addr, &ca_owned, b"http/1.1").await });
    sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "a connection past the cap was taken");
    drop(held.pop());
    let served = timeout(Duration::from_secs(5), waiting).await.expect("once one went, the waiting one is served");
    served.unwrap().expect("a TLS connection");

    let answer = until_closed(&mut slow, Duration::from_secs(15)).await.expect("the slow body is cut off");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(started.elapsed() >= Duration::from_secs(9), "{:?}", started.elapsed());
    assert!(until_closed(&mut silent, Duration::from_secs(15)).await.is_some(), "the silent one is closed");
    assert!(started.elapsed() < Duration::from_secs(25), "{:?}", started.elapsed());
}

/// How the attackers fared, for the test's output.
#[derive(Default)]
struct Tally {
    connections: AtomicU64,
    answered: AtomicU64,
    refused: AtomicU64,
}

impl Tally {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// HTTP/1.1: `review` sent in 32 KiB pieces over about 8 s (the body timeout is 10 s), the
/// answer read, again on a new connection.
async fn slow_http1(addr: SocketAddr, ca: String, review: Bytes, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut tls) = connect(addr, &ca, b"http/1.1").await else { continue };
        Tally::add(&tally.connections);
        if tls.write_all(mutate_head(review.len()).as_bytes()).await.is_err() {
            continue;
        }
        let pause = Duration::from_secs(8) / (review.len() / (32 << 10)) as u32;
        let mut sent = true;
        for piece in review.chunks(32 << 10) {
            sleep(pause).await;
            if stop.load(Ordering::Relaxed) || tls.write_all(piece).await.is_err() {
                sent = false;
                break;
            }
        }
        let answer =
            if sent { until_closed(&mut tls, Duration::from_secs(3)).await.unwrap_or_default() } else { String::new() };
        Tally::add(if answer.starts_with("HTTP/1.1 200") { &tally.answered } else { &tally.refused });
    }
}

/// HTTP/2: twice as many streams as the webhook allows at once, each sending `review` slowly.
async fn slow_http2(addr: SocketAddr, ca: String, review: Bytes, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(tls) = connect(addr, &ca, b"h2").await else { continue };
        Tally::add(&tally.connections);
        let Ok((sender, connection)) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await
        else {
            continue;
        };
        tokio::spawn(connection);
        let streams = (0..8).map(|_| {
            let (mut sender, review, stop, tally) = (sender.clone(), review.clone(), stop.clone(), tally.clone());
            async move {
                let (pieces, body) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, io::Error>>(1);
                let request = hyper::Request::post(format!("https://{HOST}/mutate"))
                    .header("content-type", "application/json")
                    .body(StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(body)))
                    .unwrap();
                let sending = tokio::spawn(async move {
                    for start in (0..review.len()).step_by(16 << 10) {
                        let piece = review.slice(start..review.len().min(start + (16 << 10)));
                        sleep(Duration::from_millis(30)).await;
                        if stop.load(Ordering::Relaxed) || pieces.send(Ok(Frame::data(piece))).await.is_err() {
                            break;
                        }
                    }
                });
                let answered = matches!(sender.send_request(request).await, Ok(r) if r.status() == 200);
                sending.abort();
                Tally::add(if answered { &tally.answered } else { &tally.refused });
            }
        });
        futures_join(streams).await;
    }
}

/// Runs the futures at once, to the last.
async fn futures_join<F: Future<Output = ()> + Send + 'static>(futures: impl Iterator<Item = F>) {
    let tasks: Vec<_> = futures.map(tokio::spawn).collect();
    for task in tasks {
        let _ = task.await;
    }
}

/// A connection that says nothing after its handshake (`head`: sends a head a byte a second),
/// again as soon as it is closed.
async fn stalling(addr: SocketAddr, ca: String, head: bool, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut tls) = connect(addr, &ca, b"http/1.1").await else { continue };
        Tally::add(&tally.connections);
        if head {
            for byte in mutate_head(MAX_REVIEW).bytes() {
                if stop.load(Ordering::Relaxed) || tls.write_all(&[byte]).await.is_err() {
                    break;
                }
                sleep(Duration::from_secs(1)).await;
            }
        } else {
            let mut buf = [0u8; 64];
            while !stop.load(Ordering::Relaxed)
                && matches!(timeout(Duration::from_secs(1), tls.read(&mut buf)).await, Err(_) | Ok(Ok(1..)))
            {
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_worst_clients_can_send_the_webhook_stays_within_its_memory_budget() {
    let budget = documented_budget();
    let (pki, dir) = (Pki::new(), tempfile::tempdir().unwrap());
    pki.install(dir.path());
    let webhook = Webhook::start(dir.path(), &pki.ca, &["--config-map", "c"]).await;
    let (addr, pid) = (webhook.addr, webhook.child.id());
    let rest = memory(pid, "VmRSS");
    let (stop, tally) = (Arc::new(AtomicBool::new(false)), Arc::new(Tally::default()));
    // The largest reviews, of the pod that costs the most to answer and of the deepest nesting.
    let reviews = [Bytes::from(large_review(MAX_REVIEW - 64)), Bytes::from(deep_review(MAX_REVIEW - 64))];
    let mut attackers = Vec::new();
    for i in 0..24 {
        let review = reviews[i % 2].clone();
        attackers.push(tokio::spawn(slow_http1(addr, pki.ca.clone(), review, stop.clone(), tally.clone())));
    }
    for i in 0..8 {
        let review = reviews[i % 2].clone();
        attackers.push(tokio::spawn(slow_http2(addr, pki.ca.clone(), review, stop.clone(), tally.clone())));
    }
    for i in 0..48 {
        attackers.push(tokio::spawn(stalling(addr, pki.ca.clone(), i % 2 == 0, stop.clone(), tally.clone())));
    }
    let mut most = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        most = most.max(memory(pid, "VmRSS"));
        sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for attacker in attackers {
        attacker.abort();
    }
    let (connections, answered, refused) = (
        tally.connections.load(Ordering::Relaxed),
        tally.answered.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
    );
    eprintln!(
        "RSS at rest {rest} bytes, at most {most} under attack (budget {budget}); {connections} connections, \
         {answered} reviews answered, {refused} not"
    );
    assert!(answered > 0, "the attack sent no review the webhook answered: it tested nothing");
    assert!(most <= budget, "RSS reached {most} bytes, over the documented budget of {budget}");
    // And it still serves.
    let why = lazily(|| format!("the webhook does not recover; log:\n{}", webhook.logs()));
    eventually(why, async || matches!(request(addr, &pki.ca, "GET", "/healthz", "").await, Ok((200, _)))).await;
    let answer = webhook.review(&pki.ca, &admission_review("after", "CREATE", pod())).await;
    assert!(answer["response"]["patch"].is_string());
}
