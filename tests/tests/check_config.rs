//! `sluice-server check` and `sluice-sidecar check`: a file validated as a start would validate
//! it, the files it names read from its folder, nothing bound; 0 and a summary, or 64 and a line
//! per error found, each naming the file.

use std::{
    net::TcpListener,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use sluice_tests::harness::binary;

const LIMITS: &str = "domain: edge
descriptors:
  - key: generic_key
    value: demo
    rate_limit: {unit: second, requests_per_unit: 20}
";

const SERVER: &str = r#"rate_limits:
  files: [limits.yaml]
resources:
  - identifier_glob: "orders.*"
    capacity: 50
    algorithm: {kind: FAIR_SHARE, lease_length: 20, refresh_interval: 5}
  - identifier_glob: "*"
    capacity: 100
    algorithm: {kind: FAIR_SHARE, lease_length: 20, refresh_interval: 5}
"#;

/// Runs `name check --config <config>` in `dir`: exit code, standard output, standard error.
fn check(name: &str, dir: &Path, config: &str) -> (Option<i32>, String, String) {
    let start = Instant::now();
    let out =
        Command::new(binary(name)).args(["check", "--config", config]).current_dir(dir).output().expect("binary runs");
    assert!(start.elapsed() < Duration::from_secs(10), "{name} check took {:?}", start.elapsed());
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).expect("UTF-8");
    (out.status.code(), text(out.stdout), text(out.stderr))
}

/// A folder holding `files` (name, content), `conf/` made for those named in it.
fn folder(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temporary directory");
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("folder");
        std::fs::write(path, text).expect("write");
    }
    dir
}

/// Holds `address` if it is free; if someone else holds it, it is taken all the same.
fn hold(address: &str) -> Option<TcpListener> {
    TcpListener::bind(address).ok()
}

/// A failed check: 64, nothing on standard output, one line on standard error naming `config`
/// and saying `why`.
fn assert_refused(name: &str, dir: &Path, config: &str, why: &str) {
    let (code, stdout, stderr) = check(name, dir, config);
    assert_eq!(code, Some(64), "{name} check {config}: {stderr}");
    assert_eq!(stdout, "", "{name} check {config}");
    assert_eq!(stderr.lines().count(), 1, "{name} check {config}: one line:\n{stderr}");
    assert!(stderr.starts_with(&format!("{config}: ")), "{name} check {config} names the file:\n{stderr}");
    assert!(stderr.contains(why), "{name} check {config} says {why:?}:\n{stderr}");
}

#[test]
fn server_check_passes_a_valid_file_with_its_ports_taken() {
    let dir = folder(&[("conf/server.yaml", SERVER), ("conf/limits.yaml", LIMITS)]);
    let _held = (hold("127.0.0.1:7777"), hold("127.0.0.1:7778"));
    let (code, stdout, stderr) = check("sluice-server", dir.path(), "conf/server.yaml");
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "conf/server.yaml: ok: 3 templates (1 from rate limit files)\n");
    assert_eq!(stderr, "");
}

#[test]
fn server_check_refuses_an_invalid_file_in_one_line() {
    let capacity = SERVER.replace("capacity: 100", "capacity: -1");
    let unknown = SERVER.replace("capacity: 100", "capacity: 100\n    bogus: 1");
    let dir = folder(&[
        ("capacity.yaml", &capacity),
        ("unknown.yaml", &unknown),
        ("syntax.yaml", "resources: [\n"),
        ("limits.yaml", LIMITS),
        ("no-limits.yaml", &SERVER.replace("limits.yaml", "missing.yaml")),
    ]);
    let server = "sluice-server";
    assert_refused(
        server,
        dir.path(),
        "capacity.yaml",
        r#"resources[1] ("*"): capacity: must be from 0 to 1e15, got -1"#,
    );
    assert_refused(server, dir.path(), "unknown.yaml", "unknown field `bogus`");
    assert_refused(server, dir.path(), "unknown.yaml", "at line 9 column 5");
    assert_refused(server, dir.path(), "syntax.yaml", "at line 2 column 1");
    assert_refused(server, dir.path(), "no-limits.yaml", "rate_limits.files[0] (missing.yaml): cannot read");
    assert_refused(server, dir.path(), "absent.yaml", "cannot read it");
}

