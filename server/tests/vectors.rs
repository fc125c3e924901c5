//! Every worked example of `data/algorithms.yaml` (SPEC §3.3) and of the priority bands in
//! `data/priorities.yaml` (SPEC §3.7), run against the core.

use std::{collections::HashMap, sync::Arc};

use serde::Deserialize;
use sluice_server::core::{Algorithm, Claim, Holds, Kind, Parameter, Resource, Template, Wants};

#[derive(Deserialize)]
struct Vectors {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    algorithm: String,
    capacity: f64,
    priority_mode: Option<String>,
    subtree_wants: Option<String>,
    #[serde(default)]
    preload: Vec<Preload>,
    steps: Vec<Step>,
}

#[derive(Deserialize)]
struct Preload {
    client: String,
    #[serde(flatten)]
    demand: DemandDoc,
}

/// One band (`wants`, `subclients`, `priority`), or a server's `bands` (several with one
/// priority: the groups of that band's profile).
#[derive(Deserialize)]
struct DemandDoc {
    #[serde(default)]
    wants: f64,
    #[serde(default = "one")]
    subclients: f64,
    #[serde(default)]
    priority: i64,
    bands: Option<Vec<BandDoc>>,
}

#[derive(Deserialize)]
struct BandDoc {
    priority: i64,
    wants: f64,
    subclients: f64,
}

impl DemandDoc {
    fn claim(&self, has: Option<f64>) -> Claim {
        let wants = match &self.bands {
            Some(bands) => {
                bands.iter().map(|b| Wants { priority: b.priority, wants: b.wants, subclients: b.subclients }).collect()
            }
            None => [Wants { priority: self.priority, wants: self.wants, subclients: self.subclients }].into(),
        };
        Claim { wants, has, holds: Holds::Own, signals: None }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Step {
    Release {
        release: String,
    },
    Request {
        client: String,
        #[serde(flatten)]
        demand: DemandDoc,
        has: Option<f64>,
        #[serde(default)]
        learning: bool,
        expect: f64,
    },
}

fn one() -> f64 {
    1.0
}

fn kind(name: &str) -> Kind {
    match name {
        "NO_ALGORITHM" => Kind::NoAlgorithm,
        "STATIC" => Kind::Static,
        "PROPORTIONAL_SHARE" => Kind::ProportionalShare,
        "FAIR_SHARE" => Kind::FairShare,
        other => panic!("unknown algorithm {other}"),
    }
}

#[test]
fn every_algorithm_vector_passes() {
    run(&load("algorithms.yaml", 20));
}

#[test]
fn every_priority_vector_passes() {
    run(&load("priorities.yaml", 8));
}

/// Reads a vectors file, checking that it still has at least `least` cases.
fn load(name: &str, least: usize) -> Vectors {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let vectors: Vectors = yaml_serde::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(vectors.cases.len() >= least, "{name} lost cases");
    vectors
}

fn run(vectors: &Vectors) {
    let now = 1_000;
    let mut failures = Vec::new();
    for case in &vectors.cases {
        let template = Template {
            identifier_glob: "*".into(),
            capacity: case.capacity,
            adaptive: None,
            safe_capacity: None,
            description: None,
            // Nothing expires during a case.
            algorithm: Algorithm {
                kind: kind(&case.algorithm),
                lease_length: 3_600,
                refresh_interval: 1,
                parameters: [("priority_mode", &case.priority_mode), ("subtree_wants", &case.subtree_wants)]
                    .into_iter()
                    .filter_map(|(name, value)| value.clone().map(|v| Parameter { name: name.into(), value: Some(v) }))
                    .collect(),
                learning_mode_duration: None,
            },
        };
        let mut resource = Resource::new(Arc::new(template));
        // A preloaded client is in the store with its wants and has 0: what a learning-mode
        // request reporting nothing leaves behind.
        for p in &case.preload {
            let claim = p.demand.claim(None);
            assert_eq!(resource.claim(&p.client, &claim, now, true).capacity, 0.0);
        }
        let mut granted: HashMap<&str, f64> = HashMap::new();
        for (i, step) in case.steps.iter().enumerate() {
            match step {
                Step::Release { release } => {
                    assert!(resource.release(release), "{}: step {i}: {release} held no lease", case.name);
                    granted.remove(release.as_str());
                }
                Step::Request { client, demand, has, learning, expect } => {
                    let has = has.or_else(|| granted.get(client.as_str()).copied());
                    let claim = demand.claim(has);
                    let got = resource.claim(client, &claim, now, *learning).capacity;
                    if (got - expect).abs() > 1e-6 {
                        failures.push(format!("{}: step {i} ({client}): expected {expect}, got {got}", case.name));
                    }
                    granted.insert(client, got);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} vector step(s) failed:\n{}", failures.len(), failures.join("\n"));
}
