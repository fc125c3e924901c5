//! Who may ask for what: policies that match a caller's identity (taken from its TLS client
//! certificate) and say which client ids it may use, which resources it may ask for, whether it
//! may call `GetServerCapacity`, and how many client ids it may hold at once. No policies: every
//! caller is trusted, as Doorman trusts them.

use std::ops::Range;

use globset::{GlobSet, GlobSetBuilder};
use regex::Regex;
use smallvec::SmallVec;

use super::glob::glob;
use crate::defaults::MAX_POLICY_PATTERNS;

/// One policy as configured.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// Matches identities: `*` stands for a run of characters without `/`, and each `*` is
    /// captured for `client_ids` (`{1}` the first).
    pub identity: String,
    /// The client ids (and server ids) a matching caller may use: `*` stands for any run of
    /// characters, `{n}` for the identity's n-th capture, taken literally.
    pub client_ids: Vec<String>,
    /// Globs of the resources it may ask for, as `identifier_glob`s are written.
    pub resources: Vec<String>,
    /// Whether it may call `GetServerCapacity`, as an intermediate server does.
    pub server_capacity: bool,
    /// Most client ids it holds leases with at once.
    pub max_client_ids: usize,
}

/// A piece of a client id pattern.
#[derive(Clone, Debug, PartialEq)]
enum Piece {
    Text(String),
    Any,
    /// The identity's capture, 0-based.
    Capture(usize),
}

#[derive(Debug)]
struct Rule {
    policy: Policy,
    identity: Regex,
    client_ids: Vec<Vec<Piece>>,
    resources: GlobSet,
}

/// The policies of a configuration, checked; the first whose identity pattern matches applies.
#[derive(Debug, Default)]
pub struct Policies {
    rules: Vec<Rule>,
}

/// Why a call is refused (PERMISSION_DENIED).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial {
    /// Policies are configured and the caller presented no client certificate (or one without
    /// a usable identity).
    Anonymous,
    /// No policy matches the identity.
    Unknown,
    /// The client id is not among the policy's.
    ClientId,
    /// These resources of the call (all of them) are outside the policy's globs.
    Resources(Vec<String>),
    /// The policy does not allow `GetServerCapacity`.
    ServerCapacity,
    /// Another identity holds leases under this client id.
    Owned,
}

impl Denial {
    /// Every [`Denial::reason`].
    pub const REASONS: &[&str] = &["anonymous", "no_policy", "client_id", "resource", "server_capacity", "owned"];

    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Denial::Anonymous => "anonymous",
            Denial::Unknown => "no_policy",
            Denial::ClientId => "client_id",
            Denial::Resources(_) => "resource",
            Denial::ServerCapacity => "server_capacity",
            Denial::Owned => "owned",
        }
    }

    /// What the caller is told: one line.
    pub fn message(&self, identity: Option<&str>, client: &str) -> String {
        let who = identity.map_or_else(|| "a caller without a client certificate".to_owned(), |i| format!("{i:?}"));
        match self {
            Denial::Anonymous => "this server's policies need a client certificate that names the caller".into(),
            Denial::Unknown => format!("no policy of this server matches the identity {who}"),
            Denial::ClientId => format!("the policy for {who} does not allow the client id {client:?}"),
            Denial::Resources(ids) => match ids.as_slice() {
                [id] => format!("the policy for {who} does not allow the resource {id:?}"),
                [id, rest @ ..] => {
                    format!(
                        "the policy for {who} does not allow the resource {id:?}, nor {} more in this call",
                        rest.len()
                    )
                }
                [] => format!("the policy for {who} does not allow these resources"),
            },
            Denial::ServerCapacity => format!("the policy for {who} does not allow GetServerCapacity"),
            Denial::Owned => format!("the client id {client:?} holds leases for another identity"),
        }
    }
}

/// What a call is, as far as policies care.
pub struct Call<'a, 'i> {
    pub client: &'a str,
    pub resources: &'i mut dyn Iterator<Item = &'a str>,
    pub server_capacity: bool,
}

impl Policies {
    /// Checks the policies; the error holds every policy's first fault, one per line, each
    /// naming it by position and identity pattern.
    pub fn new(policies: Vec<Policy>) -> Result<Policies, String> {
        let mut rules = Vec::with_capacity(policies.len());
        let mut errors = Vec::new();
        for (i, policy) in policies.into_iter().enumerate() {
            match rule(&policy) {
                Ok(rule) => rules.push(rule),
                Err((field, why)) => errors.push(format!("policies[{i}] ({:?}): {field}: {why}", policy.identity)),
            }
        }
        if errors.is_empty() { Ok(Policies { rules }) } else { Err(errors.join("\n")) }
    }

