//! envoyproxy/ratelimit's configuration, read unchanged, and the one mapping of its limits onto
//! Sluice resources, shared by the sidecar's rate limit service (which enforces them) and the
//! capacity server (which holds their capacity), so that one file is the one source of truth.
//!
//! A file is one `domain` and a tree of `descriptors`. Each node with a `rate_limit` is a
//! [`Limit`]; the resource it becomes is named by the domain and the path of `key` or
//! `key=value` steps that leads to it (`key=` for a descriptor without a value), each part
//! percent-encoded (every byte but `A-Z a-z 0-9 - . _ ~`), joined by `/`:
//! `edge/generic_key=demo`, `edge/remote_address=`. A node without a value,
//! or with a wildcard value (`foo*`), matches many values, each with a limit of its own, as in
//! envoyproxy/ratelimit: such a limit is a keyed resource whose key is the values those nodes
//! matched ([`Found::key`]).
//!
//! `requests_per_unit` per `unit` becomes a rate (per second) and a bucket as deep as one unit's
//! allowance: see [`Limit::rate`] and [`Limit::window`].
#![forbid(unsafe_code)]

mod document;
mod encode;
#[cfg(test)]
mod tests;

use std::{
    collections::{HashMap, HashSet},
    io::{self, Read},
    path::{Path, PathBuf},
};

use document::{DescriptorDoc, FileDoc, RateLimitDoc};
pub use encode::component;

/// Levels of nested descriptors a file may have (envoyproxy/ratelimit's deepest examples use 3).
pub const MAX_DEPTH: usize = 16;
/// Descriptors a file may hold, over all levels.
pub const MAX_DESCRIPTORS: usize = 10_000;
/// Files a configuration may name.
pub const MAX_FILES: usize = 64;
/// A file's bytes at most: the most descriptors a file may hold with long keys and values; a
/// path to a device or a runaway file must not take the memory.
pub const MAX_FILE_BYTES: usize = 16 << 20;
/// A resource id's bytes at most (the capacity servers' bound).
pub const MAX_ID_BYTES: usize = 1024;
/// A keyed limit's id's bytes at most, so that `/` and a key of at least 64 bytes fit in an id.
pub const MAX_KEYED_ID_BYTES: usize = MAX_ID_BYTES - 65;

/// A time unit of envoyproxy/ratelimit, with the numbers of `RateLimitResponse.RateLimit.Unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Second = 1,
    Minute = 2,
    Hour = 3,
    Day = 4,
    /// 30 days, as envoyproxy/ratelimit counts it.
    Month = 5,
    /// 365 days, as envoyproxy/ratelimit counts it.
    Year = 6,
}

impl Unit {
    pub fn seconds(self) -> f64 {
        match self {
            Unit::Second => 1.0,
            Unit::Minute => 60.0,
            Unit::Hour => 3_600.0,
            Unit::Day => 86_400.0,
            Unit::Month => 30.0 * 86_400.0,
            Unit::Year => 365.0 * 86_400.0,
        }
    }

    /// As envoyproxy/ratelimit reads it: any case.
    fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }
}

/// The files a configuration's text names in its `section`'s `files`, resolved against `dir`, at
/// most [`MAX_FILES`]: what a reload watches. Read leniently, so that a text invalid in any other
/// way still names them.
pub fn named_files(text: &str, section: &str, dir: &Path) -> Vec<PathBuf> {
    #[derive(serde::Deserialize)]
    struct Files {
        #[serde(default)]
        files: Vec<PathBuf>,
    }
    let doc: HashMap<String, yaml_serde::Value> = yaml_serde::from_str(text).unwrap_or_default();
    let files = doc.get(section).and_then(|v| yaml_serde::from_value::<Files>(v.clone()).ok());
    files.map_or_else(Vec::new, |f| f.files.iter().take(MAX_FILES).map(|f| dir.join(f)).collect())
}

/// A file's text, refused beyond [`MAX_FILE_BYTES`], or if it is not a regular file (a FIFO or a
/// terminal would hold the reload up for ever).
pub fn read(path: &Path) -> io::Result<String> {
    if !std::fs::metadata(path)?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_FILE_BYTES as u64 + 1).read_to_string(&mut text)?;
    if text.len() > MAX_FILE_BYTES {
        return Err(io::Error::other(format!("larger than {} MiB", MAX_FILE_BYTES >> 20)));
    }
    Ok(text)
}

