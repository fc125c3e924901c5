//! The server tree end to end (SPEC §3.6–3.7): real `sluice-server` processes chained with
//! `--parent`, and Doorman-protocol clients (the generated tonic stubs) at the leaves.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use sluice_proto::{
    DiscoveryRequest, GetCapacityRequest, Lease, ReleaseCapacityRequest, ResourceRequest,
    capacity_client::CapacityClient,
};
use sluice_tests::{
    config::{Algorithm, Parameter, ServerConfig, SubtreeWants, Template},
    harness::Server,
};
use tonic::{Code, transport::Channel};

/// One catch-all template of `capacity`, shared by `algorithm`.
fn config(capacity: f64, algorithm: Algorithm) -> ServerConfig {
    ServerConfig::new().template(Template::catch_all(capacity, algorithm))
}

/// Leases of 30 s refreshed every 2 s, without learning mode.
fn fair_share() -> Algorithm {
    Algorithm::fair_share(30, 2).learning(0)
}

fn root(capacity: f64) -> Server {
    Server::launch().config(&config(capacity, fair_share())).start()
}

/// An intermediate server under `parent`. Its own template's capacity is 0: whatever it hands
/// out must come from the parent.
fn child(parent: &Server) -> Server {
    Server::launch().config(&config(0.0, fair_share())).args(["--parent", &parent.grpc.to_string()]).start()
}

/// A Doorman client of one resource "r": remembers its lease and reports it as `has`.
struct Client {
    id: String,
    priority: i64,
    wants: f64,
    rpc: CapacityClient<Channel>,
    lease: Option<Lease>,
}

impl Client {
    async fn new(id: &str, server: &Server, priority: i64, wants: f64) -> Client {
        Client { id: id.into(), priority, wants, rpc: server.client().await, lease: None }
    }

    async fn refresh(&mut self) -> f64 {
        let request = GetCapacityRequest {
            client_id: self.id.clone(),
            resource: vec![ResourceRequest {
                resource_id: "r".into(),
                priority: self.priority,
                has: self.lease,
                wants: self.wants,
                signals: None,
            }],
        };
        let response = self.rpc.get_capacity(request).await.expect("GetCapacity").into_inner();
        assert!(response.mastership.is_none(), "every server here is its own master");
        let lease = response.response[0].gets;
        let capacity = lease.capacity;
        self.lease = Some(lease);
        capacity
    }
}

/// Refreshes every client once a second (the interval leaves hand out) for `seconds`; after
/// each round, checks that the grants held together stay within 2% of `capacity`. Returns the
/// last grants.
async fn run(clients: &mut [Client], capacity: f64, seconds: u64) -> HashMap<String, f64> {
    let mut held = HashMap::new();
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        for client in clients.iter_mut() {
            let granted = client.refresh().await;
            held.insert(client.id.clone(), granted);
            let total: f64 = held.values().sum();
            assert!(total <= capacity * 1.02, "clients hold {total} of {capacity}: {held:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    held
}

#[tokio::test]
async fn three_levels_share_the_root_capacity_fairly() {
    let root = root(100.0);
    let region = child(&root);
    let leaves = [child(&region), child(&region)];
    let mut clients = Vec::new();
    for (l, leaf) in leaves.iter().enumerate() {
        for c in 0..2 {
            clients.push(Client::new(&format!("leaf{l}-client{c}"), leaf, 0, 40.0).await);
        }
    }
    let held = run(&mut clients, 100.0, 12).await;
    for (client, granted) in &held {
        assert!((granted - 25.0).abs() <= 0.5, "{client} holds {granted}, its fair share is 25: {held:?}");
    }
    // The tree is visible: the region's lease from the root, and its parent on the status page.
    let (_, status) = region.get("/debug/status.json");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["parent"]["address"], root.grpc.to_string());
    let r = &status["resources"][0];
    assert!((r["parent_lease"]["capacity"].as_f64().unwrap() - 100.0).abs() < 1e-6, "{r}");
    assert_eq!(r["parent_lease"]["refresh_interval"], 2);
    assert_eq!(region.metric("sluice_server_parent_lease_capacity{resource=\"r\"}"), Some(100.0));
    let leaf = &leaves[0];
    let (_, status) = leaf.get("/debug/status.json");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["resources"][0]["parent_lease"]["refresh_interval"], 1, "halved per level, floor 1 s");
}

