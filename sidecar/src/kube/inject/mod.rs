//! Puts the sidecar into Kubernetes pods, as `linkerd inject` and `istioctl kube-inject` do:
//! every pod template of the input gets the sidecar container, its configuration volume and an
//! annotation recording the injection. `sluice-sidecar inject` runs it over YAML files and the
//! admission webhook ([`review`]) over the pods the API server sends; both call [`pod`].
//!
//! Injecting again first takes out what an earlier injection added, so injecting twice gives
//! what injecting once does, with the settings of the last run.
//!
//! What injection changes is worked out once, as [`Edit`]s, from the little it needs to know of
//! a pod (its [`Shape`]); `inject` applies them to the YAML, the webhook sends them as a JSON
//! Patch, so the webhook never holds more of a pod than that shape.

mod checks;
mod nesting;
pub mod review;

use std::fmt;

use clap::Args;
use serde::{Serialize, ser::SerializeMap};
use sluice_runtime::cli::host_port;
use yaml_serde::{Mapping, Value};

pub use self::checks::{config_map_name, image_reference, opted_out, quantity};
use self::checks::{issuer_name, kind_name, trust_domain};
use super::cluster::{KubeVersion, Mode, Native, SERVICE_ACCOUNT_DIR};
use crate::defaults::{IDENTITY_ISSUER_KIND, IDENTITY_TRUST_DOMAIN, MAX_FLOW_DEPTH};

/// The injected container's name, which an injection again replaces.
pub const CONTAINER: &str = "sluice-sidecar";

/// The volume holding the sidecar's configuration.
pub const VOLUME: &str = "sluice-config";

/// The volume holding the pod's certificate from cert-manager's CSI driver (`--identity-issuer`),
/// and where the sidecar reads it. Not below [`CONFIG_DIR`]: a ConfigMap volume is read-only on
/// the node too, so the runtime could not make a mount point in it.
pub const IDENTITY_VOLUME: &str = "sluice-identity";
pub const IDENTITY_DIR: &str = "/var/run/secrets/sluice.io/identity";

/// The CSI driver of cert-manager that issues the pods' certificates.
pub const CSI_DRIVER: &str = "csi.cert-manager.io";

/// Annotation of an injected pod: the injector's version.
pub const INJECTED: &str = "sluice.io/injected";

/// Label of an injected pod, for a PodMonitor to select the pods whose metrics it scrapes.
pub const SIDECAR_LABEL: &str = "sluice.io/sidecar";

/// Pod label or namespace label that asks the webhook for the sidecar (`enabled`), or a pod
/// label or annotation that refuses it (`disabled`).
pub const INJECT: &str = "sluice.io/inject";

/// Pod annotation naming the ConfigMap the webhook mounts.
pub const CONFIG_ANNOTATION: &str = "sluice.io/config";

/// Pod annotation choosing the mode for that pod: `"true"` a native sidecar, `"false"` a classic
/// one, whatever `--native` says.
pub const NATIVE_ANNOTATION: &str = "sluice.io/native-sidecar";

/// The key of the ConfigMap that holds the sidecar's configuration, and its mount point.
pub const CONFIG_KEY: &str = "sidecar.yaml";
pub const CONFIG_DIR: &str = "/etc/sluice";

/// The sidecar binary in the image.
pub const BINARY: &str = "/usr/local/bin/sluice-sidecar";

/// The admin listener's port on the pod IP, and the port's name (metrics, probes).
pub const ADMIN_PORT: u16 = 9901;
pub const ADMIN_PORT_NAME: &str = "sluice-admin";

/// Where the injected sidecar's `/debug/` pages listen: the pod's loopback.
pub const DEBUG_ADDR: &str = "127.0.0.1:9902";

/// The image's non-root user (distroless' `nonroot`).
const USER: u32 = 65532;

/// The image the sidecar runs from unless `--image` says otherwise.
pub const DEFAULT_IMAGE: &str = concat!("sluice:", env!("CARGO_PKG_VERSION"));

