//! Puts the sidecar into Kubernetes pods, as `linkerd inject` and `istioctl kube-inject` do:
//! every pod template of the input gets the sidecar container, its configuration volume and an
//! annotation recording the injection. `sluice-sidecar inject` runs it over YAML files and the
//! admission webhook ([`review`]) over the pods the API server sends; both call [`pod`].
//!
//! Injecting again first takes out what an earlier injection added, so injecting twice gives
//! what injecting once does, with the settings of the last run.

pub mod review;

use clap::Args;
use sluice_runtime::cli::host_port;
use yaml_serde::{Mapping, Value};

/// The injected container's name, which an injection again replaces.
pub const CONTAINER: &str = "sluice-sidecar";

/// The volume holding the sidecar's configuration.
pub const VOLUME: &str = "sluice-config";

/// Annotation of an injected pod: the injector's version.
pub const INJECTED: &str = "sluice.io/injected";

/// Label of an injected pod, for a PodMonitor to select the pods whose metrics it scrapes.
pub const SIDECAR_LABEL: &str = "sluice.io/sidecar";

/// Pod label or namespace label that asks the webhook for the sidecar (`enabled`), or a pod
/// label or annotation that refuses it (`disabled`).
pub const INJECT: &str = "sluice.io/inject";

/// Pod annotation naming the ConfigMap the webhook mounts.
pub const CONFIG_ANNOTATION: &str = "sluice.io/config";

/// The key of the ConfigMap that holds the sidecar's configuration, and its mount point.
pub const CONFIG_KEY: &str = "sidecar.yaml";
pub const CONFIG_DIR: &str = "/etc/sluice";

/// The sidecar binary in the image.
pub const BINARY: &str = "/usr/local/bin/sluice-sidecar";

/// The admin listener's port on the pod IP, and the port's name (metrics, probes).
pub const ADMIN_PORT: u16 = 9901;
pub const ADMIN_PORT_NAME: &str = "sluice-admin";

/// The image's non-root user (distroless' `nonroot`).
const USER: u32 = 65532;

/// The image the sidecar runs from unless `--image` says otherwise.
pub const DEFAULT_IMAGE: &str = concat!("sluice:", env!("CARGO_PKG_VERSION"));

/// What the injected container looks like, as flags of `inject` and `webhook`.
#[derive(Clone, Debug, Args)]
pub struct Settings {
    /// Image of the injected container (it holds /usr/local/bin/sluice-sidecar).
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,

    /// Capacity servers (comma-separated host:port), in place of the configuration's
    /// `server.addresses`; without it, the configuration's apply.
    #[arg(long = "server", value_name = "ADDRESSES", value_delimiter = ',', value_parser = host_port)]
    pub servers: Vec<String>,

    /// Inject a plain container instead of a native sidecar (an init container that keeps
    /// running), for clusters older than Kubernetes 1.29. Job pods then never complete.
    #[arg(long)]
    pub classic: bool,

    /// CPU the container requests.
    #[arg(long, default_value = "50m", value_parser = quantity)]
    pub cpu_request: String,

    /// Memory the container requests.
    #[arg(long, default_value = "32Mi", value_parser = quantity)]
    pub memory_request: String,

    /// CPU limit; none by default, since a throttled sidecar delays every request it passes.
    #[arg(long, value_parser = quantity)]
    pub cpu_limit: Option<String>,

    /// Memory limit.
    #[arg(long, default_value = "128Mi", value_parser = quantity)]
    pub memory_limit: String,
}

/// A Kubernetes resource quantity such as `100m`, `0.5`, `64Mi` or `1e3`.
pub fn quantity(text: &str) -> Result<String, String> {
    let number_end = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let digits = number.replace('.', "");
    let number_ok = !digits.is_empty() && number.matches('.').count() <= 1;
    let exponent_ok = |e: &str| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
    };
    let suffix_ok =
        matches!(suffix, "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei")
            || suffix.strip_prefix(['e', 'E']).is_some_and(exponent_ok);
    if number_ok && suffix_ok {
        Ok(text.to_owned())
    } else {
        Err(format!("{text:?} is not a Kubernetes quantity (e.g. 100m, 0.5, 64Mi)"))
    }
}

