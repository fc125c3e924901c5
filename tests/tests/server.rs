//! End-to-end tests of the real `sluice-server` binary, through a client built from the
//! generated tonic stubs.

use std::{
    io::{Read, Write},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use sluice_proto::{
    DiscoveryRequest, GetCapacityRequest, GetServerCapacityRequest, Lease, PriorityBandAggregate,
    ReleaseCapacityRequest, ResourceRequest, ServerCapacityResourceRequest, algorithm::Kind,
    capacity_client::CapacityClient,
};
use sluice_runtime::defaults::{ADMIN_HEADER_TIMEOUT, ADMIN_MAX_CONNECTIONS};
use sluice_tests::{
    config::{Algorithm, ConfigFile, ServerConfig, Template},
    harness::{self, Server},
    hostile::{IN_FLIGHT_FLAG, connect, stall},
    wait::{eventually, eventually_blocking},
};
use tonic::{Code, transport::Channel};

/// One template, of `glob`, sharing `capacity` fairly with leases refreshed every second.
fn template(glob: &str, capacity: f64, lease_length: u64, learning: u64) -> ServerConfig {
    let algorithm = Algorithm::fair_share(lease_length, 1).learning(learning);
    ServerConfig::new().template(Template::new(glob, capacity, algorithm))
}

/// [`template`] of every resource.
fn fair_share(capacity: f64, lease_length: u64, learning: u64) -> ServerConfig {
    template("*", capacity, lease_length, learning)
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

fn request(client: &str, resource: &str, wants: f64, has: Option<f64>) -> GetCapacityRequest {
    GetCapacityRequest {
        client_id: client.into(),
        resource: vec![ResourceRequest {
            resource_id: resource.into(),
            priority: 0,
            has: has.map(|capacity| Lease { expiry_time: 0, refresh_interval: 0, capacity }),
            wants,
            signals: None,
        }],
    }
}

/// The capacity granted to `client` on `resource`.
async fn ask(client: &mut CapacityClient<Channel>, id: &str, resource: &str, wants: f64) -> f64 {
    let response = client.get_capacity(request(id, resource, wants, None)).await.expect("GetCapacity").into_inner();
    assert_eq!(response.response.len(), 1);
    assert!(response.mastership.is_none(), "a master answers without a mastership redirect");
    response.response[0].gets.capacity
}

fn status_json(server: &Server, query: &str) -> Value {
    let (code, body) = server.get(&format!("/debug/status.json{query}"));
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status JSON")
}

#[tokio::test]
async fn clients_get_fair_shares_that_converge() {
    let server = Server::launch().config(&fair_share(100.0, 30, 0)).start();
    let mut client = server.client().await;
    let before = unix_now();
    let response = client.get_capacity(request("a", "db", 100.0, None)).await.unwrap().into_inner();
    let lease = &response.response[0].gets;
    assert_eq!(lease.capacity, 100.0);
    assert_eq!(lease.refresh_interval, 1);
    assert!((before + 30..=unix_now() + 30).contains(&lease.expiry_time), "expiry {}", lease.expiry_time);
    // b's fair half is still held by a: b waits, a shrinks, then b catches up.
    assert_eq!(ask(&mut client, "b", "db", 100.0).await, 0.0);
    assert_eq!(ask(&mut client, "a", "db", 100.0).await, 50.0);
    let response = client.get_capacity(request("b", "db", 100.0, None)).await.unwrap().into_inner();
    assert_eq!(response.response[0].gets.capacity, 50.0);
    assert_eq!(response.response[0].safe_capacity, Some(50.0), "capacity / clients");

    let discovery = client.discovery(DiscoveryRequest {}).await.unwrap().into_inner();
    assert!(discovery.is_master);
    assert_eq!(discovery.mastership.master_address, Some(server.grpc.to_string()));
}

#[tokio::test]
async fn learning_mode_grants_what_clients_hold_after_a_fresh_start() {
    let server = Server::launch().config(&fair_share(100.0, 30, 2)).start();
    let mut client = server.client().await;
    let started = Instant::now();
    let got = client.get_capacity(request("a", "db", 80.0, Some(30.0))).await.unwrap().into_inner();
    assert_eq!(got.response[0].gets.capacity, 30.0, "learning: what a reports holding, not its share");
    let got = client.get_capacity(request("b", "db", 80.0, Some(90.0))).await.unwrap().into_inner();
    assert_eq!(got.response[0].gets.capacity, 70.0, "learning never goes beyond capacity − Σ other has");
    assert_eq!(ask(&mut client, "c", "db", 50.0).await, 0.0, "a newcomer reporting nothing gets nothing");
    assert_eq!(status_json(&server, "").pointer("/resources/0/learning"), Some(&Value::Bool(true)));
    assert_eq!(server.metric("sluice_server_learning_mode{resource=\"db\"}"), Some(1.0));

    // Whole seconds: learning ends within 3 s of the start.
    thread::sleep(Duration::from_secs(3).saturating_sub(started.elapsed()) + Duration::from_millis(100));
    assert_eq!(status_json(&server, "").pointer("/resources/0/learning"), Some(&Value::Bool(false)));
    // Now the algorithm decides: λ = 100/3 for three clients wanting 80. b, holding the most,
    // shrinks first, which makes room for the others.
    let third = 100.0 / 3.0;
    let b = ask(&mut client, "b", "db", 80.0).await;
    assert!((b - third).abs() < 1e-9, "b got {b}");
    let a = ask(&mut client, "a", "db", 80.0).await;
    assert!((a - third).abs() < 1e-9, "a got {a}");
    let c = ask(&mut client, "c", "db", 80.0).await;
    assert!((c - third).abs() < 1e-9, "c got {c}");
}

#[tokio::test]
async fn release_frees_capacity() {
    let server = Server::launch().config(&fair_share(100.0, 30, 0)).start();
    let mut client = server.client().await;
    assert_eq!(ask(&mut client, "a", "db", 100.0).await, 100.0);
    assert_eq!(ask(&mut client, "b", "db", 100.0).await, 0.0);
    client
        .release_capacity(ReleaseCapacityRequest {
            client_id: "a".into(),
            // As Doorman's own client sends them at Close(): padded with empty ids.
            resource_id: vec!["".into(), "db".into(), "".into(), "never-used".into(), "db".into()],
        })
        .await
        .expect("release");
    assert_eq!(ask(&mut client, "b", "db", 100.0).await, 100.0);
    assert_eq!(status_json(&server, "").pointer("/resources/0/clients"), Some(&Value::from(1)));
}

#[tokio::test]
async fn an_expired_lease_stops_counting() {
    let server = Server::launch().config(&fair_share(100.0, 2, 0)).start();
    let mut client = server.client().await;
    assert_eq!(ask(&mut client, "a", "db", 100.0).await, 100.0);
    assert_eq!(ask(&mut client, "b", "db", 100.0).await, 0.0);
    // a does not refresh: within 3 s (2 s lease, whole-second expiry) its lease is gone.
    thread::sleep(Duration::from_millis(3_100));
    assert_eq!(ask(&mut client, "b", "db", 100.0).await, 100.0);
    let detail = status_json(&server, "?resource=db");
    let clients: Vec<&str> =
        detail["leases"].as_array().unwrap().iter().map(|l| l["client"].as_str().unwrap()).collect();
    assert_eq!(clients, ["b"]);
}

#[tokio::test]
async fn a_changed_file_changes_capacity_without_restart() {
    let server = Server::launch().config(&fair_share(100.0, 30, 0)).args(["--config-poll-interval", "100ms"]).start();
    let mut client = server.client().await;
    assert_eq!(ask(&mut client, "a", "db", 500.0).await, 100.0);
    server.write_config(&fair_share(300.0, 30, 0));
    eventually("the reload", async || {
        server.metric("sluice_server_config_reloads_total{result=\"success\"}") == Some(1.0)
    })
    .await;
    assert_eq!(ask(&mut client, "a", "db", 500.0).await, 300.0);
    assert_eq!(server.metric("sluice_server_capacity{resource=\"db\"}"), Some(300.0));
}

#[tokio::test]
async fn sighup_reloads_the_file() {
    // Polling effectively off: only the signal can bring the change in.
    let server = Server::launch().config(&fair_share(100.0, 30, 0)).args(["--config-poll-interval", "1h"]).start();
    let mut client = server.client().await;
    server.write_config(&fair_share(40.0, 30, 0));
    assert_eq!(ask(&mut client, "a", "db", 500.0).await, 100.0, "not reloaded before the signal");
    server.signal("HUP");
    eventually("the reload", async || {
        server.metric("sluice_server_config_reloads_total{result=\"success\"}") == Some(1.0)
    })
    .await;
    assert_eq!(ask(&mut client, "a", "db", 500.0).await, 40.0);
}

#[tokio::test]
async fn a_broken_config_is_rejected_and_the_old_one_keeps_serving() {
    let server = Server::launch().config(&fair_share(100.0, 30, 0)).args(["--config-poll-interval", "100ms"]).start();
    let mut client = server.client().await;
    let failures = || server.metric("sluice_server_config_reloads_total{result=\"failure\"}");
    // Valid YAML, invalid config: no catch-all template.
    server.write_config(&template("db", 5.0, 30, 0));
    eventually("the first rejection", async || failures() == Some(1.0)).await;
    assert_eq!(ask(&mut client, "a", "db", 500.0).await, 100.0, "the old configuration stays in force");
    let rejection =
        status_json(&server, "").pointer("/config/rejected/error").and_then(Value::as_str).map(str::to_owned);
    assert!(rejection.as_deref().is_some_and(|e| e.contains("\"*\"")), "shown on the status page: {rejection:?}");
    // Not YAML at all: written by hand, as no configuration the kit builds can be.
    server.write_raw_config("resources: [");
    eventually("the second rejection", async || failures() == Some(2.0)).await;
    assert_eq!(ask(&mut client, "a", "db", 500.0).await, 100.0);
    assert!(server.logs().contains("configuration rejected"), "the rejection is logged");
    assert_eq!(status_json(&server, "").pointer("/templates/0/capacity"), Some(&Value::from(100.0)));
    assert_eq!(
        server.metric("sluice_server_config_reloads_total{result=\"success\"}"),
        Some(0.0),
        "shown from the start"
    );
    // Fixed again: accepted.
    server.write_config(&fair_share(70.0, 30, 0));
    eventually("the fix", async || {
        server.metric("sluice_server_config_reloads_total{result=\"success\"}") == Some(1.0)
    })
    .await;
    assert_eq!(ask(&mut client, "a", "db", 500.0).await, 70.0);
    assert_eq!(status_json(&server, "").pointer("/config/rejected"), Some(&Value::Null), "cleared by the fix");
}

#[tokio::test]
async fn bad_requests_get_invalid_argument_and_change_nothing() {
    let server = Server::launch().config(&fair_share(100.0, 30, 0)).start();
    let mut client = server.client().await;
    let mut mixed = request("a", "db", 10.0, None);
    mixed.resource.push(ResourceRequest { resource_id: "other".into(), priority: 0, has: None, wants: f64::NAN, signals: None });
    let too_many = GetCapacityRequest {
        client_id: "a".into(),
        resource: (0..10_001)
            .map(|i| ResourceRequest { resource_id: format!("r{i}"), priority: 0, has: None, wants: 1.0, signals: None })
            .collect(),
    };
    let bad = [
        (request("a", "db", f64::NAN, None), "resource[0].wants"),
        (request("a", "db", f64::INFINITY, None), "resource[0].wants"),
        (request("a", "db", -1.0, None), "resource[0].wants"),
        (request("", "db", 1.0, None), "client_id"),
        (request("a", "", 1.0, None), "resource[0]"),
        (request("a", "db", 1.0, Some(f64::NAN)), "resource[0].has.capacity"),
        (mixed, "resource[1].wants"),
        (too_many, "at most 10000 resources"),
    ];
    for (req, field) in bad {
        let status = client.get_capacity(req).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(field), "{:?} should name {field}", status.message());
    }
    let server_request = |num_clients| GetServerCapacityRequest {
        server_id: "leaf".into(),
        resource: vec![ServerCapacityResourceRequest {
            resource_id: "db".into(),
            has: None,
            wants: vec![PriorityBandAggregate { priority: 1, num_clients, wants: 10.0, profile: None }],
            signals: None,
        }],
    };
    for num_clients in [0, -3] {
        let status = client.get_server_capacity(server_request(num_clients)).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("num_clients"));
    }
    let mut many_bands = server_request(1);
    // One more than the 16 a resource may claim (docs/server.md).
    many_bands.resource[0].wants =
        (0..17).map(|priority| PriorityBandAggregate { priority, num_clients: 1, wants: 1.0, profile: None }).collect();
    let status = client.get_server_capacity(many_bands).await.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("resource[0].wants: at most 16 priority bands"), "{}", status.message());
    let status = client
        .release_capacity(ReleaseCapacityRequest { client_id: String::new(), resource_id: vec!["db".into()] })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);

    assert_eq!(status_json(&server, "")["resources"], Value::Array(vec![]), "nothing reached the ledger");
    assert_eq!(
        server.metric("sluice_server_requests_total{method=\"GetCapacity\",code=\"INVALID_ARGUMENT\"}"),
        Some(8.0)
    );
    // The server is unharmed.
    assert_eq!(ask(&mut client, "a", "db", 10.0).await, 10.0);
}

