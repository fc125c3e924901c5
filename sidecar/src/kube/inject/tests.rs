use yaml_serde::Value;

use super::{review::answer, *};
use crate::{
    defaults::{IDENTITY_ISSUER_KIND, IDENTITY_TRUST_DOMAIN},
    kube::cluster::{Mode, Native},
};

const WORKLOADS: &str = include_str!("testdata/workloads.yaml");

fn settings() -> Settings {
    Settings {
        image: DEFAULT_IMAGE.into(),
        servers: Vec::new(),
        native: Native::True,
        cpu_request: "50m".into(),
        memory_request: "32Mi".into(),
        cpu_limit: None,
        memory_limit: "128Mi".into(),
        identity: Identity {
            issuer: None,
            issuer_kind: IDENTITY_ISSUER_KIND.into(),
            issuer_group: None,
            trust_domain: IDENTITY_TRUST_DOMAIN.into(),
        },
    }
}

/// The injected YAML.
fn injected(text: &str, settings: &Settings, config_map: &str) -> String {
    documents(text, settings, config_map).unwrap().0
}

fn parse_all(text: &str) -> Vec<Value> {
    yaml_serde::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn at<'a>(value: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(value, |v, key| v.get(*key).unwrap_or_else(|| panic!("no {key} in {v:?}")))
}

fn names(list: &Value) -> Vec<&str> {
    list.as_sequence().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect()
}

/// Each injected document's pod template path, by kind.
fn template(doc: &Value) -> &Value {
    match doc["kind"].as_str().unwrap() {
        "Pod" => doc,
        "CronJob" => at(doc, &["spec", "jobTemplate", "spec", "template"]),
        _ => at(doc, &["spec", "template"]),
    }
}