/// A sidecar configuration whose listener is at `listener`.
fn sidecar(listener: &str) -> String {
    format!(
        "server:
  addresses: [127.0.0.1:7777]
listeners:
  - {{name: orders, address: {listener}, upstream: orders}}
upstreams:
  - {{name: orders, url: http://127.0.0.1:8080}}
rate_limit_service:
  address: 127.0.0.1:8081
  files: [limits.yaml]
resources:
  - {{id: orders.write, kind: rate, safe_capacity: 10}}
  - {{id: orders.all, kind: rate}}
rules:
  - {{name: writes, match: {{methods: [POST]}}, resource: orders.write, also: [orders.all], on_limit: reject}}
  - {{name: reads, resource: orders.all, on_limit: reject}}
"
    )
}

#[test]
fn sidecar_check_passes_a_valid_file_with_its_ports_taken() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
    let address = listener.local_addr().expect("address").to_string();
    let dir = folder(&[("conf/sidecar.yaml", &sidecar(&address)), ("conf/limits.yaml", LIMITS)]);
    let _held = (hold("127.0.0.1:9901"), hold("127.0.0.1:8081"));
    let (code, stdout, stderr) = check("sluice-sidecar", dir.path(), "conf/sidecar.yaml");
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stdout,
        "conf/sidecar.yaml: ok: 1 listener, 1 upstream, 3 resources, 2 rules, rate limit service with 1 domain, \
         leasing from 1 server\n"
    );
    assert_eq!(stderr, "");
}

#[test]
fn sidecar_check_refuses_an_invalid_file_in_one_line() {
    let valid = sidecar("127.0.0.1:9000");
    let dir = folder(&[
        ("rule.yaml", &valid.replace("resource: orders.all, on_limit", "resource: nowhere, on_limit")),
        ("unknown.yaml", &valid.replace("kind: rate}", "kind: rate, bogus: 1}")),
        ("syntax.yaml", "listeners: [\n"),
        ("limits.yaml", LIMITS),
        ("bad-limits.yaml", "domain: edge\ndescriptors: 3\n"),
        ("limits-file.yaml", &valid.replace("[limits.yaml]", "[bad-limits.yaml]")),
        ("server-ca.yaml", &valid.replace("[127.0.0.1:7777]", "[127.0.0.1:7777]\n  tls: {ca: missing-ca.pem}")),
        (
            "upstream-ca.yaml",
            &valid.replace("url: http://127.0.0.1:8080", "url: https://127.0.0.1:8080, ca: missing-ca.pem"),
        ),
    ]);
    let sidecar = "sluice-sidecar";
    assert_refused(sidecar, dir.path(), "rule.yaml", "nowhere");
    assert_refused(sidecar, dir.path(), "unknown.yaml", "unknown field `bogus`");
    assert_refused(sidecar, dir.path(), "unknown.yaml", "at line 12 column 34");
    assert_refused(sidecar, dir.path(), "syntax.yaml", "at line 2 column 1");
    assert_refused(sidecar, dir.path(), "limits-file.yaml", "bad-limits.yaml");
    // Files a start reads besides the configuration's own.
    assert_refused(sidecar, dir.path(), "server-ca.yaml", "missing-ca.pem");
    assert_refused(sidecar, dir.path(), "upstream-ca.yaml", "missing-ca.pem");
    assert_refused(sidecar, dir.path(), "absent.yaml", "cannot read it");
}

#[test]
fn both_checks_report_every_error_found_a_line_each() {
    let server =
        SERVER.replace("capacity: 50", "capacity: -5").replace("capacity: 100", "capacity: 100\n    safe_capacity: -3");
    let sidecar = sidecar("127.0.0.1:9000")
        .replace("url: http://127.0.0.1:8080", "url: ftp://x")
        .replace("kind: rate, safe_capacity: 10", "kind: rate, safe_capacity: -10")
        .replace("{id: orders.all, kind: rate}", "{id: orders.all, kind: rate, burst: 0}");
    let dir = folder(&[("server.yaml", &server), ("sidecar.yaml", &sidecar), ("limits.yaml", LIMITS)]);
    let (code, stdout, stderr) = check("sluice-server", dir.path(), "server.yaml");
    assert_eq!((code, stdout.as_str()), (Some(64), ""), "{stderr}");
    assert_eq!(
        stderr.lines().collect::<Vec<_>>(),
        [
            r#"server.yaml: resources[0] ("orders.*"): capacity: must be from 0 to 1e15, got -5"#,
            r#"server.yaml: resources[1] ("*"): safe_capacity: must be from 0 to 1e15 or -1 (unlimited), got -3"#,
        ]
    );
    let (code, stdout, stderr) = check("sluice-sidecar", dir.path(), "sidecar.yaml");
    assert_eq!((code, stdout.as_str()), (Some(64), ""), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(lines[0].starts_with("sidecar.yaml: upstreams[0] (orders).url: "), "{stderr}");
    assert_eq!(
        lines[1],
        "sidecar.yaml: resources[0] (orders.write).safe_capacity: must be from 0 to 1e15 or .inf, got -10"
    );
    assert_eq!(lines[2], "sidecar.yaml: resources[1] (orders.all).burst: must be above 0 and at most 1e15, got 0");
}
