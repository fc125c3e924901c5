//! The sidecar's configuration (`docs/sidecar.md`).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::Serialize;

use super::{ConfigFile, span, yaml};

/// A sidecar's configuration; without [`SidecarConfig::leasing_from`] it is standalone, and each
/// resource's own capacity applies.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SidecarConfig {
    server: Option<CapacityServers>,
    listeners: Vec<Listener>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    upstreams: Vec<Upstream>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    resources: Vec<Resource>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    rules: Vec<Rule>,
    rate_limit_service: Option<RateLimitService>,
}

impl SidecarConfig {
    pub fn new() -> Self {
        Self::default()
    }

    /// `listener` sending every request to `upstream`: the shape of most tests.
    pub fn proxy(listener: Listener, upstream: Upstream) -> Self {
        let listener = listener.upstream(&upstream.name);
        Self::new().listener(listener).upstream(upstream)
    }

    /// Leases from these capacity servers (in place of the standalone capacities).
    pub fn leasing_from(mut self, servers: impl IntoIterator<Item = SocketAddr>) -> Self {
        let addresses = servers.into_iter().map(|s| s.to_string()).collect();
        self.server = Some(CapacityServers { addresses, tls: None });
        self
    }

    /// TLS toward the capacity servers of [`SidecarConfig::leasing_from`].
    pub fn server_tls(mut self, tls: ServerTls) -> Self {
        self.server.as_mut().expect("leasing_from first").tls = Some(tls);
        self
    }

    pub fn listener(mut self, listener: Listener) -> Self {
        self.listeners.push(listener);
        self
    }

    pub fn upstream(mut self, upstream: Upstream) -> Self {
        self.upstreams.push(upstream);
        self
    }

    pub fn resource(mut self, resource: Resource) -> Self {
        self.resources.push(resource);
        self
    }

    /// The next rule (the first that matches a request wins).
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Envoy's rate limit service (`docs/envoy.md`); `listeners` may then be empty.
    pub fn rate_limit_service(mut self, service: RateLimitService) -> Self {
        self.rate_limit_service = Some(service);
        self
    }

    /// Where the listeners listen, in order.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.listeners.iter().map(|l| l.address).collect()
    }
}

impl ConfigFile for SidecarConfig {
    fn yaml(&self) -> String {
        yaml(self)
    }
}

#[derive(Clone, Debug, Serialize)]
struct CapacityServers {
    addresses: Vec<String>,
    tls: Option<ServerTls>,
}

/// TLS toward the capacity servers: the CA that signs theirs (else the system roots), a client
/// certificate and key for mTLS, the name to verify (else the address's host).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerTls {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub server_name: Option<String>,
}

/// Envoy's rate limit service (RLS v3) on `address`, its limits read from envoyproxy/ratelimit's
/// `files` (relative names from the configuration file's folder).
#[derive(Clone, Debug, Serialize)]
pub struct RateLimitService {
    address: SocketAddr,
    files: Vec<PathBuf>,
    max_requests: Option<usize>,
    max_keys: Option<usize>,
    idle_timeout: Option<String>,
    when_unreachable: Option<Fallback>,
}

impl RateLimitService {
    pub fn new(address: SocketAddr, files: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        RateLimitService {
            address,
            files: files.into_iter().map(Into::into).collect(),
            max_requests: None,
            max_keys: None,
            idle_timeout: None,
            when_unreachable: None,
        }
    }

    /// Calls answered at once; beyond it a call is refused at once.
    pub fn max_requests(mut self, n: usize) -> Self {
        self.max_requests = Some(n);
        self
    }

