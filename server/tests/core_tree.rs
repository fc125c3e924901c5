//! The server tree on the sans-I/O core (SPEC §3.6–3.7), on a fake clock: an intermediate
//! ledger's requests aggregate its clients per band, its grants are capped by its own lease,
//! refresh intervals decay per level, and a root and its children hand out no more than the
//! root's capacity. Messages go through the same functions the gRPC service uses.

use std::sync::Arc;

use sluice_client::Answer;
use sluice_proto::{
    GetCapacityRequest, GetServerCapacityResponse, Mastership, PriorityBandAggregate, ReleaseCapacityRequest,
    ResourceRequest,
};
use sluice_server::{
    core::{Algorithm, Kind, Ledger, Parameter, Repository, Template, UnixSeconds},
    service, status,
};

const MAX_RESOURCES: usize = 1_000;

fn repository(capacity: f64, safe_capacity: Option<f64>, mode: &str) -> Arc<Repository> {
    repository_with(capacity, safe_capacity, &[("priority_mode", mode)])
}

fn repository_with(capacity: f64, safe_capacity: Option<f64>, parameters: &[(&str, &str)]) -> Arc<Repository> {
    let template = Template {
        identifier_glob: "*".into(),
        capacity,
        adaptive: None,
        safe_capacity,
        description: None,
        algorithm: Algorithm {
            kind: Kind::FairShare,
            lease_length: 60,
            refresh_interval: 8,
            parameters: parameters
                .iter()
                .map(|&(name, value)| Parameter { name: name.into(), value: Some(value.into()) })
                .collect(),
            learning_mode_duration: Some(0),
        },
    };
    Arc::new(Repository::new(vec![template]).unwrap())
}

fn root(capacity: f64) -> Ledger {
    Ledger::new(repository(capacity, None, "strict"), 0)
}

/// An intermediate server; its own configuration says capacity 0 (it must come from the parent).
fn intermediate(name: &str) -> Ledger {
    Ledger::new(repository(0.0, None, "strict"), 0).with_parent(name.into(), 1)
}

/// An end client's GetCapacity for resource "r"; returns (capacity, expiry, refresh interval).
fn ask(ledger: &mut Ledger, now: UnixSeconds, client: &str, priority: i64, wants: f64) -> (f64, i64, i64) {
    let req = GetCapacityRequest {
        client_id: client.into(),
        resource: vec![ResourceRequest { resource_id: "r".into(), priority, has: None, wants, signals: None }],
    };
    let gets = service::get_capacity(ledger, now, &req, None, MAX_RESOURCES).unwrap().response.remove(0).gets;
    (gets.capacity, gets.expiry_time, gets.refresh_interval)
}

/// One round trip from `child` to `parent` at `now`.
fn refresh(child: &mut Ledger, parent: &mut Ledger, now: UnixSeconds) -> GetServerCapacityResponse {
    let request = child.parent_request(now as f64).expect("a request is due");
    let response = service::get_server_capacity(parent, now, &request, None, MAX_RESOURCES).unwrap();
    assert_eq!(child.on_parent_response(now as f64, response.clone()), Answer::Updated);
    response
}

/// A root of 100 and a leaf whose one client wants 10, after the leaf's first round trip at 0.
fn leased_leaf() -> (Ledger, Ledger) {
    let mut root = root(100.0);
    let mut leaf = intermediate("leaf");
    ask(&mut leaf, 0, "a", 0, 10.0);
    refresh(&mut leaf, &mut root, 0);
    (root, leaf)
}

fn granted_to_children(ledger: &Ledger) -> f64 {
    ledger.resource("r").map_or(0.0, |r| r.bands().sums().has)
}

#[test]
fn requests_aggregate_clients_per_band_and_new_resources_are_asked_at_once() {
    let mut leaf = intermediate("leaf");
    assert_eq!(leaf.parent_due(), None, "nothing to ask for yet");
    ask(&mut leaf, 100, "a", 2, 10.0);
    assert_eq!(leaf.parent_due(), Some(f64::NEG_INFINITY), "a new resource is asked for at once");
    ask(&mut leaf, 100, "b", 2, 5.0);
    ask(&mut leaf, 100, "c", 0, 7.0);
    let request = leaf.parent_request(100.0).unwrap();
    assert_eq!(request.server_id, "leaf");
    assert_eq!(leaf.parent_due(), None, "in flight");
    assert!(leaf.parent_request(100.0).is_none(), "one request at a time");
    let r = &request.resource[0];
    assert_eq!(r.resource_id, "r");
    assert_eq!(r.has.as_ref().map(|h| h.capacity), Some(0.0), "no lease yet: what its clients hold");
    let band = |priority, num_clients, wants| PriorityBandAggregate { priority, num_clients, wants, profile: None };
    assert_eq!(r.wants, [band(2, 2, 15.0), band(0, 1, 7.0)], "most important band first");
}

