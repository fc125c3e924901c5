//! The server's configuration file: Doorman's YAML form of `ResourceRepository`, loaded unchanged
//! and validated into a [`Repository`], with a template for each limit of the envoyproxy/ratelimit
//! files it names. Those files are thus the one source of their limits' capacities, for the
//! sidecars that enforce them and the server that shares them (docs/server.md).

use std::{
    cmp::Reverse,
    collections::HashMap,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use sluice_ratelimit::{Domain, Limit, MAX_FILES, Quota, Unit};

use crate::{
    core::{Adaptive, Algorithm, Kind, Parameter, Policies, Policy, Repository, Template, check_algorithm},
    defaults::{MAX_CLIENT_IDS_PER_IDENTITY, RATE_LIMIT_LEASE_LENGTH, RATE_LIMIT_REFRESH_INTERVAL},
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    rate_limits: Option<RateLimitsDoc>,
    resources: Vec<TemplateDoc>,
    /// Sluice's own: who may ask for what (docs/server.md, Who may ask for what). Doorman's
    /// servers ignore it.
    #[serde(default)]
    policies: Vec<PolicyDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyDoc {
    identity: String,
    client_ids: Vec<String>,
    resources: Option<Vec<String>>,
    #[serde(default)]
    server_capacity: bool,
    max_client_ids: Option<usize>,
}

/// envoyproxy/ratelimit's files, each limit of which becomes a template.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitsDoc {
    files: Vec<PathBuf>,
    /// Every such template's; FAIR_SHARE by default.
    algorithm: Option<AlgorithmDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateDoc {
    identifier_glob: String,
    capacity: CapacityDoc,
    /// Sluice's own, with `capacity: adaptive`: the learned capacity's bounds and controller.
    adaptive: Option<AdaptiveDoc>,
    safe_capacity: Option<f64>,
    description: Option<String>,
    algorithm: AlgorithmDoc,
}

/// A number, or `adaptive`: learned from the service (docs/server.md, Adaptive capacity).
#[derive(Deserialize)]
#[serde(untagged)]
enum CapacityDoc {
    Fixed(f64),
    Learned(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdaptiveDoc {
    min: f64,
    max: f64,
    initial: Option<f64>,
    tolerance: Option<f64>,
    error_share: Option<f64>,
    headroom: Option<f64>,
    growth: Option<f64>,
    /// Seconds, as the algorithm's durations are.
    drain: Option<f64>,
    interval: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlgorithmDoc {
    kind: KindDoc,
    lease_length: i64,
    refresh_interval: i64,
    #[serde(default)]
    parameters: Vec<ParameterDoc>,
    learning_mode_duration: Option<i64>,
}

#[derive(Deserialize)]
#[allow(clippy::upper_case_acronyms)]
enum KindDoc {
    #[serde(rename = "NO_ALGORITHM")]
    NoAlgorithm,
    #[serde(rename = "STATIC")]
    Static,
    #[serde(rename = "PROPORTIONAL_SHARE")]
    ProportionalShare,
    #[serde(rename = "FAIR_SHARE")]
    FairShare,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ParameterDoc {
    name: String,
    value: Option<String>,
}

/// Parses and validates a configuration, reading the files it names; the error is one line
/// naming what is wrong and where. Relative paths are resolved against `dir`, the directory of
/// the configuration's file (`Path::new("")`: the working directory).
pub fn parse(text: &str, dir: &Path) -> Result<Repository, String> {
    parse_counting(text, dir).map(|(repository, _)| repository)
}

/// What `sluice-server check` says of a valid configuration, validated as [`parse`] does.
pub fn summary(text: &str, dir: &Path) -> Result<String, String> {
    let (repository, from_files) = parse_counting(text, dir)?;
    let templates = repository.templates().len();
    let plural = if templates == 1 { "" } else { "s" };
    Ok(format!("{templates} template{plural} ({from_files} from rate limit files)"))
}

/// [`parse`], and how many of the templates the rate limit files made.
fn parse_counting(text: &str, dir: &Path) -> Result<(Repository, usize), String> {
    let doc: Document = yaml_serde::from_str(text).map_err(|e| e.to_string().replace(['\n', '\r'], " "))?;
    let policies = Policies::new(doc.policies.into_iter().map(policy).collect());
    let templates: Vec<Template> = doc
        .resources
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let glob = t.identifier_glob.clone();
            template(t).map_err(|(field, why)| format!("resources[{i}] ({glob:?}): {field}: {why}"))
        })
        .collect::<Result<_, _>>()?;
    let (repository, from_files) = match doc.rate_limits {
        None => (repository(templates), 0),
        // Checked alone first, so that an error names one of them by its index in `resources`.
        Some(rate_limits) => match repository(templates.clone()) {
            Err(e) => (Err(e), 0),
            Ok(_) => {
                let mut made = from_files(rate_limits, dir, &templates)?;
                let from_files = made.len();
                made.extend(templates);
                (repository(made), from_files)
            }
        },
    };
    match (repository, policies) {
        (Ok(repository), Ok(policies)) => Ok((repository.with_policies(policies), from_files)),
        (Ok(_), Err(e)) | (Err(e), Ok(_)) => Err(e),
        (Err(templates), Err(policies)) => Err(format!("{templates}\n{policies}")),
    }
}

fn policy(p: PolicyDoc) -> Policy {
    Policy {
        identity: p.identity,
        client_ids: p.client_ids,
        resources: p.resources.unwrap_or_else(|| vec!["*".to_owned()]),
        server_capacity: p.server_capacity,
        max_client_ids: p.max_client_ids.unwrap_or(MAX_CLIENT_IDS_PER_IDENTITY),
    }
}

/// The files a configuration names (`rate_limits.files`), resolved as [`parse`] resolves them,
/// even if the rest of it is invalid: what a reload watches besides the configuration itself.
pub fn named_files(text: &str, dir: &Path) -> Vec<PathBuf> {
    sluice_ratelimit::named_files(text, "rate_limits", dir)
}

fn repository(templates: Vec<Template>) -> Result<Repository, String> {
    Repository::new(templates).map_err(|e| e.to_string())
}

/// A template as written; `Err` (field, why) where `capacity` and `adaptive` disagree.
fn template(t: TemplateDoc) -> Result<Template, (&'static str, String)> {
    let (capacity, adaptive) = match (t.capacity, t.adaptive) {
        (CapacityDoc::Fixed(capacity), None) => (capacity, None),
        (CapacityDoc::Fixed(_), Some(_)) => return Err(("adaptive", "needs `capacity: adaptive`".into())),
        (CapacityDoc::Learned(word), _) if word != "adaptive" => {
            return Err(("capacity", format!("must be a number or \"adaptive\", got {word:?}")));
        }
        (CapacityDoc::Learned(_), None) => {
            return Err(("adaptive", "`capacity: adaptive` needs `adaptive: {min: …, max: …}`".into()));
        }
        (CapacityDoc::Learned(_), Some(a)) => {
            let d = Adaptive::within(a.min, a.max);
            let adaptive = Adaptive {
                initial: a.initial.unwrap_or(d.initial),
                tolerance: a.tolerance.unwrap_or(d.tolerance),
                error_share: a.error_share.unwrap_or(d.error_share),
                headroom: a.headroom.unwrap_or(d.headroom),
                growth: a.growth.unwrap_or(d.growth),
                drain: a.drain.unwrap_or(d.drain),
                interval: a.interval.unwrap_or(d.interval),
                ..d
            };
            (adaptive.initial, Some(adaptive))
        }
    };
    Ok(Template {
        identifier_glob: t.identifier_glob,
        capacity,
        adaptive,
        safe_capacity: t.safe_capacity,
        description: t.description,
        algorithm: algorithm(t.algorithm),
    })
}

fn algorithm(a: AlgorithmDoc) -> Algorithm {
    Algorithm {
        kind: match a.kind {
            KindDoc::NoAlgorithm => Kind::NoAlgorithm,
            KindDoc::Static => Kind::Static,
            KindDoc::ProportionalShare => Kind::ProportionalShare,
            KindDoc::FairShare => Kind::FairShare,
        },
        lease_length: a.lease_length,
        refresh_interval: a.refresh_interval,
        parameters: a.parameters.into_iter().map(|p| Parameter { name: p.name, value: p.value }).collect(),
        learning_mode_duration: a.learning_mode_duration,
    }
}

/// A template for each limit with a quota in the files: a fixed limit's glob is its id, a keyed
/// limit's `<id>/*`, for its keys. None of their globs may be one of `own`'s.
fn from_files(section: RateLimitsDoc, dir: &Path, own: &[Template]) -> Result<Vec<Template>, String> {
    if section.files.len() > MAX_FILES {
        return Err(format!("rate_limits.files: at most {MAX_FILES} files, got {}", section.files.len()));
    }
    let algorithm = section.algorithm.map_or_else(
        || Algorithm {
            kind: Kind::FairShare,
            lease_length: RATE_LIMIT_LEASE_LENGTH,
            refresh_interval: RATE_LIMIT_REFRESH_INTERVAL,
            parameters: Vec::new(),
            learning_mode_duration: None,
        },
        algorithm,
    );
    check_algorithm(&algorithm).map_err(|(field, why)| format!("rate_limits.algorithm.{field}: {why}"))?;
    let own: HashMap<&str, usize> = own.iter().enumerate().map(|(i, t)| (t.identifier_glob.as_str(), i)).collect();
    let mut domains = HashMap::new();
    let mut made = Vec::new();
    for (i, file) in section.files.iter().enumerate() {
        let at = format!("rate_limits.files[{i}] ({})", file.display());
        let path = dir.join(file);
        let domain = sluice_ratelimit::read(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))
            .and_then(|text| Domain::parse(&text))
            .map_err(|e| format!("{at}: {e}"))?;
        if let Some(first) = domains.insert(domain.name.clone(), i) {
            let other = section.files[first].display();
            return Err(format!("{at}: domain {:?} is also rate_limits.files[{first}]'s ({other})", domain.name));
        }
        for limit in &domain.limits {
            let Some(quota) = limit.quota else { continue };
            let glob = if limit.keyed { format!("{}/*", limit.id) } else { limit.id.clone() };
            if let Some(j) = own.get(glob.as_str()) {
                return Err(format!("{at}: {}'s template {glob:?} is also resources[{j}]'s glob", limit.id));
            }
            made.push(Template {
                identifier_glob: glob,
                capacity: quota.rate(),
                adaptive: None,
                safe_capacity: None,
                description: Some(describe(file, limit, quota)),
                algorithm: algorithm.clone(),
            });
        }
    }
    // The first glob that matches wins and `*` spans `/`: a keyed limit nested in another's
    // (`edge/ip=/path=/*` in `edge/ip=/*`) comes first, so that its keys get its own capacity.
    made.sort_by_key(|t| Reverse(t.identifier_glob.matches('/').count()));
    Ok(made)
}

/// What a template made from `limit` says of it: `ratelimit.yaml: edge/generic_key=demo, 20 per
/// second`.
fn describe(file: &Path, limit: &Limit, quota: Quota) -> String {
    let unit = match quota.unit {
        Unit::Second => "second",
        Unit::Minute => "minute",
        Unit::Hour => "hour",
        Unit::Day => "day",
        Unit::Month => "month",
        Unit::Year => "year",
    };
    let name = limit.name.as_ref().map_or_else(String::new, |n| format!(" ({n})"));
    let each = if limit.keyed { " per key" } else { "" };
    format!("{}: {}{name}, {} per {unit}{each}", file.display(), limit.id, quota.requests_per_unit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        core::{Call, Denial},
        defaults::EMBEDDED_CONFIG,
    };

    #[test]
    fn policies_are_read_beside_the_templates_and_their_faults_reported_with_theirs() {
        let text = format!(
            "{EMBEDDED_CONFIG}\npolicies:\n  - identity: spiffe://td/ns/*/pod/*\n    client_ids: [\"{{2}}:*\"]\n    \
             resources: [\"api/*\"]\n  - identity: spiffe://td/sa/server\n    client_ids: [\"*\"]\n    \
             server_capacity: true\n    max_client_ids: 1\n"
        );
        let repository = parse(&text, Path::new("")).unwrap();
        let policies = repository.policies();
        assert_eq!(policies.len(), 2);
        let admit = |identity, client, server_capacity| {
            let mut ids = ["api/x"].into_iter();
            policies.admit(Some(identity), Call { client, resources: &mut ids, server_capacity })
        };
        assert_eq!(admit("spiffe://td/ns/a/pod/web", "web:80", false), Ok(Some(MAX_CLIENT_IDS_PER_IDENTITY)));
        assert_eq!(admit("spiffe://td/ns/a/pod/web", "web:80", true), Err(Denial::ServerCapacity));
        assert_eq!(admit("spiffe://td/sa/server", "leaf", true), Ok(Some(1)));
        assert!(parse(EMBEDDED_CONFIG, Path::new("")).unwrap().policies().trusting());

        let bad = "resources:\n  - identifier_glob: \"*\"\n    capacity: -1\n    algorithm: {kind: STATIC, lease_length: 5, \
                   refresh_interval: 5}\npolicies:\n  - identity: x\n    client_ids: [\"{1}\"]\n";
        let error = parse(bad, Path::new("")).unwrap_err();
        let lines: Vec<&str> = error.lines().collect();
        assert_eq!(lines.len(), 2, "{error}");
        assert!(lines[0].starts_with("resources[0] (\"*\"): capacity:"), "{error}");
        assert!(lines[1].starts_with("policies[0] (\"x\"): client_ids[0]:"), "{error}");
    }

    #[test]
    fn an_adaptive_template_has_its_bounds_and_the_controllers_defaults() {
        let template = |capacity: &str, adaptive: &str| {
            format!(
                "resources:\n  - identifier_glob: db\n    capacity: {capacity}\n{adaptive}    \
                 algorithm: {{kind: FAIR_SHARE, lease_length: 10, refresh_interval: 1}}\n  - identifier_glob: \"*\"\n    \
                 capacity: 0\n    algorithm: {{kind: FAIR_SHARE, lease_length: 10, refresh_interval: 1}}\n"
            )
        };
        let repository = parse_text(&template("adaptive", "    adaptive: {min: 5, max: 500, growth: 0.5}\n")).unwrap();
        let db = repository.find("db");
        let adaptive = db.adaptive.as_ref().expect("adaptive");
        assert_eq!((adaptive.min, adaptive.max, adaptive.initial, adaptive.growth), (5.0, 500.0, 500.0, 0.5));
        assert_eq!(adaptive, &Adaptive { growth: 0.5, ..Adaptive::within(5.0, 500.0) }, "the rest defaults");
        assert_eq!(db.capacity, 500.0, "what it starts from");
        assert_eq!(repository.find("other").adaptive, None);

        let error = |capacity, adaptive| parse_text(&template(capacity, adaptive)).unwrap_err();
        assert_eq!(
            error("adaptive", ""),
            "resources[0] (\"db\"): adaptive: `capacity: adaptive` needs `adaptive: {min: …, max: …}`"
        );
        assert_eq!(
            error("5", "    adaptive: {min: 5, max: 500}\n"),
            "resources[0] (\"db\"): adaptive: needs `capacity: adaptive`"
        );
        assert_eq!(
            error("lots", ""),
            "resources[0] (\"db\"): capacity: must be a number or \"adaptive\", got \"lots\""
        );
        assert_eq!(
            error("adaptive", "    adaptive: {min: 600, max: 500}\n"),
            "resources[0] (\"db\"): adaptive.min: must be from 0 to max (500), got 600"
        );
        assert_eq!(
            error("adaptive", "    adaptive: {min: 5, max: 500, headroom: 1}\n"),
            "resources[0] (\"db\"): adaptive.headroom: must be from 0 to 0.9, got 1"
        );
        assert!(error("adaptive", "    adaptive: {min: 5, max: 500, tolerence: 1}\n").contains("unknown field"));
    }

    /// A configuration without a file: what it names is found from the working directory.
    fn parse_text(text: &str) -> Result<Repository, String> {
        parse(text, Path::new(""))
    }

    #[test]
    fn every_error_is_one_line_whatever_the_glob() {
        let text = "resources:\n  - identifier_glob: \"[e-\\n]\"\n    capacity: 1\n    \
                    algorithm: {kind: STATIC, lease_length: 60, refresh_interval: 5}\n  \
                    - identifier_glob: b\n    capacity: -2\n    \
                    algorithm: {kind: STATIC, lease_length: 60, refresh_interval: 0}\n";
        let error = parse_text(text).expect_err("a malformed glob, a bad capacity, no catch-all");
        let lines: Vec<&str> = error.lines().collect();
        assert_eq!(lines.len(), 3, "{error}");
        assert!(lines[0].starts_with("resources[0] (\"[e-\\n]\"): identifier_glob: malformed glob"), "{error}");
        assert_eq!(lines[1], "resources[1] (\"b\"): capacity: must be from 0 to 1e15, got -2");
        assert!(lines[2].starts_with("resources: a template with identifier_glob \"*\" is required"), "{error}");
    }

    #[test]
    fn doormans_example_loads_unchanged() {
        let repo = parse_text(
            r#"
resources:
  - identifier_glob: fair
    capacity: 1000
    safe_capacity: 10
    description: fair share example
    algorithm: {kind: FAIR_SHARE, lease_length: 15, refresh_interval: 5}
  - identifier_glob: "*"
    capacity: 1000
    algorithm:
      kind: PROPORTIONAL_SHARE
      lease_length: 60
      refresh_interval: 15
      learning_mode_duration: 20
      parameters: [{name: priority_mode, value: ignore}]
"#,
        )
        .unwrap();
        let fair = repo.find("fair");
        assert_eq!((fair.capacity, fair.safe_capacity, fair.algorithm.kind), (1000.0, Some(10.0), Kind::FairShare));
        assert_eq!(fair.algorithm.learning_seconds(), 15, "learning lasts a lease by default");
        let other = repo.find("anything");
        assert_eq!(other.algorithm.learning_seconds(), 20);
        assert_eq!(other.algorithm.parameters[0].value.as_deref(), Some("ignore"));
    }

    #[test]
    fn the_example_in_deploy_is_valid() {
        let repo = parse_text(include_str!("../../deploy/examples/server.yaml")).unwrap();
        assert_eq!(repo.find("orders/write").capacity, 500.0);
    }

    #[test]
    fn the_embedded_default_is_valid() {
        assert_eq!(parse_text(EMBEDDED_CONFIG).unwrap().templates().len(), 1);
    }

    #[test]
    fn errors_say_where() {
        let unknown_key = "resources:\n  - identifier_glob: '*'\n    capacity: 1\n    colour: red\n    algorithm: {kind: STATIC, lease_length: 1, refresh_interval: 1}\n";
        let e = parse_text(unknown_key).unwrap_err();
        assert!(e.contains("resources[0]") && e.contains("unknown field `colour`"), "{e}");
        let bad_kind = "resources:\n  - identifier_glob: '*'\n    capacity: 1\n    algorithm: {kind: FAIRER, lease_length: 1, refresh_interval: 1}\n";
        let e = parse_text(bad_kind).unwrap_err();
        assert!(e.contains("resources[0].algorithm.kind") && e.contains("unknown variant `FAIRER`"), "{e}");
        let negative = "resources:\n  - identifier_glob: '*'\n    capacity: -1\n    algorithm: {kind: STATIC, lease_length: 1, refresh_interval: 1}\n";
        assert_eq!(parse_text(negative).unwrap_err(), "resources[0] (\"*\"): capacity: must be from 0 to 1e15, got -1");
        assert!(parse_text("").is_err());
        assert!(!parse_text("resources: [").unwrap_err().contains('\n'));
    }

    const EDGE: &str = "\
domain: edge
descriptors:
  - key: generic_key
    value: demo
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 600}
    descriptors:
      - key: path
        rate_limit: {unit: day, requests_per_unit: 172800, name: paths}
  - key: generic_key
    value: free
    rate_limit: {unlimited: true}
";

    const OWN: &str = "\
resources:
  - identifier_glob: \"orders/*\"
    capacity: 5
    algorithm: {kind: STATIC, lease_length: 60, refresh_interval: 5}
  - identifier_glob: \"*\"
    capacity: 100
    algorithm: {kind: FAIR_SHARE, lease_length: 60, refresh_interval: 5}
";

    /// A directory holding `files` (name, text).
    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    /// [`OWN`] with `rate_limits` (YAML flow) in front.
    fn with_rate_limits(rate_limits: &str) -> String {
        format!("rate_limits: {rate_limits}\n{OWN}")
    }

    #[test]
    fn each_limit_of_a_rate_limit_file_is_a_template_before_the_files_own() {
        let dir = dir_with(&[("ratelimit.yaml", EDGE)]);
        let repo = parse(&with_rate_limits("{files: [ratelimit.yaml]}"), dir.path()).unwrap();
        let templates: Vec<(&str, f64, &str)> = repo
            .templates()
            .iter()
            .map(|t| (t.identifier_glob.as_str(), t.capacity, t.description.as_deref().unwrap_or("")))
            .collect();
        assert_eq!(
            templates,
            [
                // Deepest first, so that the nested keyed limit keeps its keys.
                (
                    "edge/remote_address=/path=/*",
                    2.0,
                    "ratelimit.yaml: edge/remote_address=/path= (paths), 172800 per day per key"
                ),
                ("edge/remote_address=/*", 10.0, "ratelimit.yaml: edge/remote_address=, 600 per minute per key"),
                ("edge/generic_key=demo", 20.0, "ratelimit.yaml: edge/generic_key=demo, 20 per second"),
                ("orders/*", 5.0, ""),
                ("*", 100.0, ""),
            ],
            "the unlimited one makes none"
        );
        let default = Algorithm {
            kind: Kind::FairShare,
            lease_length: RATE_LIMIT_LEASE_LENGTH,
            refresh_interval: RATE_LIMIT_REFRESH_INTERVAL,
            parameters: Vec::new(),
            learning_mode_duration: None,
        };
        assert_eq!(repo.templates()[0].algorithm, default);
        assert_eq!(repo.find("edge/remote_address=/10.0.0.1").capacity, 10.0);
        assert_eq!(repo.find("edge/remote_address=/!overflow").capacity, 10.0);
        assert_eq!(repo.find("edge/remote_address=/path=/10.0.0.1/%2Fapi").capacity, 2.0);
        assert_eq!(repo.find("edge/generic_key=free").capacity, 100.0, "unlimited: the catch-all's");
    }

    #[test]
    fn the_algorithm_of_rate_limits_is_every_such_templates_and_is_checked() {
        let dir = dir_with(&[("ratelimit.yaml", EDGE)]);
        let algorithm = "{kind: PROPORTIONAL_SHARE, lease_length: 20, refresh_interval: 5, learning_mode_duration: 0}";
        let text = with_rate_limits(&format!("{{files: [ratelimit.yaml], algorithm: {algorithm}}}"));
        let repo = parse(&text, dir.path()).unwrap();
        for t in &repo.templates()[..3] {
            let a = &t.algorithm;
            assert_eq!(
                (a.kind, a.lease_length, a.refresh_interval, a.learning_mode_duration),
                (Kind::ProportionalShare, 20, 5, Some(0))
            );
        }
        let text = with_rate_limits(
            "{files: [ratelimit.yaml], algorithm: {kind: FAIR_SHARE, lease_length: 20, refresh_interval: 0}}",
        );
        assert_eq!(parse(&text, dir.path()).unwrap_err(), "rate_limits.algorithm.refresh_interval: must be ≥ 1, got 0");
    }

    #[test]
    fn errors_name_the_file_and_where_in_it() {
        let dir = dir_with(&[
            ("ratelimit.yaml", EDGE),
            (
                "bad.yaml",
                "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            ),
            (
                "orders.yaml",
                "domain: orders\ndescriptors:\n  - {key: all, rate_limit: {unit: second, requests_per_unit: 1}}\n",
            ),
        ]);
        let error = |files: &str| parse(&with_rate_limits(&format!("{{files: {files}}}")), dir.path()).unwrap_err();
        let missing = error("[missing.yaml]");
        let expected =
            format!("rate_limits.files[0] (missing.yaml): cannot read {}: ", dir.path().join("missing.yaml").display());
        assert!(missing.starts_with(&expected) && !missing.contains('\n'), "{missing}");
        assert_eq!(
            error("[ratelimit.yaml, bad.yaml]"),
            "rate_limits.files[1] (bad.yaml): descriptors[0].rate_limit.unit: \"fortnight\" is not one of second, minute, hour, day, month, year"
        );
        assert_eq!(
            error("[ratelimit.yaml, orders.yaml, ratelimit.yaml]"),
            "rate_limits.files[2] (ratelimit.yaml): domain \"edge\" is also rate_limits.files[0]'s (ratelimit.yaml)"
        );
        let own = OWN.replace("orders/*", "edge/generic_key=demo");
        let text = format!("rate_limits: {{files: [ratelimit.yaml]}}\n{own}");
        assert_eq!(
            parse(&text, dir.path()).unwrap_err(),
            "rate_limits.files[0] (ratelimit.yaml): edge/generic_key=demo's template \"edge/generic_key=demo\" is also resources[0]'s glob"
        );
        // The file's own templates are named by their own index, whatever comes before them.
        let text = with_rate_limits("{files: [ratelimit.yaml]}").replace("capacity: 100", "capacity: -1");
        assert_eq!(
            parse(&text, dir.path()).unwrap_err(),
            "resources[1] (\"*\"): capacity: must be from 0 to 1e15, got -1"
        );
        let many = format!("[{}]", vec!["ratelimit.yaml"; MAX_FILES + 1].join(", "));
        assert_eq!(error(&many), format!("rate_limits.files: at most {MAX_FILES} files, got {}", MAX_FILES + 1));
    }

    #[test]
    fn relative_paths_are_found_beside_the_configuration() {
        let dir = dir_with(&[("limits/edge.yaml", EDGE)]);
        let elsewhere = dir_with(&[(
            "orders.yaml",
            "domain: orders\ndescriptors:\n  - {key: tier, value: gold, rate_limit: {unit: hour, requests_per_unit: 7200}}\n",
        )]);
        let absolute = elsewhere.path().join("orders.yaml");
        let text = with_rate_limits(&format!("{{files: [limits/edge.yaml, {:?}]}}", absolute.display().to_string()));
        assert_eq!(named_files(&text, dir.path()), [dir.path().join("limits/edge.yaml"), absolute.clone()]);
        let repo = parse(&text, dir.path()).unwrap();
        assert_eq!(repo.find("orders/tier=gold").capacity, 2.0, "its own, ahead of orders/*");
        assert_eq!(repo.find("edge/generic_key=demo").capacity, 20.0);
        assert!(
            parse(&text, elsewhere.path())
                .unwrap_err()
                .starts_with("rate_limits.files[0] (limits/edge.yaml): cannot read")
        );
        assert_eq!(named_files(OWN, dir.path()), Vec::<PathBuf>::new());
        assert_eq!(
            named_files("rate_limits: {files: [a]}\nresources: [", dir.path()),
            Vec::<PathBuf>::new(),
            "not YAML"
        );
        assert_eq!(
            named_files("rate_limits: {files: [a]}\nresources: 3", dir.path()),
            [dir.path().join("a")],
            "an invalid configuration's too"
        );
    }
}
