//! The server tree under an elected root (SPEC §3.6–3.8), end to end: a real etcd, two root
//! replicas electing their master, two leaves with `--parent` naming both replicas, and four
//! Doorman-protocol clients. The root master is killed, then etcd is stopped.

use std::{
    collections::HashMap,
    net::SocketAddr,
    time::{Duration, Instant},
};

use sluice_proto::{DiscoveryRequest, GetCapacityRequest, Lease, ResourceRequest, capacity_client::CapacityClient};
use sluice_tests::{
    config::{Algorithm, Fallback, Listener, OnLimit, Resource, Rule, ServerConfig, SidecarConfig, Template, Upstream},
    etcd::Etcd,
    harness::{Server, Sidecar, free_port},
    http::{get, http1},
    upstream::UpstreamProcess,
    wait::eventually,
};
use tonic::transport::Channel;

/// The etcd lease TTL of the root replicas, in seconds.
const TTL: u64 = 2;
/// Seconds a lease lasts.
const LEASE: u64 = 6;
/// Seconds of learning mode after a root replica wins: the lease length (Doorman's default), so
/// that every lease the old master granted has been reported or has expired before the new one
/// hands out anything new. A shorter learning mode can overshoot: a child that reports late
/// still holds its old lease when another is granted afresh.
const LEARNING: u64 = LEASE;
const CAPACITY: f64 = 100.0;
/// What the root tells everyone to fall back on without a lease.
const SAFE: f64 = 10.0;

fn root_config() -> ServerConfig {
    let algorithm = Algorithm::fair_share(LEASE, 2).learning(LEARNING);
    ServerConfig::new().template(Template::catch_all(CAPACITY, algorithm).safe_capacity(SAFE))
}

/// Leaves are not elected; their own template only says how long their learning lasts.
fn leaf_config() -> ServerConfig {
    ServerConfig::new().template(Template::catch_all(0.0, Algorithm::fair_share(10, 2).learning(0)))
}

fn root_replica(etcd: &Etcd) -> Server {
    let grpc: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    Server::launch()
        .config(&root_config())
        .args(["--etcd-endpoints", &etcd.endpoint(), "--election-key", "/sluice/test/root"])
        .args(["--etcd-lease-ttl", &TTL.to_string()])
        .start_at(grpc)
}

fn leaf(parents: &str) -> Server {
    Server::launch()
        .config(&leaf_config())
        .args(["--parent", parents, "--server-id", &format!("leaf-{}", free_port())])
        .start()
}

async fn is_master(server: &Server) -> bool {
    match CapacityClient::connect(format!("http://{}", server.grpc)).await {
        Ok(mut c) => c.discovery(DiscoveryRequest {}).await.is_ok_and(|d| d.into_inner().is_master),
        Err(_) => false,
    }
}

/// A Doorman client of resource "r" at a leaf, reporting its lease as `has`.
struct Client {
    id: String,
    rpc: CapacityClient<Channel>,
    lease: Option<Lease>,
}

impl Client {
    async fn refresh(&mut self) -> f64 {
        let request = GetCapacityRequest {
            client_id: self.id.clone(),
            resource: vec![ResourceRequest { resource_id: "r".into(), priority: 0, has: self.lease, wants: 40.0, signals: None }],
        };
        let response = self.rpc.get_capacity(request).await.expect("a leaf always answers").into_inner();
        let gets = response.response[0].gets;
        self.lease = Some(gets);
        gets.capacity
    }
}

/// Refreshes all clients every half second for `seconds` and returns the grants after each
/// round; when `bounded`, checks after every answer that together they hold at most the root's
/// capacity plus 2%.
async fn run(clients: &mut [Client], seconds: f64, bounded: bool) -> Vec<HashMap<String, f64>> {
    let mut rounds = Vec::new();
    let mut held = HashMap::new();
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        for client in clients.iter_mut() {
            held.insert(client.id.clone(), client.refresh().await);
            let total: f64 = held.values().sum();
            assert!(!bounded || total <= CAPACITY * 1.02, "clients hold {total}: {held:?}");
        }
        rounds.push(held.clone());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    rounds
}

fn fair(round: &HashMap<String, f64>) -> bool {
    round.len() == 4 && round.values().all(|g| (g - CAPACITY / 4.0).abs() <= 0.5)
}