#[test]
fn child_leases_are_capped_by_the_own_lease_and_refresh_decays_per_level() {
    let mut root = root(100.0);
    let mut region = intermediate("region");
    let mut leaf = intermediate("leaf");
    // Demand flows down first: the leaf's client, the leaf at the region, the region at the root.
    ask(&mut leaf, 0, "client", 0, 30.0);
    let leaf_request = leaf.parent_request(0.0).unwrap();
    service::get_server_capacity(&mut region, 0, &leaf_request, None, MAX_RESOURCES).unwrap();
    leaf.on_parent_error(0.0, false);
    let to_root = refresh(&mut region, &mut root, 0);
    let root_lease = &to_root.response[0].gets;
    assert_eq!((root_lease.capacity, root_lease.expiry_time, root_lease.refresh_interval), (30.0, 60, 8));
    // The region received its lease at 0 (expiring at 60); at 10 it hands out leases that end
    // with its own and refresh twice as often.
    let to_leaf = refresh(&mut leaf, &mut region, 10);
    let region_lease = &to_leaf.response[0].gets;
    assert_eq!((region_lease.capacity, region_lease.expiry_time, region_lease.refresh_interval), (30.0, 60, 4));
    assert_eq!(
        to_leaf.response[0].algorithm.as_ref().map(|a| a.kind),
        Some(sluice_proto::algorithm::Kind::FairShare as i32),
        "the root's algorithm travels down"
    );
    // One level further: refresh 2, still capped by the region's lease.
    assert_eq!(ask(&mut leaf, 20, "client", 0, 30.0), (30.0, 60, 2));
    // The floor is one second.
    let mut deep = intermediate("deep");
    ask(&mut deep, 20, "x", 0, 1.0);
    refresh(&mut deep, &mut leaf, 20);
    let mut deeper = intermediate("deeper");
    ask(&mut deeper, 20, "y", 0, 1.0);
    refresh(&mut deeper, &mut deep, 20);
    assert_eq!(ask(&mut deeper, 20, "y", 0, 1.0).2, 1);
}

#[test]
fn without_a_valid_own_lease_a_server_hands_out_safe_capacity() {
    let mut root = Ledger::new(repository(100.0, Some(4.0), "strict"), 0);
    let mut leaf = intermediate("leaf");
    // Before the parent answers: the leaf's own template (no safe capacity: capacity 0 over its
    // clients) applies.
    assert_eq!(ask(&mut leaf, 0, "a", 0, 10.0).0, 0.0);
    refresh(&mut leaf, &mut root, 0);
    assert_eq!(ask(&mut leaf, 1, "a", 0, 10.0).0, 10.0);
    // The lease from the root expires at 60 and the root is gone: from then on each client gets
    // at most the root's safe capacity of 4.
    leaf.parent_request(50.0).unwrap();
    leaf.on_parent_error(50.0, false);
    assert_eq!(ask(&mut leaf, 59, "a", 0, 10.0).0, 10.0, "the lease still holds");
    // The sweep forgets the clients' expired leases, but not the parent's safe capacity.
    leaf.expire(60, usize::MAX);
    let (capacity, expiry, _) = ask(&mut leaf, 60, "a", 0, 10.0);
    assert_eq!((capacity, expiry), (4.0, 120));
}

#[test]
fn a_failed_request_tries_the_next_address_then_backs_off_but_retries_before_the_own_lease_expires() {
    let (_, mut leaf) = leased_leaf();
    assert_eq!(leaf.parent_due(), Some(8.0), "the next refresh after the root's interval");
    leaf.parent_request(8.0).unwrap();
    leaf.on_parent_error(8.0, true);
    assert_eq!(leaf.parent_due(), Some(f64::NEG_INFINITY), "another of the parent's addresses at once");
    leaf.parent_request(8.0).unwrap();
    leaf.on_parent_error(8.0, false);
    let due = leaf.parent_due().unwrap();
    assert!((8.5..=9.0).contains(&due), "first retry after half to one backoff base: {due}");
    let mut retries = Vec::new();
    while let Some(due) = leaf.parent_due().filter(|&due| due < 60.0) {
        retries.push(due);
        leaf.parent_request(due).unwrap();
        leaf.on_parent_error(due, false);
    }
    assert!(retries.windows(2).all(|w| w[0] < w[1]));
    // Backing off from 1 s, capped at 10 s, it still retries in the last 2 s of the lease.
    assert!(retries.iter().any(|&t| (58.0..60.0).contains(&t)), "retries: {retries:?}");
}