/// A ConfigMap name: a DNS subdomain (RFC 1123), as Kubernetes requires.
pub fn config_map_name(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= 253
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok { Ok(text.to_owned()) } else { Err(format!("{text:?} is not a ConfigMap name")) }
}

/// Every document of a multi-document YAML stream, each with the sidecar in its pod templates,
/// as YAML again. Empty documents are left out.
pub fn documents(text: &str, settings: &Settings, config_map: &str) -> Result<String, String> {
    let mut out = Vec::new();
    for (i, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let mut value: Value =
            serde::Deserialize::deserialize(document).map_err(|e| format!("document {}: {e}", i + 1))?;
        if value.is_null() {
            continue;
        }
        object(&mut value, settings, config_map).map_err(|e| format!("document {}: {e}", i + 1))?;
        out.push(yaml_serde::to_string(&value).map_err(|e| format!("document {}: {e}", i + 1))?);
    }
    Ok(out.join("---\n"))
}

/// Where each kind that has pods keeps its pod template.
fn template_path(kind: &str) -> Option<&'static [&'static str]> {
    match kind {
        "Pod" => Some(&[]),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => Some(&["spec", "template"]),
        "CronJob" => Some(&["spec", "jobTemplate", "spec", "template"]),
        _ => None,
    }
}

/// One object (a `List`'s items each); kinds without pods are left as they are.
pub fn object(object: &mut Value, settings: &Settings, config_map: &str) -> Result<(), String> {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default().to_owned();
    let name = object.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("").to_owned();
    if kind == "List" {
        let items = object.get_mut("items").and_then(Value::as_sequence_mut);
        for (i, item) in items.into_iter().flatten().enumerate() {
            self::object(item, settings, config_map).map_err(|e| format!("items[{i}]: {e}"))?;
        }
        return Ok(());
    }
    let Some(path) = template_path(&kind) else { return Ok(()) };
    let mut template = &mut *object;
    for key in path {
        template = template.get_mut(*key).ok_or_else(|| format!("{kind} {name:?}: no {}", path.join(".")))?;
    }
    pod(template, settings, config_map).map_err(|e| format!("{kind} {name:?}: {e}"))
}

/// A pod or pod template (metadata and spec): the sidecar added, or put in place of the one an
/// earlier injection added.
pub fn pod(pod: &mut Value, settings: &Settings, config_map: &str) -> Result<(), String> {
    let pod = pod.as_mapping_mut().ok_or("the pod is not a mapping")?;
    let metadata = child(pod, "metadata")?;
    child(metadata, "annotations")?
        .insert(INJECTED.into(), concat!("sluice-sidecar ", env!("CARGO_PKG_VERSION")).into());
    child(metadata, "labels")?.insert(SIDECAR_LABEL.into(), "injected".into());
    let spec = pod.get_mut("spec").and_then(Value::as_mapping_mut).ok_or("no spec")?;
    for list in ["initContainers", "containers"] {
        remove_named(spec, list, CONTAINER)?;
    }
    remove_named(spec, "volumes", VOLUME)?;
    if settings.classic {
        sequence(spec, "containers")?.push(container(settings));
    } else {
        // First, so that it serves the workload's own init containers too.
        sequence(spec, "initContainers")?.insert(0, container(settings));
    }
    sequence(spec, "volumes")?.push(map([
        ("name", VOLUME.into()),
        (
            "configMap",
            map([
                ("name", config_map.into()),
                ("items", Value::Sequence(vec![map([("key", CONFIG_KEY.into()), ("path", CONFIG_KEY.into())])])),
            ]),
        ),
    ]));
    Ok(())
}

