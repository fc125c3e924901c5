//! The webhook's answer to an `AdmissionReview` (admission.k8s.io/v1): the pod's [`super::edits`]
//! as a JSON Patch. It never refuses a pod: one it does not inject (already injected, opted out)
//! or cannot (not a pod, no ConfigMap named) is allowed unchanged, with the reason for the log.
//!
//! The review is read into types that keep only what the answer needs, borrowing the body's
//! strings: the rest of the pod is skipped as it is parsed, so answering costs little beyond the
//! body itself (a JSON tree of the same pod took some 60 times its size).

use std::{borrow::Cow, fmt, marker::PhantomData};

use base64::{Engine, engine::general_purpose::STANDARD};
use serde::{
    Deserialize, Deserializer, Serialize,
    de::{IgnoredAny, SeqAccess, Visitor},
};

use super::{
    CONFIG_ANNOTATION, CONTAINER, IDENTITY_VOLUME, INJECT, List, Settings, Shape, Slot, VOLUME,
    checks::{admin_port_taken, native_mark, port_clash},
    config_map_name, edits, opted_out,
};
use crate::defaults::{MAX_REVIEW_UID_BYTES, REVIEW_SHOWN_CHARS};
use crate::kube::cluster::{KubeVersion, Mode};

/// What the webhook did with one request.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// The sidecar was injected, in that mode.
    Injected(Mode),
    /// Left unchanged on purpose.
    Skipped(String),
    /// Left unchanged because it could not be handled.
    Unhandled(String),
}

/// The answer to one request.
#[derive(Debug)]
pub struct Answer {
    /// The `AdmissionReview` to send back, as JSON.
    pub review: String,
    pub outcome: Outcome,
    /// The request's uid and pod (namespace/name, shortened), for the log.
    pub uid: String,
    pub pod: String,
    /// A dry run (`kubectl apply --dry-run=server`): nothing will be created.
    pub dry_run: bool,
}

/// A string from the body: borrowed unless it has escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Of<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Of<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }
        }
        deserializer.deserialize_str(Of(PhantomData))
    }
}

fn text<'a>(text: &'a Option<Text>) -> Option<&'a str> {
    text.as_ref().map(|t| &*t.0)
}

#[derive(Deserialize)]
struct Review<'a> {
    #[serde(borrow, rename = "apiVersion")]
    api_version: Option<Text<'a>>,
    #[serde(borrow)]
    request: Option<Request<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    #[serde(borrow)]
    uid: Option<Text<'a>>,
    #[serde(borrow)]
    kind: Option<Kind<'a>>,
    #[serde(borrow)]
    resource: Option<Resource<'a>>,
    #[serde(borrow)]
    sub_resource: Option<Text<'a>>,
    #[serde(borrow)]
    operation: Option<Text<'a>>,
    #[serde(borrow)]
    namespace: Option<Text<'a>>,
    #[serde(borrow)]
    object: Option<Pod<'a>>,
    dry_run: Option<bool>,
}

#[derive(Deserialize)]
struct Kind<'a> {
    #[serde(borrow)]
    kind: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct Resource<'a> {
    #[serde(borrow)]
    resource: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct Pod<'a> {
    #[serde(borrow)]
    metadata: Option<Metadata<'a>>,
    spec: Option<Spec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata<'a> {
    #[serde(borrow)]
    name: Option<Text<'a>>,
    #[serde(borrow)]
    generate_name: Option<Text<'a>>,
    #[serde(borrow)]
    annotations: Option<Marks<'a>>,
    #[serde(borrow)]
    labels: Option<Marks<'a>>,
}

/// The annotations or labels the webhook reads (`super::INJECTED`, `super::INJECT`,
/// `CONFIG_ANNOTATION`); the others are skipped.
#[derive(Deserialize)]
struct Marks<'a> {
    #[serde(rename = "sluice.io/injected")]
    injected: Option<IgnoredAny>,
    #[serde(borrow, rename = "sluice.io/inject")]
    inject: Option<Text<'a>>,
    #[serde(borrow, rename = "sluice.io/config")]
    config: Option<Text<'a>>,
    #[serde(borrow, rename = "sluice.io/native-sidecar")]
    native: Option<Text<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default, deserialize_with = "containers")]
    init_containers: Option<Listed>,
    #[serde(default, deserialize_with = "containers")]
    containers: Option<Listed>,
    #[serde(default, deserialize_with = "volumes")]
    volumes: Option<Listed>,
}

