//! The webhook's AdmissionReview input: any bytes are answered or refused with a one-line
//! reason, never a panic; an answer allows the pod, echoes the uid and, when it patches the pod,
//! the patch applies and makes of it what `inject` makes.
#![no_main]
#![forbid(unsafe_code)]

use base64::{Engine, engine::general_purpose::STANDARD};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sluice_sidecar::kube::{
    cluster::{KubeVersion, Native},
    inject::{self, CONFIG_ANNOTATION, DEFAULT_IMAGE, Identity, Settings, review::answer},
};

fuzz_target!(|data: &[u8]| {
    let settings = Settings {
        image: DEFAULT_IMAGE.into(),
        servers: vec!["leaf:7777".into()],
        native: match data.first() {
            Some(b' ') => Native::False,
            Some(b'\t') => Native::Auto,
            _ => Native::True,
        },
        cpu_request: "50m".into(),
        memory_request: "32Mi".into(),
        cpu_limit: None,
        memory_limit: "128Mi".into(),
        // Every other input with the identity volume, so that both volumes' edits are fuzzed.
        identity: Identity {
            issuer: data.len().is_multiple_of(2).then(|| "sluice-identity".into()),
            issuer_kind: "ClusterIssuer".into(),
            issuer_group: None,
            trust_domain: "cluster.local".into(),
        },
    };
    // The API server's version as the webhook last asked it: unknown, or 1.0 to 1.39.
    let version = data.get(1).map(|b| KubeVersion { major: 1, minor: u32::from(b % 40) });
    let answered = match answer(data, &settings, Some("default"), version) {
        Err(reason) => return assert!(!reason.contains('\n'), "one line: {reason:?}"),
        Ok(answered) => answered,
    };
    let reply: Value = serde_json::from_str(&answered.review).expect("the answer is JSON");
    let response = &reply["response"];
    assert_eq!(response["allowed"], true);
    // The tree of the request, where one can be built (it refuses nesting past 128).
    let Ok(request) = serde_json::from_slice::<Value>(data) else { return };
    let request = &request["request"];
    assert_eq!(response["uid"], request["uid"]);
    let Some(patch) = response["patch"].as_str() else { return };
    let patch: json_patch::Patch = serde_json::from_slice(&STANDARD.decode(patch).expect("base64")).expect("a patch");
    let mut patched = request["object"].clone();
    json_patch::patch(&mut patched, &patch).expect("the patch applies to the pod");
    let mut injected: yaml_serde::Value = serde_json::from_value(request["object"].clone()).expect("as YAML");
    let config_map = request["object"]["metadata"]["annotations"][CONFIG_ANNOTATION].as_str().unwrap_or("default");
    inject::pod(&mut injected, &settings, config_map, version).expect("inject takes the pod the webhook injected");
    assert!(patched == serde_json::to_value(&injected).expect("as JSON"), "the webhook's pod is inject's");
});
