//! The configuration from an etcd key (`--config etcd:<key>`), end to end: a real etcd, three
//! real `sluice-server` replicas watching one key. A change is in force on every replica within
//! a second; an invalid value changes nothing; while etcd is gone the last good configuration
//! stays, and the replicas follow the key again once it is back.

use std::time::Duration;

use serde_json::Value;
use sluice_tests::{
    config::{Algorithm, ConfigFile, ServerConfig, Template},
    etcd::Etcd,
    harness::{self, Server},
    wait::{eventually, lazily},
};

const KEY: &str = "/sluice/test/config";

fn config(capacity: f64) -> String {
    ServerConfig::new().template(Template::catch_all(capacity, Algorithm::fair_share(30, 1))).yaml()
}

fn replica(etcd: &Etcd) -> Server {
    Server::launch()
        .args(["--etcd-endpoints", &etcd.endpoint(), "--election-key", "/sluice/test/config-election"])
        .args(["--etcd-lease-ttl", "2", "--config", &format!("etcd:{KEY}")])
        .start()
}

fn status(server: &Server) -> Value {
    let (code, body) = server.get("/debug/status.json");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status JSON")
}

/// The capacity of the one template the server has in force.
fn capacity(server: &Server) -> f64 {
    status(server)["templates"][0]["capacity"].as_f64().expect("a template")
}

/// Puts a configuration of `capacity` and returns how long until every server had it in force.
async fn follow(etcd: &Etcd, servers: &[Server], capacity_now: f64) -> Duration {
    etcd.put(KEY, &config(capacity_now)).await;
    eventually(
        lazily(|| {
            format!("every server has capacity {capacity_now}: {:?}", servers.iter().map(capacity).collect::<Vec<_>>())
        }),
        async || servers.iter().all(|s| capacity(s) == capacity_now),
    )
    .await
}

fn rejections(server: &Server) -> usize {
    server.logs().matches("configuration rejected").count()
}

#[tokio::test]
async fn three_servers_follow_the_key_keep_the_last_good_value_and_outlive_etcd() {
    let mut etcd = Etcd::start();
    etcd.put(KEY, &config(100.0)).await;
    let servers = [replica(&etcd), replica(&etcd), replica(&etcd)];
    for server in &servers {
        assert_eq!(capacity(server), 100.0, "the key's value at start");
        assert_eq!(status(server)["config"]["path"], format!("etcd:{KEY}"));
    }

    let mut slowest = Duration::ZERO;
    for capacity in [200.0, 300.0, 400.0] {
        let took = follow(&etcd, &servers, capacity).await;
        println!("3 servers followed the key to capacity {capacity} in {took:?}");
        assert!(took < Duration::from_secs(1), "{took:?}: not within a second");
        slowest = slowest.max(took);
    }
    println!("slowest of 3 changes: {slowest:?}");
    for server in &servers {
        assert_eq!(server.metric("sluice_server_config_reloads_total{result=\"success\"}"), Some(3.0));
    }

    // An invalid value: refused with one line on each server, and the last good one still served.
    etcd.put(KEY, "resources: [").await;
    for server in &servers {
        eventually(lazily(|| format!("the invalid value is rejected:\n{}", server.logs())), async || {
            server.metric("sluice_server_config_reloads_total{result=\"failure\"}") == Some(1.0)
        })
        .await;
        assert_eq!(rejections(server), 1, "{}", server.logs());
        assert_eq!(capacity(server), 400.0);
        assert!(status(server)["config"]["rejected"]["error"].is_string());
    }
    // A deleted key changes nothing either.
    etcd.delete(KEY).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for server in &servers {
        assert_eq!(capacity(server), 400.0);
        assert!(server.logs().contains("the configuration key was deleted"), "{}", server.logs());
    }

    // etcd gone: the last good configuration stays in force, and the servers keep serving it.
    etcd.stop("KILL");
    tokio::time::sleep(Duration::from_secs(3)).await;
    for server in &servers {
        assert_eq!(capacity(server), 400.0);
        assert_eq!(server.get("/healthz").0, 200);
    }
    // Back: the servers watch again and follow the next change. It is put as soon as etcd is
    // back, usually before they have reconnected (their backoff has grown to 2 s): they then read
    // it with the key when they reconnect, not from a watch.
    etcd.restart();
    let took = follow(&etcd, &servers, 500.0).await;
    println!("3 servers followed the first change after etcd restarted in {took:?}");
    let took = follow(&etcd, &servers, 600.0).await;
    println!("and the next one in {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}: not within a second");
    for server in &servers {
        assert_eq!(rejections(server), 1, "no more rejections: {}", server.logs());
    }
}

#[tokio::test]
async fn sighup_reads_the_key_again() {
    let etcd = Etcd::start();
    etcd.put(KEY, &config(100.0)).await;
    let server = replica(&etcd);
    server.signal("HUP");
    eventually("applied again", async || {
        server.metric("sluice_server_config_reloads_total{result=\"success\"}") == Some(1.0)
    })
    .await;
    assert_eq!(capacity(&server), 100.0);
}

#[tokio::test]
async fn a_start_without_a_valid_value_exits_with_one_line() {
    let etcd = Etcd::start();
    let endpoint = etcd.endpoint();
    let start = |config: &str| harness::run("sluice-server", &["--etcd-endpoints", &endpoint, "--config", config]);
    let one_line = |output: &std::process::Output| {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        stderr
    };

    let output = start("etcd:/sluice/test/none");
    assert_eq!(output.status.code(), Some(64));
    let stderr = one_line(&output);
    assert!(stderr.contains("etcd:/sluice/test/none: no such key in etcd"), "{stderr}");

    etcd.put("/sluice/test/bad", "resources: [").await;
    let output = start("etcd:/sluice/test/bad");
    assert_eq!(output.status.code(), Some(64));
    assert!(one_line(&output).starts_with("sluice-server: etcd:/sluice/test/bad: "));

    let output = harness::run("sluice-server", &["--config", "etcd:/sluice/test/none"]);
    assert_eq!(output.status.code(), Some(64));
    assert!(one_line(&output).contains("needs --etcd-endpoints"));

    let output = harness::run("sluice-server", &["check", "--config", "etcd:/sluice/test/none"]);
    assert_eq!(output.status.code(), Some(64));
    assert!(one_line(&output).contains("check reads files"));

    // etcd down at start: nothing to start with.
    drop(etcd);
    let output = start("etcd:/sluice/test/none");
    assert_eq!(output.status.code(), Some(1));
    let stderr = one_line(&output);
    assert!(stderr.contains("etcd:/sluice/test/none: "), "{stderr}");
}
