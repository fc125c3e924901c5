//! The sidecar's configuration file (SPEC §4): where it listens, which upstreams it may reach,
//! the resources it leases and the rules that charge requests to them. Parsing validates
//! everything, so a configuration either goes into force whole or not at all.

mod document;
mod rate_limit;
#[cfg(test)]
mod tests;
mod validate;
mod values;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use http::{Method, Uri};
use serde::Deserialize;
use sluice_ratelimit::Domain;

pub use rate_limit::named_files;
pub use validate::{parse, parse_with};

use crate::core::{Capacity, Cost, Fallback, Kind};

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The capacity servers; `None` is standalone mode (local capacities).
    pub server: Option<ServerConfig>,
    pub listeners: Vec<Listener>,
    pub upstreams: Vec<Upstream>,
    /// The file's resources, then those of the rate limit service's limits.
    pub resources: Vec<Resource>,
    pub rules: Vec<Rule>,
    pub rate_limit_service: Option<RateLimitService>,
}

/// Envoy's rate limit service (RLS v3), answered from the leases of the resources its domains'
/// limits become (`sluice_ratelimit`).
#[derive(Clone, Debug)]
pub struct RateLimitService {
    pub address: SocketAddr,
    /// The files as named, for the log and the status page.
    pub files: Vec<PathBuf>,
    /// One per file, each a distinct domain.
    pub domains: Vec<Arc<Domain>>,
    /// Calls answered at once; beyond it a call is refused at once (UNAVAILABLE).
    pub max_requests: usize,
}

/// What the command line says of the capacity servers, in place of the file's settings it names:
/// `--server-addresses` for `server.addresses` (a `server` section without TLS added if the file
/// has none), and each `--server-tls-*` file for that file of `server.tls`, the others kept (the
/// injected sidecar's certificate from cert-manager's CSI driver, under a file's server name).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServerFlags {
    pub addresses: Vec<String>,
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    /// Tried in order; Discovery finds the master among them.
    pub addresses: Vec<String>,
    pub tls: Option<ServerTls>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServerTls {
    /// CA bundle that signs the servers' certificates; the system roots when absent.
    pub ca: Option<PathBuf>,
    /// Client certificate and key for mTLS.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Name to verify in the servers' certificates; the address's host when absent.
    pub server_name: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Listener {
    pub name: String,
    pub address: SocketAddr,
    /// The upstream every request goes to; `None` routes by Host/`:authority` among the
    /// upstreams' `hosts`.
    pub upstream: Option<String>,
    pub max_connections: usize,
    /// Requests in flight at once over all the listener's connections and streams; beyond it
    /// a request is refused at once (503), so that memory stays within its budget.
    pub max_requests: usize,
    pub idle_timeout: Duration,
    pub header_read_timeout: Duration,
    /// How long a response, or an HTTP/2 stream's, may wait for the application to take more.
    pub send_timeout: Duration,
    pub max_header_bytes: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Upstream {
    pub name: String,
    /// `http://` or `https://` with an authority and no path.
    pub url: Uri,
    /// Host names (without port, lower case) a routing listener sends here.
    pub hosts: Vec<String>,
    /// Extra CA bundle for an `https://` upstream, used instead of the system roots.
    pub ca: Option<PathBuf>,
    /// Whole-request timeout toward the upstream (until response headers); none by default.
    pub timeout: Option<Duration>,
    /// How long a response body from the upstream may send nothing before it is cut off.
    pub body_idle_timeout: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    pub id: String,
    pub kind: Kind,
    /// Standalone mode's capacity (requests or cost units per second, or in-flight).
    pub capacity: Option<Capacity>,
    pub burst: Burst,
    pub priority: i64,
    pub when_unreachable: Fallback,
    /// Capacity under `safe` before any server has named one; `None`: no limit.
    pub safe_capacity: Option<Capacity>,
    /// A keyed resource: each value of a request attribute is a resource of its own.
    pub key: Option<KeySpec>,
}

/// A rate resource's token bucket depth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Burst {
    /// [`crate::defaults::BURST_SECONDS`] of the rate in force, at least 2.
    Default,
    /// `burst:` as configured, above 0.
    Depth(Cost),
    /// This many seconds of the rate in force, at least 1: a rate limit service's limit, whose
    /// buckets over the fleet hold one unit's allowance (`sluice_ratelimit::Quota::window`).
    Window(f64),
}

/// How a keyed resource makes its keys (see [`crate::core::KeyTable`]).
#[derive(Clone, Debug, PartialEq)]
pub struct KeySpec {
    pub per: KeyAttribute,
    /// Most keys of values held at once; values beyond share one overflow key.
    pub max_keys: usize,
    /// A key unused this long is dropped and its lease released.
    pub idle_timeout: Duration,
    /// Metric series per key (opt-in: clients choose the values), else per keyed resource.
    pub per_key_metrics: bool,
}

/// The request attribute whose value names the key.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyAttribute {
    /// The header's first value.
    Header(http::HeaderName),
    /// The normalized path's segment, 0 for the first after the leading `/`.
    PathSegment(usize),
    /// The query parameter's first value, form-decoded.
    Query(String),
    GrpcService,
    GrpcMethod,
    Method,
    /// Lower case, without port.
    Host,
    /// What a rate limit service call's descriptor matched with its open entries
    /// (`sluice_ratelimit::Found::key`); no HTTP rule charges such a resource.
    Descriptor,
}