/// What a replica that is not the master answers a GetServerCapacity with.
fn not_master(master: Option<&str>) -> GetServerCapacityResponse {
    GetServerCapacityResponse {
        response: vec![],
        mastership: Some(Mastership { master_address: master.map(str::to_string) }),
    }
}

#[test]
fn a_redirect_leaves_the_lease_alone_and_asks_a_named_master_at_once_but_not_twice_in_a_row() {
    let (mut root, mut leaf) = leased_leaf();
    let lease = |leaf: &Ledger| leaf.resource("r").and_then(|r| r.parent_lease(8)).map(|l| (l.capacity, l.expiry));
    let before = lease(&leaf);
    assert_eq!(before, Some((10.0, 60)));

    leaf.parent_request(8.0).unwrap();
    assert_eq!(
        leaf.on_parent_response(8.0, not_master(Some("root-1:8081"))),
        Answer::Redirect(Some("root-1:8081".into()))
    );
    assert_eq!(lease(&leaf), before, "a redirect carries no lease");
    assert_eq!(leaf.parent_due(), Some(f64::NEG_INFINITY), "the named master at once");
    // Replicas naming each other: the second redirect in a row backs off.
    leaf.parent_request(8.0).unwrap();
    leaf.on_parent_response(8.0, not_master(Some("root-0:8081")));
    assert!(leaf.parent_due().unwrap() > 8.0);
    // The master answers; then a replica that knows no master: Discovery again, after a backoff.
    refresh(&mut leaf, &mut root, 9);
    leaf.parent_request(17.0).unwrap();
    assert_eq!(leaf.on_parent_response(17.0, not_master(None)), Answer::Redirect(None));
    assert!(leaf.parent_due().unwrap() > 17.0);
    assert_eq!(lease(&leaf).map(|(capacity, _)| capacity), Some(10.0));
}

#[test]
fn a_two_level_tree_never_hands_out_more_than_the_root_capacity() {
    for subtree_wants in ["sum", "profile"] {
        never_more_than_the_root_capacity(subtree_wants);
    }
}

fn never_more_than_the_root_capacity(subtree_wants: &str) {
    // Two leaves, each with clients at two priorities, under a root of capacity 100, refreshed
    // in turns for a few minutes of fake time with changing demand.
    let mut root = Ledger::new(repository_with(100.0, None, &[("subtree_wants", subtree_wants)]), 0);
    let mut leaves = [intermediate("leaf-0"), intermediate("leaf-1")];
    let mut rng = fastrand::Rng::with_seed(5);
    for now in 0..300 {
        for (l, leaf) in leaves.iter_mut().enumerate() {
            for c in 0..4 {
                let priority = i64::from(c % 2 == 0);
                ask(leaf, now, &format!("{l}-{c}"), priority, rng.f64() * 40.0);
            }
            if leaf.parent_due().is_some_and(|due| due <= now as f64) {
                refresh(leaf, &mut root, now);
            }
            root.expire(now, usize::MAX);
        }
        let reserved = granted_to_children(&root);
        assert!(reserved <= 100.0 + 1e-9, "{subtree_wants}, {now}: the root reserved {reserved}");
        // What the end clients hold: never more than the root's capacity, even while a leaf's
        // lease shrinks and its clients have not all refreshed yet.
        let held: f64 = leaves.iter().map(granted_to_children).sum();
        assert!(held <= 100.0 + 1e-9, "{subtree_wants}, {now}: clients hold {held}");
    }
}

#[test]
fn strict_priority_through_two_levels_serves_the_high_band_first() {
    // Capacity 100. Leaf A has high-priority clients wanting 70 in all; leaf B has a high client
    // wanting 20 and low clients wanting 200. The high band (90) is served in full; the low
    // band gets the remaining 10.
    let mut root = root(100.0);
    let mut a = intermediate("a");
    let mut b = intermediate("b");
    for round in 0..4 {
        let now = round * 10;
        ask(&mut a, now, "a-high-1", 5, 40.0);
        ask(&mut a, now, "a-high-2", 5, 30.0);
        ask(&mut b, now, "b-high", 5, 20.0);
        ask(&mut b, now, "b-low-1", 1, 100.0);
        ask(&mut b, now, "b-low-2", 1, 100.0);
        refresh(&mut a, &mut root, now);
        refresh(&mut b, &mut root, now);
    }
    let now = 40;
    assert_eq!(ask(&mut a, now, "a-high-1", 5, 40.0).0, 40.0);
    assert_eq!(ask(&mut a, now, "a-high-2", 5, 30.0).0, 30.0);
    assert_eq!(ask(&mut b, now, "b-high", 5, 20.0).0, 20.0);
    let low = ask(&mut b, now, "b-low-1", 1, 100.0).0 + ask(&mut b, now, "b-low-2", 1, 100.0).0;
    assert!((low - 10.0).abs() < 1e-9, "the low band shares what is left: {low}");
}

