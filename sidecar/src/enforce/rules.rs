//! Request → resources (SPEC §4.2): the first rule whose match holds names what the request is
//! charged, how much, and what happens when a limit says no.

use std::{borrow::Cow, sync::Arc, time::Duration};

use http::{HeaderMap, Request};

use super::{gate::Gate, keyed::Keyed};
use crate::{
    canonical::{self, Ambiguous, is_grpc},
    config::{CostRule, KeyAttribute, Match, OnLimit, PathMatch},
    core::{Cost, TooLong},
};

/// What a matching rule charges: compiled once per configuration.
pub struct Charge {
    pub rule: String,
    /// The rule's fixed resources, in order (the rule's resource first, then its `also`).
    pub gates: Vec<Arc<Gate>>,
    /// The rule's keyed resources, each with its place among all the resources it charges.
    pub keyed: Vec<(usize, Arc<Keyed>)>,
    pub cost: CostRule,
    pub on_limit: OnLimit,
    pub max_wait: Duration,
}

/// The charge for one request, as classification found it.
pub struct Charged {
    pub charge: Arc<Charge>,
    pub cost: Costed,
    pub gates: Resolved,
}

/// The gates a request passes, with its keys found.
pub enum Resolved {
    /// The rule's own: it charges no keyed resource.
    Rule,
    /// Every resource's, each keyed one's key in its place.
    Keyed(Vec<Arc<Gate>>),
    /// The request's value for a keyed resource makes a key too long for an id (`bytes`, over
    /// the room its id leaves): it is refused.
    Unsafe { resource: Arc<str>, bytes: usize },
}

impl Charged {
    /// The gates to pass, in order (none for an unsafe key).
    pub fn gates(&self) -> &[Arc<Gate>] {
        match &self.gates {
            Resolved::Rule => &self.charge.gates,
            Resolved::Keyed(gates) => gates,
            Resolved::Unsafe { .. } => &[],
        }
    }

    /// The most a declared cost may be: the rule's `max_cost`, or without one the least that
    /// any of its resources takes at once now (a rate's burst: more would leave it in debt).
    pub fn most(&self) -> Cost {
        match &self.charge.cost {
            CostRule::Header { max: Some(max), .. } | CostRule::Bytes { max: Some(max), .. } => *max,
            _ => self.gates().iter().map(|g| g.largest_cost()).fold(Cost::MAX, |a, b| if b < a { b } else { a }),
        }
    }
}

/// What a request is to be charged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Costed {
    /// By the rule: its constant, or its default for a request that declares none.
    Fixed(Cost),
    /// Declared by the request in the rule's header: a finite number ≥ 0, to be checked against
    /// what the rule's resources take at once before it is charged anywhere.
    Declared(f64),
}

/// One listener's rules, in order.
#[derive(Default)]
pub struct Rules {
    rules: Vec<(Match, Arc<Charge>)>,
}

impl Rules {
    pub fn new(rules: Vec<(Match, Arc<Charge>)>) -> Rules {
        Rules { rules }
    }

    /// The first rule matching `req`, if any; an attribute a rule reads that has no single
    /// reading refuses the request (see [`canonical`]).
    pub fn classify<B>(&self, req: &Request<B>) -> Result<Option<Charged>, Ambiguous> {
        let mut path = None;
        let mut rules = self.rules.iter();
        let charge = loop {
            match rules.next() {
                Some((m, charge)) if matches(m, req, &mut path)? => break charge,
                Some(_) => {}
                None => return Ok(None),
            }
        };
        let cost = match &charge.cost {
            CostRule::Constant(c) => Costed::Fixed(*c),
            CostRule::Header { name, default, .. } => {
                header_cost(req.headers(), name)?.map_or(Costed::Fixed(*default), Costed::Declared)
            }
            // Admission reads the body's length, or meters the body as it passes.
            CostRule::Bytes { .. } => Costed::Fixed(Cost::default()),
        };
        let gates = if charge.keyed.is_empty() { Resolved::Rule } else { resolve(charge, req, &mut path)? };
        Ok(Some(Charged { charge: charge.clone(), cost, gates }))
    }
}

/// The gates of a charge with keyed resources: each one's key from the request.
fn resolve<'r, B>(
    charge: &Charge,
    req: &'r Request<B>,
    path: &mut Option<Cow<'r, str>>,
) -> Result<Resolved, Ambiguous> {
    let count = charge.gates.len() + charge.keyed.len();
    let mut gates = Vec::with_capacity(count);
    let (mut fixed, mut keyed) = (charge.gates.iter(), charge.keyed.iter().peekable());
    for i in 0..count {
        match keyed.next_if(|(at, _)| *at == i) {
            Some((_, k)) => match k.gate(attribute(k.attribute(), req, path)?.as_deref()) {
                Ok(gate) => gates.push(gate),
                Err(TooLong { bytes }) => return Ok(Resolved::Unsafe { resource: k.id.clone(), bytes }),
            },
            None => gates.push(fixed.next().expect("the charge's fixed gates fill the other places").clone()),
        }
    }
    Ok(Resolved::Keyed(gates))
}

