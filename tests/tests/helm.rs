//! The Helm chart (helm/sluice) and the manifests made from it, without a cluster: `helm lint
//! --strict`; every object rendered with the defaults and with each `ci/` values file validates
//! strictly for Kubernetes 1.30 and 1.37 (Prometheus-operator and cert-manager objects against
//! their own schemas); bad values are refused with a message naming them; the rules and the
//! dashboard are deploy/'s files, not copies; deploy/k8s is what deploy/k8s/render.sh makes; the
//! named template `sluice.sidecar` is the container `inject` adds; and `inject`'s output on every
//! kind validates. The webhook runs two replicas spread over nodes under a disruption budget, and
//! renders the same every time; the install hook checks every tier's configuration with the real
//! `sluice-server check`.

use std::{collections::HashMap, fs, path::Path, process::Command};

use serde_json::Value;
use sluice_sidecar::config::ServerFlags;
use sluice_tests::{
    harness::{binary, free_port, http_get},
    kube::{
        Launch, chart, container, documents, find, helm, pod_template, render, repo, run_with_input, tools_ready,
        validate,
    },
    wait::eventually_blocking,
};

fn ci_values() -> Vec<String> {
    let mut files: Vec<String> = fs::read_dir(chart().join("ci"))
        .expect("helm/sluice/ci")
        .map(|e| e.expect("entry").path().display().to_string())
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "a root only, the rate limit service, a tree with TLS, the webhook: {files:?}");
    files
}

fn kinds(objects: &[Value]) -> Vec<String> {
    objects.iter().map(|o| o["kind"].as_str().unwrap_or_default().to_owned()).collect()
}

#[test]
fn the_chart_lints_and_every_rendering_validates_strictly() {
    if !tools_ready("the chart test") {
        return;
    }
    let chart_dir = chart().display().to_string();
    let mut renderings = vec![("defaults".to_owned(), Vec::new())];
    renderings.extend(ci_values().into_iter().map(|f| (f.clone(), vec!["--values".to_owned(), f])));
    for (name, args) in &renderings {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let lint = helm(&[&["lint", "--strict", &chart_dir], &args[..]].concat());
        assert!(
            lint.as_ref().is_ok_and(|out| out.contains("0 chart(s) failed")),
            "helm lint --strict ({name}): {lint:?}"
        );
        let yaml = render(&chart(), &args).unwrap_or_else(|e| panic!("helm template ({name}): {e}"));
        let summary = validate(&yaml).unwrap_or_else(|e| panic!("{name}: {e}"));
        println!("{name}:\n{summary}");
        let objects = documents(&yaml);
        let kinds = kinds(&objects);
        for kind in ["StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceAccount", "Pod", "Job"] {
            assert!(kinds.iter().any(|k| k == kind), "{name}: no {kind} in {kinds:?}");
        }
        assert_eq!(
            summary.lines().map(|l| l.split(' ').nth(1).unwrap().parse::<usize>().unwrap()).sum::<usize>(),
            objects.len()
        );
    }
    // What each ci file is for is there.
    let tree = documents(&render(&chart(), &["--values", &ci_values()[2]]).unwrap());
    let leaf = container(pod_template(find(&tree, "StatefulSet", "sluice-leaf")), "server");
    let args: Vec<&str> = leaf["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    for expected in [
        "--debug-addr=127.0.0.1:7779",
        "--parent=sluice-root.sluice.svc:7777",
        "--server-id=sluice-leaf",
        "--etcd-endpoints=http://sluice-etcd.sluice.svc:2379",
        "--election-key=/sluice/sluice/sluice-leaf",
        "--tls-cert=/etc/sluice/tls/tls.crt",
        "--parent-tls-ca=/etc/sluice/tls/ca.crt",
    ] {
        assert!(args.contains(&expected), "{expected} in {args:?}");
    }
    let root = container(pod_template(find(&tree, "StatefulSet", "sluice-root")), "server");
    assert!(root["args"].as_array().unwrap().contains(&"--tls-client-ca=/etc/sluice/tls/ca.crt".into()));
    assert_eq!(find(&tree, "StatefulSet", "sluice-root")["spec"]["replicas"], 3);
    let webhook = documents(&render(&chart(), &["--values", &ci_values()[3]]).unwrap());
    for kind in ["MutatingWebhookConfiguration", "Certificate", "PodMonitor", "ServiceMonitor", "PrometheusRule"] {
        assert!(kinds(&webhook).iter().any(|k| k == kind), "webhook values: no {kind}");
    }
    let configuration = find(&webhook, "MutatingWebhookConfiguration", "sluice-injector");
    for hook in configuration["webhooks"].as_array().unwrap() {
        assert_eq!(hook["failurePolicy"], "Ignore");
    }
}

#[test]
fn the_webhook_runs_two_replicas_spread_over_nodes_and_a_drain_evicts_one_at_a_time() {
    if !tools_ready("the chart test") {
        return;
    }
    let objects = documents(&render(&chart(), &["--set", "injector.enabled=true"]).unwrap());
    let deployment = find(&objects, "Deployment", "sluice-injector");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pods = &deployment["spec"]["selector"]["matchLabels"];
    let budget = &find(&objects, "PodDisruptionBudget", "sluice-injector")["spec"];
    assert_eq!(budget["maxUnavailable"], 1);
    assert_eq!(&budget["selector"]["matchLabels"], pods);
    let spread = pod_template(deployment)["spec"]["topologySpreadConstraints"].as_array().unwrap();
    let keys: Vec<&str> = spread.iter().map(|c| c["topologyKey"].as_str().unwrap()).collect();
    assert_eq!(keys, ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]);
    assert!(spread.iter().all(|c| &c["labelSelector"]["matchLabels"] == pods));
    // One replica has no budget: it would only say that the one may go.
    let one =
        documents(&render(&chart(), &["--set", "injector.enabled=true", "--set", "injector.replicas=1"]).unwrap());
    assert!(!one.iter().any(|o| o["kind"] == "PodDisruptionBudget" && o["metadata"]["name"] == "sluice-injector"));
}

