//! The tiers under failure, end to end: real servers, sidecars and etcd, with a fault proxy
//! (`sluice_tests::faults`) on the links between them. Each test keeps a sidecar under steady
//! load through the fault and checks what SPEC §3.4 and §4.3 promise:
//! - no request fails because of the capacity plane: the fallback (`safe`, above the load)
//!   admits while there is no lease, so every answer is a 200;
//! - no request waits past its deadline (`max_wait` of delay mode, plus the upstream's time);
//! - the fallback applies within a refresh interval of the lease's expiry;
//! - what the root has granted, and what the clients hold as granted, stays within capacity;
//! - after the fault heals, grants come back within a bound, which is printed.
//!
//! A rolling deploy of sidecars in waves checks that the capacity follows the live pods.
//!
//! Leases are short (4 s, refreshed every second) so that each test takes 20–50 s.

use std::{
    fmt::Display,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use sluice_proto::{GetCapacityRequest, Lease, ResourceRequest, capacity_client::CapacityClient};
use sluice_tests::{
    config::{Algorithm, Fallback, Listener, OnLimit, Resource, Rule, ServerConfig, SidecarConfig, Template, Upstream},
    etcd::Etcd,
    faults::{Fault, FaultProxy},
    harness::{Server, Sidecar, status_json},
    http::{http1, send},
    upstream::UpstreamProcess,
    wait::{eventually, lazily},
};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

const CAPACITY: f64 = 100.0;
/// What a client without a lease falls back on: above any one sidecar's load here.
const SAFE: f64 = 50.0;
const LEASE: u64 = 4;
const REFRESH: f64 = 1.0;
const MAX_WAIT: Duration = Duration::from_secs(1);
/// What the greedy Doorman client asks for: with a sidecar's ~10 a second, the root is nearly
/// full, so a grant made twice would show in Σ.
const GREEDY_WANTS: f64 = 85.0;
/// Requests a second of each sidecar's steady load.
const LOAD: f64 = 8.0;
/// Slack on any measured time for a loaded 2-core machine, sampling (every 100 ms) and unix
/// times in whole seconds (lease expiries).
const SLACK: f64 = 1.5;
/// How soon grants must be back after a fault heals: two refresh intervals (a client that
/// failed in a row retries within a refresh interval, and its answer is in force within the
/// next), plus slack.
const RECONVERGE: f64 = 2.0 * REFRESH + SLACK;

/// Leases of [`LEASE`], refreshed every [`REFRESH`].
fn algorithm() -> Algorithm {
    Algorithm::fair_share(LEASE, REFRESH as u64)
}

/// The capacity template; `learning`: seconds of learning mode after a start.
fn template(learning: u64) -> ServerConfig {
    ServerConfig::new().template(Template::catch_all(CAPACITY, algorithm().learning(learning)).safe_capacity(SAFE))
}

/// A leaf's own template: its capacity comes from its parent.
fn leaf_template() -> ServerConfig {
    ServerConfig::new().template(Template::catch_all(0.0, algorithm().learning(0)))
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// A sidecar of resource "orders" (`on_limit`: what its rule does beyond the lease) in front of
/// `upstream`, leasing from `servers` as `client_id`.
fn sidecar(
    servers: &[SocketAddr],
    upstream: &UpstreamProcess,
    client_id: &str,
    on_limit: Rule,
) -> (Sidecar, SocketAddr) {
    // A second of the load as burst: a loaded machine's scheduling stalls bunch the evenly
    // spaced requests, which the default 0.1 s would refuse for reasons of its own.
    let orders = Resource::new("orders").when_unreachable(Fallback::Safe).burst(LOAD);
    let config = SidecarConfig::proxy(Listener::app(), Upstream::app(upstream.addr()))
        .leasing_from(servers.iter().copied())
        .resource(orders)
        .rule(on_limit);
    let sidecar = Sidecar::launch(&config).args(["--client-id", client_id]).start();
    let listen = sidecar.listen();
    (sidecar, listen)
}

fn delay_mode() -> Rule {
    Rule::charging("orders").on_limit(OnLimit::Delay).max_wait(MAX_WAIT)
}

/// One request through a sidecar: when it started (unix seconds), its status (0: no answer),
/// and how long it took.
#[derive(Clone, Copy, Debug)]
struct Request {
    at: f64,
    status: u16,
    took: f64,
}

/// Steady load on a sidecar's listener, one request at a time at [`LOAD`] a second.
struct Load {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Vec<Request>>,
}

impl Load {
    fn start(listen: SocketAddr) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let (client, url) = (http1(), format!("http://{listen}/echo"));
                let mut requests = Vec::new();
                let period = Duration::from_secs_f64(1.0 / LOAD);
                while !stop.load(Ordering::Relaxed) {
                    let (at, start) = (unix_now(), Instant::now());
                    let request = http::Request::get(&url).body(Default::default()).unwrap();
                    let answer = send(&client, request, Duration::from_secs(10)).await;
                    let took = start.elapsed();
                    requests.push(Request {
                        at,
                        status: answer.map_or(0, |a| a.status.as_u16()),
                        took: took.as_secs_f64(),
                    });
                    tokio::time::sleep(period.saturating_sub(took)).await;
                }
                requests
            }
        });
        Load { stop, task }
    }

    async fn stop(self) -> Vec<Request> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Every request from `since` on was admitted, none waited past `MAX_WAIT` (plus slack for the
/// upstream and the machine).
fn check_requests(what: &str, requests: &[Request], since: f64) {
    let counted: Vec<_> = requests.iter().filter(|r| r.at >= since).collect();
    assert!(counted.len() as f64 >= LOAD, "{what}: too few requests to judge: {}", counted.len());
    let failed: Vec<_> = counted.iter().filter(|r| r.status != 200).collect();
    assert!(failed.is_empty(), "{what}: {} of {} requests not admitted: {failed:?}", failed.len(), counted.len());
    let slowest = counted.iter().map(|r| r.took).fold(0.0, f64::max);
    assert!(slowest <= MAX_WAIT.as_secs_f64() + SLACK, "{what}: a request took {slowest:.2} s");
    println!("{what}: {} requests, all admitted, the slowest {slowest:.3} s", counted.len());
}

/// A Doorman client at the root that wants [`GREEDY_WANTS`], refreshing every half second:
/// what it holds is shared with the sampler.
struct Greedy {
    lease: Arc<Mutex<Option<Lease>>>,
    task: JoinHandle<()>,
}

impl Greedy {
    fn start(server: SocketAddr) -> Greedy {
        let lease = Arc::new(Mutex::new(None));
        let channel = Channel::from_shared(format!("http://{server}")).unwrap().connect_lazy();
        let task = tokio::spawn({
            let lease = lease.clone();
            async move {
                let mut rpc = CapacityClient::new(channel);
                loop {
                    let has = *lease.lock().unwrap();
                    let request = GetCapacityRequest {
                        client_id: "greedy".into(),
                        resource: vec![ResourceRequest {
                            resource_id: "orders".into(),
                            priority: 0,
                            has,
                            wants: GREEDY_WANTS,
                            signals: None,
                        }],
                    };
                    if let Ok(Ok(answer)) =
                        tokio::time::timeout(Duration::from_secs(2), rpc.get_capacity(request)).await
                        && let Some(r) = answer.into_inner().response.first()
                    {
                        *lease.lock().unwrap() = Some(r.gets);
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        });
        Greedy { lease, task }
    }

    /// What it holds as granted right now.
    fn holds(lease: &Mutex<Option<Lease>>) -> f64 {
        lease.lock().unwrap().filter(|l| l.expiry_time as f64 > unix_now()).map_or(0.0, |l| l.capacity)
    }
}

impl Drop for Greedy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One look at the system, every 100 ms.
#[derive(Clone, Debug, Default)]
struct Sample {
    at: f64,
    /// The sidecar's mode, capacity and lease expiry.
    mode: String,
    capacity: Option<f64>,
    expiry: Option<f64>,
    /// Σ has at the root (None while it does not answer).
    root_has: Option<f64>,
    /// What the root's direct clients hold as granted and unexpired: the greedy client and the
    /// sidecar or leaf below it.
    held: f64,
    /// A leaf's lease from its parent, when it has a valid one.
    parent_lease: Option<(f64, f64)>,
}

/// Samples in the background until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<Vec<Sample>>,
}

/// Where to look: the sidecar's and the root's admin listeners, a leaf's if there is one, and
/// the greedy client's lease.
#[derive(Clone)]
struct Watch {
    sidecar: SocketAddr,
    roots: Vec<SocketAddr>,
    leaf: Option<SocketAddr>,
    greedy: Option<Arc<Mutex<Option<Lease>>>>,
}

fn resource(status: &Value) -> Option<&Value> {
    status["resources"].as_array()?.iter().find(|r| r["id"] == "orders")
}

impl Watch {
    fn sample(&self) -> Sample {
        let mut sample = Sample { at: unix_now(), ..Sample::default() };
        if let Some(r) = status_json(self.sidecar).as_ref().and_then(resource) {
            sample.mode = r["mode"].as_str().unwrap_or_default().to_owned();
            sample.capacity = r["capacity"].as_f64();
            sample.expiry = r["lease_expiry"].as_f64();
        }
        // Only masters hold leases; a root that does not answer counts for nothing.
        let roots: Vec<f64> = self
            .roots
            .iter()
            .filter_map(|&root| status_json(root))
            .map(|s| resource(&s).and_then(|r| r["has"].as_f64()).unwrap_or(0.0))
            .collect();
        sample.root_has = (!roots.is_empty()).then(|| roots.iter().sum());
        sample.parent_lease = self.leaf.and_then(status_json).as_ref().and_then(resource).and_then(|r| {
            let lease = &r["parent_lease"];
            Some((lease["capacity"].as_f64()?, lease["expiry_time"].as_f64()?))
        });
        let below = match self.leaf {
            Some(_) => sample.parent_lease.map_or(0.0, |(capacity, _)| capacity),
            None if sample.mode == "leased" && sample.expiry.is_some_and(|e| e > sample.at) => {
                sample.capacity.unwrap_or(0.0)
            }
            None => 0.0,
        };
        sample.held = below + self.greedy.as_deref().map_or(0.0, Greedy::holds);
        sample
    }

    /// Whether the system satisfies `done` now. Called from the tests' runtime: the blocking
    /// status reads are moved off its workers, which carry the load.
    fn shows(&self, done: impl Fn(&Sample) -> bool) -> bool {
        tokio::task::block_in_place(|| done(&self.sample()))
    }

    /// `what`, with the system as it is when a failure shows it.
    fn waiting_for<'a>(&'a self, what: &'a str) -> impl Display + 'a {
        lazily(move || format!("{what}: {:?}", self.sample()))
    }

    fn start(&self) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let (watch, stopped) = (self.clone(), stop.clone());
        let thread = thread::spawn(move || {
            let mut samples = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                samples.push(watch.sample());
                thread::sleep(Duration::from_millis(100));
            }
            samples
        });
        Sampler { stop, thread }
    }
}

impl Sampler {
    fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// Σ granted stays within capacity (2% for rounding between the samples of different
/// processes), as held by the root's clients and, unless `reserving`, in the root's ledger.
/// A root `reserving` for a cut-off subtree keeps its lapsed lease as that subtree's safe
/// capacity for a while (by design, so that it does not give the share away twice): its ledger
/// may then hold more than the capacity until the other clients' leases have shrunk.
fn check_sigma(what: &str, samples: &[Sample], reserving: bool) {
    for s in samples {
        let limit = if reserving { CAPACITY + SAFE } else { CAPACITY };
        assert!(s.root_has.unwrap_or(0.0) <= limit * 1.02, "{what}: the root has granted {:?}: {s:?}", s.root_has);
        assert!(s.held <= CAPACITY * 1.02, "{what}: clients hold {} as granted: {s:?}", s.held);
    }
    let peak = |f: fn(&Sample) -> f64| samples.iter().map(f).fold(0.0, f64::max);
    let (held, ledger) = (peak(|s| s.held), peak(|s| s.root_has.unwrap_or(0.0)));
    println!(
        "{what}: Σ held by the root's clients peaked at {held:.1} of {CAPACITY}, the root's ledger at {ledger:.1}"
    );
}

/// Every time the sidecar went from a lease to its fallback: how long after the lease's
/// expiry. Each must be within a refresh interval (plus slack); returns them.
fn fallback_delays(what: &str, samples: &[Sample]) -> Vec<f64> {
    let mut delays = Vec::new();
    for pair in samples.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        if before.mode == "leased" && after.mode.starts_with("fallback") {
            let expiry = before.expiry.expect("a lease has an expiry");
            delays.push(after.at - expiry);
        }
    }
    for delay in &delays {
        assert!(*delay <= REFRESH + SLACK, "{what}: the fallback applied {delay:.2} s after the lease expired");
    }
    println!("{what}: fallback after expiry: {delays:.2?} s");
    delays
}

/// How long after `since` the first sample satisfying `back` was taken; fails past
/// [`RECONVERGE`].
fn reconverged(what: &str, samples: &[Sample], since: f64, back: impl Fn(&Sample) -> bool) -> f64 {
    let took = samples.iter().find(|s| s.at >= since && back(s)).map(|s| s.at - since);
    let took = took.unwrap_or_else(|| panic!("{what}: never back after the fault healed"));
    assert!(took <= RECONVERGE, "{what}: back only {took:.2} s after the fault healed");
    println!("{what}: back {took:.2} s after the fault healed");
    took
}

fn leased(s: &Sample) -> bool {
    s.mode == "leased" && s.capacity.is_some_and(|c| c > 0.0)
}

/// Runs steady load and the sampler until the sidecar has a lease and a few seconds more, so
/// that each fault strikes a sidecar in its steady state.
async fn warm_up(watch: &Watch, listen: SocketAddr) -> (Load, Sampler, f64) {
    let load = Load::start(listen);
    let sampler = watch.start();
    eventually(watch.waiting_for("leased"), async || watch.shows(leased)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    (load, sampler, unix_now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_leaves_its_sidecar_on_the_lease_then_the_fallback_until_it_is_back() {
    let upstream = UpstreamProcess::start(None);
    let server = Server::launch().config(&template(0)).start();
    let (grpc, admin) = (server.grpc, server.admin);
    let greedy = Greedy::start(grpc);
    let (sidecar, listen) = sidecar(&[grpc], &upstream, "pod", delay_mode());
    let mut watch =
        Watch { sidecar: sidecar.admin, roots: vec![admin], leaf: None, greedy: Some(greedy.lease.clone()) };
    let (load, sampler, since) = warm_up(&watch, listen).await;

    drop(server); // SIGKILL
    let on_safe = |s: &Sample| s.mode == "fallback_safe" && s.capacity == Some(SAFE);
    eventually(watch.waiting_for("fallback"), async || watch.shows(on_safe)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Back with a learning mode as long as a lease, as after any restart that must not grant
    // what others may still hold.
    let back = Server::launch().config(&template(LEASE)).start_at(grpc);
    watch.roots = vec![back.admin];
    let healed = unix_now();
    eventually(watch.waiting_for("leased again"), async || watch.shows(leased)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (requests, samples) = (load.stop().await, sampler.stop());
    let what = "server SIGKILL";
    check_requests(what, &requests, since);
    check_sigma(what, &samples, false);
    assert_eq!(fallback_delays(what, &samples).len(), 1, "one fallback, after the lease expired");
    reconverged(what, &samples, healed, leased);
}

/// The processes of [`behind_a_proxy`], which live as long as this value.
type Processes = (UpstreamProcess, Server, Greedy, Sidecar);

/// A sidecar under load, warmed up, whose server (with a greedy client beside it) is behind a
/// fault proxy.
async fn behind_a_proxy() -> (Processes, FaultProxy, Watch, Load, Sampler, f64) {
    let upstream = UpstreamProcess::start(None);
    let server = Server::launch().config(&template(0)).start();
    let proxy = FaultProxy::start(server.grpc);
    let greedy = Greedy::start(server.grpc);
    let (sidecar, listen) = sidecar(&[proxy.addr()], &upstream, "pod", delay_mode());
    let watch =
        Watch { sidecar: sidecar.admin, roots: vec![server.admin], leaf: None, greedy: Some(greedy.lease.clone()) };
    let (load, sampler, since) = warm_up(&watch, listen).await;
    ((upstream, server, greedy, sidecar), proxy, watch, load, sampler, since)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_slower_than_the_refresh_interval_costs_no_request() {
    let (_processes, proxy, watch, load, sampler, since) = behind_a_proxy().await;

    // A second each way: every answer comes two refresh intervals after its question.
    proxy.set(Fault::Delay(Duration::from_secs(1)));
    tokio::time::sleep(Duration::from_secs(12)).await;
    proxy.set(Fault::Pass);
    let healed = unix_now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    eventually(watch.waiting_for("leased"), async || watch.shows(leased)).await;

    let (requests, samples) = (load.stop().await, sampler.stop());
    let what = "slow server";
    check_requests(what, &requests, since);
    check_sigma(what, &samples, false);
    fallback_delays(what, &samples);
    let slow: Vec<_> = samples.iter().filter(|s| s.at >= since && s.at < healed).collect();
    let leased_share = slow.iter().filter(|s| leased(s)).count() as f64 / slow.len() as f64;
    println!("{what}: leased in {:.0}% of the samples while slow", leased_share * 100.0);
    assert!(leased_share > 0.0, "slow answers still bring leases");
    reconverged(what, &samples, healed, leased);
}

/// A sidecar under load behind a fault proxy to its server: each of `faults` in turn for so
/// many seconds, then healed; judged as `what`.
async fn sidecar_through(what: &str, faults: &[(Fault, u64)]) {
    let (_processes, proxy, watch, load, sampler, since) = behind_a_proxy().await;

    let mut heals = Vec::new();
    for &(fault, seconds) in faults {
        proxy.set(fault);
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        proxy.set(Fault::Pass);
        heals.push((fault, seconds, unix_now()));
        eventually(watch.waiting_for("leased again"), async || watch.shows(leased)).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    let (requests, samples) = (load.stop().await, sampler.stop());
    check_requests(what, &requests, since);
    check_sigma(what, &samples, false);
    let outlasting = heals.iter().filter(|(_, seconds, _)| *seconds > LEASE).count();
    assert!(fallback_delays(what, &samples).len() >= outlasting, "each fault that outlasts the lease falls back");
    for (fault, _, healed) in heals {
        reconverged(&format!("{what} ({fault:?})"), &samples, healed, leased);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_cut_off_from_its_server_falls_back_and_recovers() {
    // The cut outlasts a lease; a reset is short, as when a proxy on the way restarts.
    sidecar_through("sidecar cut off", &[(Fault::Cut, LEASE + 4), (Fault::Reset, 2)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_partitioned_from_its_server_falls_back_within_a_refresh_interval_of_expiry() {
    sidecar_through("sidecar partitioned", &[(Fault::Blackhole, LEASE + 4)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaf_partitioned_from_its_root_hands_out_the_safe_capacity_and_recovers() {
    let upstream = UpstreamProcess::start(None);
    let root = Server::launch().config(&template(0)).start();
    let proxy = FaultProxy::start(root.grpc);
    let leaf = Server::launch().config(&leaf_template()).args(["--parent", &proxy.addr().to_string()]).start();
    let greedy = Greedy::start(root.grpc);
    let (sidecar, listen) = sidecar(&[leaf.grpc], &upstream, "pod", delay_mode());
    let watch = Watch {
        sidecar: sidecar.admin,
        roots: vec![root.admin],
        leaf: Some(leaf.admin),
        greedy: Some(greedy.lease.clone()),
    };
    let (load, sampler, since) = warm_up(&watch, listen).await;

    proxy.set(Fault::Blackhole);
    let cut = unix_now();
    eventually(watch.waiting_for("the leaf's lease lapsed"), async || watch.shows(|s| s.parent_lease.is_none())).await;
    tokio::time::sleep(Duration::from_secs_f64(REFRESH + SLACK + 1.0)).await;
    proxy.set(Fault::Pass);
    let healed = unix_now();
    // A lease under the leaf's own from the root again.
    let granted = |s: &Sample| {
        s.mode == "leased" && s.parent_lease.is_some_and(|(_, parent)| s.expiry.is_some_and(|e| e <= parent))
    };
    eventually(watch.waiting_for("granted again"), async || watch.shows(granted)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (requests, samples) = (load.stop().await, sampler.stop());
    let what = "leaf partitioned";
    check_requests(what, &requests, since);
    check_sigma(what, &samples, true);
    // The leaf's lease from the root lapses, and within a refresh interval its sidecar is on
    // the root's safe capacity: its own fallback (a lease from the leaf ends with the leaf's),
    // or the leaf's grant without a lease of its own, at most the safe capacity and lasting
    // past the lapsed lease.
    let during: Vec<_> = samples.iter().filter(|s| s.at >= cut && s.at < healed).collect();
    let lapsed = during.iter().position(|s| s.parent_lease.is_none()).expect("the leaf's lease lapsed");
    let expiry = during[..lapsed].last().and_then(|s| s.parent_lease).expect("a lease before").1;
    let on_safe = |s: &Sample| match s.mode.as_str() {
        "fallback_safe" => s.capacity == Some(SAFE),
        "leased" => s.expiry.is_some_and(|e| e > expiry) && s.capacity.is_some_and(|c| c <= SAFE),
        _ => false,
    };
    let safe = during[lapsed..].iter().position(|s| on_safe(s)).expect("the safe capacity") + lapsed;
    let delay = during[safe].at - expiry;
    println!("{what}: the sidecar on the safe capacity {delay:.2} s after the leaf's lease expired");
    assert!(delay <= REFRESH + SLACK, "{what}: the safe capacity came {delay:.2} s after the expiry");
    assert!(during[safe..].iter().all(|s| on_safe(s)), "{what}: on the safe capacity until healed");
    reconverged(what, &samples, healed, granted);
}

/// A root replica elected on etcd at `etcd` (an endpoint URL).
fn replica(etcd: &str) -> Server {
    Server::launch()
        .config(&template(LEASE))
        .args(["--etcd-endpoints", etcd, "--election-key", "/sluice/test/faults", "--etcd-lease-ttl", "2"])
        .start()
}

/// Called from the tests' runtime: the blocking status read is moved off its workers.
fn is_master(admin: SocketAddr) -> bool {
    tokio::task::block_in_place(|| status_json(admin)).is_some_and(|s| s["election"]["role"] == "master")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elected_replicas_survive_a_master_cut_off_from_etcd_and_the_loss_of_etcd() {
    let mut etcd = Etcd::start();
    let link = FaultProxy::start(etcd.endpoint().trim_start_matches("http://").parse().unwrap());
    // The first replica up is the master, and reaches etcd through the proxy.
    let a = replica(&format!("http://{}", link.addr()));
    let b = replica(&etcd.endpoint());
    assert!(is_master(a.admin) && !is_master(b.admin), "the first replica up wins");
    let upstream = UpstreamProcess::start(None);
    let (sidecar, listen) = sidecar(&[a.grpc, b.grpc], &upstream, "pod", delay_mode());
    let watch = Watch { sidecar: sidecar.admin, roots: vec![a.admin, b.admin], leaf: None, greedy: None };
    // The master learns for a lease length before it grants a newcomer anything.
    let (load, sampler, since) = warm_up(&watch, listen).await;

    // Partition the master from etcd: it steps down, the other replica wins, and the sidecar
    // follows it on its lease (which a learning master grants again).
    link.set(Fault::Blackhole);
    let took = eventually("a new master", async || is_master(b.admin)).await;
    println!("etcd partition: the other replica master after {:.2} s", took.as_secs_f64());
    eventually("the deposed master steps down", async || !is_master(a.admin)).await;
    tokio::time::sleep(Duration::from_secs(LEASE + 2)).await;
    link.set(Fault::Pass);
    eventually(watch.waiting_for("leased"), async || watch.shows(leased)).await;

    // Lose etcd: no replica is master; the sidecar keeps its lease until it expires, then
    // falls back; etcd back, a master is elected and grants again after its learning.
    etcd.stop("KILL");
    eventually(watch.waiting_for("fallback"), async || watch.shows(|s| s.mode == "fallback_safe")).await;
    assert!(!is_master(a.admin) && !is_master(b.admin), "no master without etcd");
    tokio::time::sleep(Duration::from_secs(2)).await;
    etcd.restart();
    let healed = unix_now();
    eventually(watch.waiting_for("leased again"), async || watch.shows(leased)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (requests, samples) = (load.stop().await, sampler.stop());
    let what = "etcd faults";
    check_requests(what, &requests, since);
    check_sigma(what, &samples, false);
    assert!(!fallback_delays(what, &samples).is_empty(), "the lease expired without etcd");
    // A new master learns for a lease length before it grants: that is part of the way back.
    reconverged(what, &samples, healed, leased);
}

/// A pod of the rolling deploy: a sidecar under steady load.
struct Pod {
    name: String,
    sidecar: Sidecar,
    load: Load,
    started: f64,
}

/// How long a new pod's first seconds are, in which it may refuse under 1% of its requests
/// while its first lease comes (none at all later).
const FIRST_SECONDS: f64 = 5.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_hands_the_capacity_to_the_live_pods_and_takes_it_back_at_once() {
    let upstream = UpstreamProcess::start(None);
    let server = Server::launch().config(&template(0)).start();
    let admin = server.admin;
    let root = move || status_json(admin).as_ref().and_then(resource).cloned().unwrap_or(Value::Null);
    let clients = move || root()["clients"].as_u64().unwrap_or(0);
    // Σ has at the server, sampled throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = thread::spawn({
        let stop = stop.clone();
        move || {
            let mut peak: f64 = 0.0;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(root()["has"].as_f64().unwrap_or(0.0));
                thread::sleep(Duration::from_millis(100));
            }
            peak
        }
    });
    let wait_for_clients = async |n: u64| {
        let why = lazily(|| format!("{} clients at the server, not {n}", clients()));
        eventually(why, async || tokio::task::block_in_place(clients) == n).await.as_secs_f64()
    };

    let mut old: Vec<Pod> = Vec::new();
    let mut report = Vec::new();
    for wave in 0..3 {
        let mut new = Vec::new();
        for i in 0..3 {
            let name = format!("pod-{wave}-{i}");
            let (sidecar, listen) =
                sidecar(&[server.grpc], &upstream, &name, Rule::charging("orders").on_limit(OnLimit::Reject));
            new.push(Pod { name, sidecar, load: Load::start(listen), started: unix_now() });
        }
        // Every new pod holds a lease beside the old ones.
        wait_for_clients((old.len() + new.len()) as u64).await;
        tokio::time::sleep(Duration::from_secs_f64(FIRST_SECONDS + 2.0)).await;
        // The old wave goes: each releases its lease on SIGTERM, and the server forgets it at
        // once, not a lease length later.
        let before = root()["has"].as_f64().unwrap();
        for mut pod in old.drain(..) {
            let requests = pod.load.stop().await;
            pod.sidecar.signal("TERM");
            assert_eq!(tokio::task::block_in_place(|| pod.sidecar.wait_exit(Duration::from_secs(10))), Some(0));
            report.push((pod.name, pod.started, requests));
        }
        let released = wait_for_clients(new.len() as u64).await;
        let after = root()["has"].as_f64().unwrap();
        println!(
            "wave {wave}: the old pods' leases gone {released:.2} s after the last exit; Σ has {before:.1} → {after:.1}"
        );
        assert!(released < 2.0, "the old pods' leases gone only {released:.2} s after the last exit");
        if wave > 0 {
            assert!(after < before, "released capacity leaves the ledger: {before} → {after}");
        }
        old = new;
    }
    for pod in old {
        report.push((pod.name, pod.started, pod.load.stop().await));
    }
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.join().unwrap();
    println!("Σ has at the server peaked at {peak:.1} of {CAPACITY}");
    assert!(peak <= CAPACITY * 1.02, "the server granted {peak} of {CAPACITY}");

    // In its first seconds, a pod refuses under 1% of its requests; past them, nothing.
    for (name, started, requests) in &report {
        let (first, later): (Vec<&Request>, Vec<_>) = requests.iter().partition(|r| r.at < started + FIRST_SECONDS);
        let refused = |rs: &[&Request]| rs.iter().filter(|r| r.status != 200).count();
        let last = first.iter().filter(|r| r.status != 200).map(|r| r.at - started).fold(0.0, f64::max);
        println!(
            "{name}: refused {} of its first {} requests ({FIRST_SECONDS} s, the last {last:.2} s after its start), {} of {} later",
            refused(&first),
            first.len(),
            refused(&later),
            later.len()
        );
        assert!(!later.is_empty(), "{name} ran past its first seconds");
        assert!((refused(&first) as f64) < 0.01 * first.len() as f64, "{name} refused requests in its first seconds");
        assert_eq!(refused(&later), 0, "{name} refused requests past its first seconds");
    }
}
