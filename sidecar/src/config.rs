//! The sidecar's configuration file (SPEC §4): where it listens, which upstreams it may reach,
//! the resources it leases and the rules that charge requests to them. Parsing validates
//! everything, so a configuration either goes into force whole or not at all.

use std::{collections::HashSet, net::SocketAddr, path::PathBuf, time::Duration};

use http::{Method, Uri, uri::Scheme};
use serde::Deserialize;
use sluice_client::defaults::{MAX_ID_BYTES, MAX_RESOURCES_PER_REQUEST};

use crate::{
    canonical,
    core::{Capacity, Cost, Fallback, Kind, MAX_AMOUNT},
    defaults,
};

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The capacity servers; `None` is standalone mode (local capacities).
    pub server: Option<ServerConfig>,
    pub listeners: Vec<Listener>,
    pub upstreams: Vec<Upstream>,
    pub resources: Vec<Resource>,
    pub rules: Vec<Rule>,
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
    /// Token bucket depth, above 0; `None`: [`defaults::BURST_SECONDS`] of the current rate.
    pub burst: Option<Cost>,
    pub priority: i64,
    pub when_unreachable: Fallback,
    /// Capacity under `safe` before any server has named one; `None`: no limit.
    pub safe_capacity: Option<Capacity>,
    /// A keyed resource: each value of a request attribute is a resource of its own.
    pub key: Option<KeySpec>,
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