#[derive(Clone, Debug)]
pub struct Rule {
    pub name: String,
    pub matcher: Match,
    /// The resource the rule charges first, then its `also` resources.
    pub resources: Vec<String>,
    pub cost: CostRule,
    pub on_limit: OnLimit,
    pub max_wait: Duration,
}

#[derive(Clone, Debug, Default)]
pub struct Match {
    pub listener: Option<String>,
    pub methods: Vec<Method>,
    pub path: Option<PathMatch>,
    /// Lower-case host glob, port excluded.
    pub host: Option<globset::GlobMatcher>,
    pub grpc_service: Option<String>,
    pub grpc_method: Option<String>,
    /// Header name (lower case) and exact value.
    pub headers: Vec<(http::HeaderName, String)>,
}

#[derive(Clone, Debug)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
    Glob(globset::GlobMatcher),
}

/// What a rule charges each request.
#[derive(Clone, Debug, PartialEq)]
pub enum CostRule {
    Constant(Cost),
    /// Declared by the request in a header; `default` when it is absent or not a non-negative
    /// number. A declared cost above `max` (`None`: what each charged resource takes at once,
    /// see [`Limiter::largest_cost`](crate::core::Limiter::largest_cost)) is refused.
    Header {
        name: http::HeaderName,
        default: Cost,
        max: Option<Cost>,
    },
    /// The bytes of the request's or the response's body (`request_bytes`, `response_bytes`;
    /// rate resources only): see [`crate::metered`]. `max` bounds a request's Content-Length,
    /// charged up front, and the debt a body's bytes charged after the fact may leave (`None`:
    /// what each resource takes at once, its burst).
    Bytes {
        of: Side,
        max: Option<Cost>,
    },
}

/// Which body a rule's cost in bytes counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Request,
    Response,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnLimit {
    Delay,
    Reject,
    Shadow,
}

/// The unit tests' configuration: one listener `l` in front of upstream `u`, then `rest`
/// (YAML of `resources` and `rules`).
#[cfg(test)]
pub fn for_test(rest: &str) -> Config {
    let listener = "listeners:\n  - {name: l, address: 127.0.0.1:1, upstream: u}\n";
    let upstream = "upstreams:\n  - {name: u, url: http://127.0.0.1:2}\n";
    parse(&format!("{listener}{upstream}{rest}")).unwrap_or_else(|e| panic!("{e}:\n{rest}"))
}

impl Config {
    /// The listeners are bound and the servers connected at start; a reload may change
    /// everything else, a listener's upstream and timeouts included.
    pub fn restart_needed(&self, next: &Config) -> Option<String> {
        let binds = |c: &Config| {
            c.listeners
                .iter()
                .map(|l| (l.name.clone(), l.address, l.max_connections, l.max_requests))
                .collect::<Vec<_>>()
        };
        if binds(self) != binds(next) {
            return Some(
                "listener names, addresses, max_connections or max_requests changed; they take effect at restart"
                    .into(),
            );
        }
        if self.server != next.server {
            return Some("the `server` section changed; it takes effect at restart".into());
        }
        let serving = |c: &Config| c.rate_limit_service.as_ref().map(|s| (s.address, s.max_requests));
        if serving(self) != serving(next) {
            return Some(
                "rate_limit_service: whether it is served, its address or max_requests changed; they take effect at restart"
                    .into(),
            );
        }
        None
    }

    pub fn resource(&self, id: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.id == id)
    }
}
