//! Master election on etcd (SPEC §3.8), end to end: a real etcd, real `sluice-server` replicas,
//! real sockets. The lease TTL is short so that failovers take seconds.

use std::{
    net::SocketAddr,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use sluice_proto::{
    DiscoveryRequest, GetCapacityRequest, GetServerCapacityRequest, Lease, Mastership, PriorityBandAggregate,
    ReleaseCapacityRequest, ResourceRequest, ServerCapacityResourceRequest,
};
use sluice_tests::{
    config::{Algorithm, ServerConfig, Template},
    etcd::Etcd,
    harness::{self, Server, free_port},
    wait::eventually,
};
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

/// The etcd lease TTL the replicas run with, in seconds.
const TTL: u64 = 2;

/// Slack on top of a TTL for etcd to notice an expired lease (it checks twice a second), for the
/// replicas to hear of it, and for a busy test machine.
const SLACK: Duration = Duration::from_secs(3);

/// Learning lasts far longer than any test, so every grant below is a learning-mode grant.
fn config() -> ServerConfig {
    ServerConfig::new().template(Template::catch_all(100.0, Algorithm::fair_share(30, 1).learning(300)))
}

/// A replica on a free port that advertises `localhost:<port>`, a name distinct from its listen
/// address, so that the tests see the advertise address travel through etcd.
fn replica(etcd: &Etcd, key: &str) -> (Server, String) {
    let grpc: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let advertised = format!("localhost:{}", grpc.port());
    let server = Server::launch()
        .config(&config())
        .args(["--etcd-endpoints", &etcd.endpoint(), "--election-key", key])
        .args(["--etcd-lease-ttl", &TTL.to_string(), "--advertise-address", &advertised])
        .start_at(grpc);
    (server, advertised)
}

async fn discovery(server: &Server) -> (bool, Option<String>) {
    let answer = server.client().await.discovery(DiscoveryRequest {}).await.expect("Discovery").into_inner();
    (answer.is_master, answer.mastership.master_address)
}

/// What the gRPC health service says of `doorman.Capacity`.
async fn health(server: &Server) -> ServingStatus {
    let channel = Channel::from_shared(format!("http://{}", server.grpc)).unwrap().connect().await.unwrap();
    let check = HealthCheckRequest { service: "doorman.Capacity".into() };
    HealthClient::new(channel).check(check).await.expect("health check").into_inner().status()
}

fn request(client: &str, wants: f64, has: Option<f64>) -> GetCapacityRequest {
    GetCapacityRequest {
        client_id: client.into(),
        resource: vec![ResourceRequest {
            resource_id: "db".into(),
            priority: 0,
            has: has.map(|capacity| Lease { expiry_time: 0, refresh_interval: 0, capacity }),
            wants,
            signals: None,
        }],
    }
}

fn status(server: &Server) -> Value {
    let (code, body) = server.get("/debug/status.json");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status JSON")
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

#[tokio::test]
async fn one_master_and_followers_redirect_to_it() {
    let etcd = Etcd::start();
    let (a, a_address) = replica(&etcd, "/sluice/test/redirect");
    let (b, _) = replica(&etcd, "/sluice/test/redirect");

    assert_eq!(discovery(&a).await, (true, Some(a_address.clone())), "the first replica up wins");
    assert_eq!(discovery(&b).await, (false, Some(a_address.clone())), "the other names the master");

    let redirect = Some(Mastership { master_address: Some(a_address.clone()) });
    let mut follower = b.client().await;
    let answer = follower.get_capacity(request("c", 10.0, Some(10.0))).await.unwrap().into_inner();
    assert!(answer.response.is_empty(), "a follower grants nothing: {answer:?}");
    assert_eq!(answer.mastership, redirect);
    let answer = follower
        .get_server_capacity(GetServerCapacityRequest {
            server_id: "leaf".into(),
            resource: vec![ServerCapacityResourceRequest {
                resource_id: "db".into(),
                has: None,
                wants: vec![PriorityBandAggregate { priority: 0, num_clients: 1, wants: 10.0, profile: None }],
                signals: None,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.response.is_empty());
    assert_eq!(answer.mastership, redirect);
    let answer = follower
        .release_capacity(ReleaseCapacityRequest { client_id: "c".into(), resource_id: vec!["db".into()] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.mastership, redirect);

    let answer = a.client().await.get_capacity(request("c", 10.0, Some(10.0))).await.unwrap().into_inner();
    assert_eq!(answer.mastership, None, "the master answers itself");
    assert_eq!(answer.response[0].gets.capacity, 10.0, "learning: what the client holds");

    let (a_status, b_status) = (status(&a), status(&b));
    assert_eq!(a_status["election"]["mode"], "etcd");
    assert_eq!(a_status["election"]["key"], "/sluice/test/redirect");
    assert_eq!(a_status["election"]["role"], "master");
    assert_eq!(b_status["election"]["role"], "follower");
    assert_eq!(b_status["master_address"], a_address.as_str());
    assert_eq!(b_status["resources"], Value::Array(vec![]), "a follower keeps no state");
    let (_, page) = b.get("/debug/status");
    assert!(page.contains("role: <b>follower</b>") && page.contains(&format!("master: {a_address}")), "{page}");
    assert_eq!(a.metric("sluice_server_is_master"), Some(1.0));
    assert_eq!(b.metric("sluice_server_is_master"), Some(0.0));
    assert_eq!(a.metric("sluice_server_elections_total{result=\"won\"}"), Some(1.0));
    assert_eq!(b.get("/readyz").0, 200, "a follower that names the master is ready");
}

#[tokio::test]
async fn a_replica_takes_over_a_killed_master_within_a_ttl_and_starts_learning() {
    let etcd = Etcd::start();
    let (mut a, _) = replica(&etcd, "/sluice/test/failover");
    let (b, b_address) = replica(&etcd, "/sluice/test/failover");
    assert!(discovery(&a).await.0);
    let killed_at = unix_now();
    a.signal("KILL");
    a.wait_exit(Duration::from_secs(5));

    let took =
        eventually("the follower becomes master", async || discovery(&b).await == (true, Some(b_address.clone())))
            .await;
    println!("failover after SIGKILL took {took:?}");
    assert!(took < Duration::from_secs(TTL) + SLACK, "{took:?}: not within a TTL and slack");
    let s = status(&b);
    assert_eq!(s["election"]["role"], "master");
    assert!(s["serving_since"].as_i64().unwrap() >= killed_at, "a fresh ledger from the win: {s}");
    assert_eq!(s["resources"], Value::Array(vec![]), "the new master starts empty");

    // Learning mode (SPEC §3.4): clients get back what they report holding, newcomers nothing.
    let mut client = b.client().await;
    let got = |answer: sluice_proto::GetCapacityResponse| answer.response[0].gets.capacity;
    assert_eq!(got(client.get_capacity(request("x", 80.0, Some(40.0))).await.unwrap().into_inner()), 40.0);
    assert_eq!(got(client.get_capacity(request("y", 80.0, Some(50.0))).await.unwrap().into_inner()), 50.0);
    assert_eq!(got(client.get_capacity(request("z", 50.0, None)).await.unwrap().into_inner()), 0.0);
    assert_eq!(status(&b)["resources"][0]["learning"], true);
    assert_eq!(b.metric("sluice_server_elections_total{result=\"won\"}"), Some(1.0));
}

#[tokio::test]
async fn sigterm_resigns_so_a_replica_takes_over_at_once() {
    let etcd = Etcd::start();
    let (mut a, _) = replica(&etcd, "/sluice/test/resign");
    let (b, b_address) = replica(&etcd, "/sluice/test/resign");
    a.signal("TERM");
    // Far less than the TTL: nobody waits for a lease to expire.
    let took =
        eventually("the follower becomes master", async || discovery(&b).await == (true, Some(b_address.clone())))
            .await;
    println!("takeover after SIGTERM took {took:?}");
    assert!(took < Duration::from_millis(1500), "{took:?}: not at once");
    assert_eq!(a.wait_exit(Duration::from_secs(15)), Some(0), "log:\n{}", a.logs());
}

#[tokio::test]
async fn the_master_steps_down_when_etcd_stops_and_a_master_returns_with_it() {
    let mut etcd = Etcd::start();
    let (a, a_address) = replica(&etcd, "/sluice/test/outage");
    let (b, _) = replica(&etcd, "/sluice/test/outage");
    etcd.stop("KILL");

    let took = eventually("the master steps down", async || discovery(&a).await == (false, None)).await;
    println!("step-down after etcd died took {took:?}");
    assert!(took < Duration::from_secs(TTL + 1), "{took:?}: not within a TTL");
    assert_eq!(a.metric("sluice_server_is_master"), Some(0.0));
    assert_eq!(a.metric("sluice_server_elections_total{result=\"lost\"}"), Some(1.0));
    let took = eventually("the follower forgets the master", async || discovery(&b).await == (false, None)).await;
    assert!(took < Duration::from_secs(1), "the follower forgot the master after {took:?}");
    assert_eq!(a.get("/readyz").0, 503, "no master to serve or name");
    let took = eventually("gRPC health agrees", async || health(&a).await == ServingStatus::NotServing).await;
    assert!(took < Duration::from_secs(1), "gRPC health agreed after {took:?}");
    let answer = a.client().await.get_capacity(request("c", 10.0, Some(10.0))).await.unwrap().into_inner();
    assert!(answer.response.is_empty());
    assert_eq!(answer.mastership, Some(Mastership { master_address: None }), "master unknown: retry");

    etcd.restart();
    let took = eventually("a master is elected again", async || {
        let (a_master, a_names) = discovery(&a).await;
        let (b_master, b_names) = discovery(&b).await;
        a_master != b_master && a_names.is_some() && a_names == b_names
    })
    .await;
    println!("re-election after etcd restarted took {took:?}");
    assert!(took < Duration::from_secs(TTL) + 2 * SLACK, "{took:?}: not within a TTL and slack");
    let (_, master) = discovery(&a).await;
    println!("master now {master:?} (was {a_address})");
    let took = eventually("serving again", async || health(&a).await == ServingStatus::Serving).await;
    assert!(took < Duration::from_secs(1), "serving again after {took:?}");
}

#[tokio::test]
async fn the_master_steps_down_within_a_ttl_when_etcd_stops_answering() {
    let etcd = Etcd::start();
    let (a, _) = replica(&etcd, "/sluice/test/frozen");
    // Frozen, etcd keeps its connections open: only the keep-alive deadline can tell.
    etcd.signal("STOP");
    let took = eventually("the master steps down", async || !discovery(&a).await.0).await;
    println!("step-down after etcd froze took {took:?}");
    assert!(took < Duration::from_secs(TTL + 1), "{took:?}: not within a TTL");
    assert_eq!(a.metric("sluice_server_is_master"), Some(0.0));

    etcd.signal("CONT");
    let took = eventually("the replica is master again", async || discovery(&a).await.0).await;
    assert!(took < Duration::from_secs(TTL) + 2 * SLACK, "master again after {took:?}");
}

#[test]
fn bad_election_flags_exit_64_with_one_line() {
    for args in [
        &["--etcd-endpoints", "ftp://127.0.0.1:2379"][..],
        &["--etcd-endpoints", "http://127.0.0.1:2379,https://127.0.0.1:2379"],
        &["--election-key", "/sluice/x"],
        &["--etcd-endpoints", "http://127.0.0.1:2379", "--etcd-lease-ttl", "0"],
        &["--etcd-endpoints", "http://127.0.0.1:2379", "--election-key", ""],
    ] {
        let output = harness::run("sluice-server", args);
        assert_eq!(output.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
}