/// What the injected container looks like, as flags of `inject` and `webhook`.
#[derive(Clone, Debug, Args)]
pub struct Settings {
    /// Image of the injected container (it holds /usr/local/bin/sluice-sidecar).
    #[arg(long, default_value = DEFAULT_IMAGE, value_parser = image_reference)]
    pub image: String,

    /// Capacity servers (comma-separated host:port), in place of the configuration's
    /// `server.addresses`; without it, the configuration's apply.
    #[arg(long = "server", value_name = "ADDRESSES", value_delimiter = ',', value_parser = host_port)]
    pub servers: Vec<String>,

    /// A native sidecar (an init container that keeps running, Kubernetes 1.29 and later) or a
    /// classic one (the first container, holding the others until it is ready; a Job's pod then
    /// never completes). `auto`: native where the API server is 1.29 or later; `inject`, which
    /// asks no cluster, then injects classic. A pod's `sluice.io/native-sidecar` annotation
    /// ("true" or "false") overrides it.
    #[arg(long, value_enum, default_value_t = Native::Auto)]
    pub native: Native,

    /// CPU the container requests.
    #[arg(long, default_value = "50m", value_parser = quantity)]
    pub cpu_request: String,

    /// Memory the container requests.
    #[arg(long, default_value = "32Mi", value_parser = quantity)]
    pub memory_request: String,

    /// CPU limit; none by default, since a throttled sidecar delays every request it passes.
    #[arg(long, value_parser = quantity)]
    pub cpu_limit: Option<String>,

    /// Memory limit: what the sidecar's listeners may hold at their defaults (docs/sidecar.md,
    /// Memory budget, about 190 MiB) with room for keyed resources.
    #[arg(long, default_value = "256Mi", value_parser = quantity)]
    pub memory_limit: String,

    #[command(flatten)]
    pub identity: Identity,
}

/// Each injected sidecar's own certificate, from cert-manager's CSI driver: its SPIFFE id
/// `spiffe://<trust domain>/ns/<namespace>/pod/<pod>` is the identity the capacity servers'
/// policies match, and the sidecar speaks mTLS to them with it (docs/kubernetes.md, Identities).
#[derive(Clone, Debug, Args)]
pub struct Identity {
    /// cert-manager issuer of the sidecars' certificates (driver csi.cert-manager.io); without
    /// it the sidecars get none and reach the capacity servers as their configuration says.
    #[arg(long = "identity-issuer", value_name = "NAME", value_parser = issuer_name)]
    pub issuer: Option<String>,

    /// Kind of --identity-issuer: a ClusterIssuer by default, since the driver asks for a pod's
    /// certificate in the pod's own namespace.
    #[arg(long = "identity-issuer-kind", value_name = "KIND", default_value = IDENTITY_ISSUER_KIND,
          value_parser = kind_name)]
    pub issuer_kind: String,

    /// API group of --identity-issuer, for an external issuer; default: cert-manager's own.
    #[arg(long = "identity-issuer-group", value_name = "GROUP", value_parser = issuer_name)]
    pub issuer_group: Option<String>,

    /// Trust domain of the sidecars' SPIFFE ids.
    #[arg(long = "identity-trust-domain", value_name = "DOMAIN", default_value = IDENTITY_TRUST_DOMAIN,
          value_parser = trust_domain)]
    pub trust_domain: String,
}