fn containers<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Listed>, D::Error> {
    deserializer.deserialize_option(Items(&[CONTAINER], PhantomData))
}

fn volumes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Listed>, D::Error> {
    deserializer.deserialize_option(Items(&[VOLUME, IDENTITY_VOLUME], PhantomData))
}

/// A list of named items as read: where each of ours is, and the first other declaring the
/// sidecar's admin port (only containers have ports).
struct Listed {
    lists: Vec<List>,
    admin_port: Option<String>,
}

/// Reads a list of named items (containers, volumes) keeping only where those named in `.0` are
/// and which other declares the admin port.
struct Items<'de>(&'static [&'static str], PhantomData<&'de ()>);

#[derive(Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    name: Option<Text<'a>>,
    #[serde(default, rename = "ports", deserialize_with = "admin_port")]
    admin_port: bool,
}

/// Whether a list of ports holds the admin port, read a port at a time: a list of many holds
/// no more memory than one.
fn admin_port<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    struct Ports;
    impl<'de> Visitor<'de> for Ports {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of ports")
        }
        fn visit_unit<E>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut ports: A) -> Result<bool, A::Error> {
            let mut taken = false;
            while let Some(port) = ports.next_element::<Port<'de>>()? {
                taken |= admin_port_taken(port.container_port, text(&port.protocol));
            }
            Ok(taken)
        }
    }
    deserializer.deserialize_any(Ports)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Port<'a> {
    container_port: Option<u64>,
    #[serde(borrow)]
    protocol: Option<Text<'a>>,
}

impl<'de> Visitor<'de> for Items<'de> {
    type Value = Option<Listed>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_none<E>(self) -> Result<Option<Listed>, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Option<Listed>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<Listed>, D::Error> {
        deserializer.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Option<Listed>, A::Error> {
        let (mut index, mut admin_port) = (0usize, None);
        let (mut found, mut repeats) = (vec![None; self.0.len()], vec![false; self.0.len()]);
        while let Some(item) = items.next_element::<Named>()? {
            match self.0.iter().position(|ours| text(&item.name) == Some(ours)) {
                Some(k) => {
                    repeats[k] |= found[k].is_some();
                    found[k] = Some(index);
                }
                None if admin_port.is_none() && item.admin_port => {
                    admin_port = Some(text(&item.name).unwrap_or_default().to_owned());
                }
                None => {}
            }
            index = index.saturating_add(1);
        }
        let lists = found.into_iter().zip(repeats).map(|(f, r)| if r { List::Repeats } else { List::Items(f) });
        Ok(Some(Listed { lists: lists.collect(), admin_port }))
    }
}

/// What is sent back.
#[derive(Serialize)]
struct Reply<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'static str,
    response: Response<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Response<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
}

/// The `AdmissionReview` answering `body` from an API server of `version` (`None`: unknown), and
/// what was done; `Err` when the body is not an `AdmissionReview` request (nothing to answer it
/// with).
pub fn answer(
    body: &[u8],
    settings: &Settings,
    config_map: Option<&str>,
    version: Option<KubeVersion>,
) -> Result<Answer, String> {
    let review: Review = serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    let request = review.request.ok_or("no request")?;
    let uid = text(&request.uid).ok_or("no request.uid")?;
    if uid.len() > MAX_REVIEW_UID_BYTES {
        return Err(format!("request.uid is longer than {MAX_REVIEW_UID_BYTES} bytes"));
    }
    let metadata = request.object.as_ref().and_then(|pod| pod.metadata.as_ref());
    let name = metadata.and_then(|m| text(&m.name).or(text(&m.generate_name))).unwrap_or_default();
    let pod = shortened(&format!("{}/{name}", text(&request.namespace).unwrap_or_default()));
    let (outcome, patch) = match mutate(&request, settings, config_map, version) {
        Ok(Some((patch, mode))) => (Outcome::Injected(mode), Some(patch)),
        Ok(None) => (Outcome::Skipped(skip_reason(metadata)), None),
        Err(why) => (Outcome::Unhandled(why), None),
    };
    // Answered in the request's version (the chart asks for v1), never echoing an unknown one.
    const V1BETA1: &str = "admission.k8s.io/v1beta1";
    let api_version = if text(&review.api_version) == Some(V1BETA1) { V1BETA1 } else { "admission.k8s.io/v1" };
    let reply = Reply {
        api_version,
        kind: "AdmissionReview",
        response: Response { uid, allowed: true, patch_type: patch.is_some().then_some("JSONPatch"), patch },
    };
    let review = serde_json::to_string(&reply).map_err(|e| format!("the answer: {e}"))?;
    Ok(Answer { review, outcome, uid: uid.to_owned(), pod, dry_run: request.dry_run.unwrap_or(false) })
}

