//! `sluice-sidecar webhook` end to end: real `AdmissionReview` requests over TLS to the running
//! binary. The pod its JSON Patch makes is the pod `sluice-sidecar inject` makes, and validates;
//! what it does not handle is allowed unchanged; rotated certificate files are taken without a
//! restart; and the certificate the chart generates serves it.

use std::{
    fs,
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use base64::{Engine, engine::general_purpose::STANDARD};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rcgen::{CertificateParams, KeyPair};
use serde_json::{Value, json};
use sluice_tests::{
    harness::{binary, free_port},
    kube::{chart, documents, find, render, run_with_input, tools_ready, validate},
};
use tokio_rustls::{
    TlsConnector,
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
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(request(addr, ca, "GET", "/healthz", "").await, Ok((200, _))) {
            assert!(Instant::now() < deadline, "the webhook is not up; log:\n{}", webhook.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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

/// One HTTPS request over a new connection, trusting only `ca` and checking the name [`HOST`].
async fn request(addr: SocketAddr, ca: &str, method: &str, path: &str, body: &str) -> Result<(u16, String), String> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca) {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let config = ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(HOST).unwrap(), stream)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
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
    let settings = ["--image", "registry.example/sluice:1", "--server", "sluice-leaf.sluice.svc:7777"];
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while request(webhook.addr, &new.ca, "GET", "/healthz", "").await.is_err() {
        assert!(Instant::now() < deadline, "the new files are not in use; log:\n{}", webhook.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(request(webhook.addr, &old.ca, "GET", "/healthz", "").await.is_err(), "the old certificate is out");
    let answer = webhook.review(&new.ca, &admission_review("r1", "CREATE", pod())).await;
    assert!(answer["response"]["patch"].is_string());
}

#[tokio::test]
async fn the_certificate_the_chart_generates_serves_the_webhook() {
    if !tools_ready("the chart certificate test") {
        return;
    }
    let objects = documents(&render(&chart(), &["--set", "injector.enabled=true"]).unwrap());
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