#[test]
fn every_kind_with_pods_gets_the_sidecar_first_among_its_init_containers() {
    let out = injected(WORKLOADS, &settings(), "app-sidecar");
    let (before, after) = (parse_all(WORKLOADS), parse_all(&out));
    assert_eq!(before.len(), after.len());
    let kinds: Vec<&str> = after.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "List", "Service"]
    );
    let listed = &after[7]["items"][0];
    for pod in after[..7].iter().map(template).chain([listed]) {
        let spec = &pod["spec"];
        assert_eq!(names(&spec["initContainers"])[0], CONTAINER);
        assert!(!names(&spec["containers"]).contains(&CONTAINER));
        let sidecar = &spec["initContainers"][0];
        assert_eq!(sidecar["restartPolicy"], "Always");
        assert_eq!(sidecar["image"], DEFAULT_IMAGE);
        assert_eq!(sidecar["command"][0], BINARY);
        let args: Vec<&str> = sidecar["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        let expected = ["--config", "/etc/sluice/sidecar.yaml", "--admin-addr", "$(POD_IP):9901"];
        let expected = [&expected[..], &["--debug-addr", "127.0.0.1:9902", "--log-format", "json"]].concat();
        assert_eq!(args, expected);
        assert_eq!(sidecar["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
        assert_eq!(sidecar["env"][1]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
        assert_eq!(sidecar["ports"][0]["name"], ADMIN_PORT_NAME);
        assert_eq!(sidecar["startupProbe"]["httpGet"]["path"], "/ready");
        assert_eq!(sidecar["livenessProbe"]["httpGet"]["path"], "/live");
        let security = &sidecar["securityContext"];
        assert_eq!(security["runAsNonRoot"], true);
        assert_eq!(security["readOnlyRootFilesystem"], true);
        assert_eq!(security["allowPrivilegeEscalation"], false);
        assert_eq!(security["capabilities"]["drop"][0], "ALL");
        assert_eq!(sidecar["volumeMounts"][0]["readOnly"], true);
        let volume = spec["volumes"].as_sequence().unwrap().last().unwrap();
        assert_eq!(volume["configMap"]["name"], "app-sidecar");
        assert_eq!(volume["configMap"]["items"][0]["key"], "sidecar.yaml");
        assert_eq!(pod["metadata"]["annotations"][INJECTED], concat!("sluice-sidecar ", env!("CARGO_PKG_VERSION")));
        assert_eq!(pod["metadata"]["labels"][SIDECAR_LABEL], "injected");
    }
    // What is not a pod template is as it was.
    assert_eq!(after[7]["items"][1], before[7]["items"][1]);
    assert_eq!(after[8], before[8]);
    for (b, a) in before.iter().zip(&after).skip(1).take(6) {
        assert_eq!(a["metadata"], b["metadata"], "the workload's own metadata is not touched");
    }
}

#[test]
fn what_the_pod_had_stays_as_it_was() {
    let out = parse_all(&injected(WORKLOADS, &settings(), "app-sidecar"));
    let (before, after) = (template(&parse_all(WORKLOADS)[1]).clone(), template(&out[1]).clone());
    let (spec_before, spec_after) = (&before["spec"], &after["spec"]);
    assert_eq!(names(&spec_after["initContainers"]), [CONTAINER, "migrate"]);
    assert_eq!(spec_after["initContainers"][1], spec_before["initContainers"][0]);
    assert_eq!(spec_after["containers"], spec_before["containers"], "probes, ports and mounts kept");
    assert_eq!(names(&spec_after["volumes"]), ["cache", "settings", VOLUME]);
    assert_eq!(after["metadata"]["labels"]["app"], "orders");
    assert_eq!(after["metadata"]["annotations"]["example.com/team"], "orders");
    // Keys keep their order: the output reads like the input.
    let keys: Vec<&str> = spec_after.as_mapping().unwrap().keys().map(|k| k.as_str().unwrap()).collect();
    assert_eq!(keys, ["initContainers", "containers", "volumes"]);
}

#[test]
fn injecting_twice_gives_what_injecting_once_does() {
    for native in [Native::True, Native::False] {
        let settings = Settings { native, ..settings() };
        let once = injected(WORKLOADS, &settings, "app-sidecar");
        let twice = injected(&once, &settings, "app-sidecar");
        assert_eq!(once, twice, "{native:?}");
    }
    // Again with other settings: the sidecar is replaced, not added twice.
    let native = injected(WORKLOADS, &settings(), "app-sidecar");
    let other = Settings { native: Native::False, image: "registry.example/sluice:2".into(), ..settings() };
    let classic = parse_all(&injected(&native, &other, "other"));
    let pod = template(&classic[1]);
    assert_eq!(names(&pod["spec"]["initContainers"]), ["migrate"]);
    assert_eq!(names(&pod["spec"]["containers"]), [CONTAINER, "app"]);
    assert_eq!(pod["spec"]["containers"][0]["image"], "registry.example/sluice:2");
    assert_eq!(names(&pod["spec"]["volumes"]), ["cache", "settings", VOLUME]);
    assert_eq!(pod["spec"]["volumes"][2]["configMap"]["name"], "other");
}

#[test]
fn classic_mode_adds_a_plain_container_first_that_holds_the_others_until_ready() {
    let settings = Settings { native: Native::False, ..settings() };
    let out = parse_all(&injected(WORKLOADS, &settings, "app-sidecar"));
    let pod = template(&out[1]);
    assert_eq!(names(&pod["spec"]["initContainers"]), ["migrate"]);
    assert_eq!(names(&pod["spec"]["containers"]), [CONTAINER, "app"]);
    let sidecar = &pod["spec"]["containers"][0];
    assert!(sidecar.get("restartPolicy").is_none());
    let hook: Vec<&str> = sidecar["lifecycle"]["postStart"]["exec"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(hook, [BINARY, "wait"]);
    // `wait` is a subcommand of the binary, with defaults that find the injected sidecar.
    let cli = <crate::cli::Cli as clap::Parser>::try_parse_from(hook).expect("the binary's own subcommand");
    assert!(matches!(cli.command, Some(crate::cli::Command::Wait(_))));
}

#[test]
fn auto_is_classic_offline_and_a_pods_annotation_overrides_the_flag() {
    let auto = Settings { native: Native::Auto, ..settings() };
    let out = parse_all(&injected(WORKLOADS, &auto, "app-sidecar"));
    assert_eq!(names(&template(&out[1])["spec"]["containers"]), [CONTAINER, "app"]);
    let annotated = |value: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n    {NATIVE_ANNOTATION}: \"{value}\"\n\
             spec:\n  containers:\n  - name: app\n    image: app\n"
        )
    };
    let native = parse_all(&injected(&annotated("true"), &auto, "app-sidecar"));
    assert_eq!(names(&native[0]["spec"]["initContainers"]), [CONTAINER]);
    let classic = parse_all(&injected(&annotated("false"), &settings(), "app-sidecar"));
    assert_eq!(names(&classic[0]["spec"]["containers"]), [CONTAINER, "app"]);
    let refused = documents(&annotated("yes"), &settings(), "app-sidecar").unwrap_err();
    assert!(refused.why.contains("sluice.io/native-sidecar: \"yes\" is neither"), "{refused:?}");
}

#[test]
fn the_sidecar_holds_no_service_account_token() {
    for native in [Native::True, Native::False] {
        let out = parse_all(&injected(WORKLOADS, &Settings { native, ..settings() }, "app-sidecar"));
        let spec = &template(&out[1])["spec"];
        let sidecar = [&spec["initContainers"], &spec["containers"]]
            .into_iter()
            .flat_map(|list| list.as_sequence().unwrap())
            .find(|c| c["name"] == CONTAINER)
            .unwrap();
        let mounts: Vec<&str> =
            sidecar["volumeMounts"].as_sequence().unwrap().iter().map(|m| m["mountPath"].as_str().unwrap()).collect();
        // Kubernetes mounts the token into no container that has something at its directory.
        assert!(mounts.contains(&"/var/run/secrets/kubernetes.io/serviceaccount"), "{native:?}: {mounts:?}");
    }
}

#[test]
fn servers_and_resources_come_from_the_flags() {
    let settings = Settings {
        servers: vec!["sluice-leaf.sluice:7777".into(), "backup:7777".into()],
        cpu_request: "100m".into(),
        cpu_limit: Some("1".into()),
        memory_limit: "64Mi".into(),
        ..settings()
    };
    let out = parse_all(&injected(WORKLOADS, &settings, "app-sidecar"));
    let sidecar = &out[0]["spec"]["initContainers"][0];
    let args = sidecar["args"].as_sequence().unwrap();
    assert_eq!(args[8..], [Value::from("--server-addresses"), "sluice-leaf.sluice:7777,backup:7777".into()]);
    assert_eq!(sidecar["resources"]["requests"]["cpu"], "100m");
    assert_eq!(sidecar["resources"]["limits"]["cpu"], "1");
    assert_eq!(sidecar["resources"]["limits"]["memory"], "64Mi");
}

#[test]
fn the_sidecar_takes_the_args_it_is_given_and_logs_json() {
    let settings = Settings { servers: vec!["sluice-leaf.sluice:7777".into()], ..settings() };
    let out = parse_all(&injected(WORKLOADS, &settings, "app-sidecar"));
    let args = out[0]["spec"]["initContainers"][0]["args"].as_sequence().unwrap().iter();
    // The kubelet puts the pod's IP in place of $(POD_IP).
    let args = args.map(|a| a.as_str().unwrap().replace("$(POD_IP)", "10.0.0.1"));
    let cli = <crate::cli::Cli as clap::Parser>::try_parse_from([BINARY.to_owned()].into_iter().chain(args))
        .expect("the sidecar's own flags");
    assert!(cli.command.is_none());
    assert!(matches!(cli.sidecar.log_format, sluice_runtime::cli::LogFormat::Json));
    // The status pages on the pod's loopback, apart from the probes and metrics.
    assert_eq!(cli.sidecar.debug_addr, Some(DEBUG_ADDR.parse().unwrap()));
}

#[test]
fn input_that_cannot_be_injected_is_named() {
    let cases = [
        (
            "kind: Deployment\nmetadata: {name: d}\nspec: {replicas: 1}\n",
            "document 1: Deployment \"d\": no spec.template",
        ),
        ("kind: Pod\nmetadata: {name: p}\n", "document 1: Pod \"p\": no spec"),
        (
            "kind: Pod\nmetadata: {name: p}\nspec: {containers: 3}\n",
            "document 1: Pod \"p\": spec.containers is not a list",
        ),
        ("kind: Service\n---\nkind: Pod\nspec: [\n", "document 2:"),
    ];
    for (input, expected) in cases {
        let error = documents(input, &settings(), "c").unwrap_err().why;
        assert!(error.starts_with(expected), "{error:?} should start with {expected:?}");
    }
}

#[test]
fn flag_values_are_checked() {
    for good in ["100m", "0.5", "1", "64Mi", "1Gi", "1e3", "2E-1", ".5"] {
        assert_eq!(quantity(good).as_deref(), Ok(good));
    }
    for bad in ["", "m", "1.2.3", "64MB", "-1", "1e", "ten"] {
        assert!(quantity(bad).is_err(), "{bad:?}");
    }
    for good in ["app", "app-sidecar", "a.b-c1"] {
        assert!(config_map_name(good).is_ok(), "{good:?}");
    }
    for bad in ["", "App", "-app", "app-", "a_b", &"a".repeat(254)] {
        assert!(config_map_name(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn each_object_gets_a_line_saying_what_was_done() {
    let (once, report) = documents(WORKLOADS, &settings(), "app-sidecar").unwrap();
    let expected = [
        "pod/single: injected (native sidecar)",
        "deployment/orders: injected (native sidecar)",
        "statefulset/ledger: injected (native sidecar)",
        "daemonset/agent: injected (native sidecar)",
        "replicaset/legacy: injected (native sidecar)",
        "job/report: injected (native sidecar)",
        "cronjob/nightly: injected (native sidecar)",
        "pod/listed: injected (native sidecar)",
        "configmap/listed-settings: skipped (not a workload)",
        "service/orders: skipped (not a workload)",
    ];
    assert_eq!(report, expected);
    let (_, again) = documents(&once, &settings(), "app-sidecar").unwrap();
    assert_eq!(again[1], "deployment/orders: already injected");
    let other = Settings { image: "registry.example/sluice:2".into(), ..settings() };
    let (_, other) = documents(&once, &other, "app-sidecar").unwrap();
    assert_eq!(other[1], "deployment/orders: injected (native sidecar)");
}

#[test]
fn a_pod_labelled_or_annotated_disabled_is_left_as_it_is() {
    for (key, mark) in [("labels", "{sluice.io/inject: disabled}"), ("annotations", "{sluice.io/inject: disabled}")] {
        let input = format!(
            "kind: Deployment\nmetadata: {{name: web}}\nspec:\n  template:\n    metadata: {{{key}: {mark}}}\n    \
             spec: {{containers: [{{name: app, image: app}}]}}\n"
        );
        let (out, report) = documents(&input, &settings(), "c").unwrap();
        assert_eq!(parse_all(&out), parse_all(&input), "{key}");
        assert_eq!(report, ["deployment/web: skipped (sluice.io/inject: disabled)"]);
    }
    // Any other value is no opt-out.
    let enabled = "kind: Pod\nmetadata: {name: x, labels: {sluice.io/inject: enabled}}\nspec: {containers: []}\n";
    assert_eq!(documents(enabled, &settings(), "c").unwrap().1, ["pod/x: injected (native sidecar)"]);
}

#[test]
fn what_the_pod_already_uses_of_the_sidecars_is_refused() {
    let pod = |containers: &str, volumes: &str| {
        format!("kind: Pod\nmetadata: {{name: x}}\nspec: {{containers: {containers}, volumes: {volumes}}}\n")
    };
    let refused = [
        (
            pod("[{name: app, ports: [{containerPort: 9901}]}]", "[]"),
            "document 1: Pod \"x\": container \"app\" already uses port 9901, the sidecar's admin port",
        ),
        (
            pod("[{name: app}, {name: metrics, ports: [{containerPort: 9901, protocol: TCP}]}]", "[]"),
            "document 1: Pod \"x\": container \"metrics\" already uses port 9901, the sidecar's admin port",
        ),
        (
            pod("[{name: app}]", "[{name: sluice-config, emptyDir: {}}]"),
            "document 1: Pod \"x\": volume \"sluice-config\" is the pod's own, and a volume of the sidecar's has that name",
        ),
    ];
    for (input, expected) in refused {
        let refusal = documents(&input, &settings(), "c").unwrap_err();
        assert_eq!(refusal, Refusal { why: expected.into(), clash: true });
    }
    // UDP 9901 is free for the sidecar, and an injected pod's volume is the sidecar's own.
    let udp = pod("[{name: app, ports: [{containerPort: 9901, protocol: UDP}]}]", "[]");
    let (once, _) = documents(&udp, &settings(), "c").unwrap();
    assert_eq!(documents(&once, &settings(), "c").unwrap().1, ["pod/x: already injected"]);
    // A port taken after the injection is refused on the next.
    let taken = once.replace("protocol: UDP", "protocol: TCP");
    assert!(documents(&taken, &settings(), "c").unwrap_err().clash);
    // Input that cannot be read is no clash.
    assert!(!documents("kind: Pod\n", &settings(), "c").unwrap_err().clash);
}

#[test]
fn uninject_takes_out_what_inject_added() {
    for native in [Native::True, Native::False] {
        let settings = Settings { native, ..settings() };
        let (out, report) = uninjected(&injected(WORKLOADS, &settings, "app-sidecar")).unwrap();
        assert_eq!(parse_all(&out), parse_all(WORKLOADS), "{native:?}");
        assert_eq!(report[..2], ["pod/single: uninjected", "deployment/orders: uninjected"]);
        assert_eq!(report[9], "service/orders: skipped (not a workload)");
        let (again, report) = uninjected(&out).unwrap();
        assert_eq!(again, out, "uninjecting twice is uninjecting once");
        assert_eq!(report[0], "pod/single: not injected");
    }
    // A pod never injected keeps a volume of the sidecar's volume's name.
    let own = "kind: Pod\nmetadata: {name: x}\nspec: {containers: [], volumes: [{name: sluice-config}]}\n";
    let (out, report) = uninjected(own).unwrap();
    assert_eq!(parse_all(&out), parse_all(own));
    assert_eq!(report, ["pod/x: not injected"]);
}

#[test]
fn image_references_are_checked() {
    let digest = format!("registry.example/sluice@sha256:{}", "a".repeat(64));
    let good = ["sluice:0.1.0", "sluice", "registry.example/team/sluice:1", "localhost:5000/sluice:v1.2-rc_1", &digest];
    for good in good {
        assert_eq!(image_reference(good).as_deref(), Ok(good));
    }
    let bad = ["", "Sluice", "sluice:", ":1", "-sluice", "a//b", "sluice:t!g", "sluice latest", "sluice@sha256:12"];
    for bad in bad {
        assert!(image_reference(bad).is_err(), "{bad:?}");
    }
}

/// An AdmissionReview request for `pod`, as the API server sends it.
fn review(pod: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    }))
    .unwrap()
}

/// The Deployment's pod as its ReplicaSet creates it.
fn orders_pod() -> serde_json::Value {
    let template = template(&parse_all(WORKLOADS)[1]).clone();
    let mut pod = serde_json::to_value(&template).unwrap();
    pod["apiVersion"] = "v1".into();
    pod["kind"] = "Pod".into();
    pod["metadata"]["generateName"] = "orders-5d8f7c-".into();
    pod["metadata"]["annotations"][CONFIG_ANNOTATION] = "orders-sidecar".into();
    pod
}

#[test]
fn the_webhook_patch_makes_the_pod_that_inject_makes() {
    let pod = orders_pod();
    let answered = answer(&review(pod.clone()), &settings(), Some("default-sidecar"), None).unwrap();
    assert_eq!(answered.outcome, review::Outcome::Injected(Mode::Native));
    assert_eq!(answered.pod, "shop/orders-5d8f7c-");
    let answered_review: serde_json::Value = serde_json::from_str(&answered.review).unwrap();
    let response = &answered_review["response"];
    assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    use base64::Engine;
    let patch = base64::engine::general_purpose::STANDARD.decode(response["patch"].as_str().unwrap()).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    // inject on the same pod, with the annotation's ConfigMap.
    let mut injected: Value = serde_json::from_value(pod).unwrap();
    super::pod(&mut injected, &settings(), "orders-sidecar", None).unwrap();
    assert_eq!(patched, serde_json::to_value(&injected).unwrap());
}

#[test]
fn the_webhook_allows_what_it_does_not_inject_unchanged() {
    let unchanged = |body: Vec<u8>, config_map: Option<&str>| {
        let answered = answer(&body, &settings(), config_map, None).unwrap();
        let review: serde_json::Value = serde_json::from_str(&answered.review).unwrap();
        assert_eq!(review["response"]["allowed"], true);
        assert!(review["response"].get("patch").is_none());
        answered.outcome
    };
    let mut injected = orders_pod();
    injected["metadata"]["annotations"][INJECTED] = "sluice-sidecar 0.0.1".into();
    assert_eq!(unchanged(review(injected), None), review::Outcome::Skipped("already injected".into()));
    let mut disabled = orders_pod();
    disabled["metadata"]["labels"][INJECT] = "disabled".into();
    assert_eq!(unchanged(review(disabled), None), review::Outcome::Skipped("sluice.io/inject: disabled".into()));

    let mut own = orders_pod();
    own["spec"]["volumes"][0]["name"] = VOLUME.into();
    let outcome = unchanged(review(own), None);
    assert!(matches!(&outcome, review::Outcome::Unhandled(why) if why.contains("the pod's own")), "{outcome:?}");

    let mut port = orders_pod();
    port["spec"]["containers"][0]["ports"][0]["containerPort"] = 9901.into();
    let outcome = unchanged(review(port), None);
    assert_eq!(outcome, review::Outcome::Unhandled(checks::port_clash("app")));

    let mut unnamed = orders_pod();
    unnamed["metadata"]["annotations"].as_object_mut().unwrap().remove(CONFIG_ANNOTATION);
    let outcome = unchanged(review(unnamed.clone()), None);
    assert!(matches!(&outcome, review::Outcome::Unhandled(why) if why.contains("no sluice.io/config")), "{outcome:?}");
    let mut misnamed = orders_pod();
    misnamed["metadata"]["annotations"][CONFIG_ANNOTATION] = "Not_A_Name".into();
    assert!(matches!(unchanged(review(misnamed), Some("default")), review::Outcome::Unhandled(_)));

    let mut update: serde_json::Value = serde_json::from_slice(&review(orders_pod())).unwrap();
    update["request"]["operation"] = "UPDATE".into();
    let outcome = unchanged(serde_json::to_vec(&update).unwrap(), None);
    assert!(matches!(&outcome, review::Outcome::Unhandled(why) if why.contains("UPDATE")), "{outcome:?}");
    let mut deployment: serde_json::Value = serde_json::from_slice(&review(orders_pod())).unwrap();
    deployment["request"]["kind"]["kind"] = "Deployment".into();
    deployment["request"]["resource"]["resource"] = "deployments".into();
    let outcome = unchanged(serde_json::to_vec(&deployment).unwrap(), None);
    assert!(matches!(&outcome, review::Outcome::Unhandled(why) if why.contains("not a pod")), "{outcome:?}");

    // Without the annotation, the webhook's own --config-map.
    let answered = answer(&review(unnamed), &settings(), Some("default-sidecar"), None).unwrap();
    assert_eq!(answered.outcome, review::Outcome::Injected(Mode::Native));

    // No uid to answer: the API server's failure policy decides.
    assert!(answer(b"{}", &settings(), None, None).unwrap_err().contains("no request"));
    assert!(answer(b"{\"request\": {}}", &settings(), None, None).unwrap_err().contains("uid"));
    assert!(answer(b"not json", &settings(), None, None).unwrap_err().contains("not an AdmissionReview"));
    let mut long_uid: serde_json::Value = serde_json::from_slice(&review(orders_pod())).unwrap();
    long_uid["request"]["uid"] = "u".repeat(129).into();
    let refused = answer(&serde_json::to_vec(&long_uid).unwrap(), &settings(), None, None).unwrap_err();
    assert!(refused.contains("longer than 128"), "{refused}");
}

/// Patches `pod` with the webhook's answer for it.
fn webhook_patched(pod: &serde_json::Value, settings: &Settings) -> Result<serde_json::Value, review::Outcome> {
    let answered = answer(&review(pod.clone()), settings, None, None).unwrap();
    if !matches!(answered.outcome, review::Outcome::Injected(_)) {
        return Err(answered.outcome);
    }
    let answered: serde_json::Value = serde_json::from_str(&answered.review).unwrap();
    use base64::Engine;
    let patch =
        base64::engine::general_purpose::STANDARD.decode(answered["response"]["patch"].as_str().unwrap()).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    Ok(patched)
}

#[test]
fn the_patch_holds_only_what_changes_whatever_the_pods_size() {
    // A large pod: the patch neither copies its lists nor grows with them.
    let mut pod = orders_pod();
    let env: Vec<_> = (0..20_000).map(|i| serde_json::json!({"name": format!("V{i}"), "value": "x"})).collect();
    pod["spec"]["initContainers"][0]["env"] = env.into();
    let small = answer(&review(orders_pod()), &settings(), None, None).unwrap().review.len();
    let large = answer(&review(pod.clone()), &settings(), None, None).unwrap().review.len();
    assert_eq!(small, large);
    // An earlier sidecar anywhere in the lists is taken out, in both modes, as `inject` does.
    let mut earlier = orders_pod();
    let stale = serde_json::json!({"name": CONTAINER, "image": "old"});
    earlier["spec"]["containers"].as_array_mut().unwrap().insert(0, stale.clone());
    earlier["spec"]["initContainers"].as_array_mut().unwrap().push(stale);
    earlier["spec"]["volumes"].as_array_mut().unwrap().insert(0, serde_json::json!({"name": VOLUME, "emptyDir": {}}));
    earlier["metadata"].as_object_mut().unwrap().remove("labels");
    for native in [Native::True, Native::False] {
        let settings = Settings { native, ..settings() };
        let mut injected: Value = serde_json::from_value(earlier.clone()).unwrap();
        super::pod(&mut injected, &settings, "orders-sidecar", None).unwrap();
        let patched = webhook_patched(&earlier, &settings).unwrap();
        assert_eq!(patched, serde_json::to_value(&injected).unwrap(), "{native:?}");
    }
    // Two of them: Kubernetes refuses the pod, so it is left to that.
    let mut twice = orders_pod();
    let sidecar = serde_json::json!({"name": CONTAINER});
    twice["spec"]["containers"] = serde_json::json!([sidecar, sidecar]);
    let outcome = webhook_patched(&twice, &settings()).unwrap_err();
    assert!(matches!(&outcome, review::Outcome::Unhandled(why) if why.contains("more than one")), "{outcome:?}");
}

#[test]
fn deep_flow_nesting_is_refused_before_parsing() {
    let deep = |open: &str, close: &str, n: usize| format!("kind: Pod\nspec: {}1{}\n", open.repeat(n), close.repeat(n));
    for (open, close) in [("{a: ", "}"), ("[", "]"), ("{\"a\":", "}"), ("[{a: [", "]}]")] {
        let ok = deep(open, close, 40);
        assert!(nesting::check(&ok, MAX_FLOW_DEPTH).is_ok(), "{ok}");
        let error = documents(&deep(open, close, 50_000), &settings(), "c").unwrap_err().why;
        assert_eq!(error, "line 2: [ ] and { } nested more than 128 deep", "{open}");
    }
    // Brackets the parser reads as text do not count (but at the start of a block scalar's line,
    // where only the parser's indentation tells text from a token, they do)...
    let texts = [
        "a: '{{{{'\n",
        "a: \"[[[[\\\"[[\"\n",
        "a: b {{{{\n",
        "a: b # {{{{\n",
        "a: |\n  x {{{{\n  y [[[[\nb: 1\n",
        "a: !<x[[[[> y\n",
        "a: 'it''s [[[['\n",
        "[a, 'b[[[[', \"c{{{{\"]\n",
    ];
    for text in texts {
        assert!(nesting::check(text, 3).is_ok(), "{text:?}");
        assert!(yaml_serde::from_str::<Value>(text).is_ok(), "the parser takes {text:?}");
    }
    // ...but those it may read as flow collections do, whatever hides them from a simpler scan:
    // a quote in a block scalar or a plain scalar's next line, a comment ended by another line
    // break, an anchor, a document marker.
    let hidden = [
        "a: |\n  'x\nb: {{{{x}}}}\nc: 'y'\n",
        "a: b\n  'c\nd: {{{{x}}}}\ne: 'f'\n",
        "a: 1 # \u{85}{{{{x}}}}\n",
        "a: &x{{{{x}}}}\n",
        "a: b\n--- {{{{x}}}}\n",
        "[a\n'b, {{{{x}}}}]\n",
    ];
    for text in hidden {
        assert!(nesting::check(text, 3).is_err(), "{text:?}");
    }
}

fn with_identity() -> Settings {
    let identity = Identity { issuer: Some("sluice-identity".into()), ..settings().identity };
    Settings { servers: vec!["sluice-root.sluice.svc:7777".into()], identity, ..settings() }
}

#[test]
fn an_identity_issuer_gives_each_sidecar_a_certificate_naming_its_pod_and_mtls_with_it() {
    let out = parse_all(&injected(WORKLOADS, &with_identity(), "app-sidecar"));
    let pod = &out[0];
    let volumes = &pod["spec"]["volumes"];
    assert_eq!(names(volumes)[names(volumes).len() - 2..], [VOLUME, IDENTITY_VOLUME]);
    let csi = &volumes.as_sequence().unwrap().last().unwrap()["csi"];
    assert_eq!((csi["driver"].as_str(), csi["readOnly"].as_bool()), (Some(CSI_DRIVER), Some(true)));
    let attributes = &csi["volumeAttributes"];
    for (key, value) in [
        ("issuer-name", "sluice-identity"),
        ("issuer-kind", "ClusterIssuer"),
        ("uri-sans", "spiffe://cluster.local/ns/${POD_NAMESPACE}/pod/${POD_NAME}"),
        ("common-name", "${POD_NAME}"),
    ] {
        assert_eq!(attributes[format!("csi.cert-manager.io/{key}").as_str()], value, "{key}");
    }
    assert!(attributes.get("csi.cert-manager.io/issuer-group").is_none());
    let sidecar = &pod["spec"]["initContainers"][0];
    let args: Vec<&str> = sidecar["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let tls = [
        "--server-tls-ca",
        "/var/run/secrets/sluice.io/identity/ca.crt",
        "--server-tls-cert",
        "/var/run/secrets/sluice.io/identity/tls.crt",
        "--server-tls-key",
        "/var/run/secrets/sluice.io/identity/tls.key",
    ];
    assert_eq!(args[args.len() - 6..], tls);
    let mount = sidecar["volumeMounts"].as_sequence().unwrap().last().unwrap();
    assert_eq!((mount["name"].as_str(), mount["mountPath"].as_str()), (Some(IDENTITY_VOLUME), Some(IDENTITY_DIR)));
    // The sidecar takes those flags.
    let args = args.iter().map(|a| a.replace("$(POD_IP)", "10.0.0.1"));
    let cli = <crate::cli::Cli as clap::Parser>::try_parse_from([BINARY.to_owned()].into_iter().chain(args)).unwrap();
    assert_eq!(cli.sidecar.server_flags().key, Some(format!("{IDENTITY_DIR}/tls.key").into()));

    // A group when set; injecting again without an issuer takes the identity out; uninjecting
    // takes both volumes out.
    let grouped = Identity { issuer_group: Some("example.io".into()), ..with_identity().identity };
    let again = parse_all(&injected(WORKLOADS, &Settings { identity: grouped, ..with_identity() }, "app-sidecar"));
    let volumes = again[0]["spec"]["volumes"].as_sequence().unwrap();
    assert_eq!(volumes.last().unwrap()["csi"]["volumeAttributes"]["csi.cert-manager.io/issuer-group"], "example.io");
    let once = injected(WORKLOADS, &with_identity(), "app-sidecar");
    assert_eq!(injected(&once, &with_identity(), "app-sidecar"), once, "injecting twice is injecting once");
    let without = injected(&once, &settings(), "app-sidecar");
    assert_eq!(without, injected(WORKLOADS, &settings(), "app-sidecar"));
    assert_eq!(parse_all(&uninjected(&once).unwrap().0), parse_all(WORKLOADS));
    // The webhook patches the same pod, the first time and over an earlier injection.
    let pod = orders_pod();
    let mut by_inject: Value = serde_json::from_value(pod.clone()).unwrap();
    super::pod(&mut by_inject, &with_identity(), "orders-sidecar", None).unwrap();
    let webhook = webhook_patched(&pod, &with_identity()).unwrap();
    assert_eq!(webhook, serde_json::to_value(&by_inject).unwrap());
    let mut earlier = serde_json::to_value(&by_inject).unwrap();
    earlier["metadata"]["annotations"].as_object_mut().unwrap().remove(INJECTED);
    assert_eq!(webhook_patched(&earlier, &settings()).unwrap()["spec"]["volumes"], {
        let mut plain: Value = serde_json::from_value(pod).unwrap();
        super::pod(&mut plain, &settings(), "orders-sidecar", None).unwrap();
        serde_json::to_value(&plain).unwrap()["spec"]["volumes"].clone()
    });
    // A pod's own volume of that name is refused, and bad flag values are one line each.
    let own = "kind: Pod\nmetadata: {name: x}\nspec: {containers: [], volumes: [{name: sluice-identity}]}\n";
    assert!(
        documents(own, &with_identity(), "c").unwrap_err().why.contains("volume \"sluice-identity\" is the pod's own")
    );
    for (flag, bad) in
        [("--identity-issuer", "Bad_Name"), ("--identity-issuer-kind", "issuer"), ("--identity-trust-domain", "a/b")]
    {
        let parsed =
            <crate::cli::Cli as clap::Parser>::try_parse_from([BINARY, "inject", "--config-map", "c", flag, bad]);
        assert!(parsed.unwrap_err().to_string().contains(&format!("{bad:?}")), "{flag} {bad}");
    }
}
