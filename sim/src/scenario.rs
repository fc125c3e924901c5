//! Scenario files: a small YAML document saying what runs (servers, clients and their load), for
//! how long, over what network, and what happens when. See `scenarios/*.yaml` and the crate's
//! `README.md`.

use std::{path::Path, sync::Arc};

use serde::Deserialize;
use sluice_server::core::Repository;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name: the results folder and the row of the table.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Every random choice of the run derives from it.
    pub seed: u64,
    /// Simulated seconds.
    pub duration: f64,
    /// Seconds between two samples of the metrics.
    #[serde(default = "one_second")]
    pub sample_every: f64,
    #[serde(default)]
    pub network: NetworkSpec,
    /// The root's configuration in Doorman's YAML form, loaded by the server's own parser.
    pub repository: yaml_serde::Value,
    /// The resource every client asks for.
    pub resource: String,
    #[serde(default)]
    pub topology: TopologySpec,
    pub clients: Vec<ClientGroup>,
    /// The service the resource protects, if the run models one: what the clients' admitted
    /// calls meet there is what their sidecars report (`capacity: adaptive` learns from it).
    pub service: Option<ServiceSpec>,
    #[serde(default)]
    pub events: Vec<EventSpec>,
    pub mishaps: Option<Mishaps>,
}

fn one_second() -> f64 {
    1.0
}

/// Every message (request or answer) takes `delay` plus a uniform share of `jitter` seconds and
/// is lost with probability `loss`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    #[serde(default)]
    pub delay: f64,
    #[serde(default)]
    pub jitter: f64,
    #[serde(default)]
    pub loss: f64,
}

/// The server tree: `levels[i]` servers under each server of the level above (none: the root
/// alone), each server a group of `replicas` electing a master. Clients are dealt round-robin
/// to the servers of the lowest level.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    #[serde(default = "one_replica")]
    pub replicas: usize,
    #[serde(default)]
    pub levels: Vec<usize>,
}

fn one_replica() -> usize {
    1
}

impl Default for TopologySpec {
    fn default() -> Self {
        TopologySpec { replicas: one_replica(), levels: Vec::new() }
    }
}

/// A service that can be overloaded, as `sluice-upstream --workers` is: `workers` calls served at
/// once, each taking `service_time` seconds, up to `queue` more waiting for a worker.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    pub workers: u32,
    pub service_time: f64,
    #[serde(default = "thousand")]
    pub queue: usize,
}

fn thousand() -> usize {
    1000
}

/// `count` alike clients.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientGroup {
    #[serde(default = "one_client")]
    pub count: usize,
    pub load: LoadSpec,
    /// When the clients start offering load (and first ask for capacity).
    #[serde(default)]
    pub join: f64,
    /// When they stop and release their leases; never if absent.
    pub leave: Option<f64>,
    /// Cost of one simulated request: fewer, larger arrivals for large loads.
    #[serde(default = "unit_cost")]
    pub request_cost: f64,
    #[serde(default)]
    pub priority: i64,
    /// The sidecar's `when_unreachable`.
    #[serde(default)]
    pub fallback: FallbackSpec,
    /// The sidecar's configured `safe_capacity`, enforced until a server names one.
    #[serde(default)]
    pub safe_capacity: f64,
}

fn one_client() -> usize {
    1
}

fn unit_cost() -> f64 {
    1.0
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FallbackSpec {
    #[default]
    Safe,
    Optimistic,
    Pessimistic,
}

/// Offered load in cost units per second: `base`, then a random walk.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSpec {
    pub base: f64,
    pub walk: Option<Walk>,
}

/// Every `every` seconds the load moves by a uniform amount in ±`step`, kept within
/// [`min`, `max`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Walk {
    pub every: f64,
    pub step: f64,
    pub min: f64,
    pub max: f64,
}

