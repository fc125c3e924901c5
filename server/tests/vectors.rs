//! Every worked example of `data/algorithms.yaml` (SPEC §3.3), run against the core.

use std::{collections::HashMap, sync::Arc};

use serde::Deserialize;
use sluice_server::core::{Algorithm, Claim, Kind, Resource, Template};

#[derive(Deserialize)]
struct Vectors {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    algorithm: String,
    capacity: f64,
    #[serde(default)]
    preload: Vec<Preload>,
    steps: Vec<Step>,
}

#[derive(Deserialize)]
struct Preload {
    client: String,
    wants: f64,
    #[serde(default = "one")]
    subclients: f64,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Step {
    Release {
        release: String,
    },
    Request {
        client: String,
        wants: f64,
        #[serde(default = "one")]
        subclients: f64,
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
fn every_vector_passes() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/algorithms.yaml")).unwrap();
    let vectors: Vectors = yaml_serde::from_str(&text).unwrap();
    assert!(vectors.cases.len() >= 20, "the vectors file lost cases");
    let now = 1_000;
    let mut failures = Vec::new();
    for case in &vectors.cases {
        let template = Template {
            identifier_glob: "*".into(),
            capacity: case.capacity,
            safe_capacity: None,
            description: None,
            // Nothing expires during a case.
            algorithm: Algorithm {
                kind: kind(&case.algorithm),
                lease_length: 3_600,
                refresh_interval: 1,
                parameters: vec![],
                learning_mode_duration: None,
            },
        };
        let mut resource = Resource::new(Arc::new(template));
        // A preloaded client is in the store with its wants and has 0: what a learning-mode
        // request reporting nothing leaves behind.
        for p in &case.preload {
            let claim = Claim { wants: p.wants, subclients: p.subclients, has: None };
            assert_eq!(resource.claim(&p.client, &claim, now, true).capacity, 0.0);
        }
        let mut granted: HashMap<&str, f64> = HashMap::new();
        for (i, step) in case.steps.iter().enumerate() {
            match step {
                Step::Release { release } => {
                    assert!(resource.release(release), "{}: step {i}: {release} held no lease", case.name);
                    granted.remove(release.as_str());
                }
                Step::Request { client, wants, subclients, has, learning, expect } => {
                    let has = has.or_else(|| granted.get(client.as_str()).copied());
                    let claim = Claim { wants: *wants, subclients: *subclients, has };
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
