//! What `inject` and the webhook check: their flags' values, whether a pod refuses the sidecar,
//! and whether it already uses what the sidecar adds.

use yaml_serde::Value;

use super::{ADMIN_PORT, CONTAINER, IDENTITY_VOLUME, INJECT, INJECTED, List, Shape, VOLUME};

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

/// Whether `text` is a DNS subdomain (RFC 1123), as Kubernetes requires of most names.
fn dns_subdomain(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A ConfigMap name: a DNS subdomain.
pub fn config_map_name(text: &str) -> Result<String, String> {
    if dns_subdomain(text) { Ok(text.to_owned()) } else { Err(format!("{text:?} is not a ConfigMap name")) }
}

/// A cert-manager issuer's name or API group: a DNS subdomain.
pub fn issuer_name(text: &str) -> Result<String, String> {
    if dns_subdomain(text) {
        Ok(text.to_owned())
    } else {
        Err(format!("{text:?} is not an issuer's name or group (a DNS subdomain, e.g. sluice-identity)"))
    }
}

/// A Kubernetes kind, such as `ClusterIssuer`.
pub fn kind_name(text: &str) -> Result<String, String> {
    let ok = text.len() <= 63
        && text.starts_with(|c: char| c.is_ascii_uppercase())
        && text.bytes().all(|b| b.is_ascii_alphanumeric());
    if ok { Ok(text.to_owned()) } else { Err(format!("{text:?} is not a kind (e.g. ClusterIssuer)")) }
}

/// A SPIFFE trust domain: lower-case letters, digits, `.`, `-` and `_`, at most 255.
pub fn trust_domain(text: &str) -> Result<String, String> {
    let ok = (1..=255).contains(&text.len())
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok { Ok(text.to_owned()) } else { Err(format!("{text:?} is not a SPIFFE trust domain (e.g. cluster.local)")) }
}

/// An image reference, `[registry/]repository[:tag][@digest]`, as container runtimes take it.
pub fn image_reference(text: &str) -> Result<String, String> {
    let (rest, digest) = text.split_once('@').map_or((text, None), |(rest, digest)| (rest, Some(digest)));
    let digest_ok = digest.is_none_or(|d| {
        d.split_once(':').is_some_and(|(algorithm, hex)| {
            !algorithm.is_empty() && hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())
        })
    });
    // The tag follows the last colon past the last slash: one before it is a registry's port.
    let last = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last..].rfind(':') {
        Some(i) => (&rest[..last + i], Some(&rest[last + i + 1..])),
        None => (rest, None),
    };
    let tag_ok = tag.is_none_or(|t| {
        (1..=128).contains(&t.len())
            && !t.starts_with(['.', '-'])
            && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    });
    let mut components: Vec<&str> = name.split('/').collect();
    let registry_ok = match components.first() {
        Some(&host) if components.len() > 1 && (host.contains(['.', ':']) || host == "localhost") => {
            components.remove(0);
            !host.starts_with(['.', '-', ':']) && host.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:".contains(&b))
        }
        _ => true,
    };
    let component_ok = |c: &str| {
        c.starts_with(|c: char| c.is_ascii_alphanumeric())
            && c.ends_with(|c: char| c.is_ascii_alphanumeric())
            && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    };
    if digest_ok && tag_ok && registry_ok && components.into_iter().all(component_ok) {
        Ok(text.to_owned())
    } else {
        Err(format!("{text:?} is not an image reference (e.g. registry.example/sluice:1)"))
    }
}

/// Whether a pod's `sluice.io/inject` label or annotation refuses the sidecar; the webhook and
/// `inject` both ask it.
pub fn opted_out(label: Option<&str>, annotation: Option<&str>) -> bool {
    [label, annotation].contains(&Some("disabled"))
}

/// A pod's [`NATIVE_ANNOTATION`](super::NATIVE_ANNOTATION): `Some(true)` or `Some(false)` for
/// "true" or "false", `None` without it; anything else is refused, not guessed at.
pub fn native_mark(value: Option<&str>) -> Result<Option<bool>, String> {
    match value {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(other) => Err(format!("{}: {other:?} is neither \"true\" nor \"false\"", super::NATIVE_ANNOTATION)),
    }
}

/// A port of the sidecar's that another container of the pod declares: the admin port.
pub fn clash(pod: &Value) -> Result<(), String> {
    for container in containers(pod) {
        let name = container.get("name").and_then(Value::as_str).unwrap_or_default();
        if name == CONTAINER {
            continue;
        }
        let mut ports = container.get("ports").and_then(Value::as_sequence).into_iter().flatten();
        if ports.any(|p| {
            admin_port_taken(p.get("containerPort").and_then(Value::as_u64), p.get("protocol").and_then(Value::as_str))
        }) {
            return Err(port_clash(name));
        }
    }
    Ok(())
}

/// Whether a container's port of `number` and `protocol` is the sidecar's admin port.
pub fn admin_port_taken(number: Option<u64>, protocol: Option<&str>) -> bool {
    number == Some(ADMIN_PORT.into()) && protocol.is_none_or(|p| p == "TCP")
}

/// Why a pod whose container `name` declares the admin port is refused.
pub fn port_clash(name: &str) -> String {
    format!("container {name:?} already uses port {ADMIN_PORT}, the sidecar's admin port")
}

/// A volume of one of the sidecar's volumes' names in a pod without the sidecar is the pod's
/// own, which neither `inject` nor the webhook replaces.
pub fn own_volume(shape: &Shape) -> Result<(), String> {
    let sidecar = [shape.init_containers, shape.containers].iter().any(|l| matches!(l, List::Items(Some(_))));
    for (list, name) in [(shape.volumes, VOLUME), (shape.identity_volume, IDENTITY_VOLUME)] {
        if matches!(list, List::Items(Some(_))) && !sidecar {
            return Err(format!("volume {name:?} is the pod's own, and a volume of the sidecar's has that name"));
        }
    }
    Ok(())
}

/// Whether the sidecar was injected into the pod: it has the injection's annotation or the
/// sidecar container (as the chart's named template `sluice.sidecar` adds it).
pub fn injected(pod: &Value) -> bool {
    let annotated = pod.get("metadata").and_then(|m| m.get("annotations")).and_then(|a| a.get(INJECTED)).is_some();
    annotated || containers(pod).any(|c| c.get("name").and_then(Value::as_str) == Some(CONTAINER))
}

/// The pod's init containers and containers.
fn containers(pod: &Value) -> impl Iterator<Item = &Value> {
    let spec = pod.get("spec");
    let lists = ["initContainers", "containers"].map(|key| spec.and_then(|s| s.get(key)).and_then(Value::as_sequence));
    lists.into_iter().flatten().flatten()
}

/// The pod's `sluice.io/inject` in its labels or its annotations.
pub fn inject_mark<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod.get("metadata")?.get(key)?.get(INJECT)?.as_str()
}