/// What end clients get from a root of 100 over two leaves once settled: leaf A's clients want
/// 5 and 95, leaf B's one client 95; the root's template says `subtree_wants`.
fn settled_tree(subtree_wants: &str) -> [f64; 3] {
    let mut root = Ledger::new(repository_with(100.0, None, &[("subtree_wants", subtree_wants)]), 0);
    let (mut a, mut b) = (intermediate("a"), intermediate("b"));
    let mut got = [0.0; 3];
    for round in 0..5 {
        let now = round * 10;
        got = [
            ask(&mut a, now, "a-small", 0, 5.0).0,
            ask(&mut a, now, "a-large", 0, 95.0).0,
            ask(&mut b, now, "b", 0, 95.0).0,
        ];
        refresh(&mut a, &mut root, now);
        refresh(&mut b, &mut root, now);
    }
    got
}

#[test]
fn with_subtree_wants_profile_a_tree_shares_max_min_over_its_end_clients() {
    // Max-min over 5, 95, 95 with 100: 5, 47.5, 47.5.
    assert_eq!(settled_tree("profile"), [5.0, 47.5, 47.5]);
    // Doorman's sums: leaf A counts as two clients wanting 100, B as one wanting 95; the level
    // is 100/3, so A gets 66.67 and its large client 61.67, against B's 33.33.
    let [small, large, b] = settled_tree("sum");
    assert_eq!(small, 5.0);
    assert!((large - 185.0 / 3.0).abs() < 1e-9 && (b - 100.0 / 3.0).abs() < 1e-9, "{large} {b}");
}

#[test]
fn a_child_sends_its_profile_once_its_parent_names_subtree_wants_profile() {
    let mut root = Ledger::new(repository_with(100.0, None, &[("subtree_wants", "profile")]), 0);
    let mut leaf = intermediate("leaf");
    for (client, wants) in [("x", 5.0), ("y", 95.0), ("z", 95.0)] {
        ask(&mut leaf, 0, client, 0, wants);
    }
    // Before the parent's first answer the leaf's own template (sum) is in force.
    let profile = |request: &sluice_proto::GetServerCapacityRequest| request.resource[0].wants[0].profile.clone();
    let first = leaf.parent_request(0.0).unwrap();
    assert_eq!((first.resource[0].wants[0].num_clients, profile(&first)), (3, None));
    let response = service::get_server_capacity(&mut root, 0, &first, None, MAX_RESOURCES).unwrap();
    leaf.on_parent_response(0.0, response);
    leaf.retry_parent();
    let next = leaf.parent_request(1.0).unwrap();
    let groups: Vec<(i64, f64)> =
        profile(&next).expect("a profile").group.iter().map(|g| (g.num_clients, g.wants)).collect();
    assert_eq!(groups, [(1, 5.0), (2, 190.0)], "by level, equal levels together");
    assert_eq!((next.resource[0].wants[0].num_clients, next.resource[0].wants[0].wants), (3, 195.0));
}

/// Held at the root for a leaf: what its lease keeps reserved there.
fn reserved_for(root: &Ledger, leaf: &str) -> f64 {
    root.resource("r").and_then(|r| r.leases().get(leaf)).map_or(0.0, |l| l.demand.has)
}

/// A leaf whose clients a and b want `wants` each, leased by `root` at 0 and granted it at 1.
fn leaf_of_two(root: &mut Ledger, wants: f64) -> Ledger {
    let mut leaf = intermediate("leaf");
    ask(&mut leaf, 0, "a", 0, wants);
    ask(&mut leaf, 0, "b", 0, wants);
    refresh(&mut leaf, root, 0);
    assert_eq!((ask(&mut leaf, 1, "a", 0, wants).0, ask(&mut leaf, 1, "b", 0, wants).0), (wants, wants));
    leaf
}