impl Identity {
    /// The CSI volume that asks for the pod's certificate, when an issuer is named. The driver
    /// puts the pod's namespace and name in place of `${POD_NAMESPACE}` and `${POD_NAME}`.
    fn volume(&self) -> Option<Value> {
        let issuer = self.issuer.as_deref()?;
        let mut attributes = Mapping::new();
        let mut attribute = |key: &str, value: String| {
            attributes.insert(format!("{CSI_DRIVER}/{key}").into(), value.into());
        };
        attribute("issuer-name", issuer.to_owned());
        attribute("issuer-kind", self.issuer_kind.clone());
        if let Some(group) = &self.issuer_group {
            attribute("issuer-group", group.clone());
        }
        attribute("uri-sans", format!("spiffe://{}/ns/${{POD_NAMESPACE}}/pod/${{POD_NAME}}", self.trust_domain));
        attribute("common-name", "${POD_NAME}".to_owned());
        // A client certificate: the servers' mTLS listener requires the usage.
        attribute("key-usages", "digital signature,key encipherment,client auth".to_owned());
        // The key readable by the sidecar's group (the image's non-root user).
        attribute("fs-group", USER.to_string());
        Some(map([
            ("name", IDENTITY_VOLUME.into()),
            (
                "csi",
                map([
                    ("driver", CSI_DRIVER.into()),
                    ("readOnly", true.into()),
                    ("volumeAttributes", Value::Mapping(attributes)),
                ]),
            ),
        ]))
    }
}

/// What injection did with one object.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Done {
    /// Injected, in that mode.
    Injected(Mode),
    /// Injected before with the same settings: nothing changed.
    Unchanged,
    /// Refused by its `sluice.io/inject: disabled`.
    OptedOut,
    /// A kind without pods.
    NotAWorkload,
    /// `uninject` took the sidecar out.
    Removed,
    /// `uninject` found no sidecar.
    NotInjected,
}

impl fmt::Display for Done {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Done::Injected(Mode::Native) => f.write_str("injected (native sidecar)"),
            Done::Injected(Mode::Classic) => f.write_str("injected (classic sidecar, first container)"),
            Done::Unchanged => f.write_str("already injected"),
            Done::OptedOut => write!(f, "skipped ({INJECT}: disabled)"),
            Done::NotAWorkload => f.write_str("skipped (not a workload)"),
            Done::Removed => f.write_str("uninjected"),
            Done::NotInjected => f.write_str("not injected"),
        }
    }
}

/// Why input is not injected; `clash` when a pod already uses what the sidecar adds (a refusal
/// of the request, where the others are input that cannot be read).
#[derive(Debug, PartialEq)]
pub struct Refusal {
    pub why: String,
    pub clash: bool,
}

impl Refusal {
    fn within(self, context: impl fmt::Display) -> Refusal {
        Refusal { why: format!("{context}: {}", self.why), ..self }
    }
}

impl From<String> for Refusal {
    fn from(why: String) -> Refusal {
        Refusal { why, clash: false }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.why)
    }
}

/// Every document of a multi-document YAML stream, each with the sidecar in its pod templates,
/// as YAML again, and a line per object saying what was done (`deployment/web: injected`).
/// Empty documents are left out.
pub fn documents(text: &str, settings: &Settings, config_map: &str) -> Result<(String, Vec<String>), Refusal> {
    rewrite(text, &|template| pod(template, settings, config_map, None))
}

/// Every document with what [`documents`] added taken out again, and a line per object.
pub fn uninjected(text: &str) -> Result<(String, Vec<String>), Refusal> {
    rewrite(text, &uninject)
}

/// A pod template visitor: what it did with the template.
type Each<'a> = &'a dyn Fn(&mut Value) -> Result<Done, Refusal>;

