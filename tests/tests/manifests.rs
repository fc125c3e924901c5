//! What the manifests describe really runs: the chart's server containers (a root tier of two
//! replicas electing through a real etcd and reading their configuration from a key there, and a
//! leaf tier under it) and the sidecar of
//! deploy/k8s/example-app.yaml are started with exactly the command, args and environment the
//! objects give (the kubelet's `$(VAR)` expansion and downward API done here), with only their
//! addresses moved to free loopback ports; then every probe they declare is asked on the port it
//! names, and a request goes through the sidecar. Where a Docker engine runs, the containers run
//! from the image (deploy/image/build.sh) on the host's network with the securityContext's
//! read-only root and non-root user; elsewhere the binaries run directly. No cluster and no pod or
//! container network: everything is on 127.0.0.1.

use std::{
    collections::HashMap,
    ffi::OsString,
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use serde_json::Value;
use sluice_tests::{
    config::{Algorithm, ConfigFile, ServerConfig, Template},
    docker::{Engine, describe},
    etcd::Etcd,
    harness::{binary, can_run, free_port, http_get, missing_tools},
    kube::{Launch, chart, container, documents, find, pod_template, render, repo, tools_ready},
    upstream::UpstreamProcess,
    wait::{eventually_blocking, lazily},
};
use tempfile::TempDir;

const IMAGE: &str = "sluice-test:manifests";

fn loopback() -> SocketAddr {
    ([127, 0, 0, 1], free_port()).into()
}

/// Where the containers run: the image on a private Docker engine, or the binaries here.
enum Runner {
    Docker(Engine),
    Direct,
}

/// A started container or process; stopped when dropped (the engine removes its containers).
enum Running {
    Container(String),
    Process(Child, PathBuf),
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Running::Process(child, _) = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Runner {
    fn new() -> Runner {
        let client: OsString = std::env::var_os("DOCKER").unwrap_or_else(|| "docker".into());
        let mut missing = missing_tools(&["dockerd", &client.to_string_lossy(), "apt-get", "dpkg-deb", "strip"]);
        let root = fs::read_to_string("/proc/self/status")
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")));
        if !root {
            missing.push("root (dockerd runs as root)".into());
        }
        if std::env::var_os("CI").is_none() && !missing.is_empty() {
            eprintln!("NOTE: no Docker engine here ({}): the binaries run directly", missing.join(", "));
            return Runner::Direct;
        }
        if !can_run("running the manifests' containers from the image", &missing) {
            return Runner::Direct;
        }
        let engine = Engine::start(client);
        let bins = binary("sluice-server").parent().expect("binary directory").to_path_buf();
        let out = engine.program(repo().join("deploy/image/build.sh")).arg(&bins).env("IMAGE", IMAGE).output();
        let out = out.expect("build.sh runs");
        assert!(out.status.success(), "deploy/image/build.sh: {}", describe(&out));
        Runner::Docker(engine)
    }

    /// Starts what `launch` describes, with `volumes` (host directory, mount path) in place of
    /// the container's volume mounts.
    fn start(&self, name: &str, launch: &Launch, volumes: &[(&Path, &str)], security: &Value) -> Running {
        match self {
            Runner::Docker(engine) => {
                let mut args: Vec<String> =
                    ["run", "--detach", "--name", name, "--network", "host"].map(String::from).into();
                // The container's securityContext, as docker says it.
                if security["readOnlyRootFilesystem"] == true {
                    args.push("--read-only".into());
                }
                if security["capabilities"]["drop"][0] == "ALL" {
                    args.extend(["--cap-drop".into(), "ALL".into()]);
                }
                if security["allowPrivilegeEscalation"] == false {
                    args.extend(["--security-opt".into(), "no-new-privileges".into()]);
                }
                if let Some(user) = security["runAsUser"].as_u64() {
                    args.extend(["--user".into(), format!("{user}:{user}")]);
                }
                for (host, path) in volumes {
                    args.extend(["--volume".into(), format!("{}:{path}:ro", host.display())]);
                }
                for (key, value) in &launch.env {
                    args.extend(["--env".into(), format!("{key}={value}")]);
                }
                args.extend(["--entrypoint".into(), launch.command[0].clone(), IMAGE.into()]);
                args.extend(launch.command[1..].iter().cloned());
                engine.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
                Running::Container(name.to_owned())
            }
            Runner::Direct => {
                // The image's paths: its binaries are this build's, its mounts the directories.
                let program = binary(Path::new(&launch.command[0]).file_name().unwrap().to_str().unwrap());
                let args: Vec<String> = launch.command[1..]
                    .iter()
                    .map(|arg| {
                        volumes
                            .iter()
                            .fold(arg.clone(), |arg, (host, path)| arg.replace(path, &host.display().to_string()))
                    })
                    .collect();
                let log = std::env::temp_dir().join(format!("sluice-manifests-{name}-{}.log", std::process::id()));
                let child = Command::new(program)
                    .args(args)
                    .envs(launch.env.iter().map(|(k, v)| (k, v)))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(fs::File::create(&log).unwrap())
                    .spawn()
                    .expect("the binary starts");
                Running::Process(child, log)
            }
        }
    }

    fn logs(&self, running: &Running) -> String {
        match (self, running) {
            (Runner::Docker(engine), Running::Container(name)) => {
                describe(&engine.command().args(["logs", name]).output().expect("docker logs"))
            }
            (_, Running::Process(_, log)) => fs::read_to_string(log).unwrap_or_default(),
            _ => unreachable!(),
        }
    }

    /// Waits until every HTTP probe of `container` answers 200 on the port it names, found in
    /// `ports` (name → the loopback address it was moved to).
    fn probe(&self, running: &Running, container: &Value, ports: &HashMap<String, SocketAddr>) -> Vec<String> {
        let mut asked = Vec::new();
        for kind in ["startupProbe", "readinessProbe", "livenessProbe"] {
            let probe = &container[kind]["httpGet"];
            let Some(path) = probe["path"].as_str() else { continue };
            let port = probe["port"].as_str().expect("a named port");
            let addr = ports[port];
            let why = lazily(|| format!("{kind} {path} on {port} ({addr}) not 200; logs:\n{}", self.logs(running)));
            eventually_blocking(why, || matches!(http_get(addr, path), Ok((200, _))));
            asked.push(format!("{kind} {path} on {port}"));
        }
        asked
    }

    fn stop(self) {
        if let Runner::Docker(engine) = self {
            engine.stop();
        }
    }
}

/// The ConfigMap data key `key` written into a directory of its own, as the kubelet mounts it.
fn mounted(dir: &TempDir, name: &str, key: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    fs::create_dir_all(&path).unwrap();
    fs::write(path.join(key), text).unwrap();
    // Readable by the image's non-root user.
    Command::new("chmod").args(["-R", "a+rX"]).arg(dir.path()).status().unwrap();
    path
}

#[test]
fn the_servers_and_the_sidecar_the_manifests_describe_run_and_answer_their_probes() {
    if !tools_ready("the manifests run test") || !can_run("the manifests run test", &missing_tools(&["etcd"])) {
        return;
    }
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    // Each tier's server configuration, in the chart's values.
    let tier = |capacity: f64| {
        ServerConfig::new().template(Template::catch_all(capacity, Algorithm::fair_share(10, 2).learning(0))).yaml()
    };
    let key = "/sluice/manifests/root";
    tokio::runtime::Runtime::new().unwrap().block_on(etcd.put(key, &tier(100.0)));
    let chart_values = serde_json::json!({
        "etcd": {"endpoints": [etcd.endpoint()], "leaseTTL": 2},
        "tiers": [
            {"name": "root", "replicas": 2, "configKey": key},
            {"name": "leaf", "parent": "root", "config": tier(0.0)},
        ],
    });
    fs::write(&values, yaml_serde::to_string(&chart_values).unwrap()).unwrap();
    let objects = documents(&render(&chart(), &["--values", values.to_str().unwrap()]).expect("the chart renders"));
    let runner = Runner::new();
    let mut running = Vec::new();

    // The servers: each replica's pod name, its gRPC and admin ports moved to loopback.
    let mut grpc_of: HashMap<&str, Vec<SocketAddr>> = HashMap::new();
    for tier in ["root", "leaf"] {
        let set = find(&objects, "StatefulSet", &format!("sluice-{tier}"));
        let server = container(pod_template(set), "server");
        // The root's is in etcd.
        let config =
            find(&objects, "ConfigMap", &format!("sluice-{tier}"))["data"]["server.yaml"].as_str().unwrap_or_default();
        let config_dir = mounted(&dir, tier, "server.yaml", config);
        let mount = server["volumeMounts"][0]["mountPath"].as_str().unwrap().to_owned();
        let replicas: Vec<SocketAddr> = (0..set["spec"]["replicas"].as_u64().unwrap()).map(|_| loopback()).collect();
        for (i, grpc) in replicas.iter().enumerate() {
            let pod = format!("sluice-{tier}-{i}");
            let mut launch = Launch::of(server, &HashMap::from([("metadata.name", pod.as_str())]));
            assert_eq!(launch.command[0], "/usr/local/bin/sluice-server");
            assert!(
                launch
                    .flag("--advertise-address")
                    .unwrap()
                    .starts_with(&format!("{pod}.sluice-{tier}-peers.sluice.svc:"))
            );
            if tier == "root" {
                assert_eq!(launch.flag("--config"), Some(format!("etcd:{key}").as_str()));
            }
            let admin = loopback();
            // Each pod has a loopback of its own; here they share one.
            assert_eq!(launch.flag("--debug-addr"), Some("127.0.0.1:7779"), "the status pages on loopback");
            launch.set_flag("--debug-addr", &loopback().to_string());
            launch.set_flag("--grpc-addr", &grpc.to_string());
            launch.set_flag("--admin-addr", &admin.to_string());
            launch.set_flag("--advertise-address", &grpc.to_string());
            if let Some(parent) = launch.flag("--parent") {
                assert_eq!(parent, "sluice-root.sluice.svc:7777");
                let parents: Vec<String> = grpc_of["root"].iter().map(SocketAddr::to_string).collect::<Vec<_>>();
                launch.set_flag("--parent", &parents.join(","));
            }
            let process = runner.start(&pod, &launch, &[(&config_dir, &mount)], &server["securityContext"]);
            let ports = HashMap::from([("admin".to_owned(), admin), ("grpc".to_owned(), *grpc)]);
            let asked = runner.probe(&process, server, &ports);
            println!("{pod}: {}", asked.join(", "));
            assert_eq!(asked.len(), 3);
            let (_, metrics) = http_get(admin, "/metrics").unwrap();
            assert!(metrics.contains("sluice_server_"), "{pod} serves its metrics on admin");
            running.push(process);
        }
        grpc_of.insert(tier, replicas);
    }

    // The `helm test` pod's script asks the root tier for capacity (with this machine's grpcurl:
    // its image cannot be pulled here).
    if can_run("the helm test pod's script", &missing_tools(&["grpcurl", "sed", "grep"])) {
        let test = container(find(&objects, "Pod", "sluice-test-capacity"), "get-capacity");
        let mut launch = Launch::of(test, &HashMap::new());
        assert_eq!(launch.env[0], ("ROOT".to_owned(), "sluice-root.sluice.svc:7777".to_owned()));
        launch.env[0].1 = grpc_of["root"][1].to_string();
        let out = Command::new(&launch.command[0])
            .args(&launch.command[1..])
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("the script runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "the helm test script failed: {}", describe(&out));
        let master = stdout.lines().next().unwrap().strip_prefix("root tier's master: ").expect("a master");
        assert!(grpc_of["root"].iter().any(|a| a.to_string() == master), "{stdout}");
        assert!(stdout.contains("\"gets\""), "{stdout}");
    }

    // The example application's sidecar, leasing from the leaf tier.
    let example = documents(&fs::read_to_string(repo().join("deploy/k8s/example-app.yaml")).unwrap());
    let template = pod_template(find(&example, "Deployment", "orders-client"));
    let sidecar = container(template, "sluice-sidecar");
    let upstream = UpstreamProcess::start(None);
    let listen = loopback();
    let config = find(&example, "ConfigMap", "orders-client-sidecar")["data"]["sidecar.yaml"].as_str().unwrap();
    assert!(config.contains("address: 127.0.0.1:9000") && config.contains("url: http://orders.shop.svc:8080"));
    let config = config
        .replace("127.0.0.1:9000", &listen.to_string())
        .replace("http://orders.shop.svc:8080", &format!("http://{}", upstream.addr()));
    let config_dir = mounted(&dir, "sidecar", "sidecar.yaml", &config);
    let downward = HashMap::from([("metadata.name", "orders-client-7d9c5-x2x4z"), ("status.podIP", "127.0.0.1")]);
    let mut launch = Launch::of(sidecar, &downward);
    assert_eq!(launch.flag("--admin-addr"), Some("127.0.0.1:9901"), "on the pod IP");
    assert_eq!(launch.flag("--server-addresses"), Some("sluice-root.sluice.svc:7777"));
    let admin = loopback();
    assert_eq!(launch.flag("--debug-addr"), Some("127.0.0.1:9902"), "the status pages on loopback");
    let debug = loopback();
    launch.set_flag("--debug-addr", &debug.to_string());
    launch.set_flag("--admin-addr", &admin.to_string());
    launch.set_flag("--server-addresses", &grpc_of["leaf"][0].to_string());
    let mount = sidecar["volumeMounts"][0]["mountPath"].as_str().unwrap().to_owned();
    let process = runner.start("sidecar", &launch, &[(&config_dir, &mount)], &sidecar["securityContext"]);
    let ports = HashMap::from([("sluice-admin".to_owned(), admin)]);
    let asked = runner.probe(&process, sidecar, &ports);
    println!("sidecar: {}", asked.join(", "));
    assert_eq!(asked.len(), 2, "startup and liveness");
    assert_eq!(http_get(admin, "/debug/status").unwrap().0, 404, "not on the pod IP");
    assert_eq!(http_get(debug, "/debug/status").unwrap().0, 200);
    let (_, metrics) = http_get(admin, "/metrics").unwrap();
    assert!(metrics.contains("sluice_sidecar_"), "metrics on the named port");
    let (_, status) = http_get(debug, "/debug/status.json").unwrap();
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["client_id"], "orders-client-7d9c5-x2x4z:9000".replace("9000", &listen.port().to_string()));
    // The application's call, through the sidecar, to the service it calls.
    let why = lazily(|| format!("no request passed the sidecar; logs:\n{}", runner.logs(&process)));
    eventually_blocking(why, || matches!(http_get(listen, "/echo"), Ok((200, _))));
    // And its lease comes down the tree: root master → leaf → sidecar.
    let status = || serde_json::from_str::<Value>(&http_get(debug, "/debug/status.json").unwrap().1).unwrap();
    let why = lazily(|| format!("no lease through the tree: {}", status()));
    eventually_blocking(why, || status()["resources"][0]["mode"] == "leased");
    running.push(process);
    drop(running);
    runner.stop();
    drop(etcd);
}
