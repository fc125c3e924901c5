//! The configuration file checked, item by item, into a [`Config`]: an error is one line naming
//! the item and field.

use std::{collections::HashSet, path::Path, time::Duration};

use http::{Method, uri::Scheme};
use sluice_client::{
    defaults::{MAX_ID_BYTES, MAX_RESOURCES_PER_REQUEST},
    out_of_range,
};

use super::{
    document::*,
    rate_limit::rate_limit_service,
    values::{amount, count, duration, fallback, within_limit},
    *,
};
use crate::{
    canonical,
    core::{Capacity, Kind, could_be_key},
    defaults,
};

/// Parses and validates a configuration; the error names what is wrong and where, one line per
/// error found (see [`parse_with`]).
pub fn parse(text: &str) -> Result<Config, String> {
    parse_with(text, &ServerFlags::default(), Path::new(""))
}

/// [`parse`], with the command line's `flags` in place of the file's `server` settings they name
/// (see [`ServerFlags`]); the files it names by relative paths read from `base`, the
/// configuration file's folder.
///
/// Every item is checked and every error reported, except that an item naming others (a listener
/// its upstream, a rule its listener and resources) is checked only once those are valid, so that
/// one mistake is not also reported as a dangling name.
pub fn parse_with(text: &str, flags: &ServerFlags, base: &Path) -> Result<Config, String> {
    let mut doc: Document = yaml_serde::from_str(text).map_err(|e| e.to_string().replace(['\n', '\r'], " "))?;
    if !flags.addresses.is_empty() {
        let section = doc.server.get_or_insert_with(|| ServerDoc { addresses: Vec::new(), tls: None });
        section.addresses = flags.addresses.clone();
    }
    if flags.ca.is_some() || flags.cert.is_some() || flags.key.is_some() {
        let Some(section) = doc.server.as_mut() else {
            return Err("--server-tls-ca, --server-tls-cert and --server-tls-key need capacity servers: \
                        --server-addresses or the configuration's server section"
                .into());
        };
        let tls = section.tls.get_or_insert(ServerTlsDoc { ca: None, cert: None, key: None, server_name: None });
        for (field, flag) in [(&mut tls.ca, &flags.ca), (&mut tls.cert, &flags.cert), (&mut tls.key, &flags.key)] {
            if flag.is_some() {
                field.clone_from(flag);
            }
        }
    }
    let standalone = doc.server.is_none();
    let mut errors = Errors::default();
    let server = doc.server.map(server).transpose();
    let server = errors.take(server).flatten();
    let upstreams_before = errors.count();
    let upstreams = errors.all(doc.upstreams.into_iter().enumerate().map(|(i, u)| upstream(i, u)));
    let upstreams_valid = errors.count() == upstreams_before;
    errors.take(unique("upstreams", upstreams.iter().map(|u| u.name.as_str())));
    let mut hosts = HashSet::new();
    let shared_host = upstreams.iter().flat_map(|u| &u.hosts).find(|h| !hosts.insert(h.as_str()));
    if let Some(h) = shared_host {
        errors.push(format!("upstreams: host {h:?} is routed to more than one upstream"));
    }
    if doc.listeners.is_empty() && doc.rate_limit_service.is_none() {
        errors.push("listeners: at least one listener is required (or a rate_limit_service)".into());
    }
    let resources_before = errors.count();
    let resources = errors.all(doc.resources.into_iter().enumerate().map(|(i, r)| resource(i, r, standalone)));
    let resources_valid = errors.count() == resources_before;
    let mut listeners = Vec::new();
    let listeners_before = errors.count();
    if upstreams_valid {
        listeners = errors.all(doc.listeners.into_iter().enumerate().map(|(i, l)| listener(i, l, &upstreams)));
        errors.take(unique("listeners", listeners.iter().map(|l| l.name.as_str())));
        if let Some(dup) = duplicate(listeners.iter().map(|l| l.address)) {
            errors.push(format!("listeners: address {dup} is used twice"));
        }
    }
    let listeners_valid = upstreams_valid && errors.count() == listeners_before;
    // Rules charge the file's resources only: the rate limit service's are charged by its calls.
    let mut rules = Vec::new();
    if resources_valid && listeners_valid {
        rules = errors.all(doc.rules.into_iter().enumerate().map(|(i, r)| rule(i, r, &listeners, &resources)));
        // A name is how an operator refers to a rule; two rules of one name are a mistake.
        errors.take(unique("rules", rules.iter().map(|r| r.name.as_str())));
    }
    let mut resources = resources;
    let rate_limit_service = match doc.rate_limit_service {
        Some(section) => errors.take(rate_limit_service(section, base, standalone)).map(|(service, limits)| {
            resources.extend(limits);
            service
        }),
        None => None,
    };
    errors.take(unique("resources", resources.iter().map(|r| r.id.as_str())));
    errors.take(keyed_ids(&resources, server.is_some()));
    errors.done()?;
    Ok(Config { server, listeners, upstreams, resources, rules, rate_limit_service })
}