#[tokio::test]
async fn resources_beyond_the_limit_are_refused_whole() {
    let server = Server::launch().config(&fair_share(100.0, 30, 0)).args(["--max-resources", "2"]).start();
    let mut client = server.client().await;
    let three = GetCapacityRequest {
        client_id: "a".into(),
        resource: ["r1", "r2", "r3"]
            .map(|id| ResourceRequest { resource_id: id.into(), priority: 0, has: None, wants: 1.0, signals: None })
            .to_vec(),
    };
    let status = client.get_capacity(three).await.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status_json(&server, "")["resources"], Value::Array(vec![]), "nothing was added");
    assert_eq!(ask(&mut client, "a", "r1", 1.0).await, 1.0);
    assert_eq!(ask(&mut client, "a", "r2", 1.0).await, 1.0);
    let status = client.get_capacity(request("a", "r3", 1.0, None)).await.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(ask(&mut client, "b", "r1", 1.0).await, 1.0, "known resources still serve");
}

#[tokio::test]
async fn past_the_lease_bound_newcomers_are_refused_while_holders_renew() {
    let server = Server::launch().config(&fair_share(100.0, 30, 0)).args(["--max-leases", "3"]).start();
    let mut client = server.client().await;
    for id in ["a", "b", "c"] {
        ask(&mut client, id, "db", 10.0).await;
    }
    let refused = client.get_capacity(request("d", "db", 10.0, None)).await.expect_err("no room");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("at most 3 leases (--max-leases)"), "{}", refused.message());
    let status = client.get_capacity(request("a", "other", 10.0, None)).await.expect_err("a new lease of a holder");
    assert_eq!(status.code(), Code::ResourceExhausted);
    for _ in 0..3 {
        assert_eq!(ask(&mut client, "a", "db", 20.0).await, 20.0, "a holder renews, its wants changed");
    }
    assert_eq!(status_json(&server, "")["leases"], 3);
    assert_eq!(server.metric("sluice_server_leases"), Some(3.0));
    assert_eq!(server.metric("sluice_server_lease_limit"), Some(3.0));
    client
        .release_capacity(ReleaseCapacityRequest { client_id: "b".into(), resource_id: vec!["db".into()] })
        .await
        .unwrap();
    assert_eq!(ask(&mut client, "d", "db", 10.0).await, 10.0, "a released lease makes room");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_request_bytes_in_flight_are_refused_at_once_and_small_ones_pass() {
    // 64 KiB: a small call counts about 24.5 KiB (docs/server.md).
    let server =
        Server::launch().config(&fair_share(100.0, 30, 0)).args(["--max-request-bytes-in-flight", "65536"]).start();
    let mut client = server.client().await;
    // 100 resources with ids of 1 KiB: about 100 KB, more than the whole budget.
    let large = GetCapacityRequest {
        client_id: "a".into(),
        resource: (0..100)
            .map(|k| ResourceRequest { resource_id: format!("r{k:0>1023}"), priority: 0, has: None, wants: 1.0, signals: None })
            .collect(),
    };
    let refused = client.get_capacity(large).await.expect_err("larger than the budget");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains(IN_FLIGHT_FLAG) && refused.message().contains("never"), "{}", refused.message());
    assert_eq!(ask(&mut client, "a", "db", 10.0).await, 10.0, "a small call passes");
    assert_eq!(status_json(&server, "")["leases"], 1, "the large request changed nothing");

    // A call whose body stops half-way holds what it sent: the next small one does not fit
    // beside it and is refused at once, not kept waiting.
    let connection = connect(server.grpc).await;
    // Stalled once the server holds it: a call of the client's still in flight when it arrived
    // may have left it no room (then it is refused, and stalled again).
    let mut stalled = stall(&connection, server.grpc, 50_000, 30_000).await;
    eventually("a call stalled with its bytes held", async || {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if stalled.answered() {
            stalled = stall(&connection, server.grpc, 50_000, 30_000).await;
            return false;
        }
        true
    })
    .await;
    let mut refused = None;
    eventually("a small call refused while the stalled one holds the budget", async || {
        let asked = Instant::now();
        let answer = client.get_capacity(request("a", "db", 10.0, None)).await;
        refused = answer.err().map(|status| (status, asked.elapsed()));
        refused.is_some()
    })
    .await;
    let (status, took) = refused.expect("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains(IN_FLIGHT_FLAG) && status.message().contains("retry"), "{}", status.message());
    assert!(took < Duration::from_secs(1), "refused after {took:?}");
    // Once the stalled call ends, its bytes are free again.
    drop(stalled);
    eventually("the stalled call's bytes given back", async || {
        client.get_capacity(request("a", "db", 10.0, None)).await.is_ok()
    })
    .await;
    let shed = server.metric("sluice_server_requests_shed_total").expect("the counter");
    assert!(shed >= 2.0, "{shed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_listener_serves_at_most_max_connections_and_takes_the_next_when_one_closes() {
    let server = Server::launch().config(&fair_share(100.0, 30, 0)).args(["--max-connections", "2"]).start();
    let mut first = server.client().await;
    let mut second = server.client().await;
    ask(&mut first, "a", "db", 1.0).await;
    ask(&mut second, "b", "db", 1.0).await;
    // A third connection waits in the kernel's backlog: its call is not answered.
    let mut third = tokio::time::timeout(Duration::from_secs(5), server.client()).await.expect("connected");
    let waiting = tokio::spawn(async move { (ask(&mut third, "c", "db", 1.0).await, third) });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "a third connection was served");
    assert_eq!(server.metric("sluice_server_grpc_connections"), Some(2.0));
    assert!(server.logs().contains("holds its most connections"), "the cap is logged:\n{}", server.logs());
    // One closes: the waiting one takes its place.
    drop(first);
    let (got, _third) =
        tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("served once one closed").unwrap();
    assert_eq!(got, 1.0);
    assert_eq!(ask(&mut second, "b", "db", 1.0).await, 1.0, "the others are still served");
    assert_eq!(server.metric("sluice_server_grpc_connections"), Some(2.0));
}

