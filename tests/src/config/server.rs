//! A capacity server's configuration (`docs/server.md`).

use serde::Serialize;

use super::{ConfigFile, yaml};

/// A capacity server's configuration: Doorman's `ResourceRepository`. A resource takes the
/// template whose glob is its id, else the first that matches it; the catch-all `*` comes last.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerConfig {
    rate_limits: Option<RateLimits>,
    resources: Vec<Template>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    policies: Vec<Policy>,
}

/// Who may ask for what: the client ids, resources and calls of the identities that match.
#[derive(Clone, Debug, Serialize)]
pub struct Policy {
    identity: String,
    client_ids: Vec<String>,
    resources: Option<Vec<String>>,
    server_capacity: bool,
    max_client_ids: Option<usize>,
}

impl Policy {
    pub fn new(identity: &str, client_ids: &[&str]) -> Self {
        Policy {
            identity: identity.into(),
            client_ids: client_ids.iter().map(|&c| c.into()).collect(),
            resources: None,
            server_capacity: false,
            max_client_ids: None,
        }
    }

    pub fn resources(mut self, globs: &[&str]) -> Self {
        self.resources = Some(globs.iter().map(|&g| g.into()).collect());
        self
    }

    /// May call GetServerCapacity, as an intermediate server does.
    pub fn server_capacity(mut self) -> Self {
        self.server_capacity = true;
        self
    }

    pub fn max_client_ids(mut self, n: usize) -> Self {
        self.max_client_ids = Some(n);
        self
    }
}

/// envoyproxy/ratelimit files, each of whose limits is a template ahead of `resources`.
#[derive(Clone, Debug, Serialize)]
struct RateLimits {
    files: Vec<String>,
    algorithm: Option<Algorithm>,
}

impl ServerConfig {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the limits of `files` (relative: beside the configuration) as templates, each with
    /// `algorithm` (`None`: the server's default).
    pub fn rate_limits(mut self, files: &[&str], algorithm: Option<Algorithm>) -> Self {
        self.rate_limits = Some(RateLimits { files: files.iter().map(|f| (*f).to_owned()).collect(), algorithm });
        self
    }

    pub fn template(mut self, template: Template) -> Self {
        self.resources.push(template);
        self
    }

    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }
}

impl ConfigFile for ServerConfig {
    fn yaml(&self) -> String {
        yaml(self)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Template {
    identifier_glob: String,
    capacity: Capacity,
    adaptive: Option<Adaptive>,
    safe_capacity: Option<f64>,
    description: Option<String>,
    algorithm: Algorithm,
}

impl Template {
    pub fn new(identifier_glob: &str, capacity: f64, algorithm: Algorithm) -> Self {
        Template {
            identifier_glob: identifier_glob.into(),
            capacity: Capacity::Fixed(capacity),
            adaptive: None,
            safe_capacity: None,
            description: None,
            algorithm,
        }
    }

    /// A template whose capacity is learned from the service, between `min` and `max`.
    pub fn adaptive(identifier_glob: &str, min: f64, max: f64, algorithm: Algorithm) -> Self {
        Template {
            capacity: Capacity::Learned("adaptive"),
            adaptive: Some(Adaptive { min, max }),
            ..Self::new(identifier_glob, 0.0, algorithm)
        }
    }

    /// The template of every resource no other template names.
    pub fn catch_all(capacity: f64, algorithm: Algorithm) -> Self {
        Self::new("*", capacity, algorithm)
    }

    /// What clients fall back on without a lease.
    pub fn safe_capacity(mut self, capacity: f64) -> Self {
        self.safe_capacity = Some(capacity);
        self
    }

    pub fn description(mut self, text: &str) -> Self {
        self.description = Some(text.into());
        self
    }
}

/// A number, or `adaptive`.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(untagged)]
enum Capacity {
    Fixed(f64),
    Learned(&'static str),
}

/// An adaptive template's bounds; the controller's settings keep their defaults.
#[derive(Clone, Copy, Debug, Serialize)]
struct Adaptive {
    min: f64,
    max: f64,
}

#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AlgorithmKind {
    NoAlgorithm,
    Static,
    ProportionalShare,
    FairShare,
}

/// How a template's capacity is shared, in whole seconds.
#[derive(Clone, Debug, Serialize)]
pub struct Algorithm {
    kind: AlgorithmKind,
    lease_length: u64,
    refresh_interval: u64,
    learning_mode_duration: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    parameters: Vec<Parameter>,
}

impl Algorithm {
    /// Learning mode lasts a lease length unless [`Algorithm::learning`] says otherwise.
    pub fn new(kind: AlgorithmKind, lease_length: u64, refresh_interval: u64) -> Self {
        Algorithm { kind, lease_length, refresh_interval, learning_mode_duration: None, parameters: Vec::new() }
    }

    pub fn fair_share(lease_length: u64, refresh_interval: u64) -> Self {
        Self::new(AlgorithmKind::FairShare, lease_length, refresh_interval)
    }

    /// Seconds of learning mode after the server starts or wins an election.
    pub fn learning(mut self, seconds: u64) -> Self {
        self.learning_mode_duration = Some(seconds);
        self
    }

    pub fn parameter(mut self, parameter: Parameter) -> Self {
        self.parameters.push(parameter);
        self
    }
}

/// Sluice's own template parameters.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(tag = "name", content = "value", rename_all = "snake_case")]
pub enum Parameter {
    /// How clients' priorities divide the capacity into bands.
    PriorityMode(PriorityMode),
    /// How a parent counts an intermediate server's demand (read from the root).
    SubtreeWants(SubtreeWants),
}

#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PriorityMode {
    Strict,
    Ignore,
}

#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SubtreeWants {
    Sum,
    Profile,
}