fn rewrite(text: &str, each: Each) -> Result<(String, Vec<String>), Refusal> {
    nesting::check(text, MAX_FLOW_DEPTH)?;
    let (mut out, mut report) = (Vec::new(), Vec::new());
    for (i, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let within = |e: Refusal| e.within(format_args!("document {}", i + 1));
        let mut value: Value = serde::Deserialize::deserialize(document).map_err(|e| within(format!("{e}").into()))?;
        if value.is_null() {
            continue;
        }
        object(&mut value, each, &mut report).map_err(within)?;
        out.push(yaml_serde::to_string(&value).map_err(|e| within(format!("{e}").into()))?);
    }
    Ok((out.join("---\n"), report))
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

/// One object (a `List`'s items each), what was done with it added to `report`; kinds without
/// pods are left as they are.
fn object(object: &mut Value, each: Each, report: &mut Vec<String>) -> Result<(), Refusal> {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default().to_owned();
    let name = object.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("").to_owned();
    if kind == "List" {
        let items = object.get_mut("items").and_then(Value::as_sequence_mut);
        for (i, item) in items.into_iter().flatten().enumerate() {
            self::object(item, each, report).map_err(|e| e.within(format_args!("items[{i}]")))?;
        }
        return Ok(());
    }
    let done = match template_path(&kind) {
        None => Done::NotAWorkload,
        Some(path) => {
            let mut template = &mut *object;
            for key in path {
                template = template.get_mut(*key).ok_or_else(|| format!("{kind} {name:?}: no {}", path.join(".")))?;
            }
            each(template).map_err(|e| e.within(format_args!("{kind} {name:?}")))?
        }
    };
    report.push(format!("{}/{name}: {done}", kind.to_lowercase()));
    Ok(())
}

/// A pod or pod template (metadata and spec): the sidecar added, or put in place of the one an
/// earlier injection added, unless it opted out, in the mode of a cluster of `version` (`None`:
/// unknown). Nothing changes when it cannot be injected.
pub fn pod(
    pod: &mut Value,
    settings: &Settings,
    config_map: &str,
    version: Option<KubeVersion>,
) -> Result<Done, Refusal> {
    if opted_out(checks::inject_mark(pod, "labels"), checks::inject_mark(pod, "annotations")) {
        return Ok(Done::OptedOut);
    }
    let shape = Shape::of(pod)?;
    checks::clash(pod).and_then(|()| checks::own_volume(&shape)).map_err(|why| Refusal { why, clash: true })?;
    let before = pod.clone();
    let (edits, mode) = edits(&shape, settings, config_map, version)?;
    for edit in edits {
        edit.apply(pod)?;
    }
    Ok(if *pod == before { Done::Unchanged } else { Done::Injected(mode) })
}

/// A pod or pod template without what an injection added: the sidecar container, its volume,
/// the annotation and the label, and the lists and mappings they leave empty (but `containers`,
/// which every pod has). A pod never
/// injected keeps all it has, a volume of the sidecar's volume's name too.
pub fn uninject(pod: &mut Value) -> Result<Done, Refusal> {
    if !checks::injected(pod) {
        return Ok(Done::NotInjected);
    }
    let remove = |parent: Option<&mut Value>, key: &str, ours: &str| {
        let Some(Value::Mapping(parent)) = parent else { return };
        match parent.get_mut(key) {
            Some(Value::Sequence(items)) => items.retain(|i| i.get("name").and_then(Value::as_str) != Some(ours)),
            Some(Value::Mapping(marks)) => {
                marks.remove(ours);
            }
            _ => return,
        }
        if key != "containers"
            && parent.get(key).is_some_and(|v| {
                v.as_sequence().is_some_and(Vec::is_empty) || v.as_mapping().is_some_and(Mapping::is_empty)
            })
        {
            parent.remove(key);
        }
    };
    let ours =
        [("initContainers", CONTAINER), ("containers", CONTAINER), ("volumes", VOLUME), ("volumes", IDENTITY_VOLUME)];
    for (key, ours) in ours {
        remove(pod.get_mut("spec"), key, ours);
    }
    for (key, ours) in [("annotations", INJECTED), ("labels", SIDECAR_LABEL)] {
        remove(pod.get_mut("metadata"), key, ours);
    }
    if let Some(pod) = pod.as_mapping_mut()
        && pod.get("metadata").and_then(Value::as_mapping).is_some_and(Mapping::is_empty)
    {
        pod.remove("metadata");
    }
    Ok(Done::Removed)
}

/// What a mapping of the pod is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Slot {
    /// Absent or null.
    Absent,
    Mapping,
    Other,
}