#[test]
fn a_cut_lease_cuts_each_client_to_its_due_and_the_parent_reserves_the_rest_until_it_is_given_back() {
    let mut root = root(100.0);
    let mut leaf = leaf_of_two(&mut root, 50.0);
    // Another leaf's two clients come: their fair half is still held by the first leaf's.
    let mut other = intermediate("other");
    ask(&mut other, 2, "c", 0, 50.0);
    ask(&mut other, 2, "d", 0, 50.0);
    assert_eq!(refresh(&mut other, &mut root, 2).response[0].gets.capacity, 0.0);
    // The first leaf's lease is cut to 50; the root keeps reserving the 100 its clients hold.
    assert_eq!(refresh(&mut leaf, &mut root, 3).response[0].gets.capacity, 50.0);
    assert_eq!(reserved_for(&root, "leaf"), 100.0);
    // Each client is cut to its due (25) as it asks — the first is not squeezed to 0 to make
    // room that b still holds — so the leaf holds more than its lease until b has asked too.
    assert_eq!(ask(&mut leaf, 4, "a", 0, 50.0).0, 25.0);
    assert_eq!(granted_to_children(&leaf), 75.0);
    assert_eq!(ask(&mut leaf, 5, "b", 0, 50.0).0, 25.0);
    assert_eq!(granted_to_children(&leaf), 50.0);
    // Given back at the leaf's next report, and only then the other leaf's.
    assert_eq!(refresh(&mut other, &mut root, 5).response[0].gets.capacity, 0.0, "still reserved for the leaf");
    refresh(&mut leaf, &mut root, 6);
    assert_eq!(reserved_for(&root, "leaf"), 50.0);
    assert_eq!(refresh(&mut other, &mut root, 7).response[0].gets.capacity, 50.0);
}

#[test]
fn a_root_whose_capacity_is_lowered_cuts_each_client_to_its_due_and_never_grows_its_total() {
    let mut root = root(100.0);
    assert_eq!((ask(&mut root, 0, "a", 0, 50.0).0, ask(&mut root, 0, "b", 0, 50.0).0), (50.0, 50.0));
    root.set_repository(repository(50.0, None, "strict"));
    // a is cut to its due, not to the nothing that b's 50 leaves free; the total only falls.
    assert_eq!(ask(&mut root, 1, "a", 0, 50.0).0, 25.0);
    assert_eq!(granted_to_children(&root), 75.0);
    assert_eq!(ask(&mut root, 2, "b", 0, 50.0).0, 25.0);
    assert_eq!(granted_to_children(&root), 50.0);
    // Once the leases fit, a newcomer waits for room as before.
    assert_eq!(ask(&mut root, 3, "c", 0, 50.0).0, 0.0);
}

#[test]
fn a_new_intermediate_master_keeps_its_lease_at_the_parent_while_it_learns() {
    let mut root = root(100.0);
    leaf_of_two(&mut root, 40.0);
    let mut other = intermediate("other");
    ask(&mut other, 1, "c", 0, 100.0);
    assert_eq!(refresh(&mut other, &mut root, 1).response[0].gets.capacity, 20.0);

    // The leaf's master dies; its replica (same server id) starts empty and learns for a lease
    // length. Client a comes back first, reporting the 40 it holds.
    let learning = Template {
        algorithm: Algorithm { learning_mode_duration: Some(60), ..root.repository().find("r").algorithm.clone() },
        capacity: 0.0,
        adaptive: None,
        ..(**root.repository().find("r")).clone()
    };
    let mut replica = Ledger::new(Arc::new(Repository::new(vec![learning]).unwrap()), 5).with_parent("leaf".into(), 2);
    let req = GetCapacityRequest {
        client_id: "a".into(),
        resource: vec![ResourceRequest {
            resource_id: "r".into(),
            priority: 0,
            has: Some(sluice_proto::Lease { expiry_time: 60, refresh_interval: 4, capacity: 40.0 }),
            wants: 40.0,
            signals: None,
        }],
    };
    let gets = service::get_capacity(&mut replica, 6, &req, None, MAX_RESOURCES).unwrap().response.remove(0).gets;
    assert_eq!(gets.capacity, 40.0, "before any lease, a learning master grants what the client holds");
    // Its request carries no `has`: it does not know yet what b holds. The root keeps the
    // whole lease for it rather than the 40 it has heard of, and grants it that.
    let request = replica.parent_request(6.0).unwrap();
    assert_eq!(request.resource[0].has, None);
    let response = service::get_server_capacity(&mut root, 6, &request, None, MAX_RESOURCES).unwrap();
    assert_eq!(response.response[0].gets.capacity, 80.0);
    assert_eq!(reserved_for(&root, "leaf"), 80.0);
    replica.on_parent_response(6.0, response);
    assert_eq!(ask(&mut other, 7, "c", 0, 100.0).0, 20.0);
    assert_eq!(refresh(&mut other, &mut root, 7).response[0].gets.capacity, 20.0, "nothing freed for others");
    // b comes back too and is granted its 40 under the new master's lease, which runs past the
    // last lease the old master reported under (expiring at 60). Still learning at 64, the
    // replica says nothing yet of what its clients hold, so the root still keeps the 80.
    let b = GetCapacityRequest { client_id: "b".into(), ..req };
    assert_eq!(
        service::get_capacity(&mut replica, 30, &b, None, MAX_RESOURCES).unwrap().response[0].gets.capacity,
        40.0
    );
    assert!(refresh(&mut replica, &mut root, 64).response[0].gets.expiry_time > 64);
    assert_eq!(reserved_for(&root, "leaf"), 80.0);
    assert_eq!(refresh(&mut other, &mut root, 64).response[0].gets.capacity, 20.0, "nothing freed for others");
}