#[test]
fn the_webhook_renders_the_same_every_time_unless_its_certificate_is_generated() {
    if !tools_ready("the chart test") {
        return;
    }
    // What a GitOps tool does at every sync: render the chart, compare with the cluster.
    let twice = |set: &[&str]| {
        let args = [&["--set", "injector.enabled=true"][..], set].concat();
        (render(&chart(), &args).unwrap(), render(&chart(), &args).unwrap())
    };
    let (first, second) = twice(&[]);
    assert!(first == second, "two renderings with the defaults differ");
    assert!(documents(&first).iter().any(|o| o["kind"] == "Certificate"), "cert-manager's by default");
    // `generate` makes a new CA at every rendering, as values.yaml and docs/kubernetes.md say.
    let (first, second) = twice(&["--set", "injector.certificate.source=generate"]);
    assert!(first != second);
}

#[test]
fn the_generated_webhook_ca_is_the_webhook_configurations_ca_bundle() {
    if !tools_ready("the chart test") {
        return;
    }
    let objects = documents(
        &render(&chart(), &["--set", "injector.enabled=true", "--set", "injector.certificate.source=generate"])
            .unwrap(),
    );
    let secret = find(&objects, "Secret", "sluice-injector-tls");
    let configuration = find(&objects, "MutatingWebhookConfiguration", "sluice-injector");
    assert_eq!(configuration["webhooks"][0]["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    assert_eq!(configuration["webhooks"][1]["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    validate(&objects.iter().map(|o| serde_json::to_string(o).unwrap()).collect::<Vec<_>>().join("\n---\n"))
        .expect("valid");
}

#[test]
fn the_rate_limit_service_runs_the_sidecar_on_the_files_the_root_tier_loads_too() {
    if !tools_ready("the rate limit service chart test") {
        return;
    }
    // Off by default: no object of its own, and the tiers' ConfigMaps hold their server.yaml only.
    let defaults = documents(&render(&chart(), &[]).unwrap());
    let own = |objects: &[Value]| {
        objects
            .iter()
            .filter(|o| o["metadata"]["labels"]["app.kubernetes.io/component"] == "rate-limit-service")
            .count()
    };
    assert_eq!(own(&defaults), 0);
    let data = find(&defaults, "ConfigMap", "sluice-root")["data"].as_object().unwrap().clone();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["server.yaml"]);

    let values = ci_values().into_iter().find(|f| f.ends_with("rls-values.yaml")).expect("ci/rls-values.yaml");
    let objects = documents(&render(&chart(), &["--values", &values]).unwrap());
    assert_eq!(own(&objects), 4, "ConfigMap, Service, Deployment, PodDisruptionBudget");
    let service = &find(&objects, "Service", "sluice-rls")["spec"]["ports"][0];
    assert_eq!((service["port"].as_u64(), service["appProtocol"].as_str()), (Some(8081), Some("grpc")));
    let deployment = find(&objects, "Deployment", "sluice-rls");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let template = pod_template(deployment);
    assert_eq!(template["metadata"]["labels"]["sluice.io/sidecar"], "rate-limit-service");
    let container = container(template, "rate-limit-service");
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(
        args,
        [
            "--config=/etc/sluice/sidecar.yaml",
            "--admin-addr=$(POD_IP):9901",
            "--debug-addr=127.0.0.1:9902",
            "--server-addresses=sluice-root.sluice.svc:7777"
        ]
    );
    let selector = &find(&objects, "PodMonitor", "sluice-sidecars")["spec"]["selector"]["matchExpressions"][0];
    assert!(selector["values"].as_array().unwrap().contains(&"rate-limit-service".into()));

    // What the pods read is a configuration the sidecar takes, with the file beside it; the root
    // tier has the same file beside its server.yaml.
    let config = find(&objects, "ConfigMap", "sluice-rls")["data"].as_object().unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in &config {
        fs::write(dir.path().join(name), text.as_str().unwrap()).unwrap();
    }
    let sidecar_yaml = config["sidecar.yaml"].as_str().unwrap();
    let servers = ServerFlags { addresses: vec!["sluice-root.sluice.svc:7777".into()], ..ServerFlags::default() };
    let parsed = sluice_sidecar::config::parse_with(sidecar_yaml, &servers, dir.path())
        .unwrap_or_else(|e| panic!("{e}:\n{sidecar_yaml}"));
    let service = parsed.rate_limit_service.expect("the rate limit service");
    assert_eq!(service.address.port(), 8081);
    assert!(parsed.listeners.is_empty());
    assert!(parsed.resources.iter().any(|r| r.id == "edge/generic_key=demo"), "the file's limits are resources");
    let root = find(&objects, "ConfigMap", "sluice-root")["data"].as_object().unwrap().clone();
    assert_eq!(root["ratelimit.yaml"], config["ratelimit.yaml"]);
    assert!(root["server.yaml"].as_str().unwrap().contains("files: [ratelimit.yaml]"));
    // And the server takes that configuration with the file beside it: it comes up ready.
    let server_dir = tempfile::tempdir().unwrap();
    for (name, text) in &root {
        fs::write(server_dir.path().join(name), text.as_str().unwrap()).unwrap();
    }
    let (grpc, admin) = (free_port(), free_port());
    let mut server = Command::new(binary("sluice-server"))
        .arg("--config")
        .arg(server_dir.path().join("server.yaml"))
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}"), "--admin-addr", &format!("127.0.0.1:{admin}")])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ready = eventually_blocking("the server on the root tier's configuration", || {
        server.try_wait().unwrap().is_some()
            || matches!(http_get(([127, 0, 0, 1], admin).into(), "/readyz"), Ok((200, _)))
    });
    let exited = server.try_wait().unwrap();
    let _ = server.kill();
    let out = server.wait_with_output().unwrap();
    assert!(
        exited.is_none(),
        "the server refused the root tier's configuration: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("the server took the root tier's configuration, ready in {ready:?}");
}

