//! The server's configuration file: Doorman's YAML form of `ResourceRepository`, loaded unchanged
//! and validated into a [`Repository`].

use serde::Deserialize;

use crate::core::{Algorithm, Kind, Parameter, Repository, Template};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    resources: Vec<TemplateDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateDoc {
    identifier_glob: String,
    capacity: f64,
    safe_capacity: Option<f64>,
    description: Option<String>,
    algorithm: AlgorithmDoc,
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

/// Parses and validates a configuration; the error is one line naming what is wrong and where.
pub fn parse(text: &str) -> Result<Repository, String> {
    let doc: Document = yaml_serde::from_str(text).map_err(|e| e.to_string().replace('\n', " "))?;
    let templates = doc
        .resources
        .into_iter()
        .map(|t| Template {
            identifier_glob: t.identifier_glob,
            capacity: t.capacity,
            safe_capacity: t.safe_capacity,
            description: t.description,
            algorithm: Algorithm {
                kind: match t.algorithm.kind {
                    KindDoc::NoAlgorithm => Kind::NoAlgorithm,
                    KindDoc::Static => Kind::Static,
                    KindDoc::ProportionalShare => Kind::ProportionalShare,
                    KindDoc::FairShare => Kind::FairShare,
                },
                lease_length: t.algorithm.lease_length,
                refresh_interval: t.algorithm.refresh_interval,
                parameters: t
                    .algorithm
                    .parameters
                    .into_iter()
                    .map(|p| Parameter { name: p.name, value: p.value })
                    .collect(),
                learning_mode_duration: t.algorithm.learning_mode_duration,
            },
        })
        .collect();
    // A glob's error quotes the character it choked on, which may be a line break.
    Repository::new(templates).map_err(|e| e.to_string().replace('\n', "\\n").replace('\r', "\\r"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults::EMBEDDED_CONFIG;

    #[test]
    fn an_error_is_one_line_whatever_the_glob() {
        let text = "resources:\n  - identifier_glob: \"[e-\\n]\"\n    capacity: 1\n    \
                    algorithm: {kind: STATIC, lease_length: 60, refresh_interval: 5}\n";
        let error = parse(text).expect_err("a malformed glob");
        assert!(error.contains("malformed glob") && !error.contains('\n'), "{error:?}");
    }

    #[test]
    fn doormans_example_loads_unchanged() {
        let repo = parse(
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
        let repo = parse(include_str!("../../deploy/examples/server.yaml")).unwrap();
        assert_eq!(repo.find("orders/write").capacity, 500.0);
    }

    #[test]
    fn the_embedded_default_is_valid() {
        assert_eq!(parse(EMBEDDED_CONFIG).unwrap().templates().len(), 1);
    }

    #[test]
    fn errors_say_where() {
        let unknown_key = "resources:\n  - identifier_glob: '*'\n    capacity: 1\n    colour: red\n    algorithm: {kind: STATIC, lease_length: 1, refresh_interval: 1}\n";
        let e = parse(unknown_key).unwrap_err();
        assert!(e.contains("resources[0]") && e.contains("unknown field `colour`"), "{e}");
        let bad_kind = "resources:\n  - identifier_glob: '*'\n    capacity: 1\n    algorithm: {kind: FAIRER, lease_length: 1, refresh_interval: 1}\n";
        let e = parse(bad_kind).unwrap_err();
        assert!(e.contains("resources[0].algorithm.kind") && e.contains("unknown variant `FAIRER`"), "{e}");
        let negative = "resources:\n  - identifier_glob: '*'\n    capacity: -1\n    algorithm: {kind: STATIC, lease_length: 1, refresh_interval: 1}\n";
        assert_eq!(parse(negative).unwrap_err(), "resources[0] (\"*\"): capacity: must be finite and ≥ 0, got -1");
        assert!(parse("").is_err());
        assert!(!parse("resources: [").unwrap_err().contains('\n'));
    }
}