#[test]
fn a_leaf_cut_off_past_its_lease_keeps_its_safe_share_reserved_for_a_while() {
    // Safe capacity is dynamic: 90 over 6 subclients, 15 each.
    let mut root = root(90.0);
    let (mut cut, mut live) = (intermediate("cut"), intermediate("live"));
    for client in ["a", "b"] {
        ask(&mut cut, 0, client, 0, 20.0);
    }
    for client in ["c", "d", "e", "f"] {
        ask(&mut live, 0, client, 0, 5.0);
    }
    assert_eq!(refresh(&mut cut, &mut root, 0).response[0].gets.capacity, 40.0);
    assert_eq!(refresh(&mut live, &mut root, 0).response[0].gets.capacity, 20.0);
    // "cut" is never heard of again. Its lease runs out at 60; its clients live on the safe
    // capacity of 15 each that its leaf hands out, so the root keeps 30 of its 40.
    root.expire(60, usize::MAX);
    let lapsed = root.resource("r").unwrap().leases().get("cut").unwrap();
    assert!(lapsed.lapsed);
    assert_eq!(reserved_for(&root, "cut"), 30.0);
    let page = status::resource_detail(&root, "r", 60, 10).unwrap();
    assert!(page.leases.iter().any(|l| l.client == "cut" && l.lapsed && l.expiry_time == 60 + 3 * 60));
    for client in ["c", "d", "e", "f"] {
        ask(&mut live, 61, client, 0, 40.0);
    }
    assert_eq!(refresh(&mut live, &mut root, 61).response[0].gets.capacity, 60.0);
    // Three lease lengths later the root gives up on it.
    root.expire(60 + 3 * 60, usize::MAX);
    assert_eq!(reserved_for(&root, "cut"), 0.0);
    assert_eq!(refresh(&mut live, &mut root, 241).response[0].gets.capacity, 90.0);
}

#[test]
fn a_leaf_cut_off_reserves_its_whole_safe_capacity_and_keeps_it_for_a_while_after_it_comes_back() {
    // Safe capacity is dynamic: 60 over 4 subclients, 15 each.
    let mut root = root(60.0);
    let (mut cut, mut live) = (intermediate("cut"), intermediate("live"));
    for client in ["a", "b", "c"] {
        ask(&mut cut, 0, client, 0, 2.0);
    }
    ask(&mut live, 0, "d", 0, 100.0);
    assert_eq!(refresh(&mut cut, &mut root, 0).response[0].gets.capacity, 6.0);
    assert_eq!(refresh(&mut live, &mut root, 0).response[0].gets.capacity, 54.0);
    // "cut" goes silent and its lease runs out: its three clients fall back on 15 each, more
    // than the 6 it held, and the root reserves all 45 — the live leaf is cut to the rest.
    root.expire(60, usize::MAX);
    assert_eq!(reserved_for(&root, "cut"), 45.0);
    assert_eq!(refresh(&mut live, &mut root, 61).response[0].gets.capacity, 15.0);
    // Back at 70 with only a heard from again (b and c still live on their safe capacity): the
    // reservation stays for RETURN_GRACE (20 s) whatever it reports...
    cut.expire(70, usize::MAX);
    assert_eq!(ask(&mut cut, 70, "a", 0, 2.0).0, 2.0);
    refresh(&mut cut, &mut root, 70);
    assert_eq!(reserved_for(&root, "cut"), 45.0);
    refresh(&mut cut, &mut root, 89);
    assert_eq!(reserved_for(&root, "cut"), 45.0);
    assert_eq!(refresh(&mut live, &mut root, 89).response[0].gets.capacity, 15.0);
    // ...then follows what it holds, and the live leaf gets the rest.
    refresh(&mut cut, &mut root, 90);
    assert_eq!(reserved_for(&root, "cut"), 2.0);
    assert_eq!(refresh(&mut live, &mut root, 91).response[0].gets.capacity, 58.0);
}