/// What a list of the pod's spec is, and where in it what an earlier injection added is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum List {
    /// Absent or null.
    Absent,
    /// A list, with the index of its item of the injected name, if any.
    Items(Option<usize>),
    /// A list with more than one item of the injected name, which Kubernetes refuses.
    Repeats,
    Other,
}

impl List {
    /// The list of `names`, the item of `ours` looked for.
    fn of<'a>(names: impl IntoIterator<Item = Option<&'a str>>, ours: &str) -> List {
        let mut found = None;
        for (i, name) in names.into_iter().enumerate() {
            if name == Some(ours) {
                if found.is_some() {
                    return List::Repeats;
                }
                found = Some(i);
            }
        }
        List::Items(found)
    }
}

/// All that injection needs to know of a pod.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub metadata: Slot,
    pub annotations: Slot,
    pub labels: Slot,
    pub spec: Slot,
    pub init_containers: List,
    pub containers: List,
    pub volumes: List,
    /// Where [`IDENTITY_VOLUME`] is in the same list.
    pub identity_volume: List,
    /// The pod's [`NATIVE_ANNOTATION`]: `Some` when it says "true" or "false".
    pub native: Option<bool>,
}

impl Shape {
    /// The shape of a YAML pod.
    fn of(pod: &Value) -> Result<Shape, String> {
        let pod = pod.as_mapping().ok_or("the pod is not a mapping")?;
        let slot = |value: Option<&Value>| match value {
            None | Some(Value::Null) => Slot::Absent,
            Some(Value::Mapping(_)) => Slot::Mapping,
            Some(_) => Slot::Other,
        };
        let metadata = pod.get("metadata");
        let annotations = metadata.and_then(|m| m.get("annotations"));
        let native = checks::native_mark(annotations.and_then(|a| a.get(NATIVE_ANNOTATION)).and_then(Value::as_str))?;
        let spec = pod.get("spec");
        let list = |key: &str, ours: &str| match spec.and_then(|spec| spec.get(key)) {
            None | Some(Value::Null) => List::Absent,
            Some(Value::Sequence(items)) => List::of(items.iter().map(|i| i.get("name").and_then(Value::as_str)), ours),
            Some(_) => List::Other,
        };
        Ok(Shape {
            metadata: slot(metadata),
            annotations: slot(annotations),
            labels: slot(metadata.and_then(|m| m.get("labels"))),
            spec: slot(spec),
            init_containers: list("initContainers", CONTAINER),
            containers: list("containers", CONTAINER),
            volumes: list("volumes", VOLUME),
            identity_volume: list("volumes", IDENTITY_VOLUME),
            native,
        })
    }
}

/// One step of a path into the pod.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    Key(&'static str),
    Index(usize),
    /// Past a list's last item.
    End,
}

/// One change to a pod, as a JSON Patch (RFC 6902) operation: `add` sets a mapping's key or
/// inserts into a list, `remove` takes a list's item out.
#[derive(Clone, Debug, PartialEq)]
pub enum Edit {
    Add(Vec<Step>, Value),
    Remove(Vec<Step>),
}

