//! Kubernetes objects for the chart, inject and webhook tests, without a cluster: `helm` renders
//! the chart, `tests/kubernetes/validate.py` checks objects strictly against the schemas of
//! Kubernetes 1.30 and 1.37 (and of the Prometheus operator and cert-manager), and the
//! containers the objects describe can be read back as the command lines to start.

use std::{
    collections::HashMap,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use serde::Deserialize;
use serde_json::Value;

use crate::harness::{can_run, missing_tools};

/// The Kubernetes versions every object is validated for: the oldest with native sidecars on
/// by default that is still common, and the newest the schemas cover.
pub const VERSIONS: [&str; 2] = ["1.30", "1.37"];

/// The Python modules `validate.py` imports.
const MODULES: &str =
    "kubernetes_validate, jsonschema, yaml, cloudcoil.models.prometheus_operator, cloudcoil.models.cert_manager";

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_path_buf()
}

pub fn chart() -> PathBuf {
    repo().join("helm/sluice")
}

/// Whether `helm` and the validator's Python modules are here (see `can_run`).
pub fn tools_ready(test: &str) -> bool {
    let mut missing = missing_tools(&["helm", "python3"]);
    if missing.is_empty() {
        let check = Command::new("python3").args(["-c", &format!("import {MODULES}")]).output();
        if !check.is_ok_and(|out| out.status.success()) {
            missing.push(format!("the Python modules {MODULES}"));
        }
    }
    can_run(test, &missing)
}

/// Runs a command with `stdin`, returning its output.
pub fn run_with_input(command: &mut Command, stdin: &str) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
    child.wait_with_output().expect("wait")
}

/// `helm` with `args`: its standard output, or its standard error as the error.
pub fn helm(args: &[&str]) -> Result<String, String> {
    let out = Command::new("helm").args(args).output().expect("helm runs");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    if out.status.success() { Ok(text(&out.stdout)) } else { Err(text(&out.stderr)) }
}

/// The chart rendered as release `sluice` in namespace `sluice`, with `args` (values files,
/// `--set`s) added.
pub fn render(chart: &Path, args: &[&str]) -> Result<String, String> {
    let chart = chart.to_str().expect("a UTF-8 path");
    helm(&[&["template", "sluice", chart, "--namespace", "sluice"], args].concat())
}

/// Validates every object of a YAML stream strictly for each of [`VERSIONS`]: the validator's
/// summary (one line per kind), or its error.
pub fn validate(yaml: &str) -> Result<String, String> {
    let script = repo().join("tests/kubernetes/validate.py");
    let mut command = Command::new("python3");
    command.arg(script);
    for version in VERSIONS {
        command.args(["-k", version]);
    }
    let out = run_with_input(command.arg("-"), yaml);
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    if out.status.success() { Ok(text(&out.stdout)) } else { Err(text(&out.stderr)) }
}

/// The documents of a YAML stream, as JSON values; empty documents left out.
pub fn documents(yaml: &str) -> Vec<Value> {
    yaml_serde::Deserializer::from_str(yaml)
        .map(|document| yaml_serde::Value::deserialize(document).expect("valid YAML"))
        .map(|value| serde_json::to_value(value).expect("JSON-compatible YAML"))
        .filter(|value| !value.is_null())
        .collect()
}

/// The object of `kind` named `name`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The pod template of a workload (or the pod itself).
pub fn pod_template(object: &Value) -> &Value {
    match object["kind"].as_str() {
        Some("Pod") => object,
        Some("CronJob") => &object["spec"]["jobTemplate"]["spec"]["template"],
        _ => &object["spec"]["template"],
    }
}

/// The container `name` of a pod template, among its containers and init containers.
pub fn container<'a>(template: &'a Value, name: &str) -> &'a Value {
    let spec = &template["spec"];
    ["initContainers", "containers"]
        .iter()
        .filter_map(|list| spec[list].as_array())
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// What a container runs, as the kubelet would start it: its command and args with `$(VAR)`
/// replaced from its environment (literal values and those in `downward`, the downward API's
/// values by field path), and that environment.
#[derive(Clone, Debug)]
pub struct Launch {
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The container's named ports.
    pub ports: HashMap<String, u16>,
}

impl Launch {
    pub fn of(container: &Value, downward: &HashMap<&str, &str>) -> Launch {
        let mut env = Vec::new();
        for var in container["env"].as_array().into_iter().flatten() {
            let name = var["name"].as_str().expect("env name").to_owned();
            let value = match (&var["value"], &var["valueFrom"]["fieldRef"]["fieldPath"]) {
                (Value::String(value), _) => value.clone(),
                (_, Value::String(path)) => {
                    downward.get(path.as_str()).unwrap_or_else(|| panic!("no value for {path}")).to_string()
                }
                _ => panic!("env {name}: neither a value nor a field"),
            };
            env.push((name, value));
        }
        let expand = |text: &str| {
            env.iter().fold(text.to_owned(), |text, (name, value)| text.replace(&format!("$({name})"), value))
        };
        let strings = |list: &Value| -> Vec<String> {
            list.as_array().into_iter().flatten().map(|a| expand(a.as_str().expect("a string"))).collect()
        };
        let command = [strings(&container["command"]), strings(&container["args"])].concat();
        let ports = container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| (p["name"].as_str().expect("port name").to_owned(), p["containerPort"].as_u64().unwrap() as u16))
            .collect();
        Launch { command, env, ports }
    }

    /// The value of `--flag`, given as `--flag=value` or `--flag value`.
    pub fn flag(&self, flag: &str) -> Option<&str> {
        let prefix = format!("{flag}=");
        self.command.iter().enumerate().find_map(|(i, arg)| {
            if arg == flag { self.command.get(i + 1).map(String::as_str) } else { arg.strip_prefix(&prefix) }
        })
    }

    /// Puts `value` in place of the value of `--flag`, wherever and however it is given.
    pub fn set_flag(&mut self, flag: &str, value: &str) {
        let prefix = format!("{flag}=");
        let at = self.command.iter().position(|a| a == flag || a.starts_with(&prefix));
        match at {
            Some(i) if self.command[i] == flag => self.command[i + 1] = value.to_owned(),
            Some(i) => self.command[i] = format!("{flag}={value}"),
            None => panic!("no {flag} in {:?}", self.command),
        }
    }
}