/// The JSON Patch injecting the sidecar into the request's pod, base64-encoded, and its mode;
/// `None` for a pod to leave alone.
fn mutate(
    request: &Request,
    settings: &Settings,
    default_config_map: Option<&str>,
    version: Option<KubeVersion>,
) -> Result<Option<(String, Mode)>, String> {
    let kind = request.kind.as_ref().and_then(|k| text(&k.kind));
    let resource = request.resource.as_ref().and_then(|r| text(&r.resource));
    if kind != Some("Pod") || resource != Some("pods") {
        return Err(format!("not a pod: {} {}", shown(kind), shown(resource)));
    }
    let operation = text(&request.operation);
    if operation != Some("CREATE") || request.sub_resource.is_some() {
        return Err(format!("not a pod's creation: {} {}", shown(operation), shown(text(&request.sub_resource))));
    }
    let pod = request.object.as_ref().ok_or("no request.object")?;
    let metadata = pod.metadata.as_ref();
    if !skip_reason(metadata).is_empty() {
        return Ok(None);
    }
    let annotations = metadata.and_then(|m| m.annotations.as_ref());
    let config_map = match annotations.and_then(|a| text(&a.config)).or(default_config_map) {
        Some(name) => config_map_name(name).map_err(|e| format!("{}: {e}", CONFIG_ANNOTATION))?,
        None => {
            return Err(format!("no {} annotation, and the webhook has no --config-map", CONFIG_ANNOTATION));
        }
    };
    let slot = |present: bool| if present { Slot::Mapping } else { Slot::Absent };
    let spec = pod.spec.as_ref();
    let lists = spec.into_iter().flat_map(|s| [&s.init_containers, &s.containers]).flatten();
    if let Some(name) = lists.filter_map(|l| l.admin_port.as_deref()).next() {
        return Err(port_clash(name));
    }
    // The `k`th of the names the list was read for.
    let list = |listed: Option<&Option<Listed>>, k: usize| {
        listed.and_then(Option::as_ref).and_then(|l| l.lists.get(k).copied()).unwrap_or(List::Absent)
    };
    let shape = Shape {
        metadata: slot(metadata.is_some()),
        annotations: slot(annotations.is_some()),
        labels: slot(metadata.is_some_and(|m| m.labels.is_some())),
        spec: slot(spec.is_some()),
        init_containers: list(spec.map(|s| &s.init_containers), 0),
        containers: list(spec.map(|s| &s.containers), 0),
        volumes: list(spec.map(|s| &s.volumes), 0),
        identity_volume: list(spec.map(|s| &s.volumes), 1),
        native: native_mark(annotations.and_then(|a| text(&a.native)))?,
    };
    let (edits, mode) = edits(&shape, settings, &config_map, version)?;
    let patch = serde_json::to_vec(&edits).map_err(|e| format!("the patch: {e}"))?;
    Ok(Some((STANDARD.encode(patch), mode)))
}

/// Why a pod is left alone, or "" to inject it.
fn skip_reason(metadata: Option<&Metadata>) -> String {
    let (annotations, labels) =
        (metadata.and_then(|m| m.annotations.as_ref()), metadata.and_then(|m| m.labels.as_ref()));
    if annotations.is_some_and(|a| a.injected.is_some()) {
        "already injected".into()
    } else if opted_out(labels.and_then(|m| text(&m.inject)), annotations.and_then(|m| text(&m.inject))) {
        format!("{INJECT}: disabled")
    } else {
        String::new()
    }
}

/// At most [`REVIEW_SHOWN_CHARS`] characters of a request's string, for the log.
fn shortened(text: &str) -> String {
    match text.char_indices().nth(REVIEW_SHOWN_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// A request's field in a reason: quoted and shortened, or `null`.
fn shown(value: Option<&str>) -> String {
    value.map_or_else(|| "null".into(), |v| format!("{:?}", shortened(v)))
}