/// The sidecar container.
fn container(settings: &Settings) -> Value {
    let mut args: Vec<Value> = vec![
        "--config".into(),
        format!("{CONFIG_DIR}/{CONFIG_KEY}").into(),
        // On the pod IP, so that the kubelet's probes and Prometheus reach it.
        "--admin-addr".into(),
        format!("$(POD_IP):{ADMIN_PORT}").into(),
    ];
    if !settings.servers.is_empty() {
        args.extend(["--server-addresses".into(), settings.servers.join(",").into()]);
    }
    let mut limits = Mapping::new();
    if let Some(cpu) = &settings.cpu_limit {
        limits.insert("cpu".into(), cpu.as_str().into());
    }
    limits.insert("memory".into(), settings.memory_limit.as_str().into());
    let field = |name: &str, path: &str| {
        map([
            ("name", name.into()),
            ("valueFrom", map([("fieldRef", map([("apiVersion", "v1".into()), ("fieldPath", path.into())]))])),
        ])
    };
    let probe = |path: &str, period: u32, failures: u32| {
        map([
            ("httpGet", map([("path", path.into()), ("port", ADMIN_PORT_NAME.into())])),
            ("periodSeconds", period.into()),
            ("failureThreshold", failures.into()),
        ])
    };
    let mut container = map([
        ("name", CONTAINER.into()),
        ("image", settings.image.as_str().into()),
        ("command", Value::Sequence(vec![BINARY.into()])),
        ("args", Value::Sequence(args)),
        // POD_NAME is the lease client id.
        ("env", Value::Sequence(vec![field("POD_NAME", "metadata.name"), field("POD_IP", "status.podIP")])),
        (
            "ports",
            Value::Sequence(vec![map([
                ("name", ADMIN_PORT_NAME.into()),
                ("containerPort", ADMIN_PORT.into()),
                ("protocol", "TCP".into()),
            ])]),
        ),
        ("startupProbe", probe("/ready", 1, 60)),
        ("livenessProbe", probe("/live", 10, 3)),
        (
            "resources",
            map([
                (
                    "requests",
                    map([
                        ("cpu", settings.cpu_request.as_str().into()),
                        ("memory", settings.memory_request.as_str().into()),
                    ]),
                ),
                ("limits", Value::Mapping(limits)),
            ]),
        ),
        (
            "securityContext",
            map([
                ("runAsNonRoot", true.into()),
                ("runAsUser", USER.into()),
                ("runAsGroup", USER.into()),
                ("readOnlyRootFilesystem", true.into()),
                ("allowPrivilegeEscalation", false.into()),
                ("capabilities", map([("drop", Value::Sequence(vec!["ALL".into()]))])),
                ("seccompProfile", map([("type", "RuntimeDefault".into())])),
            ]),
        ),
        (
            "volumeMounts",
            Value::Sequence(vec![map([
                ("name", VOLUME.into()),
                ("mountPath", CONFIG_DIR.into()),
                ("readOnly", true.into()),
            ])]),
        ),
    ]);
    if !settings.classic {
        let container = container.as_mapping_mut().expect("a mapping");
        container.insert("restartPolicy".into(), "Always".into());
    }
    container
}

fn map<const N: usize>(entries: [(&str, Value); N]) -> Value {
    Value::Mapping(entries.into_iter().map(|(key, value)| (Value::from(key), value)).collect())
}

/// The mapping under `key`, added if absent.
fn child<'a>(parent: &'a mut Mapping, key: &str) -> Result<&'a mut Mapping, String> {
    let value = parent.entry(key.into()).or_insert(Value::Mapping(Mapping::new()));
    if value.is_null() {
        *value = Value::Mapping(Mapping::new());
    }
    value.as_mapping_mut().ok_or_else(|| format!("{key} is not a mapping"))
}

/// The sequence under `key`, added if absent.
fn sequence<'a>(parent: &'a mut Mapping, key: &str) -> Result<&'a mut Vec<Value>, String> {
    let value = parent.entry(key.into()).or_insert(Value::Sequence(Vec::new()));
    if value.is_null() {
        *value = Value::Sequence(Vec::new());
    }
    value.as_sequence_mut().ok_or_else(|| format!("spec.{key} is not a list"))
}

/// Takes the item named `name` out of the list under `key`. The list stays where it is, even
/// if empty, so that injecting again puts everything back in the same place.
fn remove_named(spec: &mut Mapping, key: &str, name: &str) -> Result<(), String> {
    match spec.get_mut(key) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Sequence(items)) => {
            items.retain(|item| item.get("name").and_then(Value::as_str) != Some(name));
            Ok(())
        }
        Some(_) => Err(format!("spec.{key} is not a list")),
    }
}

#[cfg(test)]
mod tests;