    /// Whether every caller is trusted (no policies).
    pub fn trusting(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether `identity` may make `call`: `Ok(None)` when every caller is trusted, else the
    /// most client ids it may hold.
    pub fn admit(&self, identity: Option<&str>, call: Call<'_, '_>) -> Result<Option<usize>, Denial> {
        if self.trusting() {
            return Ok(None);
        }
        let identity = identity.ok_or(Denial::Anonymous)?;
        let (rule, captures) = self
            .rules
            .iter()
            .find_map(|rule| {
                let found = rule.identity.captures(identity)?;
                let captures: SmallVec<[Range<usize>; 4]> =
                    found.iter().skip(1).map(|m| m.map_or(0..0, |m| m.range())).collect();
                Some((rule, captures))
            })
            .ok_or(Denial::Unknown)?;
        if call.server_capacity && !rule.policy.server_capacity {
            return Err(Denial::ServerCapacity);
        }
        let capture = |n: usize| &identity[captures[n].clone()];
        if !rule.client_ids.iter().any(|pattern| matches(pattern, &capture, call.client)) {
            return Err(Denial::ClientId);
        }
        let outside: Vec<String> =
            call.resources.filter(|id| !rule.resources.is_match(id)).map(str::to_owned).collect();
        if !outside.is_empty() {
            return Err(Denial::Resources(outside));
        }
        Ok(Some(rule.policy.max_client_ids))
    }
}

/// A policy checked and compiled; else the field at fault and why.
fn rule(policy: &Policy) -> Result<Rule, (String, String)> {
    let fail = |field: &str, why: String| Err((field.to_owned(), why));
    if policy.identity.is_empty() {
        return fail("identity", "must not be empty".into());
    }
    for (field, count) in [("client_ids", policy.client_ids.len()), ("resources", policy.resources.len())] {
        if !(1..=MAX_POLICY_PATTERNS).contains(&count) {
            return fail(field, format!("must list from 1 to {MAX_POLICY_PATTERNS} patterns, got {count}"));
        }
    }
    if policy.max_client_ids == 0 {
        return fail("max_client_ids", "must be ≥ 1, got 0".into());
    }
    let escaped: Vec<String> = policy.identity.split('*').map(regex::escape).collect();
    let identity =
        Regex::new(&format!("^{}$", escaped.join("([^/]*)"))).map_err(|e| ("identity".to_owned(), e.to_string()))?;
    let stars = escaped.len() - 1;
    let client_ids = policy
        .client_ids
        .iter()
        .enumerate()
        .map(|(j, pattern)| pieces(pattern, stars).map_err(|why| (format!("client_ids[{j}]"), why)))
        .collect::<Result<_, _>>()?;
    let mut resources = GlobSetBuilder::new();
    for (j, pattern) in policy.resources.iter().enumerate() {
        resources.add(glob(pattern).map_err(|why| (format!("resources[{j}]"), why))?);
    }
    let resources = resources.build().map_err(|e| ("resources".to_owned(), e.to_string()))?;
    Ok(Rule { policy: policy.clone(), identity, client_ids, resources })
}

/// A client id pattern in pieces: `{n}` names one of the identity's `stars` captures.
fn pieces(pattern: &str, stars: usize) -> Result<Vec<Piece>, String> {
    if pattern.is_empty() {
        return Err("must not be empty".into());
    }
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = pattern;
    while let Some(c) = rest.chars().next() {
        rest = &rest[c.len_utf8()..];
        let piece = match c {
            '*' => Piece::Any,
            '{' => {
                let Some((number, after)) = rest.split_once('}') else {
                    return Err(format!("{pattern:?}: '{{' without '}}'"));
                };
                rest = after;
                match number.parse::<usize>() {
                    Ok(n) if (1..=stars).contains(&n) => Piece::Capture(n - 1),
                    _ => {
                        return Err(format!(
                            "{pattern:?}: {{{number}}} names no capture of the identity pattern, which has {stars}"
                        ));
                    }
                }
            }
            c => {
                text.push(c);
                continue;
            }
        };
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(piece);
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// Whether `id` matches `pattern` with the captures substituted as text: the classic wildcard
/// match, going back only to the last `*`, so linear in practice and never exponential.
fn matches<'a>(pattern: &[Piece], capture: &dyn Fn(usize) -> &'a str, id: &str) -> bool {
    // The pattern as bytes, `None` for `*`.
    let mut flat: SmallVec<[Option<u8>; 128]> = SmallVec::new();
    for piece in pattern {
        match piece {
            Piece::Text(text) => flat.extend(text.bytes().map(Some)),
            Piece::Capture(n) => flat.extend(capture(*n).bytes().map(Some)),
            Piece::Any => flat.push(None),
        }
    }
    let id = id.as_bytes();
    let (mut p, mut i) = (0, 0);
    let mut back: Option<(usize, usize)> = None;
    while i < id.len() {
        match flat.get(p) {
            Some(None) => {
                back = Some((p, i));
                p += 1;
            }
            Some(Some(b)) if *b == id[i] => {
                p += 1;
                i += 1;
            }
            _ => match back {
                Some((star, from)) => {
                    p = star + 1;
                    i = from + 1;
                    back = Some((star, from + 1));
                }
                None => return false,
            },
        }
    }
    flat[p..].iter().all(Option::is_none)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults::MAX_CLIENT_IDS_PER_IDENTITY;

    impl Policy {
        fn new(identity: &str, client_ids: &[&str]) -> Policy {
            Policy {
                identity: identity.to_owned(),
                client_ids: client_ids.iter().map(|&c| c.to_owned()).collect(),
                resources: vec!["*".to_owned()],
                server_capacity: false,
                max_client_ids: MAX_CLIENT_IDS_PER_IDENTITY,
            }
        }
    }

    fn admit(
        policies: &Policies,
        identity: Option<&str>,
        client: &str,
        resources: &[&str],
    ) -> Result<Option<usize>, Denial> {
        let mut ids = resources.iter().copied();
        policies.admit(identity, Call { client, resources: &mut ids, server_capacity: false })
    }

    fn pods() -> Policies {
        let mut pod = Policy::new("spiffe://cluster.local/ns/*/pod/*", &["{2}:*"]);
        pod.resources = vec!["api/*".into(), "db".into()];
        pod.max_client_ids = 4;
        let mut server = Policy::new("spiffe://cluster.local/ns/sluice/sa/sluice-server", &["*"]);
        server.server_capacity = true;
        Policies::new(vec![pod, server]).unwrap()
    }

    #[test]
    fn every_reason_is_listed() {
        let denials = [
            Denial::Anonymous,
            Denial::Unknown,
            Denial::ClientId,
            Denial::Resources(Vec::new()),
            Denial::ServerCapacity,
            Denial::Owned,
        ];
        assert_eq!(denials.map(|d| d.reason()), Denial::REASONS);
    }

    #[test]
    fn no_policies_trust_everyone() {
        let policies = Policies::new(Vec::new()).unwrap();
        assert!(policies.trusting());
        assert_eq!(admit(&policies, None, "anyone", &["anything"]), Ok(None));
    }

    #[test]
    fn a_pod_may_use_ids_under_its_own_name_only() {
        let p = pods();
        let me = Some("spiffe://cluster.local/ns/shop/pod/web-1");
        assert_eq!(admit(&p, me, "web-1:8080", &["api/orders", "db"]), Ok(Some(4)));
        assert_eq!(admit(&p, me, "web-2:8080", &["db"]), Err(Denial::ClientId));
        assert_eq!(admit(&p, me, "web-1", &["db"]), Err(Denial::ClientId));
        assert_eq!(admit(&p, me, "web-1:8080", &["db", "cache"]), Err(Denial::Resources(vec!["cache".into()])));
        let mut none = std::iter::empty();
        let call = Call { client: "web-1:1", resources: &mut none, server_capacity: true };
        assert_eq!(p.admit(me, call), Err(Denial::ServerCapacity));
    }

    #[test]
    fn a_star_in_an_identity_stays_within_a_segment() {
        let p = pods();
        assert_eq!(
            admit(&p, Some("spiffe://cluster.local/ns/a/b/pod/web-1"), "web-1:1", &["db"]),
            Err(Denial::Unknown)
        );
        assert_eq!(admit(&p, None, "web-1:1", &["db"]), Err(Denial::Anonymous));
    }

    #[test]
    fn a_capture_is_text_not_a_pattern() {
        let p = Policies::new(vec![Policy::new("dns:*", &["{1}"])]).unwrap();
        assert_eq!(admit(&p, Some("dns:a*"), "a*", &["x"]), Ok(Some(MAX_CLIENT_IDS_PER_IDENTITY)));
        assert_eq!(admit(&p, Some("dns:a*"), "abc", &["x"]), Err(Denial::ClientId));
    }

    #[test]
    fn wildcards_match_as_globs_do() {
        let any = |pattern: &str, id: &str| matches(&pieces(pattern, 0).unwrap(), &|_| "", id);
        assert!(any("*", ""));
        assert!(any("a*b*c", "aXbYbc"));
        assert!(!any("a*b*c", "aXbYb"));
        assert!(any("*:*", "web:80"));
        assert!(!any("web", "web2"));
        let long = "a".repeat(1000);
        assert!(!any("*a*a*a*a*a*a*b", &long), "no exponential backtracking");
    }

    #[test]
    fn every_faulty_policy_is_named() {
        let mut bad = Policy::new("x/*", &["{2}"]);
        bad.max_client_ids = 1;
        let mut none = Policy::new("", &["a"]);
        none.max_client_ids = 1;
        let error = Policies::new(vec![bad, none, Policy::new("y", &[])]).unwrap_err();
        let lines: Vec<&str> = error.lines().collect();
        assert_eq!(lines.len(), 3, "{error}");
        assert!(lines[0].starts_with("policies[0] (\"x/*\"): client_ids[0]:"), "{error}");
        assert!(lines[1].starts_with("policies[1] (\"\"): identity: must not be empty"), "{error}");
        assert!(lines[2].contains("client_ids: must list from 1 to"), "{error}");
    }
}
