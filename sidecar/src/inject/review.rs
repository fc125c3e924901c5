//! The webhook's answer to an `AdmissionReview` (admission.k8s.io/v1): the pod with the sidecar
//! injected by [`super::pod`], as a JSON Patch. It never refuses a pod: one it does not inject
//! (already injected, opted out) or cannot (not a pod, no ConfigMap named) is allowed unchanged,
//! with the reason for the log.

use base64::{Engine, engine::general_purpose::STANDARD};
use serde_json::{Value, json};

use super::{CONFIG_ANNOTATION, INJECT, INJECTED, Settings, config_map_name, pod};

/// What the webhook did with one request.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// The sidecar was injected.
    Injected,
    /// Left unchanged on purpose.
    Skipped(String),
    /// Left unchanged because it could not be handled.
    Unhandled(String),
}

/// The answer to one request.
#[derive(Debug)]
pub struct Answer {
    /// The `AdmissionReview` to send back.
    pub review: Value,
    pub outcome: Outcome,
    /// The request's uid and pod (namespace/name), for the log.
    pub uid: String,
    pub pod: String,
}

/// The `AdmissionReview` answering `body`, and what was done; `Err` when the body is not an
/// `AdmissionReview` request at all (no uid to answer).
pub fn answer(body: &[u8], settings: &Settings, config_map: Option<&str>) -> Result<Answer, String> {
    let review: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let request = &review["request"];
    let Some(uid) = request["uid"].as_str() else { return Err("no request.uid".into()) };
    let metadata = &request["object"]["metadata"];
    let name = metadata["name"].as_str().or(metadata["generateName"].as_str()).unwrap_or_default();
    let pod = format!("{}/{name}", request["namespace"].as_str().unwrap_or_default());
    let mut response = json!({"uid": uid, "allowed": true});
    let outcome = match mutate(request, settings, config_map) {
        Ok(Some(patch)) => {
            let patch = serde_json::to_vec(&patch).expect("a patch serialises");
            response["patchType"] = "JSONPatch".into();
            response["patch"] = STANDARD.encode(patch).into();
            Outcome::Injected
        }
        Ok(None) => Outcome::Skipped(skip_reason(request)),
        Err(why) => Outcome::Unhandled(why),
    };
    let api_version = review["apiVersion"].as_str().unwrap_or("admission.k8s.io/v1");
    let review = json!({"apiVersion": api_version, "kind": "AdmissionReview", "response": response});
    Ok(Answer { review, outcome, uid: uid.to_owned(), pod })
}

/// The patch injecting the sidecar into the request's pod; `None` for a pod to leave alone.
fn mutate(
    request: &Value,
    settings: &Settings,
    default_config_map: Option<&str>,
) -> Result<Option<Vec<Value>>, String> {
    if request["kind"]["kind"] != "Pod" || request["resource"]["resource"] != "pods" {
        return Err(format!("not a pod: {} {}", request["kind"]["kind"], request["resource"]["resource"]));
    }
    if request["operation"] != "CREATE" || !request["subResource"].is_null() {
        return Err(format!("not a pod's creation: {} {}", request["operation"], request["subResource"]));
    }
    let original = &request["object"];
    if !original.is_object() {
        return Err("no request.object".into());
    }
    let annotations = &original["metadata"]["annotations"];
    if !skip_reason(request).is_empty() {
        return Ok(None);
    }
    let config_map = match annotations[CONFIG_ANNOTATION].as_str().or(default_config_map) {
        Some(name) => config_map_name(name).map_err(|e| format!("{CONFIG_ANNOTATION}: {e}"))?,
        None => return Err(format!("no {CONFIG_ANNOTATION} annotation, and the webhook has no --config-map")),
    };
    let mut injected: yaml_serde::Value =
        serde_json::from_value(original.clone()).map_err(|e| format!("request.object: {e}"))?;
    pod(&mut injected, settings, &config_map)?;
    let injected = serde_json::to_value(&injected).map_err(|e| format!("the injected pod: {e}"))?;
    Ok(Some(patch(original, &injected)))
}

/// Why a pod is left alone, or "" to inject it.
fn skip_reason(request: &Value) -> String {
    let metadata = &request["object"]["metadata"];
    if !metadata["annotations"][INJECTED].is_null() {
        "already injected".into()
    } else if metadata["labels"][INJECT] == "disabled" || metadata["annotations"][INJECT] == "disabled" {
        format!("{INJECT}: disabled")
    } else {
        String::new()
    }
}

/// The JSON Patch (RFC 6902) that turns `old` into `new`, one operation per changed field of
/// the pod's metadata and spec.
pub fn patch(old: &Value, new: &Value) -> Vec<Value> {
    let mut ops = Vec::new();
    for section in ["metadata", "spec"] {
        let (before, after) = (&old[section], &new[section]);
        let (Some(before), Some(after)) = (before.as_object(), after.as_object()) else {
            if before != after {
                ops.push(json!({"op": "add", "path": format!("/{section}"), "value": after}));
            }
            continue;
        };
        for (key, value) in after {
            let path = format!("/{section}/{}", escape(key));
            match before.get(key) {
                None => ops.push(json!({"op": "add", "path": path, "value": value})),
                Some(was) if was != value => ops.push(json!({"op": "replace", "path": path, "value": value})),
                Some(_) => {}
            }
        }
        for key in before.keys().filter(|key| !after.contains_key(*key)) {
            ops.push(json!({"op": "remove", "path": format!("/{section}/{}", escape(key))}));
        }
    }
    ops
}

/// A key as a JSON Pointer reference token (RFC 6901).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}