/// A connection that never sends a byte gives its place back after the first byte's timeout
/// (10 s), as a TLS handshake that stops half-way does.
#[tokio::test]
async fn a_connection_that_never_speaks_is_let_go() {
    let server = Server::launch().config(&fair_share(100.0, 30, 0)).args(["--max-connections", "1"]).start();
    let mut silent = std::net::TcpStream::connect(server.grpc).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let started = std::time::Instant::now();
    let served = tokio::spawn(async move {
        let mut client = server.client().await;
        (ask(&mut client, "a", "db", 1.0).await, server)
    });
    let closed = tokio::task::spawn_blocking(move || std::io::Read::read(&mut silent, &mut [0; 1]));
    assert!(matches!(closed.await.unwrap(), Ok(0) | Err(_)), "the silent connection is closed");
    let (got, _server) = tokio::time::timeout(Duration::from_secs(20), served).await.expect("served").unwrap();
    assert_eq!(got, 1.0);
    assert!(started.elapsed() >= Duration::from_secs(5), "served only once the silent one went");
}

#[tokio::test]
async fn a_lower_level_server_gets_capacity_for_its_bands() {
    let server = Server::launch().config(&fair_share(100.0, 30, 0)).start();
    let mut client = server.client().await;
    let response = client
        .get_server_capacity(GetServerCapacityRequest {
            server_id: "leaf-1".into(),
            resource: vec![ServerCapacityResourceRequest {
                resource_id: "db".into(),
                has: None,
                wants: vec![
                    PriorityBandAggregate { priority: 0, num_clients: 3, wants: 30.0, profile: None },
                    PriorityBandAggregate { priority: 1, num_clients: 2, wants: 20.0, profile: None },
                ],
                signals: None,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let r = &response.response[0];
    assert_eq!(r.gets.capacity, 50.0);
    let algorithm = r.algorithm.as_ref().expect("the algorithm for the leaf to apply");
    assert_eq!((algorithm.kind(), algorithm.lease_length, algorithm.refresh_interval), (Kind::FairShare, 30, 1));
    assert_eq!(r.safe_capacity, Some(20.0), "100 shared by 5 subclients");
    // An end client now competes with the leaf's five subclients: λ = 100 / 6.
    let got = client.get_capacity(request("end", "db", 100.0, None)).await.unwrap().into_inner();
    assert_eq!(got.response[0].gets.capacity, 50.0, "the leaf is satisfied with 50; the rest is free");
    assert!((got.response[0].safe_capacity.unwrap() - 100.0 / 6.0).abs() < 1e-9);
}

#[tokio::test]
async fn health_reflection_metrics_and_debug_pages() {
    let server = Server::launch().config(&fair_share(100.0, 30, 0)).start();
    let mut client = server.client().await;
    ask(&mut client, "a <b>", "orders/write", 10.0).await;

    let channel = Channel::from_shared(format!("http://{}", server.grpc)).unwrap().connect().await.unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest { service: "doorman.Capacity".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(serving.status(), tonic_health::pb::health_check_response::ServingStatus::Serving);

    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let mut reflection = ServerReflectionClient::new(channel);
    let ask_list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection.server_reflection_info(tokio_stream_once(ask_list)).await.unwrap().into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) = answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("not a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains(&"doorman.Capacity".to_owned()), "{names:?}");

    assert_eq!(server.get("/healthz").0, 200);
    assert_eq!(server.get("/readyz").0, 200);
    let (code, html) = server.get("/debug/status");
    assert_eq!(code, 200);
    assert!(html.contains("orders/write") && html.contains("FAIR_SHARE"), "{html}");
    let (code, html) = server.get("/debug/status?resource=orders%2Fwrite");
    assert_eq!(code, 200);
    assert!(html.contains("a &lt;b&gt;"), "client ids are escaped: {html}");
    assert_eq!(server.get("/debug/status?resource=nothing").0, 404);
    let status = status_json(&server, "");
    assert_eq!(status["resources"][0]["id"], "orders/write");
    assert_eq!(status["resources"][0]["has"], 10.0);
    assert_eq!(status["is_master"], true);
    let (_, metrics) = server.get("/metrics");
    for name in [
        "sluice_server_requests_total{method=\"GetCapacity\",code=\"OK\"} 1",
        "sluice_server_request_duration_seconds_bucket{method=\"GetCapacity\"",
        "sluice_server_capacity{resource=\"orders/write\"} 100",
        "sluice_server_has{resource=\"orders/write\"} 10",
        "sluice_server_wants{resource=\"orders/write\"} 10",
        "sluice_server_clients{resource=\"orders/write\"} 1",
        "sluice_server_learning_mode{resource=\"orders/write\"} 0",
        "sluice_server_is_master 1",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}:\n{metrics}");
    }
    assert_eq!(server.get("/nope").0, 404);
    // HEAD answers like GET without the body; other methods are refused, naming the allowed ones.
    let raw = |method: &str| {
        let mut stream = std::net::TcpStream::connect(server.admin).unwrap();
        write!(stream, "{method} /healthz HTTP/1.0\r\n\r\n").unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer.to_ascii_lowercase()
    };
    let head = raw("HEAD");
    assert!(head.starts_with("http/1.0 200") && head.ends_with("\r\n\r\n"), "{head:?}");
    let post = raw("POST");
    assert!(post.starts_with("http/1.0 405") && post.contains("allow: get, head"), "{post:?}");
}

fn tokio_stream_once<T: Send + 'static>(item: T) -> impl tonic::IntoStreamingRequest<Message = T> {
    tokio_stream::iter([item])
}

// Multi-threaded, so that the client's connection answers the server's goodbye while the test
// thread waits for the exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_server_cleanly_and_logs_are_json() {
    let mut server = Server::launch().args(["--log-format", "json"]).start();
    let mut client = server.client().await;
    assert_eq!(ask(&mut client, "a", "anything", 10.0).await, 0.0, "the embedded default starts in learning mode");
    // Without a file, SIGHUP has nothing to reload, and must not end the process.
    server.signal("HUP");
    eventually("the SIGHUP log line", async || server.logs().contains("SIGHUP ignored")).await;
    assert_eq!(server.get("/healthz").0, 200);
    server.signal("TERM");
    let signalled = Instant::now();
    assert_eq!(server.wait_exit(Duration::from_secs(15)), Some(0));
    assert!(signalled.elapsed() < Duration::from_secs(5), "an idle connection does not hold up the exit");
    let logs = server.logs();
    let events: Vec<Value> = logs.lines().map(|l| serde_json::from_str(l).expect("a JSON log line")).collect();
    let messages: Vec<&str> = events.iter().filter_map(|e| e["message"].as_str()).collect();
    assert!(messages.contains(&"sluice-server serving") && messages.contains(&"shutting down"), "{logs}");
    assert!(events.iter().any(|e| e["grpc"] == server.grpc.to_string()), "fields are structured: {logs}");
}

#[test]
fn bad_flags_and_configs_exit_64_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, fair_share(-5.0, 30, 0).yaml()).unwrap();
    let broken = broken.to_str().unwrap();
    let cases: [(&[&str], &str); 15] = [
        (&["--grpc-addr", "nowhere"], "invalid value 'nowhere' for '--grpc-addr"),
        (&["--no-such-flag"], "unexpected argument '--no-such-flag'"),
        (&["--config-poll-interval", "0s"], "must be greater than 0"),
        (&["--config-poll-interval", "-1s"], "must be greater than 0"),
        (&["--config-poll-interval", "1ns"], "must be at least 100ms"),
        (&["--tls-cert", broken], "required arguments were not provided: --tls-key"),
        (&["--parent", "127.0.0.1:1,nowhere"], "\"nowhere\" is not host:port"),
        (&["--advertise-address", ""], "\"\" is not host:port"),
        (&["--max-resources", "many"], "invalid value 'many' for '--max-resources"),
        (&["--max-request-bytes-in-flight", "1000"], "must be a whole number from 65536 to 1099511627776"),
        (&["--max-request-bytes-in-flight", "-1"], "must be a whole number from 65536"),
        (&["--max-connections", "0"], "must be a whole number from 1 to 1000000"),
        (&["--config", broken], "capacity: must be from 0 to 1e15, got -5"),
        (&["--config", "/nonexistent/sluice.yaml"], "--config /nonexistent/sluice.yaml"),
        (&["--tls-cert", broken, "--tls-key", broken, "--grpc-addr", "127.0.0.1:0"], "is not PEM"),
    ];
    for (args, why) in cases {
        let out = harness::run("sluice-server", args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: one line, got {stderr:?}");
        assert!(stderr.contains(why), "{args:?}: {stderr:?} should say {why:?}");
    }
    // Every flag also comes from the environment.
    let out =
        std::process::Command::new(harness::binary("sluice-server")).env("SLUICE_CONFIG", broken).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains(broken));
}