/// Runs here what the chart's pre-install and pre-upgrade hook runs: the hook ConfigMap's files
/// in a folder, and each container of the hook Job as its command and args say, with its mount
/// path moved to that folder and the image's binary this build's. Each container's name, exit
/// code and standard error.
fn config_check(objects: &[Value]) -> Vec<(String, Option<i32>, String)> {
    let config_map = find(objects, "ConfigMap", "sluice-config-check");
    let job = find(objects, "Job", "sluice-config-check");
    let annotation = |o: &Value, key: &str| o["metadata"]["annotations"][key].as_str().unwrap().to_owned();
    for hook in [config_map, job] {
        assert_eq!(annotation(hook, "helm.sh/hook"), "pre-install,pre-upgrade");
        assert_eq!(annotation(hook, "helm.sh/hook-delete-policy"), "before-hook-creation,hook-succeeded");
    }
    let weight = |o: &Value| annotation(o, "helm.sh/hook-weight").parse::<i32>().unwrap();
    assert!(weight(config_map) < weight(job), "the ConfigMap is made before the Job that mounts it");
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in config_map["data"].as_object().unwrap() {
        fs::write(dir.path().join(name), text.as_str().unwrap()).unwrap();
    }
    let spec = &pod_template(job)["spec"];
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert!(spec.get("serviceAccountName").is_none(), "the chart's ServiceAccount does not exist before an install");
    assert_eq!(spec["volumes"].as_array().unwrap().len(), 1);
    assert_eq!(spec["volumes"][0]["configMap"]["name"], "sluice-config-check");
    let folder = dir.path().to_str().unwrap();
    spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|container| {
            assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
            let mount = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
            let launch = Launch::of(container, &HashMap::new());
            let program = binary(Path::new(&launch.command[0]).file_name().unwrap().to_str().unwrap());
            let out = Command::new(program)
                .args(launch.command[1..].iter().map(|arg| arg.replace(mount, folder)))
                .output()
                .expect("the check runs");
            let name = container["name"].as_str().unwrap().to_owned();
            (name, out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
        })
        .collect()
}

#[test]
fn the_install_hook_checks_every_tiers_configuration_as_the_server_does() {
    if !tools_ready("the configuration check hook test") {
        return;
    }
    // The defaults, and a root tier that names a rate limit file beside its configuration.
    let rls = ci_values().into_iter().find(|f| f.ends_with("rls-values.yaml")).unwrap();
    for args in [&[][..], &["--values", &rls][..]] {
        let checks = config_check(&documents(&render(&chart(), args).unwrap()));
        assert_eq!(checks.len(), 1, "{args:?}: one tier, one container");
        for (tier, code, stderr) in checks {
            assert_eq!(code, Some(0), "{args:?}: tier {tier}: {stderr}");
        }
    }
    // A leaf tier with a capacity the server refuses: its container says so, the root's passes.
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    let tier = |capacity: i32| {
        format!(
            "resources:\n  - identifier_glob: \"*\"\n    capacity: {capacity}\n    \
             algorithm: {{kind: FAIR_SHARE, lease_length: 60, refresh_interval: 15}}\n"
        )
    };
    let chart_values = serde_json::json!({"tiers": [
        {"name": "root", "config": tier(100)},
        {"name": "leaf", "parent": "root", "config": tier(-5)},
    ]});
    fs::write(&values, yaml_serde::to_string(&chart_values).unwrap()).unwrap();
    let checks = config_check(&documents(&render(&chart(), &["--values", values.to_str().unwrap()]).unwrap()));
    let names: Vec<&str> = checks.iter().map(|(tier, ..)| tier.as_str()).collect();
    assert_eq!(names, ["root", "leaf"]);
    assert_eq!(checks[0].1, Some(0), "root: {}", checks[0].2);
    let (_, code, stderr) = &checks[1];
    assert_eq!(*code, Some(64), "{stderr}");
    assert!(stderr.contains("leaf.server.yaml: resources[0] (\"*\"): capacity:"), "{stderr}");
    assert!(stderr.contains("got -5"), "{stderr}");
}

/// `helm template` with `values` must fail, saying `expected`. The values are written by hand:
/// they are what the chart's checks refuse, and their tiers' `config: 'resources: []'` is a
/// placeholder the chart passes on unread, never a server's configuration in use.
fn refused(values: &str, expected: &str) {
    if !tools_ready("the values schema test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad-values.yaml");
    fs::write(&file, values).unwrap();
    let error = render(&chart(), &["--values", file.to_str().unwrap()]).expect_err("bad values must be refused");
    assert!(error.contains(expected), "{expected:?} not in:\n{error}");
}

#[test]
fn a_misspelt_value_is_refused() {
    refused("injectr:\n  enabled: true\n", "additional properties 'injectr' not allowed");
}

#[test]
fn a_rate_limit_service_with_an_unknown_fallback_or_a_path_for_a_file_name_is_refused() {
    refused("rateLimitService:\n  enabled: true\n  whenUnreachable: never\n", "at '/rateLimitService/whenUnreachable'");
    // A file's name is a ConfigMap key and a name beside the configuration, never a path.
    refused("rateLimitService:\n  files:\n    ../limits.yaml: 'domain: x'\n", "invalid propertyName '../limits.yaml'");
}

#[test]
fn a_tier_without_a_name_or_configuration_is_refused() {
    refused("tiers:\n  - replicas: 1\n", "missing property 'name'");
    refused("tiers:\n  - {name: root}\n", "tiers[0] (root): set config or configKey, one of them");
    refused(
        "etcd: {trial: {enabled: true}}\ntiers:\n  - {name: root, config: 'resources: []', configKey: /sluice/c}\n",
        "tiers[0] (root): set config or configKey, one of them",
    );
}

#[test]
fn a_configuration_key_without_etcd_is_refused() {
    refused(
        "tiers:\n  - {name: root, configKey: /sluice/config}\n",
        "tiers[0] (root): configKey reads etcd: set etcd.endpoints or etcd.trial.enabled",
    );
}