    /// Keys of each keyed limit (a descriptor without value, or with a wildcard).
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = Some(n);
        self
    }

    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = span(timeout);
        self
    }

    pub fn when_unreachable(mut self, fallback: Fallback) -> Self {
        self.when_unreachable = Some(fallback);
        self
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Listener {
    name: String,
    address: SocketAddr,
    upstream: Option<String>,
    max_connections: Option<usize>,
    max_requests: Option<usize>,
    idle_timeout: Option<String>,
    header_read_timeout: Option<String>,
    send_timeout: Option<String>,
    max_header_bytes: Option<usize>,
}

impl Listener {
    /// A listener without an upstream of its own: it routes by host among the upstreams' `hosts`.
    pub fn new(name: &str, address: SocketAddr) -> Self {
        Listener {
            name: name.into(),
            address,
            upstream: None,
            max_connections: None,
            max_requests: None,
            idle_timeout: None,
            header_read_timeout: None,
            send_timeout: None,
            max_header_bytes: None,
        }
    }

    /// The listener the tests call `app`, on a free port.
    pub fn app() -> Self {
        Self::new("app", ([127, 0, 0, 1], crate::harness::free_port()).into())
    }

    /// Sends every request to the upstream named `name`.
    pub fn upstream(mut self, name: &str) -> Self {
        self.upstream = Some(name.into());
        self
    }

    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = Some(n);
        self
    }

    pub fn max_requests(mut self, n: usize) -> Self {
        self.max_requests = Some(n);
        self
    }

    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = span(timeout);
        self
    }

    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = span(timeout);
        self
    }

    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = span(timeout);
        self
    }

    pub fn max_header_bytes(mut self, bytes: usize) -> Self {
        self.max_header_bytes = Some(bytes);
        self
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Upstream {
    name: String,
    url: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    hosts: Vec<String>,
    ca: Option<PathBuf>,
    timeout: Option<String>,
    body_idle_timeout: Option<String>,
}

impl Upstream {
    /// `url`: `http://` or `https://` with an authority and no path.
    pub fn new(name: &str, url: impl Into<String>) -> Self {
        Upstream {
            name: name.into(),
            url: url.into(),
            hosts: Vec::new(),
            ca: None,
            timeout: None,
            body_idle_timeout: None,
        }
    }

    /// The upstream the tests call `app`: cleartext at `address`.
    pub fn app(address: SocketAddr) -> Self {
        Self::new("app", format!("http://{address}"))
    }

    /// Host names a routing listener sends here.
    pub fn hosts(mut self, hosts: &[&str]) -> Self {
        self.hosts = hosts.iter().map(|h| h.to_string()).collect();
        self
    }

    /// The CA bundle of an `https://` upstream, in place of the system roots.
    pub fn ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(path.into());
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = span(timeout);
        self
    }

    pub fn body_idle_timeout(mut self, timeout: Duration) -> Self {
        self.body_idle_timeout = span(timeout);
        self
    }
}

#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Rate,
    Concurrency,
}

/// What a resource admits while it has no lease (`when_unreachable`).
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    Safe,
    Optimistic,
    Pessimistic,
}

/// The request attribute whose values key a keyed resource.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Per {
    Header(String),
    /// The normalized path's segment, from 0.
    PathSegment(usize),
    Query(String),
    Grpc(GrpcPart),
    Method,
    Host,
}

#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GrpcPart {
    Service,
    Method,
}

/// Metric series of a keyed resource: per resource (the default) or per key.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metrics {
    PerResource,
    PerKey,
}

#[derive(Clone, Debug, Serialize)]
pub struct Resource {
    id: String,
    kind: Option<Kind>,
    capacity: Option<f64>,
    burst: Option<f64>,
    priority: Option<i64>,
    when_unreachable: Option<Fallback>,
    safe_capacity: Option<f64>,
    per: Option<Per>,
    max_keys: Option<usize>,
    idle_timeout: Option<String>,
    metrics: Option<Metrics>,
}

impl Resource {
    /// A rate resource (cost a second); standalone, it needs a [`Resource::capacity`].
    pub fn new(id: &str) -> Self {
        Resource {
            id: id.into(),
            kind: None,
            capacity: None,
            burst: None,
            priority: None,
            when_unreachable: None,
            safe_capacity: None,
            per: None,
            max_keys: None,
            idle_timeout: None,
            metrics: None,
        }
    }