#[test]
fn an_admin_request_head_that_never_ends_is_cut_off() {
    let server = Server::launch().start();
    let mut stream = std::net::TcpStream::connect(server.admin).unwrap();
    std::io::Write::write_all(&mut stream, b"GET /metrics HTTP/1.1\r\nHost: x\r\n").unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let opened = std::time::Instant::now();
    let mut answer = Vec::new();
    let read = std::io::Read::read_to_end(&mut stream, &mut answer);
    // The timeout is 10 s; a minute (the read timeout) would mean there is none.
    assert!(opened.elapsed() < Duration::from_secs(55), "cut off after {:?}: {read:?}", opened.elapsed());
    assert!(answer.is_empty() || answer.starts_with(b"HTTP/1.1 408"), "{}", String::from_utf8_lossy(&answer));
}

/// Sends a GET on `stream` and reads the answer's head: its status line, empty if the
/// connection was closed instead.
fn get_on(stream: &mut std::net::TcpStream, path: &str) -> String {
    if write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").is_err() {
        return String::new();
    }
    let mut answer = [0; 512];
    let n = stream.read(&mut answer).unwrap_or(0);
    String::from_utf8_lossy(&answer[..n]).lines().next().unwrap_or_default().to_owned()
}

#[test]
fn the_admin_listener_holds_a_bounded_number_of_connections_and_lets_idle_ones_go() {
    let server = Server::launch().start();
    let connect = || {
        let stream = std::net::TcpStream::connect(server.admin).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        stream
    };
    let opened = Instant::now();
    let mut held: Vec<_> = (0..ADMIN_MAX_CONNECTIONS).map(|_| connect()).collect();
    for stream in &mut held {
        assert_eq!(get_on(stream, "/healthz"), "HTTP/1.1 200 OK", "kept alive");
    }
    assert_eq!(get_on(&mut connect(), "/healthz"), "", "one more is closed at once");
    held.pop();
    eventually_blocking("room for one more", || get_on(&mut connect(), "/healthz") == "HTTP/1.1 200 OK");
    // Idle, they are let go after the header timeout (10 s), freeing their places.
    let mut rest = [0; 1];
    assert_eq!(held[0].read(&mut rest).unwrap_or(0), 0, "closed by the server");
    let idle = opened.elapsed();
    assert!(idle >= ADMIN_HEADER_TIMEOUT && idle < ADMIN_HEADER_TIMEOUT * 2, "let go after {idle:?}");
}

#[test]
fn a_grpc_listener_out_of_file_descriptors_pauses_instead_of_spinning() {
    let server = Server::launch().start();
    let pid = server.pid().to_string();
    let limited = std::process::Command::new("prlimit").args(["--pid", &pid, "--nofile=64:64"]).status().unwrap();
    assert!(limited.success(), "prlimit (util-linux) lowers the server's descriptor limit");
    // More connections than descriptors: those left in the backlog make every accept fail.
    let _held: Vec<std::net::TcpStream> =
        (0..100).map(|_| std::net::TcpStream::connect(server.grpc).expect("connect")).collect();
    thread::sleep(Duration::from_millis(500));
    let cpu = || harness::cpu_seconds(server.pid()).map(|(user, system)| user + system).unwrap();
    let before = cpu();
    thread::sleep(Duration::from_secs(2));
    let used = cpu() - before;
    // A loop retrying at once burns a whole core (2 s here); one that pauses, next to nothing.
    assert!(used < 0.4, "{used:.2} s of CPU in 2 s while out of descriptors; log:\n{}", server.logs());
    assert!(server.logs().contains("accepting a gRPC connection failed"), "the failure is logged:\n{}", server.logs());
}