#[test]
fn etcd_tls_without_https_endpoints_is_refused() {
    refused(
        "etcd:\n  endpoints: [\"http://etcd:2379\"]\n  tls: {secretName: etcd-client}\n",
        "etcd.tls.secretName: TLS toward etcd needs https:// etcd.endpoints",
    );
    refused(
        "etcd:\n  trial: {enabled: true}\n  auth: {secretName: etcd-user}\n",
        "etcd.tls and etcd.auth are for etcd.endpoints, not the trial etcd",
    );
}

/// etcd over TLS with a client certificate and a user, and a root tier whose configuration is an
/// etcd key: the flags, the Secret's volume and the user's environment variable are on every
/// server, the password nowhere in the objects, and only the leaf's configuration is checked at
/// install.
#[test]
fn etcd_tls_auth_and_a_configuration_key_render_and_validate() {
    if !tools_ready("the chart test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    let chart_values = serde_json::json!({
        "etcd": {
            "endpoints": ["https://etcd-0.etcd:2379", "https://etcd-1.etcd:2379"],
            "tls": {"secretName": "sluice-etcd-client"},
            "auth": {"secretName": "sluice-etcd-user", "key": "credentials"},
        },
        "tiers": [
            {"name": "root", "replicas": 3, "configKey": "/sluice/config/root"},
            {"name": "leaf", "replicas": 2, "parent": "root", "config": "resources: []\n"},
        ],
    });
    fs::write(&values, yaml_serde::to_string(&chart_values).unwrap()).unwrap();
    let values = values.to_str().unwrap();
    let lint = helm(&["lint", "--strict", chart().to_str().unwrap(), "--values", values]);
    assert!(lint.as_ref().is_ok_and(|out| out.contains("0 chart(s) failed")), "{lint:?}");
    let yaml = render(&chart(), &["--values", values]).unwrap();
    println!("{}", validate(&yaml).unwrap());
    let objects = documents(&yaml);
    for tier in ["root", "leaf"] {
        let set = find(&objects, "StatefulSet", &format!("sluice-{tier}"));
        let server = container(pod_template(set), "server");
        let args: Vec<&str> = server["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        for expected in [
            "--etcd-endpoints=https://etcd-0.etcd:2379,https://etcd-1.etcd:2379",
            "--etcd-cacert=/etc/sluice/etcd-tls/ca.crt",
            "--etcd-cert=/etc/sluice/etcd-tls/tls.crt",
            "--etcd-key=/etc/sluice/etcd-tls/tls.key",
        ] {
            assert!(args.contains(&expected), "{tier}: {expected} in {args:?}");
        }
        let user = server["env"].as_array().unwrap().iter().find(|e| e["name"] == "SLUICE_ETCD_USER").unwrap();
        assert_eq!(
            user["valueFrom"]["secretKeyRef"],
            serde_json::json!({"name": "sluice-etcd-user", "key": "credentials"})
        );
        let mount = server["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "etcd-tls").unwrap();
        assert_eq!(mount["mountPath"], "/etc/sluice/etcd-tls");
        let volumes = pod_template(set)["spec"]["volumes"].as_array().unwrap();
        let volume = volumes.iter().find(|v| v["name"] == "etcd-tls").unwrap();
        assert_eq!(volume["secret"]["secretName"], "sluice-etcd-client");
        let config = if tier == "root" {
            "--config=etcd:/sluice/config/root"
        } else {
            "--config=/etc/sluice/config/server.yaml"
        };
        assert!(args.contains(&config), "{tier}: {config} in {args:?}");
    }
    let root = container(pod_template(find(&objects, "StatefulSet", "sluice-root")), "server");
    assert_eq!(root["workingDir"], "/etc/sluice/config", "the key's rate limit files are found in the ConfigMap");
    assert!(find(&objects, "ConfigMap", "sluice-root")["data"].get("server.yaml").is_none());
    let check = find(&objects, "Job", "sluice-config-check");
    let checked: Vec<&str> = pod_template(check)["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(checked, ["leaf"], "the key's value is checked by the servers as they apply it");
    // A configuration only in etcd: nothing to check at install.
    let only_keys = serde_json::json!({
        "etcd": {"trial": {"enabled": true}},
        "tiers": [{"name": "root", "configKey": "/sluice/config/root"}],
    });
    let file = dir.path().join("only-keys.yaml");
    fs::write(&file, yaml_serde::to_string(&only_keys).unwrap()).unwrap();
    let yaml = render(&chart(), &["--values", file.to_str().unwrap()]).unwrap();
    validate(&yaml).unwrap();
    assert!(!kinds(&documents(&yaml)).contains(&"Job".to_owned()));
}

#[test]
fn zero_replicas_are_refused() {
    refused(
        "tiers:\n  - {name: root, replicas: 0, config: 'resources: []'}\n",
        "at '/tiers/0/replicas': minimum: got 0, want 1",
    );
}

#[test]
fn an_unknown_certificate_source_is_refused() {
    refused("injector:\n  certificate:\n    source: selfsigned\n", "at '/injector/certificate/source'");
}

#[test]
fn a_bad_sidecar_memory_quantity_is_refused() {
    refused(
        "sidecar:\n  resources:\n    requests: {cpu: 50m, memory: 32MB}\n    limits: {memory: 128Mi}\n",
        "at '/sidecar/resources/requests/memory'",
    );
}

#[test]
fn an_etcd_endpoint_that_is_not_http_or_https_is_refused() {
    refused("etcd:\n  endpoints: [\"ftp://etcd:2379\"]\n", "at '/etcd/endpoints/0'");
}

#[test]
fn a_rate_limit_file_named_as_a_tiers_checked_configuration_is_refused() {
    refused(
        "rateLimitService:\n  enabled: true\n  files:\n    root.server.yaml: 'domain: x'\n",
        "rateLimitService.files: \"root.server.yaml\" is the configuration check's name for tier root's configuration",
    );
}

#[test]
fn a_parent_that_is_not_an_earlier_tier_is_refused() {
    refused(
        "tiers:\n  - {name: root, config: 'resources: []'}\n  - {name: leaf, parent: region, config: 'resources: []'}\n",
        "tiers[1] (leaf): parent \"region\" must name a tier listed before it",
    );
}

#[test]
fn replicas_without_etcd_are_refused() {
    refused(
        "tiers:\n  - {name: root, replicas: 2, config: 'resources: []'}\n",
        "tiers[0] (root): 2 replicas elect their master through etcd: set etcd.endpoints or etcd.trial.enabled",
    );
}

#[test]
fn a_grpc_probe_on_a_tls_tier_is_refused() {
    refused(
        "server:\n  readinessProbe: grpc\ntiers:\n  - {name: root, tls: {secretName: s}, config: 'resources: []'}\n",
        "server.readinessProbe grpc needs plaintext gRPC",
    );
}

#[test]
fn the_rules_and_the_dashboard_are_deploys_files_not_copies() {
    if !tools_ready("the chart test") {
        return;
    }
    // The chart links to them: one file each in the repository.
    for (link, target) in
        [("sluice-rules.yaml", "deploy/prometheus/sluice-rules.yaml"), ("sluice.json", "deploy/grafana/sluice.json")]
    {
        let link = chart().join("files").join(link);
        assert!(fs::symlink_metadata(&link).unwrap().is_symlink(), "{} is a link", link.display());
        assert_eq!(fs::canonicalize(&link).unwrap(), fs::canonicalize(repo().join(target)).unwrap());
    }
    let objects = documents(
        &render(
            &chart(),
            &["--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.dashboard.enabled=true"],
        )
        .unwrap(),
    );
    let rules = &find(&objects, "PrometheusRule", "sluice")["spec"];
    let deployed = &documents(&fs::read_to_string(repo().join("deploy/prometheus/sluice-rules.yaml")).unwrap())[0];
    assert_eq!(rules, deployed);
    let dashboard = find(&objects, "ConfigMap", "sluice-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json = |text: &str| serde_json::from_str::<Value>(text).unwrap();
    let deployed = fs::read_to_string(repo().join("deploy/grafana/sluice.json")).unwrap();
    assert_eq!(json(dashboard["data"]["sluice.json"].as_str().unwrap()), json(&deployed));

    // A packaged chart holds their content, not a dangling link.
    let dir = tempfile::tempdir().unwrap();
    helm(&["package", chart().to_str().unwrap(), "--destination", dir.path().to_str().unwrap()]).expect("helm package");
    let package = dir.path().join(format!("sluice-{}.tgz", env!("CARGO_PKG_VERSION")));
    let out = Command::new("tar").arg("-xzOf").arg(&package).arg("sluice/files/sluice-rules.yaml").output().unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        fs::read_to_string(repo().join("deploy/prometheus/sluice-rules.yaml")).unwrap()
    );
}

#[test]
fn deploy_k8s_is_what_render_sh_makes() {
    if !tools_ready("the manifests test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(repo().join("deploy/k8s/render.sh"))
        .arg(dir.path())
        .env("SIDECAR", binary("sluice-sidecar"))
        .output()
        .expect("render.sh runs");
    assert!(out.status.success(), "render.sh: {}", String::from_utf8_lossy(&out.stderr));
    for file in ["sluice.yaml", "injector.yaml", "example-app.yaml"] {
        let fresh = fs::read_to_string(dir.path().join(file)).unwrap();
        let kept = fs::read_to_string(repo().join("deploy/k8s").join(file)).unwrap();
        assert!(fresh == kept, "deploy/k8s/{file} is out of date: run deploy/k8s/render.sh");
        validate(&kept).unwrap_or_else(|e| panic!("deploy/k8s/{file}: {e}"));
    }
    // The chart's version is the binaries'; its default image is what inject adds.
    let chart_yaml = documents(&fs::read_to_string(chart().join("Chart.yaml")).unwrap()).remove(0);
    assert_eq!(chart_yaml["appVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(chart_yaml["version"], env!("CARGO_PKG_VERSION"));
}

/// `sluice-sidecar inject` with `args` on `input`.
fn inject(input: &str, args: &[&str]) -> String {
    let out = run_with_input(Command::new(binary("sluice-sidecar")).arg("inject").args(args).arg("-"), input);
    assert!(out.status.success(), "inject: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn inject_output_validates_strictly_for_every_kind() {
    if !tools_ready("the inject validation test") {
        return;
    }
    let workloads = fs::read_to_string(repo().join("sidecar/src/kube/inject/testdata/workloads.yaml")).unwrap();
    for native in ["--native=true", "--native=false"] {
        let args = ["--config-map", "app-sidecar", "--server", "sluice-leaf.sluice.svc:7777", native];
        let once = inject(&workloads, &args);
        let summary = validate(&once).unwrap_or_else(|e| panic!("inject {args:?}: {e}"));
        for kind in ["Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"] {
            assert!(summary.contains(&format!(" {kind}\n")), "{kind} validated: {summary}");
        }
        assert_eq!(inject(&once, &args), once, "injecting twice is injecting once");
    }
}

#[test]
fn the_named_template_is_the_container_inject_adds() {
    if !tools_ready("the named template test") {
        return;
    }
    // A chart of one's own would include it; here a copy of the chart renders a pod with it.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("sluice");
    let status = Command::new("cp").arg("-rL").arg(chart()).arg(&copy).status().unwrap();
    assert!(status.success());
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: app\nspec:\n";
    let app = "    - name: app\n      image: example.com/app:1\n";
    let sidecar = "    {{- include \"sluice.sidecar\" (dict \"root\" $) | nindent 4 }}\n";
    let volume = "  volumes:\n    {{- include \"sluice.sidecarVolume\" (dict \"configMap\" \"app-sidecar\" \"root\" $) \
                  | nindent 4 }}\n";
    // With identities, the certificate's volume and flags, as the chart's injector is told.
    let identity = ["--identity-issuer=sluice-sluice-identity", "--identity-issuer-kind=ClusterIssuer"];
    // `native: auto` by the cluster's version as `helm install` reports it: native from 1.29.
    for (kube_version, native, template, with_identity) in [
        ("1.30.0", "--native=true", format!("{pod}  containers:\n{app}  initContainers:\n{sidecar}{volume}"), false),
        ("1.28.0", "--native=false", format!("{pod}  containers:\n{sidecar}{app}{volume}"), false),
        ("1.30.0", "--native=true", format!("{pod}  containers:\n{app}  initContainers:\n{sidecar}{volume}"), true),
    ] {
        fs::write(copy.join("templates/app.yaml"), template).unwrap();
        let set = [
            "--set",
            if with_identity { "identity.enabled=true" } else { "identity.enabled=false" },
            "--set",
            "sidecar.resources.limits.cpu=500m",
            "--kube-version",
            kube_version,
            "--show-only",
            "templates/app.yaml",
        ];
        let rendered = documents(&render(&copy, &set).unwrap()).remove(0);
        let plain = format!("{pod}  containers:\n{app}");
        let flags =
            ["--config-map", "app-sidecar", "--server", "sluice-root.sluice.svc:7777", "--cpu-limit", "500m", native];
        let flags = [&flags[..], if with_identity { &identity[..] } else { &[] }].concat();
        let injected = documents(&inject(&plain, &flags)).remove(0);
        assert_eq!(rendered["spec"], injected["spec"], "Kubernetes {kube_version}, identity {with_identity}");
        let list = if native == "--native=true" { "initContainers" } else { "containers" };
        let args = rendered["spec"][list][0]["args"].as_array().unwrap();
        assert!(args.windows(2).any(|w| w == ["--log-format", "json"]), "the sidecar logs JSON: {args:?}");
        validate(&serde_json::to_string(&rendered).unwrap()).expect("valid");
    }
    // And the webhook the chart runs is given the same settings.
    let objects = documents(
        &render(&chart(), &["--set", "injector.enabled=true", "--set", "sidecar.resources.limits.cpu=500m"]).unwrap(),
    );
    let injector = container(pod_template(find(&objects, "Deployment", "sluice-injector")), "injector");
    let args: Vec<&str> = injector["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    for expected in [
        "--server=sluice-root.sluice.svc:7777",
        "--cpu-limit=500m",
        "--config-map=sluice-sidecar",
        concat!("--image=sluice:", env!("CARGO_PKG_VERSION")),
        "--native=auto",
    ] {
        assert!(args.contains(&expected), "{expected} in {args:?}");
    }
    // Which the webhook resolves by the API server's version, asked with the token's CA.
    assert_eq!(
        pod_template(find(&objects, "Deployment", "sluice-injector"))["spec"]["automountServiceAccountToken"],
        true
    );
}

/// A root tier of two replicas with a policy of its own and a leaf under it, with identities, the
/// webhook and the rate limit service.
fn identity_values(dir: &Path) -> String {
    let tier = |capacity: i32| {
        format!(
            "resources:\n  - identifier_glob: \"*\"\n    capacity: {capacity}\n    \
             algorithm: {{kind: FAIR_SHARE, lease_length: 60, refresh_interval: 15}}\n"
        )
    };
    let values = serde_json::json!({
        "identity": {"enabled": true},
        "etcd": {"trial": {"enabled": true}},
        "injector": {"enabled": true},
        "rateLimitService": {"enabled": true},
        "tiers": [
            {"name": "root", "replicas": 2, "config": tier(100),
             "policies": [{"identity": "spiffe://cluster.local/ns/ops/sa/admin", "client_ids": ["*"]}]},
            {"name": "leaf", "parent": "root", "config": tier(0)},
        ],
    });
    let file = dir.join("identity-values.yaml");
    fs::write(&file, yaml_serde::to_string(&values).unwrap()).unwrap();
    file.to_str().unwrap().to_owned()
}

fn strings(value: &Value) -> Vec<&str> {
    value.as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect()
}

/// A tier's configuration as its servers read it, parsed.
fn tier_config(objects: &[Value], tier: &str) -> (String, Value) {
    let text =
        find(objects, "ConfigMap", &format!("sluice-{tier}"))["data"]["server.yaml"].as_str().unwrap().to_owned();
    let parsed = yaml_serde::from_str(&text).unwrap();
    (text, parsed)
}

#[test]
fn identities_give_every_tier_mtls_a_certificate_naming_it_and_policies_the_server_takes() {
    if !tools_ready("the identity chart test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let values = identity_values(dir.path());
    let lint = helm(&["lint", "--strict", chart().to_str().unwrap(), "--values", &values]);
    assert!(lint.as_ref().is_ok_and(|out| out.contains("0 chart(s) failed")), "{lint:?}");
    let yaml = render(&chart(), &["--values", &values]).unwrap();
    assert!(yaml == render(&chart(), &["--values", &values]).unwrap(), "two renderings differ");
    println!("{}", validate(&yaml).unwrap());
    let objects = documents(&yaml);

    // The CA: a self-signed root and a CA Certificate where cert-manager reads a ClusterIssuer's
    // Secret, and the ClusterIssuer every identity comes from.
    let ca = find(&objects, "Certificate", "sluice-sluice-identity");
    assert_eq!(
        (ca["metadata"]["namespace"].as_str(), ca["spec"]["isCA"].as_bool()),
        (Some("cert-manager"), Some(true))
    );
    assert_eq!(find(&objects, "Issuer", "sluice-sluice-identity-root")["spec"]["selfSigned"], serde_json::json!({}));
    let issuer = find(&objects, "ClusterIssuer", "sluice-sluice-identity");
    assert_eq!(issuer["spec"]["ca"]["secretName"], ca["spec"]["secretName"]);

    for (tier, parent) in [("root", None), ("leaf", Some("root"))] {
        let name = format!("sluice-{tier}");
        let certificate = &find(&objects, "Certificate", &format!("{name}-identity"))["spec"];
        assert_eq!(strings(&certificate["uris"]), [format!("spiffe://cluster.local/ns/sluice/tier/{tier}")]);
        let names = strings(&certificate["dnsNames"]);
        // The Service clients dial, and each replica's name as a master advertises it.
        assert!(names.contains(&format!("{name}.sluice.svc").as_str()), "{names:?}");
        assert!(names.contains(&format!("*.{name}-peers.sluice.svc").as_str()), "{names:?}");
        assert!(strings(&certificate["usages"]).contains(&"client auth"));
        assert!(strings(&certificate["usages"]).contains(&"server auth"));
        assert_eq!(
            certificate["issuerRef"],
            serde_json::json!({"name": "sluice-sluice-identity", "kind": "ClusterIssuer"})
        );
        let set = find(&objects, "StatefulSet", &name);
        let args =
            strings(&container(pod_template(set), "server")["args"]).into_iter().map(str::to_owned).collect::<Vec<_>>();
        let mut expected = vec!["--tls-cert=/etc/sluice/tls/tls.crt", "--tls-client-ca=/etc/sluice/tls/ca.crt"];
        if parent.is_some() {
            expected.extend(["--parent-tls-ca=/etc/sluice/tls/ca.crt", "--parent-tls-cert=/etc/sluice/tls/tls.crt"]);
        }
        for flag in expected {
            assert!(args.iter().any(|a| a == flag), "{tier}: {flag} in {args:?}");
        }
        let volumes = pod_template(set)["spec"]["volumes"].as_array().unwrap();
        let tls = volumes.iter().find(|v| v["name"] == "tls").unwrap();
        assert_eq!(tls["secret"]["secretName"], certificate["secretName"]);
    }

    // The policies: the tier's own first, then the pods', then each child tier's.
    let pods = serde_json::json!({
        "identity": "spiffe://cluster.local/ns/*/pod/*", "client_ids": ["{2}:*"], "resources": ["*"], "max_client_ids": 8,
    });
    let (_, root) = tier_config(&objects, "root");
    let root: Value = serde_json::to_value(root).unwrap();
    assert_eq!(
        root["policies"],
        serde_json::json!([
            {"identity": "spiffe://cluster.local/ns/ops/sa/admin", "client_ids": ["*"]},
            pods,
            {"identity": "spiffe://cluster.local/ns/sluice/tier/leaf", "client_ids": ["*"], "server_capacity": true},
        ])
    );
    let (_, leaf) = tier_config(&objects, "leaf");
    assert_eq!(serde_json::to_value(leaf).unwrap()["policies"], serde_json::json!([pods]));
    // The install hook checks what the servers read, and the server takes it.
    let config_map = find(&objects, "ConfigMap", "sluice-config-check");
    assert_eq!(config_map["data"]["root.server.yaml"].as_str(), Some(tier_config(&objects, "root").0.as_str()));
    for (tier, code, stderr) in config_check(&objects) {
        assert_eq!(code, Some(0), "tier {tier}: {stderr}");
    }

    // The webhook injects the identity; the rate limit service's pods carry it too.
    let injector = container(pod_template(find(&objects, "Deployment", "sluice-injector")), "injector");
    for flag in [
        "--identity-issuer=sluice-sluice-identity",
        "--identity-issuer-kind=ClusterIssuer",
        "--identity-trust-domain=cluster.local",
    ] {
        assert!(strings(&injector["args"]).contains(&flag), "{flag}");
    }
    let rls = pod_template(find(&objects, "Deployment", "sluice-rls"));
    let volume = rls["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "sluice-identity").unwrap();
    assert_eq!(volume["csi"]["volumeAttributes"]["csi.cert-manager.io/issuer-name"], "sluice-sluice-identity");
    let rls_args = strings(&container(rls, "rate-limit-service")["args"]);
    assert!(rls_args.contains(&"--server-tls-cert=/var/run/secrets/sluice.io/identity/tls.crt"), "{rls_args:?}");
    // `helm test` asks with a certificate and client id of its own pod's.
    let test = find(&objects, "Pod", "sluice-test-capacity");
    assert!(test["spec"]["volumes"][0]["csi"].is_object());
    assert!(
        test["spec"]["containers"][0]["args"][0]
            .as_str()
            .unwrap()
            .contains("\"client_id\": \"sluice-test-capacity:0\"")
    );
}

#[test]
fn a_tiers_own_policies_need_identities_and_go_in_policies_with_them() {
    refused(
        "tiers:\n  - {name: root, config: 'resources: []', policies: [{identity: x}]}\n",
        "tiers[0] (root): policies are written with the chart's own, which need identity.enabled",
    );
    refused(
        "identity: {enabled: true}\ntiers:\n  - {name: root, config: 'policies: []'}\n",
        "tiers[0] (root): with identity.enabled the chart writes the policies: put this tier's own in tiers[0].policies",
    );
    refused("identity: {enabled: true, podClientIds: 0}\n", "at '/identity/podClientIds'");
    refused("identity: {enabled: true, issuerRef: {name: Bad_Name}}\n", "at '/identity/issuerRef/name'");
}

/// The pod's identity as cert-manager's CSI driver completes the injected volume's URI SAN, and
/// the sidecar's default client id `<pod>:<port>`, are what the rendered pod policy admits: a real
/// server on the root tier's rendered configuration, with mTLS, takes a GetCapacity of the pod's
/// own client id and refuses another pod's; the leaf tier's certificate may call
/// GetServerCapacity; and a real sidecar given the injected `--server-tls-*` flags leases with it.
#[tokio::test]
async fn the_pod_identity_the_injected_volume_asks_for_is_admitted_by_the_rendered_policy() {
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};
    use sluice_proto::{
        GetCapacityRequest, GetServerCapacityRequest, PriorityBandAggregate, ResourceRequest,
        ServerCapacityResourceRequest, capacity_client::CapacityClient,
    };
    use sluice_tests::{
        config::{Fallback, Kind, Listener, Match, PathMatch, Resource, Rule, SidecarConfig, Upstream},
        harness::{Server, Sidecar},
        upstream::UpstreamProcess,
        wait::lazily,
    };
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

    if !tools_ready("the identity policy test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let values = identity_values(dir.path());
    let objects = documents(&render(&chart(), &["--values", &values]).unwrap());
    let (root_config, _) = tier_config(&objects, "root");
    // What the webhook injects into a pod of namespace shop, with the chart's flags.
    let injector = container(pod_template(find(&objects, "Deployment", "sluice-injector")), "injector");
    let flags: Vec<&str> = strings(&injector["args"]).into_iter().filter(|a| a.starts_with("--identity-")).collect();
    let pod = "kind: Pod\nmetadata: {name: orders-5d8f7c-x2x9z}\nspec: {containers: [{name: app, image: app}]}\n";
    let injected = documents(&inject(pod, &[&["--config-map", "orders-sidecar"][..], &flags].concat())).remove(0);
    let volume =
        injected["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "sluice-identity").unwrap();
    let uri = volume["csi"]["volumeAttributes"]["csi.cert-manager.io/uri-sans"].as_str().unwrap();
    let spiffe = |pod: &str| uri.replace("${POD_NAMESPACE}", "shop").replace("${POD_NAME}", pod);
    assert_eq!(spiffe("orders-5d8f7c-x2x9z"), "spiffe://cluster.local/ns/shop/pod/orders-5d8f7c-x2x9z");

    let ca = sluice_tests::pki::ca();
    let pem = |name: &str, text: &str| {
        let path = dir.path().join(name);
        fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (server_cert, server_key) = sluice_tests::pki::leaf(&ca, &["127.0.0.1"]);
    let with_uri = |uri: &str| {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        params.distinguished_name.push(DnType::CommonName, "client");
        let key = KeyPair::generate().unwrap();
        (params.signed_by(&key, &ca).unwrap().pem(), key.serialize_pem())
    };
    let server = Server::launch()
        .config_text(&root_config)
        .args(["--tls-cert", &pem("server.pem", &server_cert), "--tls-key", &pem("server.key", &server_key)])
        .args(["--tls-client-ca", &pem("ca.pem", &ca.pem())])
        .start();
    let client = |(cert, key): (String, String)| {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca.pem()))
            .domain_name("127.0.0.1")
            .identity(Identity::from_pem(cert, key));
        let endpoint = Channel::from_shared(format!("https://{}", server.grpc)).unwrap().tls_config(tls).unwrap();
        async move { CapacityClient::new(endpoint.connect().await.unwrap()) }
    };
    let ask = |client_id: &str| GetCapacityRequest {
        client_id: client_id.into(),
        resource: vec![ResourceRequest { resource_id: "orders".into(), priority: 0, has: None, wants: 5.0, signals: None }],
    };
    let mut pod = client(with_uri(&spiffe("orders-5d8f7c-x2x9z"))).await;
    let granted = pod.get_capacity(ask("orders-5d8f7c-x2x9z:8080")).await.expect("the pod's own client id");
    assert_eq!(granted.into_inner().response.len(), 1);
    let refused = pod.get_capacity(ask("orders-5d8f7c-abcde:8080")).await.expect_err("another pod's client id");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    // The leaf tier's identity, from its Certificate, may ask for its clients; a pod may not.
    let leaf = find(&objects, "Certificate", "sluice-leaf-identity");
    let mut leaf = client(with_uri(leaf["spec"]["uris"][0].as_str().unwrap())).await;
    let bulk = GetServerCapacityRequest {
        server_id: "sluice-leaf".into(),
        resource: vec![ServerCapacityResourceRequest {
            resource_id: "orders".into(),
            has: None,
            wants: vec![PriorityBandAggregate { priority: 0, num_clients: 2, wants: 10.0, profile: None }],
            signals: None,
        }],
    };
    assert!(leaf.get_server_capacity(bulk.clone()).await.is_ok());
    assert_eq!(pod.get_server_capacity(bulk).await.unwrap_err().code(), tonic::Code::PermissionDenied);

    // The sidecar as injected: the servers and the identity's files from its flags, its
    // configuration saying nothing of them, its client id the pod's name and its listener's port.
    let (cert, key) = with_uri(&spiffe("orders-5d8f7c-x2x9z"));
    let identity = dir.path().join("identity");
    fs::create_dir(&identity).unwrap();
    for (file, text) in [("ca.crt", ca.pem()), ("tls.crt", cert), ("tls.key", key)] {
        fs::write(identity.join(file), text).unwrap();
    }
    let sidecar_flags: Vec<String> = strings(&injected["spec"]["containers"][0]["args"])
        .windows(2)
        .filter(|w| w[0].starts_with("--server-tls-"))
        .flat_map(|w| [w[0].to_owned(), w[1].replace(IDENTITY_DIR, identity.to_str().unwrap())])
        .collect();
    assert_eq!(sidecar_flags.len(), 6, "{sidecar_flags:?}");
    let upstream = UpstreamProcess::start(None);
    let resource = Resource::new("orders").kind(Kind::Rate).capacity(1000.0).when_unreachable(Fallback::Optimistic);
    let config = SidecarConfig::proxy(Listener::app(), Upstream::app(upstream.addr()))
        .resource(resource)
        .rule(Rule::charging("orders").matching(Match::default().path(PathMatch::Prefix("/echo".into()))));
    let port = config.addresses()[0].port();
    let clients = || server.metric("sluice_server_clients{resource=\"orders\"}").unwrap_or(0.0);
    let before = clients();
    let sidecar = Sidecar::launch(&config)
        .args(["--server-addresses".to_owned(), server.grpc.to_string()])
        .args(sidecar_flags)
        .args(["--client-id".to_owned(), format!("orders-5d8f7c-x2x9z:{port}")])
        .start();
    eventually_blocking(lazily(|| format!("no lease; log:\n{}", sidecar.logs())), || {
        let _ = http_get(sidecar.listen(), "/echo");
        sidecar.metric("sluice_sidecar_mode{resource=\"orders\",mode=\"leased\"}") == Some(1.0)
    });
    assert_eq!(clients(), before + 1.0, "the sidecar holds a lease of its own");
}

/// Where the injected sidecar reads its certificate.
const IDENTITY_DIR: &str = "/var/run/secrets/sluice.io/identity";