#[test]
fn a_leaf_asks_early_when_its_clients_wants_move_but_no_sooner_than_they_refresh() {
    let mut root = root(100.0);
    let mut leaf = intermediate("leaf");
    ask(&mut leaf, 0, "a", 0, 40.0);
    refresh(&mut leaf, &mut root, 0);
    assert_eq!(leaf.parent_due(), Some(8.0), "the refresh interval from the root");
    ask(&mut leaf, 1, "a", 0, 40.2);
    assert_eq!(leaf.parent_due(), Some(8.0), "a small move waits for the refresh");
    ask(&mut leaf, 1, "b", 0, 30.0);
    assert_eq!(leaf.parent_due(), Some(4.0), "a large one is reported after the leaf's own interval");
}

#[test]
fn capacity_in_transit_between_clients_is_asked_for_at_the_shortest_interval() {
    let mut root = root(100.0);
    // Alone, "a" gets all it wants.
    assert_eq!(ask(&mut root, 0, "a", 0, 100.0), (100.0, 60, 8));
    // "b"'s fair share is 50, but "a" holds everything until it refreshes: "b" comes back soon.
    assert_eq!(ask(&mut root, 1, "b", 0, 100.0), (0.0, 61, 1));
    // "a" is cut to its share at its refresh, and "b" then gets its own: both steady again.
    assert_eq!(ask(&mut root, 8, "a", 0, 100.0), (50.0, 68, 8));
    assert_eq!(ask(&mut root, 2, "b", 0, 100.0), (50.0, 62, 8));

    // A leaf cut while its clients still hold their old grants comes back soon to say they
    // have moved onto their smaller shares, and passes the short interval down.
    let mut root = self::root(100.0);
    let mut leaf = intermediate("leaf");
    ask(&mut leaf, 0, "x", 0, 100.0);
    refresh(&mut leaf, &mut root, 0);
    assert_eq!(ask(&mut leaf, 0, "x", 0, 100.0), (100.0, 60, 4));
    ask(&mut root, 1, "c", 0, 100.0);
    let cut = refresh(&mut leaf, &mut root, 8);
    assert_eq!((cut.response[0].gets.capacity, cut.response[0].gets.refresh_interval), (50.0, 1));
    assert_eq!(ask(&mut leaf, 9, "x", 0, 100.0), (50.0, 68, 1));
    let released = refresh(&mut leaf, &mut root, 10);
    assert_eq!((released.response[0].gets.capacity, released.response[0].gets.refresh_interval), (50.0, 8));
}

#[test]
fn a_server_whose_clients_all_left_gives_its_lease_back_at_once() {
    let mut root = root(60.0);
    let (mut a, mut b) = (intermediate("a"), intermediate("b"));
    let mut now = 100;
    for _ in 0..3 {
        ask(&mut a, now, "x", 0, 30.0);
        ask(&mut b, now, "y", 0, 60.0);
        refresh(&mut a, &mut root, now);
        refresh(&mut b, &mut root, now);
        now += 8;
    }
    assert_eq!(ask(&mut b, now, "y", 0, 60.0).0, 30.0, "an equal share while x holds 30");
    let release = ReleaseCapacityRequest { client_id: "x".into(), resource_id: vec!["r".into()] };
    service::release_capacity(&mut a, now, &release, None).unwrap();
    // Its last client gone, `a` still asks, wanting and holding nothing, and is granted 0 —
    // rather than letting its lease lapse, which the root would keep reserved for its subtree.
    assert!(a.parent_due().is_some(), "a request is due");
    let request = a.parent_request(now as f64).unwrap();
    assert_eq!(request.resource[0].has.as_ref().map(|h| h.capacity), Some(0.0));
    assert!(request.resource[0].wants.is_empty());
    let response = service::get_server_capacity(&mut root, now, &request, None, MAX_RESOURCES).unwrap();
    assert_eq!(response.response[0].gets.capacity, 0.0);
    a.on_parent_response(now as f64, response);
    refresh(&mut b, &mut root, now);
    assert_eq!(ask(&mut b, now, "y", 0, 60.0).0, 60.0, "the whole capacity, at once");
    // Given back, the resource is not asked for again.
    assert!(a.parent_due().is_none());

    // A client whose lease runs out instead may be cut off and living on its fallback: the
    // lease is kept, to lapse at the root, which keeps it reserved for the subtree meanwhile.
    for _ in 0..3 {
        now += 8;
        ask(&mut a, now, "x", 0, 30.0);
        ask(&mut b, now, "y", 0, 60.0);
        refresh(&mut a, &mut root, now);
        refresh(&mut b, &mut root, now);
    }
    assert_eq!(ask(&mut a, now, "x", 0, 30.0).0, 30.0, "x back to its share");
    now += 61;
    a.expire(now, usize::MAX);
    assert!(a.resource("r").is_some_and(|r| r.leases().is_empty()), "x's lease ran out");
    assert!(a.parent_due().is_none(), "nothing given back");
}