/// The value of a keyed resource's attribute in `req`, if it has one, in its [`canonical`]
/// form; borrowed where it can be. The request's path is normalized into `path` if that was
/// not done yet.
pub fn attribute<'a, 'r: 'a, B>(
    per: &KeyAttribute,
    req: &'r Request<B>,
    path: &'a mut Option<Cow<'r, str>>,
) -> Result<Option<Cow<'a, [u8]>>, Ambiguous> {
    let text = |s: Cow<'a, str>| {
        Some(match s {
            Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
            Cow::Owned(s) => Cow::Owned(s.into_bytes()),
        })
    };
    Ok(match per {
        KeyAttribute::Header(name) => canonical::header(req.headers(), name)?,
        KeyAttribute::PathSegment(n) => canonical::segment(normalized_once(path, req), *n),
        KeyAttribute::Query(name) => canonical::query(req.uri().query(), name)?,
        KeyAttribute::GrpcService | KeyAttribute::GrpcMethod => {
            if !is_grpc(req.headers()) {
                return Ok(None);
            }
            grpc_parts(normalized_once(path, req)).and_then(|(service, method)| {
                text(Cow::Borrowed(if *per == KeyAttribute::GrpcService { service } else { method }))
            })
        }
        KeyAttribute::Method => text(Cow::Borrowed(req.method().as_str())),
        KeyAttribute::Host => text(canonical::host(req)),
        // Charged by the rate limit service's calls, never by a rule.
        KeyAttribute::Descriptor => None,
    })
}

/// Reads only what the rule tests: most rules test neither the host nor gRPC. The request's
/// path is normalized into `path` by the first rule that tests it, for the rules after it.
fn matches<'r, B>(m: &Match, req: &'r Request<B>, path: &mut Option<Cow<'r, str>>) -> Result<bool, Ambiguous> {
    let matched = (m.methods.is_empty() || m.methods.contains(req.method()))
        && m.path.as_ref().is_none_or(|p| {
            let path = normalized_once(path, req);
            match p {
                PathMatch::Exact(e) => path == e,
                PathMatch::Prefix(prefix) => path.starts_with(prefix.as_str()),
                PathMatch::Glob(g) => g.is_match(path),
            }
        })
        && m.host.as_ref().is_none_or(|g| g.is_match(&*canonical::host(req)))
        && (m.grpc_service.is_none() && m.grpc_method.is_none()
            || is_grpc(req.headers()) && grpc_matches(m, normalized_once(path, req)));
    if !matched {
        return Ok(false);
    }
    for (name, value) in &m.headers {
        if canonical::header(req.headers(), name)?.is_none_or(|v| *v != *value.as_bytes()) {
            return Ok(false);
        }
    }
    Ok(true)
}