// ---- The file as written -------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    server: Option<ServerDoc>,
    listeners: Vec<ListenerDoc>,
    #[serde(default)]
    upstreams: Vec<UpstreamDoc>,
    #[serde(default)]
    resources: Vec<ResourceDoc>,
    #[serde(default)]
    rules: Vec<RuleDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerDoc {
    addresses: Vec<String>,
    tls: Option<ServerTlsDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerTlsDoc {
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    server_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListenerDoc {
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamDoc {
    name: String,
    url: String,
    #[serde(default)]
    hosts: Vec<String>,
    ca: Option<PathBuf>,
    timeout: Option<String>,
    body_idle_timeout: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceDoc {
    id: String,
    #[serde(default)]
    kind: KindDoc,
    capacity: Option<f64>,
    burst: Option<f64>,
    #[serde(default)]
    priority: i64,
    #[serde(default)]
    when_unreachable: FallbackDoc,
    safe_capacity: Option<f64>,
    per: Option<PerDoc>,
    max_keys: Option<usize>,
    idle_timeout: Option<String>,
    metrics: Option<MetricsDoc>,
}

/// `method`, `host`, or a map with exactly one of the attributes.
#[derive(Deserialize)]
#[serde(untagged)]
enum PerDoc {
    Named(PerNameDoc),
    Attribute(PerAttributeDoc),
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum PerNameDoc {
    Method,
    Host,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PerAttributeDoc {
    header: Option<String>,
    path_segment: Option<usize>,
    query: Option<String>,
    grpc: Option<GrpcPartDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum GrpcPartDoc {
    Service,
    Method,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum MetricsDoc {
    PerResource,
    PerKey,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "snake_case")]
enum KindDoc {
    #[default]
    Rate,
    Concurrency,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "snake_case")]
enum FallbackDoc {
    #[default]
    Safe,
    Optimistic,
    Pessimistic,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleDoc {
    name: Option<String>,
    #[serde(default, rename = "match")]
    matcher: MatchDoc,
    resource: String,
    #[serde(default)]
    also: Vec<String>,
    #[serde(default)]
    cost: CostDoc,
    max_cost: Option<f64>,
    on_limit: Option<OnLimit>,
    max_wait: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct MatchDoc {
    listener: Option<String>,
    #[serde(default)]
    methods: Vec<String>,
    path: Option<PathDoc>,
    host: Option<String>,
    grpc: Option<GrpcDoc>,
    #[serde(default)]
    headers: Vec<HeaderDoc>,
}

/// Exactly one of the three.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathDoc {
    exact: Option<String>,
    prefix: Option<String>,
    glob: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrpcDoc {
    service: Option<String>,
    method: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderDoc {
    name: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum CostDoc {
    Constant(f64),
    Header {
        header: String,
        #[serde(default = "one")]
        default: f64,
    },
    Bytes(BytesDoc),
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum BytesDoc {
    RequestBytes,
    ResponseBytes,
}

impl Default for CostDoc {
    fn default() -> Self {
        CostDoc::Constant(1.0)
    }
}

fn one() -> f64 {
    1.0
}

// ---- Validation -------------------------------------------------------------------------------

/// Parses and validates a configuration; the error is one line naming what is wrong and where.
pub fn parse(text: &str) -> Result<Config, String> {
    parse_with(text, &[])
}

/// [`parse`], with `servers` (when not empty) in place of the file's `server.addresses`
/// (`--server-addresses`), a `server` section without TLS added if the file has none.
pub fn parse_with(text: &str, servers: &[String]) -> Result<Config, String> {
    let mut doc: Document = yaml_serde::from_str(text).map_err(|e| e.to_string().replace('\n', " "))?;
    if !servers.is_empty() {
        let section = doc.server.get_or_insert_with(|| ServerDoc { addresses: Vec::new(), tls: None });
        section.addresses = servers.to_vec();
    }
    let server = doc.server.map(server).transpose()?;
    let upstreams =
        doc.upstreams.into_iter().enumerate().map(|(i, u)| upstream(i, u)).collect::<Result<Vec<_>, _>>()?;
    unique("upstreams", upstreams.iter().map(|u| u.name.as_str()))?;
    let mut hosts = HashSet::new();
    for u in &upstreams {
        if let Some(h) = u.hosts.iter().find(|h| !hosts.insert(h.as_str())) {
            return Err(format!("upstreams: host {h:?} is routed to more than one upstream"));
        }
    }
    if doc.listeners.is_empty() {
        return Err("listeners: at least one listener is required".into());
    }
    let listeners = doc
        .listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| listener(i, l, &upstreams))
        .collect::<Result<Vec<_>, _>>()?;
    unique("listeners", listeners.iter().map(|l| l.name.as_str()))?;
    if let Some(dup) = duplicate(listeners.iter().map(|l| l.address)) {
        return Err(format!("listeners: address {dup} is used twice"));
    }
    let resources = doc
        .resources
        .into_iter()
        .enumerate()
        .map(|(i, r)| resource(i, r, server.is_none()))
        .collect::<Result<Vec<_>, _>>()?;
    unique("resources", resources.iter().map(|r| r.id.as_str()))?;
    keyed_ids(&resources, server.is_some())?;
    let rules = doc
        .rules
        .into_iter()
        .enumerate()
        .map(|(i, r)| rule(i, r, &listeners, &resources))
        .collect::<Result<Vec<_>, _>>()?;
    // A name is how an operator refers to a rule; two rules of one name are a mistake.
    unique("rules", rules.iter().map(|r| r.name.as_str()))?;
    Ok(Config { server, listeners, upstreams, resources, rules })
}

fn server(doc: ServerDoc) -> Result<ServerConfig, String> {
    if doc.addresses.is_empty() {
        return Err("server.addresses: at least one address is required (omit `server` for standalone mode)".into());
    }
    for a in &doc.addresses {
        sluice_runtime::cli::host_port(a).map_err(|why| format!("server.addresses: {why}"))?;
    }
    let tls = doc.tls.map(|t| {
        if t.cert.is_some() != t.key.is_some() {
            return Err("server.tls: cert and key go together".to_owned());
        }
        Ok(ServerTls { ca: t.ca, cert: t.cert, key: t.key, server_name: t.server_name })
    });
    Ok(ServerConfig { addresses: doc.addresses, tls: tls.transpose()? })
}

fn upstream(i: usize, doc: UpstreamDoc) -> Result<Upstream, String> {
    let at = |field: &str| format!("upstreams[{i}] ({}).{field}", doc.name);
    let url: Uri = doc.url.parse().map_err(|e| format!("{}: {:?}: {e}", at("url"), doc.url))?;
    let scheme_ok = url.scheme() == Some(&Scheme::HTTP) || url.scheme() == Some(&Scheme::HTTPS);
    if !scheme_ok || url.authority().is_none() {
        return Err(format!("{}: {:?} must be http://host[:port] or https://host[:port]", at("url"), doc.url));
    }
    if !matches!(url.path(), "" | "/") || url.query().is_some() {
        return Err(format!("{}: {:?} must not have a path; requests keep theirs", at("url"), doc.url));
    }
    if doc.ca.is_some() && url.scheme() != Some(&Scheme::HTTPS) {
        return Err(format!("{}: a CA applies to https:// upstreams only", at("ca")));
    }
    let hosts = doc.hosts.iter().map(|h| canonical::host_name(h).into_owned()).collect();
    let timeout = doc.timeout.as_deref().map(|t| duration(t, &at("timeout"))).transpose()?;
    let body_idle_timeout = doc
        .body_idle_timeout
        .as_deref()
        .map_or(Ok(defaults::UPSTREAM_BODY_IDLE_TIMEOUT), |t| duration(t, &at("body_idle_timeout")))?;
    Ok(Upstream { name: doc.name, url, hosts, ca: doc.ca, timeout, body_idle_timeout })
}

fn listener(i: usize, doc: ListenerDoc, upstreams: &[Upstream]) -> Result<Listener, String> {
    let at = |field: &str| format!("listeners[{i}] ({}).{field}", doc.name);
    match &doc.upstream {
        Some(name) if !upstreams.iter().any(|u| &u.name == name) => {
            return Err(format!("{}: no upstream named {name:?}", at("upstream")));
        }
        None if upstreams.iter().all(|u| u.hosts.is_empty()) => {
            return Err(format!("{}: required unless some upstream lists `hosts` to route by Host", at("upstream")));
        }
        _ => {}
    }
    let timeout = |value: &Option<String>, field: &str, default: Duration| {
        value.as_deref().map_or(Ok(default), |t| duration(t, &at(field)))
    };
    let count = |value: Option<usize>, field: &str, default: usize, limit: usize| match value {
        Some(n) if n == 0 || n > limit => Err(format!("{}: must be from 1 to {limit}", at(field))),
        v => Ok(v.unwrap_or(default)),
    };
    Ok(Listener {
        max_connections: count(
            doc.max_connections,
            "max_connections",
            defaults::MAX_CONNECTIONS,
            defaults::MAX_CONNECTIONS_LIMIT,
        )?,
        max_requests: count(doc.max_requests, "max_requests", defaults::MAX_REQUESTS, defaults::MAX_REQUESTS_LIMIT)?,
        idle_timeout: timeout(&doc.idle_timeout, "idle_timeout", defaults::IDLE_TIMEOUT)?,
        header_read_timeout: timeout(&doc.header_read_timeout, "header_read_timeout", defaults::HEADER_READ_TIMEOUT)?,
        send_timeout: timeout(&doc.send_timeout, "send_timeout", defaults::SEND_TIMEOUT)?,
        max_header_bytes: count(
            doc.max_header_bytes,
            "max_header_bytes",
            defaults::MAX_HEADER_BYTES,
            defaults::MAX_HEADER_BYTES_LIMIT,
        )?,
        name: doc.name,
        address: doc.address,
        upstream: doc.upstream,
    })
}

fn resource(i: usize, doc: ResourceDoc, standalone: bool) -> Result<Resource, String> {
    let at = |field: &str| format!("resources[{i}] ({}).{field}", doc.id);
    if doc.id.is_empty() {
        return Err(format!("resources[{i}].id: must not be empty"));
    }
    let capacity = |value: Option<f64>, field: &str| {
        value
            .map(|v| {
                Capacity::new(v)
                    .ok_or_else(|| format!("{}: must be a number from 0 to {MAX_AMOUNT:e}, or .inf", at(field)))
            })
            .transpose()
    };
    let standalone_capacity = capacity(doc.capacity, "capacity")?;
    if standalone && standalone_capacity.is_none() {
        return Err(format!("{}: required in standalone mode (no `server`)", at("capacity")));
    }
    let burst = doc.burst.map(|b| amount(b, &at("burst"))).transpose()?;
    let key = match &doc.per {
        None => match (doc.max_keys, &doc.idle_timeout, &doc.metrics) {
            (None, None, None) => None,
            _ => return Err(format!("{}: max_keys, idle_timeout and metrics need `per`", at("per"))),
        },
        Some(per) => Some(key_spec(per, &doc, &at)?),
    };
    Ok(Resource {
        key,
        kind: match doc.kind {
            KindDoc::Rate => Kind::Rate,
            KindDoc::Concurrency => Kind::Concurrency,
        },
        capacity: standalone_capacity,
        burst,
        priority: doc.priority,
        when_unreachable: match doc.when_unreachable {
            FallbackDoc::Safe => Fallback::Safe,
            FallbackDoc::Optimistic => Fallback::Optimistic,
            FallbackDoc::Pessimistic => Fallback::Pessimistic,
        },
        safe_capacity: capacity(doc.safe_capacity, "safe_capacity")?,
        id: doc.id,
    })
}

fn key_spec(per: &PerDoc, doc: &ResourceDoc, at: &dyn Fn(&str) -> String) -> Result<KeySpec, String> {
    let per = match per {
        PerDoc::Named(PerNameDoc::Method) => KeyAttribute::Method,
        PerDoc::Named(PerNameDoc::Host) => KeyAttribute::Host,
        PerDoc::Attribute(a) => match (&a.header, a.path_segment, &a.query, &a.grpc) {
            (Some(name), None, None, None) => KeyAttribute::Header(
                http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("{}: {name:?} is not a header name", at("per.header")))?,
            ),
            (None, Some(n), None, None) => KeyAttribute::PathSegment(n),
            (None, None, Some(name), None) if name.is_empty() => {
                return Err(format!("{}: must not be empty", at("per.query")));
            }
            (None, None, Some(name), None) => KeyAttribute::Query(name.clone()),
            (None, None, None, Some(GrpcPartDoc::Service)) => KeyAttribute::GrpcService,
            (None, None, None, Some(GrpcPartDoc::Method)) => KeyAttribute::GrpcMethod,
            _ => {
                return Err(format!(
                    "{}: give exactly one of header, path_segment, query or grpc (or `method`, `host`)",
                    at("per")
                ));
            }
        },
    };
    let max_keys = match doc.max_keys {
        Some(n) if n == 0 || n > MAX_RESOURCES_PER_REQUEST => {
            return Err(format!("{}: must be from 1 to {MAX_RESOURCES_PER_REQUEST}", at("max_keys")));
        }
        n => n.unwrap_or(defaults::MAX_KEYS),
    };
    let per_key_metrics = matches!(doc.metrics, Some(MetricsDoc::PerKey));
    if per_key_metrics && max_keys > defaults::MAX_KEYS_WITH_SERIES {
        return Err(format!(
            "{}: at most {} with `metrics: per_key` (every live key is {} series on /metrics)",
            at("max_keys"),
            defaults::MAX_KEYS_WITH_SERIES,
            defaults::SERIES_PER_KEY
        ));
    }
    // The shared keys' ids must fit, and a value's key should have some room.
    if doc.id.len() + 1 + defaults::MIN_KEY_BYTES > MAX_ID_BYTES {
        let most = MAX_ID_BYTES - 1 - defaults::MIN_KEY_BYTES;
        return Err(format!("{}: a keyed resource's id is at most {most} bytes, to leave room for its keys", at("id")));
    }
    Ok(KeySpec {
        per,
        max_keys,
        idle_timeout: doc
            .idle_timeout
            .as_deref()
            .map_or(Ok(defaults::KEY_IDLE_TIMEOUT), |t| duration(t, &at("idle_timeout")))?,
        per_key_metrics,
    })
}

/// A key's id, `<keyed id>/<key>`, must name no other resource; and with a server, every id the
/// sidecar may hold at once must fit in one GetCapacity request.
fn keyed_ids(resources: &[Resource], leasing: bool) -> Result<(), String> {
    for keyed in resources.iter().filter(|r| r.key.is_some()) {
        let prefix = format!("{}/", keyed.id);
        if let Some(other) = resources.iter().find(|r| r.id.starts_with(&prefix)) {
            return Err(format!("resources ({}).id: could be a key of the keyed resource {:?}", other.id, keyed.id));
        }
    }
    // Each keyed resource may also hold its two shared keys (no value, overflow).
    let ids: usize = resources.iter().map(|r| r.key.as_ref().map_or(1, |k| k.max_keys + 2)).sum();
    if leasing && ids > MAX_RESOURCES_PER_REQUEST {
        return Err(format!(
            "resources: up to {ids} ids (each keyed resource's max_keys + 2 shared keys, one per other resource), \
             but one GetCapacity request names at most {MAX_RESOURCES_PER_REQUEST}: lower max_keys"
        ));
    }
    Ok(())
}

fn rule(i: usize, doc: RuleDoc, listeners: &[Listener], resources: &[Resource]) -> Result<Rule, String> {
    let name = doc.name.unwrap_or_else(|| format!("rules[{i}]"));
    let at = |field: &str| format!("rules[{i}] ({name}).{field}");
    let mut charged = vec![doc.resource];
    charged.extend(doc.also);
    for id in &charged {
        if !resources.iter().any(|r| &r.id == id) {
            return Err(format!("{}: {id:?} is not a declared resource", at("resource")));
        }
    }
    if let Some(dup) = duplicate(charged.iter()) {
        return Err(format!("{}: {dup:?} is charged twice", at("also")));
    }
    let m = doc.matcher;
    if let Some(l) = &m.listener
        && !listeners.iter().any(|x| &x.name == l)
    {
        return Err(format!("{}: no listener named {l:?}", at("match.listener")));
    }
    let methods = m
        .methods
        .iter()
        .map(|x| Method::from_bytes(x.to_ascii_uppercase().as_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", at("match.methods")))?;
    let glob = |text: &str, field: &str| {
        globset::GlobBuilder::new(text)
            .literal_separator(false)
            .build()
            .map(|g| g.compile_matcher())
            .map_err(|e| format!("{}: {e}", at(field)))
    };
    let path = match m.path.map(|p| (p.exact, p.prefix, p.glob)) {
        None => None,
        // Requests are matched by their normalized path, so the rule's is normalized too.
        Some((Some(p), None, None)) => Some(PathMatch::Exact(canonical::path(&p).into_owned())),
        Some((None, Some(p), None)) => Some(PathMatch::Prefix(canonical::path(&p).into_owned())),
        Some((None, None, Some(p))) => Some(PathMatch::Glob(glob(&p, "match.path.glob")?)),
        Some(_) => return Err(format!("{}: give exactly one of exact, prefix or glob", at("match.path"))),
    };
    let host = m.host.map(|h| glob(&h.to_ascii_lowercase(), "match.host")).transpose()?;
    let headers = m
        .headers
        .into_iter()
        .map(|h| {
            http::HeaderName::from_bytes(h.name.as_bytes())
                .map(|n| (n, h.value))
                .map_err(|_| format!("{}: {:?} is not a header name", at("match.headers"), h.name))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (grpc_service, grpc_method) = m.grpc.map_or((None, None), |g| (g.service, g.method));
    let cost_of = |value: f64, field: &str| {
        Cost::new(value).ok_or_else(|| format!("{}: must be a number from 0 to {MAX_AMOUNT:e}", at(field)))
    };
    let max = doc.max_cost.map(|m| amount(m, &at("max_cost"))).transpose()?;
    let cost = match doc.cost {
        CostDoc::Constant(_) if max.is_some() => {
            return Err(format!("{}: bounds a cost read from a header only, or in bytes", at("max_cost")));
        }
        CostDoc::Constant(c) => CostRule::Constant(cost_of(c, "cost")?),
        CostDoc::Header { header, default } => {
            let default = cost_of(default, "cost.default")?;
            if max.is_some_and(|max| default > max) {
                return Err(format!("{}: is above max_cost", at("cost.default")));
            }
            CostRule::Header {
                name: http::HeaderName::from_bytes(header.as_bytes())
                    .map_err(|_| format!("{}: {header:?} is not a header name", at("cost.header")))?,
                default,
                max,
            }
        }
        CostDoc::Bytes(of) => {
            // Bytes a second: a semaphore would hold a body's bytes until its response ended.
            let held = resources.iter().find(|r| r.kind == Kind::Concurrency && charged.contains(&r.id));
            if let Some(r) = held {
                return Err(format!(
                    "{}: bytes are charged to rate resources only (bytes a second); {:?} is a concurrency resource",
                    at("cost"),
                    r.id
                ));
            }
            let of = match of {
                BytesDoc::RequestBytes => Side::Request,
                BytesDoc::ResponseBytes => Side::Response,
            };
            CostRule::Bytes { of, max }
        }
    };
    let on_limit = doc.on_limit.unwrap_or(OnLimit::Reject);
    let max_wait = match doc.max_wait.as_deref() {
        None => defaults::MAX_WAIT,
        Some(t) => within_limit(t, &at("max_wait"))?,
    };
    if on_limit == OnLimit::Delay && max_wait.is_zero() {
        return Err(format!("{}: `on_limit: delay` needs a max_wait above 0", at("max_wait")));
    }
    Ok(Rule {
        matcher: Match { listener: m.listener, methods, path, host, grpc_service, grpc_method, headers },
        resources: charged,
        cost,
        on_limit,
        max_wait,
        name,
    })
}

/// A duration setting: at most [`defaults::MAX_SETTING_DURATION`].
fn within_limit(text: &str, at: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d > defaults::MAX_SETTING_DURATION => {
            Err(format!("{at}: must be at most {}", humantime::format_duration(defaults::MAX_SETTING_DURATION)))
        }
        Ok(d) => Ok(d),
        Err(e) => Err(format!("{at}: {text:?}: {e}")),
    }
}

/// A timeout: above 0 and at most [`defaults::MAX_SETTING_DURATION`].
fn duration(text: &str, at: &str) -> Result<Duration, String> {
    match within_limit(text, at)? {
        d if d.is_zero() => Err(format!("{at}: must be greater than 0")),
        d => Ok(d),
    }
}

/// An amount that must be above 0 (a burst, a bound on costs).
fn amount(value: f64, at: &str) -> Result<Cost, String> {
    Cost::new(value)
        .filter(|c| c.get() > 0.0)
        .ok_or_else(|| format!("{at}: must be a number above 0, at most {MAX_AMOUNT:e}"))
}

fn unique<'a>(what: &str, names: impl Iterator<Item = &'a str>) -> Result<(), String> {
    match duplicate(names) {
        Some(name) => Err(format!("{what}: {name:?} is defined twice")),
        None => Ok(()),
    }
}

fn duplicate<T: Eq + std::hash::Hash>(items: impl Iterator<Item = T>) -> Option<T> {
    let mut seen = HashSet::new();
    for item in items {
        if seen.contains(&item) {
            return Some(item);
        }
        seen.insert(item);
    }
    None
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
        None
    }

    pub fn resource(&self, id: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_configurations_are_valid() {
        let example = parse(include_str!("../../deploy/examples/sidecar.yaml")).expect("example");
        assert_eq!(example.rules[0].resources, ["orders.write", "orders.all"]);
        assert_eq!(example.rules[0].on_limit, OnLimit::Delay);
        let embedded = parse(defaults::EMBEDDED_CONFIG).expect("embedded default");
        assert!(embedded.server.is_none() && embedded.resources[0].capacity == Capacity::new(100.0));
    }

    #[test]
    fn server_addresses_from_the_flag_replace_the_files() {
        let servers = ["leaf.sluice:7777".to_owned()];
        let example = parse_with(include_str!("../../deploy/examples/sidecar.yaml"), &servers).expect("example");
        assert_eq!(example.server.expect("leasing").addresses, servers);
        // A standalone file leases from them too; its capacities are then not required.
        let standalone = "listeners: [{name: l, address: 127.0.0.1:1, upstream: u}]\n\
                          upstreams: [{name: u, url: http://127.0.0.1:2}]\nresources: [{id: r}]\n";
        assert!(parse(standalone).is_err());
        let leasing = parse_with(standalone, &servers).expect("leasing");
        assert_eq!(leasing.server, Some(ServerConfig { addresses: servers.to_vec(), tls: None }));
    }

    #[test]
    fn errors_name_the_item_and_field() {
        let base = "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    upstream: u\n\
                    upstreams:\n  - name: u\n    url: http://127.0.0.1:2\n";
        let cases = [
            ("resources:\n  - id: r\n", "resources[0] (r).capacity: required in standalone mode"),
            (
                "resources:\n  - id: r\n    capacity: -1\n",
                "resources[0] (r).capacity: must be a number from 0 to 1e15, or .inf",
            ),
            (
                "resources:\n  - id: r\n    capacity: 1\nrules:\n  - resource: x\n",
                "rules[0] (rules[0]).resource: \"x\" is not a declared resource",
            ),
            (
                "resources:\n  - id: r\n    capacity: 1\nrules:\n  - resource: r\n    on_limit: delay\n",
                "`on_limit: delay` needs a max_wait above 0",
            ),
            (
                "resources:\n  - id: r\n    capacity: 1\nrules:\n  - resource: r\n    also: [r]\n",
                "\"r\" is charged twice",
            ),
            (
                "resources:\n  - id: r\n    capacity: 1\n  - id: r\n    capacity: 2\n",
                "resources: \"r\" is defined twice",
            ),
            (
                "resources:\n  - id: r\n    capacity: 1\nrules:\n  - {name: a, resource: r}\n  - {name: a, resource: r}\n",
                "rules: \"a\" is defined twice",
            ),
        ];
        for (tail, expected) in cases {
            let error = parse(&format!("{base}{tail}")).expect_err(tail);
            assert!(error.contains(expected), "{error:?} should contain {expected:?}");
        }
        let bad_url = base.replace("http://127.0.0.1:2", "ftp://x");
        assert!(parse(&bad_url).unwrap_err().contains("must be http://host[:port] or https://host[:port]"));
        let path_url = base.replace("http://127.0.0.1:2", "http://x/base");
        assert!(parse(&path_url).unwrap_err().contains("must not have a path"));
    }

    #[test]
    fn every_duration_and_amount_has_a_limit() {
        let listener = |extra: &str| {
            format!(
                "listeners:\n  - {{name: l, address: 127.0.0.1:1, upstream: u{extra}}}\n\
                 upstreams:\n  - {{name: u, url: http://127.0.0.1:2}}\n"
            )
        };
        let with = |resource: &str, rule: &str| {
            format!("{}resources:\n  - {{id: r, {resource}}}\nrules:\n  - {{resource: r{rule}}}\n", listener(""))
        };
        let cases = [
            (listener(", idle_timeout: 25h"), "listeners[0] (l).idle_timeout: must be at most 1day"),
            (listener(", header_read_timeout: 0s"), "listeners[0] (l).header_read_timeout: must be greater than 0"),
            (listener(", send_timeout: 300000000000years"), "listeners[0] (l).send_timeout: must be at most 1day"),
            (listener(", max_connections: 1000001"), "listeners[0] (l).max_connections: must be from 1 to 1000000"),
            (listener(", max_requests: 0"), "listeners[0] (l).max_requests: must be from 1 to 1000000"),
            (listener(", max_header_bytes: 2000000"), "listeners[0] (l).max_header_bytes: must be from 1 to 1048576"),
            (
                listener("").replace("http://127.0.0.1:2", "http://127.0.0.1:2, timeout: 2days"),
                "upstreams[0] (u).timeout: must be at most 1day",
            ),
            (
                listener("").replace("http://127.0.0.1:2", "http://127.0.0.1:2, body_idle_timeout: 0s"),
                "upstreams[0] (u).body_idle_timeout: must be greater than 0",
            ),
            (with("capacity: 1e300", ""), "resources[0] (r).capacity: must be a number from 0 to 1e15, or .inf"),
            (with("capacity: 1, safe_capacity: .nan", ""), "resources[0] (r).safe_capacity: must be a number from 0"),
            (with("capacity: 1, burst: .inf", ""), "resources[0] (r).burst: must be a number above 0, at most 1e15"),
            (with("capacity: 1", ", cost: 1e16"), "rules[0] (rules[0]).cost: must be a number from 0 to 1e15"),
            (
                with("capacity: 1", ", cost: {header: x-cost, default: -1}"),
                "rules[0] (rules[0]).cost.default: must be a number from 0 to 1e15",
            ),
            (
                with("capacity: 1", ", cost: 2, max_cost: 5"),
                "rules[0] (rules[0]).max_cost: bounds a cost read from a header only",
            ),
            (
                format!(
                    "{}resources:\n  - {{id: r, capacity: 1}}\n  - {{id: p, kind: concurrency, capacity: 1}}\n\
                     rules:\n  - {{resource: r, also: [p], cost: request_bytes}}\n",
                    listener("")
                ),
                "rules[0] (rules[0]).cost: bytes are charged to rate resources only (bytes a second); \"p\" is a \
                 concurrency resource",
            ),
            (
                with("capacity: 1", ", cost: {header: x-cost, default: 6}, max_cost: 5"),
                "rules[0] (rules[0]).cost.default: is above max_cost",
            ),
            (
                with("capacity: 1", ", cost: {header: x-cost}, max_cost: 0"),
                "rules[0] (rules[0]).max_cost: must be a number above 0",
            ),
            (
                with("capacity: 1", ", on_limit: delay, max_wait: 300000000000years"),
                "rules[0] (rules[0]).max_wait: must be at most 1day",
            ),
        ];
        for (yaml, expected) in cases {
            let error = parse(&yaml).expect_err(&yaml);
            assert!(error.contains(expected), "{error:?} should contain {expected:?}");
        }
        // At the limits, and the smallest capacities, all is well.
        let fine =
            with("capacity: 1e-25, burst: 1e15, safe_capacity: .inf", ", cost: {header: x-cost}, max_cost: 1e15")
                .replace(
                    "upstream: u}",
                    "upstream: u, idle_timeout: 1day, send_timeout: 24h, max_connections: 1000000}",
                );
        let config = parse(&fine).expect("within the limits");
        assert_eq!(config.resources[0].capacity, Capacity::new(1e-25));
        assert_eq!(config.listeners[0].send_timeout, defaults::MAX_SETTING_DURATION);
        assert_eq!(config.upstreams[0].body_idle_timeout, defaults::UPSTREAM_BODY_IDLE_TIMEOUT);
        let CostRule::Header { max, default, .. } = &config.rules[0].cost else { panic!("a header cost") };
        assert_eq!((*max, *default), (Some(Cost::MAX), Cost::ONE));
        for (cost, of) in [("request_bytes", Side::Request), ("response_bytes", Side::Response)] {
            let config = parse(&with("capacity: 1", &format!(", cost: {cost}, max_cost: 65536"))).expect(cost);
            assert_eq!(config.rules[0].cost, CostRule::Bytes { of, max: Cost::new(65536.0) });
        }
    }

    #[test]
    fn keyed_resources_are_checked() {
        let with = |server: &str, resources: &str| {
            format!(
                "{server}listeners:\n  - {{name: l, address: 127.0.0.1:1, upstream: u}}\n\
                 upstreams:\n  - {{name: u, url: http://127.0.0.1:2}}\nresources:\n{resources}"
            )
        };
        let standalone = |resources: &str| with("", resources);
        let leasing = |resources: &str| with("server: {addresses: [\"127.0.0.1:3\"]}\n", resources);
        let long = "x".repeat(960);
        let cases = [
            (
                standalone("  - {id: k, capacity: 1, max_keys: 5}\n"),
                "resources[0] (k).per: max_keys, idle_timeout and metrics need `per`",
            ),
            (
                standalone("  - {id: k, capacity: 1, per: {header: x, query: y}}\n"),
                "(k).per: give exactly one of header",
            ),
            (
                standalone("  - {id: k, capacity: 1, per: {header: \"a b\"}}\n"),
                "(k).per.header: \"a b\" is not a header name",
            ),
            (standalone("  - {id: k, capacity: 1, per: host, max_keys: 0}\n"), "(k).max_keys: must be from 1 to 10000"),
            (
                standalone("  - {id: k, capacity: 1, per: host, idle_timeout: 0s}\n"),
                "(k).idle_timeout: must be greater than 0",
            ),
            (
                standalone(&format!("  - {{id: {long}, capacity: 1, per: host}}\n")),
                "a keyed resource's id is at most 959 bytes",
            ),
            (
                standalone("  - {id: k, capacity: 1, per: method}\n  - {id: k/GET, capacity: 1}\n"),
                "resources (k/GET).id: could be a key of the keyed resource \"k\"",
            ),
            (
                leasing(
                    "  - {id: a, per: method, max_keys: 5000}\n  - {id: b, per: host, max_keys: 4996}\n  - {id: c}\n",
                ),
                "resources: up to 10001 ids",
            ),
        ];
        for (yaml, expected) in cases {
            let error = parse(&yaml).expect_err(&yaml);
            assert!(error.contains(expected), "{error:?} should contain {expected:?}");
        }
        let fits =
            leasing("  - {id: a, per: method, max_keys: 5000}\n  - {id: b, per: host, max_keys: 4995}\n  - {id: c}\n");
        let config = parse(&fits).expect("10,000 ids");
        let key = config.resources[0].key.as_ref().unwrap();
        assert_eq!((key.max_keys, key.idle_timeout, key.per_key_metrics), (5000, defaults::KEY_IDLE_TIMEOUT, false));
        let per_key =
            parse(&standalone("  - {id: k, capacity: 1, per: {path_segment: 2}, metrics: per_key}\n")).unwrap();
        let key = per_key.resources[0].key.as_ref().unwrap();
        assert_eq!(
            (&key.per, key.max_keys, key.per_key_metrics),
            (&KeyAttribute::PathSegment(2), defaults::MAX_KEYS, true)
        );
    }
}
