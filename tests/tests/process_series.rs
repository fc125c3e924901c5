//! What both binaries say of themselves as processes: logs without colour when they go to a
//! file, `process_*` and `sluice_build_info` in /metrics; and the sidecar's status when its
//! capacity servers do not answer.

use std::time::{SystemTime, UNIX_EPOCH};

use sluice_tests::{
    config::{Listener, Resource, Rule, SidecarConfig, Upstream},
    harness::{Process, Server, Sidecar, free_port},
    http::{get, http1},
    wait::{eventually, lazily},
};

/// The process series of `process`, named `binary`, are there with sane values, and its log
/// (a file, not a terminal) has no colour escapes.
fn check_process(process: &Process, binary: &str) {
    let value = |series: &str| {
        process.metric(series).unwrap_or_else(|| panic!("{binary}: no {series} in {}", process.get("/metrics").1))
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let start = value("process_start_time_seconds");
    assert!(start <= now + 1.0 && start > now - 3600.0, "{binary} started at {start}, now {now}");
    assert!(value("process_resident_memory_bytes") > 1e6, "{binary}: RSS over 1 MB");
    assert!(value("process_cpu_seconds_total") >= 0.0);
    let open = value("process_open_fds");
    assert!(open > 0.0 && value("process_max_fds") >= open, "{binary}: {open} fds open");
    let build = format!("sluice_build_info{{version=\"{}\",binary=\"{binary}\"}}", env!("CARGO_PKG_VERSION"));
    assert_eq!(value(&build), 1.0);
    let logs = process.logs();
    assert!(!logs.is_empty(), "{binary} logged nothing");
    assert!(!logs.contains("\x1b["), "{binary}: colour escapes in a log file: {logs:?}");
}

#[tokio::test]
async fn both_binaries_show_their_process_and_build_and_log_without_colour() {
    let server = Server::launch().start();
    check_process(&server, "sluice-server");

    // Leasing from a port nobody listens on: the status says the servers do not answer.
    let dead = ([127, 0, 0, 1], free_port()).into();
    let config = SidecarConfig::proxy(Listener::app(), Upstream::app(([127, 0, 0, 1], free_port()).into()))
        .leasing_from([dead])
        .resource(Resource::new("orders"))
        .rule(Rule::charging("orders"));
    let sidecar = Sidecar::launch(&config).start();
    check_process(&sidecar, "sluice-sidecar");
    let listen = sidecar.listen();
    let status = || serde_json::from_str::<serde_json::Value>(&sidecar.get("/debug/status.json").1).unwrap();
    let client = http1();
    eventually(lazily(|| format!("no failed call to the servers: {}", status())), async || {
        get(&client, &format!("http://{listen}/")).await;
        status()["contact"]["failed_calls"].as_u64() > Some(0)
    })
    .await;
    let contact = &status()["contact"];
    assert!(contact["last_answer"].is_null() && contact["failing_since"].is_i64(), "{contact}");
    assert!(contact["error"].as_str().is_some_and(|e| !e.is_empty()), "{contact}");
    let page = sidecar.get("/debug/status").1;
    assert!(page.contains("<p class=\"unreachable\"><b>The capacity servers do not answer</b>"), "{page}");
    assert!(page.contains("(no answer yet)"), "{page}");
}