/// The errors found so far, each one line.
#[derive(Default)]
struct Errors(Vec<String>);

impl Errors {
    fn push(&mut self, error: String) {
        self.0.push(error);
    }

    fn count(&self) -> usize {
        self.0.len()
    }

    fn take<T>(&mut self, result: Result<T, String>) -> Option<T> {
        result.map_err(|e| self.push(e)).ok()
    }

    /// The valid items, the others' errors kept.
    fn all<T>(&mut self, items: impl Iterator<Item = Result<T, String>>) -> Vec<T> {
        items.filter_map(|item| self.take(item)).collect()
    }

    /// `Err` with every error, one per line.
    fn done(self) -> Result<(), String> {
        if self.0.is_empty() { Ok(()) } else { Err(self.0.join("\n")) }
    }
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
            let known = defined(upstreams.iter().map(|u| u.name.as_str()));
            return Err(format!("{}: no upstream named {name:?} ({known})", at("upstream")));
        }
        None if upstreams.iter().all(|u| u.hosts.is_empty()) => {
            return Err(format!("{}: required unless some upstream lists `hosts` to route by Host", at("upstream")));
        }
        _ => {}
    }
    let timeout = |value: &Option<String>, field: &str, default: Duration| {
        value.as_deref().map_or(Ok(default), |t| duration(t, &at(field)))
    };
    let count =
        |value: Option<usize>, field: &str, default: usize, limit: usize| count(value, &at(field), default, limit);
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
            .map(|v| Capacity::new(v).ok_or_else(|| format!("{}: {}", at(field), out_of_range(v, " or .inf"))))
            .transpose()
    };
    let standalone_capacity = capacity(doc.capacity, "capacity")?;
    if standalone && standalone_capacity.is_none() {
        return Err(format!("{}: required in standalone mode (no `server`)", at("capacity")));
    }
    let burst = doc.burst.map_or(Ok(Burst::Default), |b| amount(b, &at("burst")).map(Burst::Depth))?;
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
        when_unreachable: fallback(doc.when_unreachable),
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
    let max_keys = count(doc.max_keys, &at("max_keys"), defaults::MAX_KEYS, MAX_RESOURCES_PER_REQUEST)?;
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
        let key_of_it = |r: &&Resource| r.id.strip_prefix(&prefix).is_some_and(could_be_key);
        if let Some(other) = resources.iter().find(key_of_it) {
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
            let known = defined(resources.iter().map(|r| r.id.as_str()));
            return Err(format!("{}: {id:?} is not a declared resource ({known})", at("resource")));
        }
    }
    if let Some(dup) = duplicate(charged.iter()) {
        return Err(format!("{}: {dup:?} is charged twice", at("also")));
    }
    let m = doc.matcher;
    if let Some(l) = &m.listener
        && !listeners.iter().any(|x| &x.name == l)
    {
        let known = defined(listeners.iter().map(|l| l.name.as_str()));
        return Err(format!("{}: no listener named {l:?} ({known})", at("match.listener")));
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
    let cost_of =
        |value: f64, field: &str| Cost::new(value).ok_or_else(|| format!("{}: {}", at(field), out_of_range(value, "")));
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

/// The names a dangling reference could have meant, `defined: "a", "b"`: the first ten, so that a
/// file of thousands of resources still gets a one-line error.
fn defined<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> String {
    const SHOWN: usize = 10;
    let total = names.len();
    let shown: Vec<String> = names.take(SHOWN).map(|n| format!("{n:?}")).collect();
    match total {
        0 => "none is defined".into(),
        n if n > SHOWN => format!("defined: {}, and {} more", shown.join(", "), n - SHOWN),
        _ => format!("defined: {}", shown.join(", ")),
    }
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