/// The changes that inject the sidecar into a pod of `shape` in a cluster of `version` (`None`:
/// unknown), and the mode they inject it in; `Err` for a pod that cannot have it.
pub fn edits(
    shape: &Shape,
    settings: &Settings,
    config_map: &str,
    version: Option<KubeVersion>,
) -> Result<(Vec<Edit>, Mode), String> {
    let injected = (INJECTED, Value::from(concat!("sluice-sidecar ", env!("CARGO_PKG_VERSION"))));
    let label = (SIDECAR_LABEL, Value::from("injected"));
    let mut edits = Vec::new();
    match shape.metadata {
        Slot::Other => return Err("metadata is not a mapping".into()),
        Slot::Absent => edits.push(Edit::Add(
            vec![Step::Key("metadata")],
            map([("annotations", map([injected])), ("labels", map([label]))]),
        )),
        Slot::Mapping => {
            for (key, slot, (name, value)) in
                [("annotations", shape.annotations, injected), ("labels", shape.labels, label)]
            {
                edits.push(match slot {
                    Slot::Other => return Err(format!("{key} is not a mapping")),
                    Slot::Absent => Edit::Add(vec![Step::Key("metadata"), Step::Key(key)], map([(name, value)])),
                    Slot::Mapping => Edit::Add(vec![Step::Key("metadata"), Step::Key(key), Step::Key(name)], value),
                });
            }
        }
    }
    if shape.spec != Slot::Mapping {
        return Err("no spec".into());
    }
    checks::own_volume(shape)?;
    let lists = [
        ("initContainers", shape.init_containers, CONTAINER),
        ("containers", shape.containers, CONTAINER),
        ("volumes", shape.volumes, VOLUME),
        ("volumes", shape.identity_volume, IDENTITY_VOLUME),
    ];
    let mut earlier = Vec::new();
    for (key, list, ours) in lists {
        match list {
            List::Other => return Err(format!("spec.{key} is not a list")),
            List::Repeats => return Err(format!("spec.{key} has more than one {ours}")),
            List::Items(Some(i)) => earlier.push((key, i)),
            List::Absent | List::Items(None) => {}
        }
    }
    // Both volumes of an earlier injection: the later one out first, so that the other's index holds.
    if let [.., (a, i), (b, j)] = earlier[..]
        && a == b
        && i < j
    {
        let last = earlier.len() - 1;
        earlier.swap(last - 1, last);
    }
    for (key, i) in earlier {
        edits.push(Edit::Remove(vec![Step::Key("spec"), Step::Key(key), Step::Index(i)]));
    }
    let mode = match shape.native {
        Some(true) => Mode::Native,
        Some(false) => Mode::Classic,
        None => settings.native.mode(version),
    };
    // First either way: natively, among the init containers, so that it serves theirs too;
    // classic, among the containers, which the kubelet starts in order.
    let key = if mode == Mode::Native { "initContainers" } else { "containers" };
    let list = if mode == Mode::Native { shape.init_containers } else { shape.containers };
    let volume = map([
        ("name", VOLUME.into()),
        (
            "configMap",
            map([
                ("name", config_map.into()),
                ("items", Value::Sequence(vec![map([("key", CONFIG_KEY.into()), ("path", CONFIG_KEY.into())])])),
            ]),
        ),
    ]);
    let volumes = [Some(volume), settings.identity.volume()].into_iter().flatten().collect();
    let additions =
        [(key, list, Step::Index(0), vec![container(settings, mode)]), ("volumes", shape.volumes, Step::End, volumes)];
    for (key, list, at, items) in additions {
        match list {
            List::Absent => edits.push(Edit::Add(vec![Step::Key("spec"), Step::Key(key)], Value::Sequence(items))),
            _ => {
                edits.extend(items.into_iter().map(|item| Edit::Add(vec![Step::Key("spec"), Step::Key(key), at], item)))
            }
        }
    }
    Ok((edits, mode))
}

impl Edit {
    /// Applies it to a YAML pod whose shape it was made for.
    fn apply(self, pod: &mut Value) -> Result<(), String> {
        let (path, value) = match self {
            Edit::Add(path, value) => (path, Some(value)),
            Edit::Remove(path) => (path, None),
        };
        let unfit = || format!("the pod does not fit {}", Pointer(&path));
        let Some((&last, parents)) = path.split_last() else { return Err(unfit()) };
        let mut target = &mut *pod;
        for step in parents {
            target = match *step {
                Step::Key(key) => target.get_mut(key),
                Step::Index(i) => target.get_mut(i),
                Step::End => None,
            }
            .ok_or_else(unfit)?;
        }
        match (value, last, target) {
            (Some(value), Step::Key(key), Value::Mapping(mapping)) => {
                mapping.insert(key.into(), value);
            }
            (Some(value), Step::Index(i), Value::Sequence(items)) if i <= items.len() => items.insert(i, value),
            (Some(value), Step::End, Value::Sequence(items)) => items.push(value),
            (None, Step::Index(i), Value::Sequence(items)) if i < items.len() => {
                items.remove(i);
            }
            _ => return Err(unfit()),
        }
        Ok(())
    }
}