/// One `rate_limit` of a domain.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    /// The resource's id (see the crate's documentation).
    pub id: String,
    /// The `rate_limit`'s `name`, if it has one.
    pub name: Option<String>,
    /// `None`: `unlimited`, matched but never limited.
    pub quota: Option<Quota>,
    /// `shadow_mode`: counted as refused when over, answered OK.
    pub shadow: bool,
    /// `detailed_metric`: metric series per matched value, not only per limit.
    pub detailed: bool,
    /// The names of the limits this one replaces when both apply to a request.
    pub replaces: Vec<String>,
    /// Whether nodes on its path match many values: a keyed resource, one key per value.
    pub keyed: bool,
}

/// `requests_per_unit` per `unit`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quota {
    pub requests_per_unit: u32,
    pub unit: Unit,
}

impl Quota {
    /// Requests a second: the unit's allowance spread evenly over it.
    pub fn rate(&self) -> f64 {
        f64::from(self.requests_per_unit) / self.unit.seconds()
    }

    /// How many seconds of the rate a bucket holds: one unit. Over the fleet the buckets hold one
    /// unit's allowance, so a quiet client may spend it at once, as in a fixed window; unlike a
    /// fixed window, what it spent comes back evenly over the next unit, not all at the unit's
    /// turn, so no two windows' allowances meet at a boundary.
    pub fn window(&self) -> f64 {
        self.unit.seconds()
    }
}

/// One node of the descriptor tree.
#[derive(Debug)]
struct Node {
    key: String,
    value: Value,
    /// Index into [`Domain::limits`].
    limit: Option<usize>,
    children: Vec<Node>,
}

#[derive(Debug, PartialEq)]
enum Value {
    Exact(String),
    /// A value ending in `*`: every value that starts with the rest.
    Prefix(String),
    /// No value: every value of the key.
    Any,
}

/// A file's domain, checked.
#[derive(Debug)]
pub struct Domain {
    pub name: String,
    /// In the file's order (depth first).
    pub limits: Vec<Limit>,
    root: Vec<Node>,
}

/// The limit a descriptor matched.
#[derive(Debug, PartialEq)]
pub struct Found {
    /// Index into [`Domain::limits`].
    pub limit: usize,
    /// For a keyed limit, its key's value: the one value its open nodes matched as is, or
    /// several each percent-encoded and joined by `/`.
    pub key: Option<String>,
}

impl Domain {
    /// Reads and checks a file; the error is one line naming where in the file it is wrong.
    pub fn parse(text: &str) -> Result<Domain, String> {
        let doc: FileDoc = yaml_serde::from_str(text).map_err(|e| e.to_string().replace(['\n', '\r'], " "))?;
        if doc.domain.is_empty() {
            return Err("domain: must not be empty".into());
        }
        let mut domain = Domain { name: doc.domain, limits: Vec::new(), root: Vec::new() };
        let prefix = component(&domain.name);
        let mut count = 0;
        domain.root = nodes(&mut domain.limits, &mut count, "descriptors", &prefix, false, doc.descriptors, 1)?;
        Ok(domain)
    }

    /// The limit that a descriptor's entries (key, value) lead to, as envoyproxy/ratelimit finds
    /// it: entry by entry down the tree, each matching a node of its key with its exact value,
    /// else one whose wildcard value it starts with, else one without a value; the limit is the
    /// last entry's node's. `None`: no limit applies.
    pub fn find<'a>(&self, entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Found> {
        let mut level = &self.root;
        let mut open: Vec<&str> = Vec::new();
        let mut last = None;
        for (key, value) in entries {
            let node = find_node(level, key, value)?;
            if !matches!(node.value, Value::Exact(_)) {
                open.push(value);
            }
            level = &node.children;
            last = Some(node);
        }
        let limit = last?.limit?;
        let key = match open.as_slice() {
            [] => None,
            [one] => Some((*one).to_owned()),
            many => Some(many.iter().map(|v| component(v)).collect::<Vec<_>>().join("/")),
        };
        Some(Found { limit, key })
    }
}