#[test]
fn a_leaf_folds_its_least_important_bands_into_one_within_what_its_parent_accepts() {
    use sluice_server::defaults::MAX_BANDS;
    let mut root = root(1000.0);
    let mut leaf = intermediate("leaf");
    let priorities = MAX_BANDS as i64 + 3;
    for p in 0..priorities {
        ask(&mut leaf, 0, &format!("c{p}"), p, 10.0);
    }
    let request = leaf.parent_request(0.0).unwrap();
    let bands = &request.resource[0].wants;
    assert_eq!(bands.len(), MAX_BANDS);
    let folded = &bands[MAX_BANDS - 1];
    assert_eq!((folded.priority, folded.num_clients, folded.wants), (3, 4, 40.0), "priorities 3 to 0 in one band");
    assert_eq!(bands[0].priority, priorities - 1, "the most important first, on its own");
    let response = service::get_server_capacity(&mut root, 0, &request, None, MAX_RESOURCES).expect("accepted");
    assert_eq!(response.response[0].gets.capacity, 10.0 * priorities as f64);
}

/// A root learning the capacity of "r" between 10 and 1,000 (from 1,000), refreshed every second.
fn adaptive_root() -> Ledger {
    let mut template = repository(0.0, None, "strict").templates()[0].as_ref().clone();
    template.algorithm.refresh_interval = 1;
    template.adaptive = Some(sluice_server::core::Adaptive::within(10.0, 1000.0));
    Ledger::new(Arc::new(Repository::new(vec![template]).unwrap()), 0)
}

/// An end client's GetCapacity for "r" wanting 600, with a second's signals: `ok` answers at a
/// mean `latency`, the fastest `min`.
fn ask_with_signals(ledger: &mut Ledger, now: UnixSeconds, client: &str, ok: i64, latency: f64, min: f64) -> f64 {
    let signals = sluice_proto::Signals {
        completed: Some(ok),
        errors: Some(0),
        latency_sum: Some(ok as f64 * latency),
        min_latency: Some(min),
        seconds: Some(1.0),
    };
    let req = GetCapacityRequest {
        client_id: client.into(),
        resource: vec![ResourceRequest {
            resource_id: "r".into(),
            priority: 0,
            has: None,
            wants: 600.0,
            signals: Some(Box::new(signals)),
        }],
    };
    service::get_capacity(ledger, now, &req, None, MAX_RESOURCES).unwrap().response.remove(0).gets.capacity
}

#[test]
fn signals_pass_up_through_a_leaf_to_the_root_that_learns_the_capacity() {
    let mut root = adaptive_root();
    let mut leaf = intermediate("leaf");
    // Two clients of the leaf, each answered 200 a second: at 10 ms, then at 110 ms (queued).
    for (t, latency) in [(1, 0.010), (2, 0.010), (3, 0.110), (4, 0.110)] {
        ask_with_signals(&mut leaf, t, "a", 200, latency, 0.010);
        ask_with_signals(&mut leaf, t, "b", 200, latency, 0.010);
        let request = leaf.parent_request(t as f64).expect("a request is due");
        if t > 1 {
            let signals = request.resource[0].signals.as_ref().expect("the subtree's signals");
            // The leaf passes its two clients up as one: 400 a second over its second.
            assert_eq!((signals.completed, signals.seconds), (Some(400), Some(1.0)), "at {t}");
        }
        let response = service::get_server_capacity(&mut root, t, &request, None, MAX_RESOURCES).unwrap();
        leaf.on_parent_response(t as f64, response);
    }
    let controller = root.resource("r").and_then(|r| r.controller()).expect("the root learns");
    let last = controller.history().back().unwrap();
    assert_eq!(last.reason, sluice_server::core::Reason::Overload, "{:?}", controller.history());
    // 400 a second got through while the clients, wanting 1,200, held 1,000: all the service
    // can do. The fastest call did not wait, so no queue is left to drain: 400 × 0.95.
    assert!((controller.capacity() - 380.0).abs() < 1.0, "{}", controller.capacity());
    let lease = root.resource("r").unwrap().capacity(5).unwrap();
    assert_eq!(lease, controller.capacity(), "what the root shares");
}
