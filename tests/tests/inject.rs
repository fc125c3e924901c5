//! `sluice-sidecar inject` as a user runs it: a line per object on standard error, a pod that
//! opted out left as it is, and exit 64 with one line for a pod already using what the sidecar
//! adds, naming the object and its container; `uninject` takes out what it added; both read a
//! directory's files as one stream.

use std::{fs, process::Command};

use sluice_tests::{
    harness::binary,
    kube::{documents, run_with_input},
};

const INPUT: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: app, image: app:1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: x, annotations: {sluice.io/inject: disabled}}
spec: {containers: [{name: app, image: app:1}]}
---
apiVersion: v1
kind: Service
metadata: {name: y}
spec: {ports: [{port: 80}]}
";

fn inject(input: &str) -> std::process::Output {
    run_with_input(Command::new(binary("sluice-sidecar")).args(["inject", "--config-map", "web-sidecar", "-"]), input)
}

#[test]
fn inject_says_what_it_did_with_each_object() {
    let out = inject(INPUT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr.lines().collect::<Vec<_>>(),
        [
            "deployment/web: injected (classic sidecar, first container)",
            "pod/x: skipped (sluice.io/inject: disabled)",
            "service/y: skipped (not a workload)"
        ]
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let objects = documents(&stdout);
    // Offline, `--native auto` cannot tell the cluster's version: classic, the sidecar first.
    assert_eq!(objects[0]["spec"]["template"]["spec"]["containers"][0]["name"], "sluice-sidecar");
    assert!(objects[1]["spec"].get("initContainers").is_none(), "the opted-out pod is as it was");

    let again = inject(&stdout);
    assert!(again.status.success());
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(stderr.lines().next(), Some("deployment/web: already injected"), "{stderr}");
    assert_eq!(String::from_utf8(again.stdout).unwrap(), stdout);
}

#[test]
fn a_pod_using_the_sidecars_port_exits_64_with_one_line() {
    let clash = INPUT.replacen("image: app:1}]}\n---", "image: app:1, ports: [{containerPort: 9901}]}]}\n---", 1);
    let out = inject(&clash);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert_eq!(
        stderr,
        "sluice-sidecar: inject: -: document 1: Deployment \"web\": container \"app\" already uses port 9901, the \
         sidecar's admin port\n"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn uninject_gives_back_the_input_and_a_directory_is_one_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (first, rest) = INPUT.split_once("---\n").unwrap();
    fs::write(dir.path().join("b.yml"), rest).unwrap();
    fs::write(dir.path().join("a.yaml"), first).unwrap();
    fs::write(dir.path().join("c.json"), r#"{"kind": "Pod", "metadata": {"name": "z"}, "spec": {"containers": []}}"#)
        .unwrap();
    fs::write(dir.path().join("notes.txt"), "not: read").unwrap();
    let sidecar = |args: &[&str], input: &str| run_with_input(Command::new(binary("sluice-sidecar")).args(args), input);
    let path = dir.path().to_str().unwrap();
    let out = sidecar(&["inject", "--config-map", "web-sidecar", path], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr.lines().collect::<Vec<_>>(),
        [
            "deployment/web: injected (classic sidecar, first container)",
            "pod/x: skipped (sluice.io/inject: disabled)",
            "service/y: skipped (not a workload)",
            "pod/z: injected (classic sidecar, first container)"
        ]
    );
    let back = sidecar(&["uninject", "-"], &String::from_utf8(out.stdout).unwrap());
    let stderr = String::from_utf8_lossy(&back.stderr);
    assert!(back.status.success(), "{stderr}");
    assert_eq!(stderr.lines().next(), Some("deployment/web: uninjected"));
    let json = "---\n{kind: Pod, metadata: {name: z}, spec: {containers: []}}\n";
    assert_eq!(documents(&String::from_utf8(back.stdout).unwrap()), documents(&format!("{INPUT}{json}")));
}

#[test]
fn with_an_identity_issuer_each_sidecar_gets_its_certificate_and_uninject_takes_it_out() {
    let args = ["inject", "--config-map", "web-sidecar", "--server", "sluice-root.sluice.svc:7777"];
    let identity = ["--identity-issuer", "sluice-identity", "--identity-issuer-kind", "Issuer", "-"];
    let out = run_with_input(Command::new(binary("sluice-sidecar")).args(args).args(identity), INPUT);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let spec = &documents(&stdout)[0]["spec"]["template"]["spec"];
    let volume = &spec["volumes"][1];
    assert_eq!(volume["name"], "sluice-identity");
    let attributes = &volume["csi"]["volumeAttributes"];
    assert_eq!(attributes["csi.cert-manager.io/issuer-name"], "sluice-identity");
    assert_eq!(attributes["csi.cert-manager.io/issuer-kind"], "Issuer");
    assert_eq!(attributes["csi.cert-manager.io/common-name"], "${POD_NAME}");
    let mounts = spec["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["name"] == "sluice-identity" && m["readOnly"] == true));
    let uninjected = run_with_input(Command::new(binary("sluice-sidecar")).args(["uninject", "-"]), &stdout);
    assert_eq!(documents(&String::from_utf8(uninjected.stdout).unwrap()), documents(INPUT));
}