/// A path as a JSON Pointer (RFC 6901).
struct Pointer<'a>(&'a [Step]);

impl fmt::Display for Pointer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for step in self.0 {
            match step {
                Step::Key(key) => write!(f, "/{}", key.replace('~', "~0").replace('/', "~1"))?,
                Step::Index(i) => write!(f, "/{i}")?,
                Step::End => f.write_str("/-")?,
            }
        }
        Ok(())
    }
}

impl Serialize for Edit {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut op = serializer.serialize_map(None)?;
        match self {
            Edit::Add(path, value) => {
                op.serialize_entry("op", "add")?;
                op.serialize_entry("path", &Pointer(path).to_string())?;
                op.serialize_entry("value", value)?;
            }
            Edit::Remove(path) => {
                op.serialize_entry("op", "remove")?;
                op.serialize_entry("path", &Pointer(path).to_string())?;
            }
        }
        op.end()
    }
}

/// The sidecar container, as `mode` runs it.
fn container(settings: &Settings, mode: Mode) -> Value {
    let mut args: Vec<Value> = vec![
        "--config".into(),
        format!("{CONFIG_DIR}/{CONFIG_KEY}").into(),
        // On the pod IP, so that the kubelet's probes and Prometheus reach it.
        "--admin-addr".into(),
        format!("$(POD_IP):{ADMIN_PORT}").into(),
        // The status pages on loopback only: `kubectl port-forward pod/<pod> 9902`.
        "--debug-addr".into(),
        DEBUG_ADDR.into(),
        // One JSON object a line, as the cluster's log collectors read best.
        "--log-format".into(),
        "json".into(),
    ];
    if !settings.servers.is_empty() {
        args.extend(["--server-addresses".into(), settings.servers.join(",").into()]);
    }
    let mut mounts = vec![
        map([("name", VOLUME.into()), ("mountPath", CONFIG_DIR.into()), ("readOnly", true.into())]),
        // Over the ServiceAccount token's directory, which Kubernetes then leaves alone: the
        // sidecar never calls the API, so it holds no token.
        map([("name", VOLUME.into()), ("mountPath", SERVICE_ACCOUNT_DIR.into()), ("readOnly", true.into())]),
    ];
    if settings.identity.issuer.is_some() {
        for (flag, file) in
            [("--server-tls-ca", "ca.crt"), ("--server-tls-cert", "tls.crt"), ("--server-tls-key", "tls.key")]
        {
            args.extend([flag.into(), format!("{IDENTITY_DIR}/{file}").into()]);
        }
        mounts.push(map([
            ("name", IDENTITY_VOLUME.into()),
            ("mountPath", IDENTITY_DIR.into()),
            ("readOnly", true.into()),
        ]));
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
        ("volumeMounts", Value::Sequence(mounts)),
    ]);
    let fields = container.as_mapping_mut().expect("a mapping");
    match mode {
        Mode::Native => {
            fields.insert("restartPolicy".into(), "Always".into());
        }
        // The kubelet starts the next container once this hook returns: the application's first
        // calls find the sidecar ready (`sluice-sidecar wait`).
        Mode::Classic => {
            let wait = map([("command", Value::Sequence(vec![BINARY.into(), "wait".into()]))]);
            fields.insert("lifecycle".into(), map([("postStart", map([("exec", wait)]))]));
        }
    }
    container
}

fn map<const N: usize>(entries: [(&str, Value); N]) -> Value {
    Value::Mapping(entries.into_iter().map(|(key, value)| (Value::from(key), value)).collect())
}

#[cfg(test)]
mod tests;