#[derive(Clone, Debug, Deserialize)]
pub struct EventSpec {
    pub at: f64,
    #[serde(flatten)]
    pub action: Action,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Clients (by position in the file's order, from 0) offer `to`, or `add` on top of their
    /// walk, for `for` seconds.
    Spike(Spike),
    /// A server's master dies; after `election` seconds another live replica wins (or, with
    /// one replica, the same one restarts), starting empty in learning mode. The dead replica
    /// comes back as a standby after `restart` seconds.
    Crash(Crash),
    /// Messages to and from `server` (every server if absent) are lost with probability `rate`
    /// for `for` seconds.
    Loss(Loss),
    /// The service's workers or service time change.
    Service(ServiceChange),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spike {
    pub clients: Vec<usize>,
    pub add: Option<f64>,
    pub to: Option<f64>,
    #[serde(rename = "for")]
    pub lasts: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Crash {
    #[serde(default = "root")]
    pub server: String,
    pub election: f64,
    pub restart: Option<f64>,
}

fn root() -> String {
    "root".into()
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Loss {
    pub server: Option<String>,
    pub rate: f64,
    #[serde(rename = "for")]
    pub lasts: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceChange {
    pub workers: Option<u32>,
    pub service_time: Option<f64>,
}

/// A random mishap every `every` seconds from `from` on, of a kind drawn among those given: a
/// random client spikes by `spike.add`, a random server crashes, or a random server is cut off
/// for `outage.for` seconds (longer than a lease, leases expire during it).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mishaps {
    pub every: f64,
    pub from: f64,
    pub spike: Option<MishapSpike>,
    pub crash: Option<MishapCrash>,
    pub outage: Option<Outage>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MishapSpike {
    pub add: f64,
    #[serde(rename = "for")]
    pub lasts: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MishapCrash {
    pub election: f64,
    pub restart: Option<f64>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outage {
    #[serde(rename = "for")]
    pub lasts: f64,
}

impl Scenario {
    pub fn load(path: &Path) -> Result<Scenario, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Scenario::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Scenario, String> {
        let scenario: Scenario = yaml_serde::from_str(text).map_err(|e| e.to_string())?;
        scenario.check()?;
        Ok(scenario)
    }

    /// The root's configuration, through the server's own loader and validation (files it names
    /// are found from the working directory).
    pub fn repository(&self) -> Result<Arc<Repository>, String> {
        let text = yaml_serde::to_string(&self.repository).map_err(|e| e.to_string())?;
        sluice_server::config::parse(&text, Path::new("")).map(Arc::new).map_err(|e| format!("repository: {e}"))
    }

    pub fn client_count(&self) -> usize {
        self.clients.iter().map(|group| group.count).sum()
    }

    fn check(&self) -> Result<(), String> {
        self.repository()?;
        let positive = |what: &str, value: f64| {
            if value.is_finite() && value > 0.0 { Ok(()) } else { Err(format!("{what}: must be > 0, got {value}")) }
        };
        let non_negative = |what: &str, value: f64| {
            if value.is_finite() && value >= 0.0 { Ok(()) } else { Err(format!("{what}: must be ≥ 0, got {value}")) }
        };
        positive("duration", self.duration)?;
        positive("sample_every", self.sample_every)?;
        non_negative("network.delay", self.network.delay)?;
        non_negative("network.jitter", self.network.jitter)?;
        probability("network.loss", self.network.loss)?;
        if self.topology.replicas == 0 || self.topology.levels.contains(&0) {
            return Err("topology: every level needs at least one server, and a server one replica".into());
        }
        if let Some(service) = &self.service {
            workers("service.workers", service.workers)?;
            positive("service.service_time", service.service_time)?;
        }
        if self.client_count() == 0 {
            return Err("clients: at least one".into());
        }
        for (i, group) in self.clients.iter().enumerate() {
            let at = |field: &str| format!("clients[{i}].{field}");
            non_negative(&at("load.base"), group.load.base)?;
            non_negative(&at("join"), group.join)?;
            positive(&at("request_cost"), group.request_cost)?;
            non_negative(&at("safe_capacity"), group.safe_capacity)?;
            if let Some(leave) = group.leave
                && (leave.is_nan() || leave <= group.join)
            {
                return Err(format!("{}: must come after join", at("leave")));
            }
            if let Some(walk) = &group.load.walk {
                positive(&at("load.walk.every"), walk.every)?;
                non_negative(&at("load.walk.step"), walk.step)?;
                if !(0.0 <= walk.min && walk.min <= walk.max && walk.max.is_finite()) {
                    return Err(format!("{}: need 0 ≤ min ≤ max", at("load.walk")));
                }
            }
        }
        for (i, event) in self.events.iter().enumerate() {
            let at = |field: &str| format!("events[{i}].{field}");
            non_negative(&at("at"), event.at)?;
            match &event.action {
                Action::Spike(spike) => {
                    positive(&at("spike.for"), spike.lasts)?;
                    if let Some(&client) = spike.clients.iter().find(|&&c| c >= self.client_count()) {
                        return Err(format!("{}: no client {client}", at("spike.clients")));
                    }
                    match (spike.add, spike.to) {
                        (Some(amount), None) | (None, Some(amount)) => non_negative(&at("spike"), amount)?,
                        _ => return Err(format!("{}: exactly one of add and to", at("spike"))),
                    }
                }
                Action::Crash(crash) => {
                    non_negative(&at("crash.election"), crash.election)?;
                    if let Some(restart) = crash.restart {
                        non_negative(&at("crash.restart"), restart)?;
                    }
                }
                Action::Loss(loss) => {
                    probability(&at("loss.rate"), loss.rate)?;
                    positive(&at("loss.for"), loss.lasts)?;
                }
                Action::Service(change) => {
                    if self.service.is_none() {
                        return Err(format!("{}: the scenario has no service", at("service")));
                    }
                    if let Some(n) = change.workers {
                        workers(&at("service.workers"), n)?;
                    }
                    if let Some(time) = change.service_time {
                        positive(&at("service.service_time"), time)?;
                    }
                }
            }
        }
        if let Some(mishaps) = &self.mishaps {
            positive("mishaps.every", mishaps.every)?;
            non_negative("mishaps.from", mishaps.from)?;
            if mishaps.spike.is_none() && mishaps.crash.is_none() && mishaps.outage.is_none() {
                return Err("mishaps: name at least one of spike, crash, outage".into());
            }
        }
        Ok(())
    }
}

fn workers(what: &str, value: u32) -> Result<(), String> {
    if value > 0 { Ok(()) } else { Err(format!("{what}: at least one")) }
}

fn probability(what: &str, value: f64) -> Result<(), String> {
    if (0.0..=1.0).contains(&value) { Ok(()) } else { Err(format!("{what}: must be within [0, 1], got {value}")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
name: t
seed: 1
duration: 60
repository:
  resources:
    - identifier_glob: "*"
      capacity: 10
      algorithm: {kind: FAIR_SHARE, lease_length: 20, refresh_interval: 5}
resource: r
clients:
  - load: {base: 1}
"#;

    #[test]
    fn a_minimal_scenario_takes_the_defaults() {
        let scenario = Scenario::parse(MINIMAL).unwrap();
        assert_eq!((scenario.client_count(), scenario.topology.replicas), (1, 1));
        assert_eq!(scenario.repository().unwrap().find("r").capacity, 10.0);
    }

    #[test]
    fn mistakes_are_named() {
        let with = |extra: &str| Scenario::parse(&format!("{MINIMAL}{extra}")).unwrap_err();
        assert!(
            with("events: [{at: 5, spike: {clients: [3], to: 5, for: 1}}]")
                .contains("events[0].spike.clients: no client 3")
        );
        assert!(with("events: [{at: 5, spike: {clients: [0], for: 1}}]").contains("exactly one of add and to"));
        assert!(with("network: {loss: 2}").contains("network.loss"));
        assert!(with("colour: red").contains("unknown field"));
        assert!(
            with("events: [{at: 5, service: {workers: 4}}]").contains("events[0].service: the scenario has no service")
        );
        assert!(with("service: {workers: 0, service_time: 0.01}").contains("service.workers: at least one"));
        let bad_repository = MINIMAL.replace("capacity: 10", "capacity: -1");
        assert!(Scenario::parse(&bad_repository).unwrap_err().starts_with("repository: "));
    }
}