#[tokio::test]
async fn strict_priority_serves_high_clients_first_through_two_levels() {
    let root = root(100.0);
    let (a, b) = (child(&root), child(&root));
    let mut clients = vec![
        Client::new("a-high", &a, 5, 40.0).await,
        Client::new("b-high", &b, 5, 30.0).await,
        Client::new("b-low-1", &b, 1, 100.0).await,
        Client::new("b-low-2", &b, 1, 100.0).await,
    ];
    let held = run(&mut clients, 100.0, 12).await;
    assert!((held["a-high"] - 40.0).abs() < 1e-6, "{held:?}");
    assert!((held["b-high"] - 30.0).abs() < 1e-6, "{held:?}");
    for low in ["b-low-1", "b-low-2"] {
        assert!((held[low] - 15.0).abs() <= 0.5, "the low band shares the 30 left: {held:?}");
    }
    // Raise the high band's demand above the capacity: the low band is squeezed to nothing.
    clients[0].wants = 60.0;
    clients[1].wants = 60.0;
    let held = run(&mut clients, 100.0, 10).await;
    assert!((held["a-high"] - 50.0).abs() <= 0.5 && (held["b-high"] - 50.0).abs() <= 0.5, "{held:?}");
    assert!(held["b-low-1"] + held["b-low-2"] < 1e-6, "{held:?}");
}

#[tokio::test]
async fn with_subtree_wants_profile_the_tree_shares_max_min_over_its_end_clients() {
    // Leaf a's clients want 5 and 95, leaf b's one client 95: max-min over the three is 5, 47.5,
    // 47.5. Counted by sums, a would stand for two clients wanting 100 and get 66.7 (61.7 of
    // it to its large client), b 33.3.
    let profile = fair_share().parameter(Parameter::SubtreeWants(SubtreeWants::Profile));
    let root = Server::launch().config(&config(100.0, profile)).start();
    let (a, b) = (child(&root), child(&root));
    let mut clients = vec![
        Client::new("a-small", &a, 0, 5.0).await,
        Client::new("a-large", &a, 0, 95.0).await,
        Client::new("b", &b, 0, 95.0).await,
    ];
    let held = run(&mut clients, 100.0, 12).await;
    assert!((held["a-small"] - 5.0).abs() < 1e-6, "{held:?}");
    for large in ["a-large", "b"] {
        assert!((held[large] - 47.5).abs() <= 0.5, "{large}: max-min gives 47.5: {held:?}");
    }
    let (_, status) = a.get("/debug/status.json");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["resources"][0]["subtree_wants"], "profile", "the root's setting travels down");
}

#[tokio::test]
async fn a_leaf_answers_doorman_clients_like_a_root() {
    let root = root(100.0);
    let leaf = child(&root);
    let mut rpc = leaf.client().await;
    let discovery = rpc.discovery(DiscoveryRequest {}).await.unwrap().into_inner();
    assert!(discovery.is_master);
    assert_eq!(discovery.mastership.master_address, Some(leaf.grpc.to_string()));
    // The same two clients against the root directly and against the leaf converge alike.
    let mut at_root = [Client::new("x", &root, 0, 60.0).await, Client::new("y", &root, 0, 80.0).await];
    let mut at_leaf = [Client::new("x", &leaf, 0, 60.0).await, Client::new("y", &leaf, 0, 80.0).await];
    let direct = run(&mut at_root, 100.0, 4).await;
    // The leaf's clients are alone under the root once the direct ones leave.
    for c in &mut at_root {
        c.rpc
            .release_capacity(ReleaseCapacityRequest { client_id: c.id.clone(), resource_id: vec!["r".into()] })
            .await
            .unwrap();
    }
    let through_leaf = run(&mut at_leaf, 100.0, 8).await;
    for id in ["x", "y"] {
        assert!((direct[id] - 50.0).abs() < 1e-6, "{direct:?}");
        assert!((through_leaf[id] - direct[id]).abs() <= 0.5, "root {direct:?}, leaf {through_leaf:?}");
    }
    // Released capacity goes back to the others, at the leaf as at the root.
    at_leaf[0]
        .rpc
        .release_capacity(ReleaseCapacityRequest { client_id: "x".into(), resource_id: vec!["r".into()] })
        .await
        .unwrap();
    let alone = run(&mut at_leaf[1..], 100.0, 6).await;
    assert!((alone["y"] - 80.0).abs() <= 0.5, "{alone:?}");
    // Bad input is refused the same way.
    let mut bad = GetCapacityRequest { client_id: "z".into(), resource: vec![] };
    bad.resource.push(ResourceRequest { resource_id: "r".into(), priority: 0, has: None, wants: f64::NAN, signals: None });
    let status = rpc.get_capacity(bad).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
}