fn normalized_once<'a, 'r, B>(path: &'a mut Option<Cow<'r, str>>, req: &'r Request<B>) -> &'a str {
    path.get_or_insert_with(|| canonical::path(req.uri().path()))
}

/// gRPC paths are `/package.Service/Method`.
fn grpc_parts(path: &str) -> Option<(&str, &str)> {
    path.strip_prefix('/')?.split_once('/')
}

fn grpc_matches(m: &Match, path: &str) -> bool {
    let Some((service, method)) = grpc_parts(path) else {
        return false;
    };
    m.grpc_service.as_deref().is_none_or(|s| s == service) && m.grpc_method.as_deref().is_none_or(|x| x == method)
}

/// The cost the request declares in header `name`, if it is a number ≥ 0.
fn header_cost(headers: &HeaderMap, name: &http::HeaderName) -> Result<Option<f64>, Ambiguous> {
    let Some(value) = canonical::header(headers, name)? else {
        return Ok(None);
    };
    let cost = std::str::from_utf8(&value).ok().and_then(|v| v.trim().parse::<f64>().ok());
    Ok(cost.filter(|c| *c >= 0.0 && c.is_finite()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config, plan::Plan};

    fn rules() -> Plan {
        Plan::for_test(
            "resources:\n  - {id: writes, capacity: 1}\n  - {id: grpc, capacity: 1}\n  - {id: gold, capacity: 1}\n  - {id: rest, capacity: 1}\n\
            rules:\n\
              - {name: w, match: {methods: [post], path: {prefix: /v1/}}, resource: writes, cost: {header: x-cost, default: 2}}\n\
              - {name: g, match: {grpc: {service: pkg.Orders}}, resource: grpc}\n\
              - {name: h, match: {host: \"*.gold.test\", headers: [{name: x-tier, value: gold}]}, resource: gold, cost: 5}\n\
              - {name: r, match: {path: {glob: \"/static/**\"}}, resource: rest}\n",
        )
    }

    fn classify(plan: &Plan, req: Request<()>) -> Option<(String, f64)> {
        plan.listeners[0].rules.classify(&req).unwrap().map(|c| {
            let cost = match c.cost {
                Costed::Fixed(cost) => cost.get(),
                Costed::Declared(cost) => cost,
            };
            (c.charge.rule.clone(), cost)
        })
    }

    #[test]
    fn paths_are_matched_normalized() {
        let plan = rules();
        let post = |path: &str| Request::post(path).body(()).unwrap();
        assert_eq!(classify(&plan, post("//v1/./orders")), Some(("w".into(), 2.0)));
        assert_eq!(classify(&plan, post("/x/../%76%31/orders")), Some(("w".into(), 2.0)));
        assert_eq!(
            classify(&plan, Request::get("/static/../static//a.css").body(()).unwrap()),
            Some(("r".into(), 1.0))
        );
        // A rule written unnormalized still matches.
        let plan = Plan::for_test(
            "resources:\n  - {id: r, capacity: 1}\nrules:\n  - {name: t, match: {path: {exact: /%7Euser}}, resource: r}\n",
        );
        assert_eq!(classify(&plan, Request::get("/~user").body(()).unwrap()), Some(("t".into(), 1.0)));
    }

    #[test]
    fn the_first_matching_rule_names_the_charge() {
        let plan = rules();
        let post = Request::post("/v1/orders").header("x-cost", "3.5").body(()).unwrap();
        assert_eq!(classify(&plan, post), Some(("w".into(), 3.5)));
        let bad_cost = Request::post("/v1/orders").header("x-cost", "-1").body(()).unwrap();
        assert_eq!(classify(&plan, bad_cost), Some(("w".into(), 2.0)), "an invalid header cost uses the default");
        assert_eq!(classify(&plan, Request::get("/v1/orders").body(()).unwrap()), None, "method must match");

        let grpc = Request::post("/pkg.Orders/Create").header("content-type", "application/grpc").body(()).unwrap();
        assert_eq!(classify(&plan, grpc), Some(("g".into(), 1.0)));
        let not_grpc = Request::post("/pkg.Orders/Create").body(()).unwrap();
        assert_eq!(classify(&plan, not_grpc), None, "gRPC matches need a gRPC request");

        let gold = Request::get("/x").header("host", "EU.Gold.test:8080").header("x-tier", "gold").body(()).unwrap();
        assert_eq!(classify(&plan, gold), Some(("h".into(), 5.0)));
        let silver = Request::get("/x").header("host", "eu.gold.test").header("x-tier", "silver").body(()).unwrap();
        assert_eq!(classify(&plan, silver), None);

        assert_eq!(classify(&plan, Request::get("/static/a/b.css").body(()).unwrap()), Some(("r".into(), 1.0)));
    }

    #[test]
    fn a_keyed_resource_takes_its_key_from_the_attribute_it_names() {
        let value = |per: &str, req: Request<()>| {
            let config = config::for_test(&format!("resources:\n  - {{id: k, capacity: 1, per: {per}}}\n"));
            let per = &config.resources[0].key.as_ref().unwrap().per;
            let mut path = None;
            attribute(per, &req, &mut path).unwrap().map(|v| String::from_utf8(v.into_owned()).unwrap())
        };
        let get = |uri: &str| Request::get(uri).header("x-tenant", "acme").header("host", "API.Example:8080");
        assert_eq!(value("{header: x-tenant}", get("/").body(()).unwrap()).as_deref(), Some("acme"));
        assert_eq!(value("{header: x-other}", get("/").body(()).unwrap()), None);
        assert_eq!(value("{path_segment: 1}", get("/v1//acme/./orders").body(()).unwrap()).as_deref(), Some("acme"));
        assert_eq!(value("{path_segment: 5}", get("/v1/acme").body(()).unwrap()), None);
        assert_eq!(value("{query: t}", get("/x?a=1&t=a%20b+c").body(()).unwrap()).as_deref(), Some("a b c"));
        assert_eq!(value("{query: t}", get("/x").body(()).unwrap()), None);
        assert_eq!(value("method", Request::put("/").body(()).unwrap()).as_deref(), Some("PUT"));
        assert_eq!(value("host", get("/").body(()).unwrap()).as_deref(), Some("api.example"));
        let grpc = || Request::post("/pkg.Orders/Create").header("content-type", "application/grpc");
        assert_eq!(value("{grpc: service}", grpc().body(()).unwrap()).as_deref(), Some("pkg.Orders"));
        assert_eq!(value("{grpc: method}", grpc().body(()).unwrap()).as_deref(), Some("Create"));
        assert_eq!(value("{grpc: method}", Request::post("/pkg.Orders/Create").body(()).unwrap()), None, "not gRPC");
    }
}