fn find_node<'n>(level: &'n [Node], key: &str, value: &str) -> Option<&'n Node> {
    let of_key = || level.iter().filter(move |n| n.key == key);
    of_key()
        .find(|n| matches!(&n.value, Value::Exact(v) if v == value))
        .or_else(|| of_key().find(|n| matches!(&n.value, Value::Prefix(p) if value.starts_with(p.as_str()))))
        .or_else(|| of_key().find(|n| n.value == Value::Any))
}

fn nodes(
    limits: &mut Vec<Limit>,
    count: &mut usize,
    at: &str,
    id: &str,
    keyed: bool,
    docs: Vec<DescriptorDoc>,
    depth: usize,
) -> Result<Vec<Node>, String> {
    if !docs.is_empty() && depth > MAX_DEPTH {
        return Err(format!("{at}: descriptors nest at most {MAX_DEPTH} levels deep"));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(docs.len());
    for (i, d) in docs.into_iter().enumerate() {
        *count += 1;
        if *count > MAX_DESCRIPTORS {
            return Err(format!("descriptors: a file holds at most {MAX_DESCRIPTORS} descriptors"));
        }
        let here = format!("{at}[{i}]");
        if d.key.is_empty() {
            return Err(format!("{here}.key: must not be empty"));
        }
        if !seen.insert((d.key.clone(), d.value.clone())) {
            let what = d.value.as_ref().map_or_else(|| d.key.clone(), |v| format!("{}: {v}", d.key));
            return Err(format!("{here}: duplicate descriptor ({what}) among its siblings"));
        }
        let value = match d.value {
            None => Value::Any,
            Some(v) if v.is_empty() => {
                return Err(format!("{here}.value: must not be empty (omit it to match every value)"));
            }
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) => Value::Prefix(prefix.to_owned()),
                None => Value::Exact(v),
            },
        };
        let step = match &value {
            // `=` with nothing after it: every value. A key of a keyed limit never holds `=`
            // (the sidecar percent-encodes it), so no key of a limit is a nested limit's id.
            Value::Any => format!("{}=", component(&d.key)),
            Value::Exact(v) => format!("{}={}", component(&d.key), component(v)),
            Value::Prefix(p) => format!("{}={}", component(&d.key), component(&format!("{p}*"))),
        };
        let id = format!("{id}/{step}");
        let keyed = keyed || !matches!(value, Value::Exact(_));
        let limit = match d.rate_limit {
            None => None,
            Some(r) => {
                let bound = if keyed { MAX_KEYED_ID_BYTES } else { MAX_ID_BYTES };
                if id.len() > bound {
                    return Err(format!(
                        "{here}: its resource id is {} bytes, more than {bound} (keys and values too long)",
                        id.len()
                    ));
                }
                limits.push(limit(&here, id.clone(), r, d.shadow_mode, d.detailed_metric, keyed)?);
                Some(limits.len() - 1)
            }
        };
        let children = nodes(limits, count, &format!("{here}.descriptors"), &id, keyed, d.descriptors, depth + 1)?;
        out.push(Node { key: d.key, value, limit, children });
    }
    Ok(out)
}

fn limit(here: &str, id: String, r: RateLimitDoc, shadow: bool, detailed: bool, keyed: bool) -> Result<Limit, String> {
    let quota = if r.unlimited {
        if r.unit.is_some() || r.requests_per_unit.is_some() {
            return Err(format!("{here}.rate_limit: an unlimited limit takes no unit and no requests_per_unit"));
        }
        None
    } else {
        let unit = r
            .unit
            .ok_or_else(|| format!("{here}.rate_limit.unit: required (second, minute, hour, day, month or year)"))?;
        let unit = Unit::parse(&unit).ok_or_else(|| {
            format!("{here}.rate_limit.unit: {unit:?} is not one of second, minute, hour, day, month, year")
        })?;
        Some(Quota { requests_per_unit: r.requests_per_unit.unwrap_or(0), unit })
    };
    let replaces = r.replaces.into_iter().map(|p| p.name).collect::<Vec<_>>();
    if let Some(j) = replaces.iter().position(String::is_empty) {
        return Err(format!("{here}.rate_limit.replaces[{j}].name: must not be empty"));
    }
    Ok(Limit { id, name: r.name.filter(|n| !n.is_empty()), quota, shadow, detailed, replaces, keyed })
}
