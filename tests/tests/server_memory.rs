//! Adversarial memory tests of a real `sluice-server`, one per listener: for 30 s each, the
//! worst input the listener accepts, as fast as it takes it, while the server's resident memory
//! is sampled and held to the budget of docs/server.md ("Memory budget: the gRPC listener",
//! "Memory budget: the admin listener"), here for smaller bounds than the defaults so that they
//! are reached within seconds.

use std::{
    io::{Read, Write},
    net::TcpStream,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use prost::Message;
use sluice_proto::{GetCapacityRequest, ResourceRequest};
use sluice_runtime::defaults::{
    ADMIN_ANSWER_TIMEOUT, ADMIN_ANSWERS_AT_ONCE, ADMIN_MAX_CONNECTIONS, ADMIN_WRITE_TIMEOUT,
};
use sluice_tests::{
    config::{Algorithm, ServerConfig, Template},
    connections::rss_bytes,
    harness::{Server, http_get},
    hostile::{Flood, connect, latency_summary, probe, stall},
    wait::{eventually, lazily},
};

/// How long each listener is attacked.
const ATTACK: Duration = Duration::from_secs(30);

/// The tests take turns: each measures its own server's memory and times its answers, which a
/// flood running beside it on two cores would distort.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MB: u64 = 1 << 20;

/// The budget's parts (docs/server.md), measured on this build: a lease with a client id of
/// 1 KiB (the longest), a resource with an id of 1 KiB, what a request in flight takes per byte
/// the server counts for it (the buffer it is read into, the decoded request, its checked claims
/// and its answer: about 60 MB for 16 MiB), and a gRPC connection beside its calls.
const LEASE_BYTES: u64 = 1_600;
const RESOURCE_BYTES: u64 = 6_000;
const IN_FLIGHT_FACTOR: u64 = 4;

/// What a request of the most structures for its bytes takes per byte counted (10,000
/// resources of one-byte ids: 11 to 12 times measured), the factor of docs/server.md's budget.
const IN_FLIGHT_WORST: u64 = 16;
const CONNECTION_BYTES: u64 = 100_000;

/// What the server counts for every call besides its bytes (`CALL_BYTES` in
/// server/src/defaults.rs): at least what one whose body never comes takes.
const CALL_BYTES: u64 = 24 << 10;

/// The attacked server's request bytes in flight (the default): room for two of the flood's
/// requests, of about 12 MB each.
const BYTES_IN_FLIGHT: u64 = 32 * MB;

/// Lease length of the attacked server's resources: no lease runs out during the attack.
fn config() -> ServerConfig {
    ServerConfig::new().template(Template::catch_all(100.0, Algorithm::fair_share(3600, 60).learning(0)))
}

/// Samples the server's RSS every 100 ms until `stop` is set, failing as soon as it passes
/// `budget`; returns the peak.
fn watch(pid: u32, budget: u64, stop: &AtomicBool) -> u64 {
    let mut peak = 0;
    while !stop.load(Ordering::Relaxed) {
        let rss = rss_bytes(pid).expect("the server's RSS");
        peak = peak.max(rss);
        assert!(rss <= budget, "RSS {} MB, over the budget of {} MB", rss / MB, budget / MB);
        thread::sleep(Duration::from_millis(100));
    }
    peak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_grpc_listener_keeps_to_its_memory_budget_under_a_flood_of_the_largest_requests() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (max_leases, max_resources) = (200_000u64, 20_000u64);
    let server = Server::launch()
        .config(&config())
        .args([
            "--log",
            "warn",
            "--max-leases",
            &max_leases.to_string(),
            "--max-resources",
            &max_resources.to_string(),
            "--max-request-bytes-in-flight",
            &BYTES_IN_FLIGHT.to_string(),
        ])
        .start();
    // New clients with the longest ids, 10,000 resources each, a child server's 16 bands on
    // each every other request, from eight times as many callers as the bytes in flight let
    // through at once. Resource ids of 64 bytes keep /metrics small enough to read afterwards;
    // each resource's id is its own cost, bounded by --max-resources and counted at 1 KiB in
    // the budget.
    let flood = Flood {
        callers: 16,
        // One each: a connection's HTTP/2 window carries one of its requests at a time.
        connections: 16,
        resources: 10_000,
        // All but the honest client's.
        resource_pool: max_resources as usize - 1,
        bands: 16,
        // A profile of four groups in each band: about 12 MB a GetServerCapacity (a
        // GetCapacity of 10,000 such resources is about 1 MB).
        groups: 4,
        id_bytes: 1_024,
        resource_id_bytes: 64,
    };
    let idle = rss_bytes(server.pid()).unwrap();
    // The flood's connections and the honest client's.
    let connections = flood.connections as u64 + 1;
    let budget = idle
        + max_leases * LEASE_BYTES
        + max_resources * RESOURCE_BYTES
        + BYTES_IN_FLIGHT * IN_FLIGHT_FACTOR
        + connections * CONNECTION_BYTES;
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = tokio::spawn(flood.clone().run(server.grpc, stop.clone()));
    let probing = tokio::spawn(probe(server.grpc, stop.clone()));
    let watching = {
        let (pid, stop) = (server.pid(), stop.clone());
        thread::spawn(move || watch(pid, budget, &stop))
    };
    tokio::time::sleep(ATTACK).await;
    stop.store(true, Ordering::Relaxed);
    let peak = watching.join();
    let answers = flooding.await.unwrap();
    let honest = probing.await.unwrap();
    let latency = &honest.latency_us;
    eprintln!(
        "flood: {}\nRSS idle {} MB, peak {} MB, budget {} MB\nan honest client's GetCapacity meanwhile: {} \
         ({} refused for the bytes in flight, {} failed)",
        answers.summary(),
        idle / MB,
        peak.as_ref().map_or(0, |p| p / MB),
        budget / MB,
        latency_summary(latency),
        honest.shed,
        honest.failed,
    );
    peak.expect("RSS within the budget throughout");
    // The bound was reached: one more of the flood's requests is refused for it.
    let mut client = server.client().await.max_decoding_message_size(16 << 20);
    let refused = client.get_capacity(flood.get_capacity(u64::MAX)).await.expect_err("no room");
    assert!(refused.message().contains("--max-leases"), "{}", refused.message());
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    assert!(n(&answers.ok) > 0 && n(&answers.exhausted) > 0, "{}", answers.summary());
    // More of the flood came at once than the bytes in flight take: some was refused for it,
    // and every refusal was an answer, not a broken call.
    assert!(n(&answers.shed) > 0, "{}", answers.summary());
    assert_eq!(n(&answers.other), 0, "{}", answers.summary());
    assert_eq!(server.metric("sluice_server_requests_shed_total"), Some((n(&answers.shed) + honest.shed) as f64));
    assert_eq!(honest.failed, 0, "the honest client is always answered");
    // Its small call finds room but for a moment now and then: about 1 call in 100 measured,
    // 1 in 20 allowed (docs/server.md).
    assert!(honest.shed * 20 <= latency.len(), "{} of {} refused", honest.shed, latency.len());
    // Its call never waits behind a whole request of the flood for long: the debug build on
    // two shared cores decodes the flood's requests at about a second each, so this bound is
    // loose (before requests were applied in parts, a request of 10,000 resources × 100 bands
    // held the ledger's lock for 8 s in this build).
    assert!(latency.value_at_quantile(0.99) < 5_000_000, "{}", latency_summary(latency));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_and_a_call_whose_body_never_comes_cost_what_the_budget_counts() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = Server::launch().config(&config()).args(["--log", "warn"]).start();
    let settle = || tokio::time::sleep(Duration::from_secs(1));
    let rss = || rss_bytes(server.pid()).unwrap();
    let before = rss();
    let mut connections = Vec::new();
    for _ in 0..500 {
        connections.push(connect(server.grpc).await);
    }
    settle().await;
    let opened = rss();
    // Two calls on each, in all about 25 MB of the 32 MiB in flight, that send their header
    // and five bytes of a message of 16 MiB.
    let mut stalled = Vec::new();
    for connection in &connections {
        for _ in 0..2 {
            stalled.push(stall(connection, server.grpc, 16 << 20, 0).await);
        }
    }
    settle().await;
    let calls = rss();
    let per_connection = opened.saturating_sub(before) / connections.len() as u64;
    let per_call = calls.saturating_sub(opened) / stalled.len() as u64;
    eprintln!(
        "RSS {} MB idle, {} MB with {} connections ({per_connection} B each), {} MB with {} stalled calls \
         ({per_call} B each)",
        before / MB,
        opened / MB,
        connections.len(),
        calls / MB,
        stalled.len()
    );
    assert!(per_connection <= CONNECTION_BYTES, "{per_connection} B a connection");
    assert!(per_call <= CALL_BYTES, "{per_call} B a call");
    assert_eq!(server.metric("sluice_server_requests_shed_total"), Some(0.0), "every call found room");
}

/// Asks `path` on a new connection and reads the whole answer, or (`read` false) none of it,
/// holding the connection for a second; how many bytes came. A reader waits as long as a
/// turn can be held ([`ADMIN_WRITE_TIMEOUT`]) for each part of the answer: under the attack its
/// request waits for one of the turns, which large pages keep for seconds in the debug build (with
/// 5 s, as few as none of the answers came in 30 s on two loaded cores).
fn scrape(admin: std::net::SocketAddr, path: &str, read: bool) -> usize {
    let Ok(mut stream) = TcpStream::connect(admin) else { return 0 };
    let _ = stream.set_read_timeout(Some(ADMIN_WRITE_TIMEOUT));
    if write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").is_err() {
        return 0;
    }
    if !read {
        thread::sleep(Duration::from_secs(1));
        return 0;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_keeps_to_its_memory_budget_under_many_connections_and_scrapes() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = Server::launch().config(&config()).args(["--log", "warn"]).start();
    // Large pages: 3,000 resources with ids of 1 KiB, five series each on /metrics.
    let resource =
        |k: usize| ResourceRequest { resource_id: format!("r{k:0>1023}"), priority: 0, has: None, wants: 1.0, signals: None };
    let request = GetCapacityRequest { client_id: "owner".into(), resource: (0..3_000).map(resource).collect() };
    let mut client = server.client().await.max_decoding_message_size(16 << 20);
    client.get_capacity(request).await.expect("the resources");
    let largest = ["/metrics", "/debug/status.json", "/debug/status"]
        .map(|path| scrape(server.admin, path, true) as u64)
        .into_iter()
        .max()
        .unwrap();
    let idle = rss_bytes(server.pid()).unwrap();
    // Each answer being rendered or sent costs about three times its size while it is made (the
    // snapshot, the text, the exporter's own); one more than the turns is being rendered.
    let budget = idle + (ADMIN_ANSWERS_AT_ONCE as u64 + 1) * 3 * largest + ADMIN_MAX_CONNECTIONS as u64 * 100_000;
    eprintln!("largest answer {} MB; RSS {} MB before; budget {} MB", largest / MB, idle / MB, budget / MB);

    // 200 clients at once, four times the connections the listener holds: each scrapes a large
    // page, half of them reading the answer, half never reading it.
    let stop = Arc::new(AtomicBool::new(false));
    let (scraped, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let scrapers: Vec<_> = (0..200)
        .map(|k| {
            let (admin, stop, scraped, bytes) = (server.admin, stop.clone(), scraped.clone(), bytes.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let path = if k % 4 < 2 { "/metrics" } else { "/debug/status.json" };
                    let got = scrape(admin, path, k % 2 == 0);
                    scraped.fetch_add(u64::from(got > 0), Ordering::Relaxed);
                    bytes.fetch_add(got as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let watching = {
        let (pid, stop) = (server.pid(), stop.clone());
        thread::spawn(move || watch(pid, budget, &stop))
    };
    let started = Instant::now();
    tokio::time::sleep(ATTACK).await;
    stop.store(true, Ordering::Relaxed);
    let peak = watching.join();
    // Once the attack is over the listener answers again, at the latest when the answers it was
    // still sending to clients that never read them have run out of time.
    // Refused while its connections are all taken.
    let healthz = || http_get(server.admin, "/healthz");
    let why = lazily(|| format!("/healthz not answered after the attack: {:?}", healthz()));
    let probe = eventually(why, async || matches!(healthz(), Ok((200, _)))).await;
    assert!(probe < ADMIN_WRITE_TIMEOUT + ADMIN_ANSWER_TIMEOUT, "/healthz answered only {probe:?} after the attack");
    for scraper in scrapers {
        scraper.join().unwrap();
    }
    eprintln!(
        "{} answers read whole ({} MB) in {:?}; RSS peak {} MB of {} MB; /healthz after it answered in {probe:?}",
        scraped.load(Ordering::Relaxed),
        bytes.load(Ordering::Relaxed) / MB,
        started.elapsed(),
        peak.as_ref().map_or(0, |p| p / MB),
        budget / MB
    );
    peak.expect("RSS within the budget throughout");
    assert!(scraped.load(Ordering::Relaxed) > 0, "scrapes are answered under the attack");
}

/// Peak resident memory from /proc/PID/status (VmHWM).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server's status");
    let kb = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).expect("VmHWM");
    kb.trim().trim_end_matches("kB").trim().parse::<u64>().expect("kB") * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_takes_a_bounded_multiple_of_the_bytes_it_counts() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let shape = |bands, groups, resource_id_bytes| Flood {
        callers: 1,
        connections: 1,
        resources: 10_000,
        resource_pool: 10_000,
        bands,
        groups,
        id_bytes: 1_024,
        resource_id_bytes,
    };
    // The flood's GetServerCapacity (about 12 MB), a GetCapacity with ids of 1 KiB (10 MB), and
    // one of one-byte ids (200 KB: the most structures for its bytes); how many times what the
    // server counts for it each takes at most.
    for (flood, most) in [
        (shape(16, 4, 64), IN_FLIGHT_FACTOR),
        (shape(0, 1, 1_024), IN_FLIGHT_FACTOR),
        (shape(0, 1, 1), IN_FLIGHT_WORST),
    ] {
        // Refused whole once decoded and checked: what stays is only what it took in flight.
        let server = Server::launch().config(&config()).args(["--log", "warn", "--max-resources", "1"]).start();
        let mut client = server.client().await.max_encoding_message_size(16 << 20);
        let idle = rss_bytes(server.pid()).unwrap();
        let (bytes, refused) = if flood.bands > 0 {
            let request = flood.get_server_capacity(0);
            (request.encoded_len(), client.get_server_capacity(request).await.map(drop))
        } else {
            let request = flood.get_capacity(0);
            (request.encoded_len(), client.get_capacity(request).await.map(drop))
        };
        assert_eq!(refused.expect_err("too many resources").code(), tonic::Code::ResourceExhausted);
        let counted = (bytes + CALL_BYTES as usize) as u64;
        let took = peak_rss(server.pid()).saturating_sub(idle);
        let factor = took as f64 / counted as f64;
        eprintln!("{} B counted, {} MB taken: {factor:.1} times", counted, took / MB);
        assert!(took <= counted * most, "{factor:.1} times its {counted} B");
    }
}

/// What a lease with a short client id costs this build at most (about 210 B measured on the
/// release build, docs/server.md; the debug build's allocations are larger).
const SHORT_LEASE_BYTES: u64 = 400;

/// Distinct client ids, five resources' worth each of the most clients per resource, against
/// a server with those bounds: half are refused at that bound, memory stays within the leases it
/// lets in, and a client holding a lease before keeps it unchanged. A fifth of the issue's
/// million, with a fifth of the default bound, so that `make test` takes a minute rather than
/// five; the whole million runs with `--ignored` (321 s here, peak 130 MB for 500,000 leases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ids_beyond_the_bounds_cost_no_memory() {
    many_client_ids(200_000, Some(20_000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "five minutes: the issue's million client ids at the default bounds"]
async fn a_million_client_ids_cost_no_more_than_the_default_bounds_let_in() {
    many_client_ids(1_000_000, None).await;
}

/// `ids` client ids over five resources, against a server whose most clients per resource is
/// `max_clients` (`None`: the default, 100,000), a tenth of the ids each.
async fn many_client_ids(ids: u64, max_clients: Option<u64>) {
    let _turn = ONE_AT_A_TIME.lock().await;
    const RESOURCES: u64 = 5;
    let mut launch = Server::launch().config(&config()).args(["--log", "warn"]);
    if let Some(n) = max_clients {
        launch = launch.args(["--max-clients-per-resource".to_owned(), n.to_string()]);
    }
    let server = launch.start();
    let max_clients = max_clients.unwrap_or(100_000);
    let mut existing = server.client().await;
    let ask = |client: String, resource: String, wants: f64| GetCapacityRequest {
        client_id: client,
        resource: vec![ResourceRequest { resource_id: resource, priority: 0, has: None, wants, signals: None }],
    };
    let held = existing.get_capacity(ask("existing".into(), "own".into(), 40.0)).await.unwrap().into_inner();
    let idle = rss_bytes(server.pid()).unwrap();
    let (callers, connections) = (64, 4);
    let budget = idle
        + RESOURCES * max_clients * SHORT_LEASE_BYTES
        + (connections + 1) * CONNECTION_BYTES
        + BYTES_IN_FLIGHT * IN_FLIGHT_FACTOR;
    let stop = Arc::new(AtomicBool::new(false));
    let watching = {
        let (pid, stop) = (server.pid(), stop.clone());
        thread::spawn(move || watch(pid, budget, &stop))
    };
    let (next, granted, refused) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let mut shared = Vec::new();
    for _ in 0..connections {
        shared.push(server.client().await);
    }
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let mut client = shared[caller as usize % shared.len()].clone();
        let (next, granted, refused) = (next.clone(), granted.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ids {
                    return;
                }
                match client.get_capacity(ask(format!("c{i}"), format!("r{}", i % RESOURCES), 1.0)).await {
                    Ok(_) => granted.fetch_add(1, Ordering::Relaxed),
                    Err(status) => {
                        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                        refused.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let peak = watching.join();
    let (granted, refused) = (granted.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
    eprintln!(
        "{ids} client ids in {:.0?}: {granted} granted, {refused} refused; RSS idle {} MB, peak {} MB, budget {} MB",
        started.elapsed(),
        idle / MB,
        peak.as_ref().map_or(0, |p| p / MB),
        budget / MB
    );
    peak.expect("RSS within the budget throughout");
    assert_eq!(granted, RESOURCES * max_clients);
    assert_eq!(refused, ids - granted);
    let bound = "sluice_server_bound_refusals_total{bound=\"clients_per_resource\"}";
    assert_eq!(server.metric(bound), Some(refused as f64));
    let again = existing.get_capacity(ask("existing".into(), "own".into(), 40.0)).await.unwrap().into_inner();
    assert_eq!(again.response[0].gets.capacity, held.response[0].gets.capacity, "unaffected");
}