#[tokio::test]
async fn the_tree_survives_the_loss_of_its_root_master_and_of_etcd() {
    let mut etcd = Etcd::start();
    let replicas = [root_replica(&etcd), root_replica(&etcd)];
    let parents = replicas.iter().map(|r| r.grpc.to_string()).collect::<Vec<_>>().join(",");
    let leaves = [leaf(&parents), leaf(&parents)];
    let mut clients = Vec::new();
    for (l, leaf) in leaves.iter().enumerate() {
        for c in 0..2 {
            clients.push(Client { id: format!("leaf{l}-client{c}"), rpc: leaf.client().await, lease: None });
        }
    }

    // Learning mode at the root hands out nothing new; once it ends, the four share 100 fairly
    // and never hold more.
    run(&mut clients, LEARNING as f64 + 1.0, false).await;
    let rounds = run(&mut clients, 8.0, true).await;
    assert!(fair(rounds.last().unwrap()), "fair shares of 25: {:?}", rounds.last());

    // SIGKILL the root master: the other replica takes over within a TTL (plus slack), the
    // leaves follow it, and after its learning mode capacity is handed out again. The clients
    // never go without: the leaves keep serving on their leases meanwhile.
    let (master, other) = match (is_master(&replicas[0]).await, is_master(&replicas[1]).await) {
        (true, false) => (0, 1),
        (false, true) => (1, 0),
        roles => panic!("exactly one root master: {roles:?}"),
    };
    replicas[master].signal("KILL");
    let killed = Instant::now();
    eventually("a new root master", async || {
        if is_master(&replicas[other]).await {
            return true;
        }
        let round = run(&mut clients, 0.5, true).await;
        assert!(round.iter().all(|r| r.values().all(|g| *g > 0.0)), "clients kept capacity: {round:?}");
        false
    })
    .await;
    let took = killed.elapsed();
    println!("root failover took {took:?}");
    assert!(took < Duration::from_secs(TTL + 3), "a new root master only after {took:?}");
    let rounds = run(&mut clients, LEARNING as f64 + 8.0, true).await;
    assert!(fair(rounds.last().unwrap()), "fair shares again under the new master: {:?}", rounds.last());
    let (_, status) = replicas[other].get("/debug/status.json");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["resources"][0]["clients"], 2, "both leaves moved to the new master: {status}");

    // Stop etcd: the root master steps down at once (well within a TTL plus slack)...
    etcd.stop("KILL");
    let took = eventually("the root master steps down", async || !is_master(&replicas[other]).await).await;
    assert!(took < Duration::from_secs(TTL + 3), "the root master stepped down only after {took:?}");
    // ...the leaves keep handing out their leases until those expire...
    let on_leases = run(&mut clients, 2.0, true).await;
    assert!(fair(on_leases.last().unwrap()), "still on the last leases: {:?}", on_leases.last());
    // ...and then each client gets the root's safe capacity.
    let rounds = run(&mut clients, LEASE as f64 + 2.0, false).await;
    let last = rounds.last().unwrap();
    assert!(last.values().all(|g| (g - SAFE).abs() < 1e-9), "safe capacity after the leases expired: {last:?}");
}

#[tokio::test]
async fn a_sidecar_follows_its_servers_master_across_a_failover() {
    let etcd = Etcd::start();
    let replicas = [root_replica(&etcd), root_replica(&etcd)];
    let upstream = UpstreamProcess::start(None);
    // Pessimistic: were the sidecar ever left without a lease, nothing would pass.
    let config = SidecarConfig::proxy(Listener::app(), Upstream::app(upstream.addr()))
        .leasing_from(replicas.iter().map(|r| r.grpc))
        .resource(Resource::new("orders").when_unreachable(Fallback::Pessimistic))
        .rule(Rule::charging("orders").on_limit(OnLimit::Reject));
    let sidecar = Sidecar::launch(&config).start();
    let listen = sidecar.listen();
    let (client, url) = (http1(), format!("http://{listen}/echo"));
    let mode = || {
        let (_, body) = sidecar.get("/debug/status.json");
        let status: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
        status["resources"][0]["mode"].as_str().unwrap_or_default().to_owned()
    };
    // Learning mode at the root grants a newcomer nothing; traffic flows once it ends.
    let start = Instant::now();
    while get(&client, &url).await.status != 200 || mode() != "leased" {
        assert!(start.elapsed() < Duration::from_secs(LEARNING + 5), "never leased: {}", mode());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let master = if is_master(&replicas[0]).await { 0 } else { 1 };
    replicas[master].signal("KILL");
    // Through the failover and the new master's learning mode, the sidecar keeps its lease
    // (it reports it as `has`, which a learning master grants again) and every request passes.
    // At half the pace of before: the lease, taken at about 5 requests a second, is only some
    // 5–15% above that rate, and a learning master grants no more than the client holds, so a
    // loop that sped up meanwhile would be refused — by design (SPEC §3.4).
    let killed = Instant::now();
    while killed.elapsed() < Duration::from_secs(TTL + LEARNING + 3) {
        assert_eq!(mode(), "leased");
        assert_eq!(get(&client, &url).await.status, 200);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let (_, status) = replicas[1 - master].get("/debug/status.json");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["resources"][0]["clients"], 1, "the sidecar refreshes with the new master: {status}");
}