    pub fn kind(mut self, kind: Kind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Standalone: cost units a second, or in flight (a keyed resource's, each key's).
    pub fn capacity(mut self, capacity: f64) -> Self {
        self.capacity = Some(capacity);
        self
    }

    pub fn burst(mut self, burst: f64) -> Self {
        self.burst = Some(burst);
        self
    }

    pub fn priority(mut self, priority: i64) -> Self {
        self.priority = Some(priority);
        self
    }

    pub fn when_unreachable(mut self, fallback: Fallback) -> Self {
        self.when_unreachable = Some(fallback);
        self
    }

    pub fn safe_capacity(mut self, capacity: f64) -> Self {
        self.safe_capacity = Some(capacity);
        self
    }

    /// Keyed: each value of `per` is a resource of its own, `<id>/<key>`.
    pub fn per(mut self, per: Per) -> Self {
        self.per = Some(per);
        self
    }

    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = Some(n);
        self
    }

    /// How long a key may go unused before it is dropped.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = span(timeout);
        self
    }

    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

/// What a rule charges each request.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Cost {
    Units(f64),
    /// Declared by the request in a header; `default` (else 1) when it declares none.
    Header {
        header: String,
        default: Option<f64>,
    },
    /// The bytes of a body (rate resources only).
    Bytes(Body),
}

#[derive(Clone, Copy, Debug, Serialize)]
pub enum Body {
    #[serde(rename = "request_bytes")]
    Request,
    #[serde(rename = "response_bytes")]
    Response,
}

#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnLimit {
    Delay,
    Reject,
    Shadow,
}

#[derive(Clone, Debug, Serialize)]
pub struct Rule {
    name: Option<String>,
    #[serde(rename = "match")]
    matcher: Option<Match>,
    resource: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    also: Vec<String>,
    cost: Option<Cost>,
    max_cost: Option<f64>,
    on_limit: Option<OnLimit>,
    max_wait: Option<String>,
}

impl Rule {
    /// A rule that charges every request to `resource` (unnamed, it goes by its place: `rules[i]`).
    pub fn charging(resource: &str) -> Self {
        Rule {
            name: None,
            matcher: None,
            resource: resource.into(),
            also: Vec::new(),
            cost: None,
            max_cost: None,
            on_limit: None,
            max_wait: None,
        }
    }

    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Charges only the requests `matcher` matches.
    pub fn matching(mut self, matcher: Match) -> Self {
        self.matcher = Some(matcher);
        self
    }

    /// Charges `resource` too.
    pub fn also(mut self, resource: &str) -> Self {
        self.also.push(resource.into());
        self
    }

    pub fn cost(mut self, cost: Cost) -> Self {
        self.cost = Some(cost);
        self
    }

    pub fn max_cost(mut self, cost: f64) -> Self {
        self.max_cost = Some(cost);
        self
    }

    pub fn on_limit(mut self, on_limit: OnLimit) -> Self {
        self.on_limit = Some(on_limit);
        self
    }

    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.max_wait = span(wait);
        self
    }
}

/// What a rule matches: every condition set must hold.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Match {
    listener: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    methods: Vec<String>,
    path: Option<PathMatch>,
    host: Option<String>,
    grpc: Option<Grpc>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    headers: Vec<Header>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
    Glob(String),
}

#[derive(Clone, Debug, Serialize)]
struct Grpc {
    service: Option<String>,
    method: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
struct Header {
    name: String,
    value: String,
}

impl Match {
    pub fn listener(mut self, name: &str) -> Self {
        self.listener = Some(name.into());
        self
    }

    pub fn methods(mut self, methods: &[&str]) -> Self {
        self.methods = methods.iter().map(|m| m.to_string()).collect();
        self
    }

    pub fn path(mut self, path: PathMatch) -> Self {
        self.path = Some(path);
        self
    }

    /// A glob of host names, port excluded.
    pub fn host(mut self, glob: &str) -> Self {
        self.host = Some(glob.into());
        self
    }

    /// A gRPC call of `service`, and of `method` when given.
    pub fn grpc(mut self, service: &str, method: Option<&str>) -> Self {
        self.grpc = Some(Grpc { service: Some(service.into()), method: method.map(Into::into) });
        self
    }

    /// A header of exactly this value.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push(Header { name: name.into(), value: value.into() });
        self
    }
}
