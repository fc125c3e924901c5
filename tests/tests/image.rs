//! The container image (deploy/Dockerfile): hadolint passes; built offline on a base made on this
//! machine, it is small and runs as non-root; the server and the sidecar run from it on the host's
//! network (loopback ports), and a request through the containerised sidecar is admitted and then
//! refused by the lease the containerised server grants.
//!
//! The image packages the binaries this test was built with (the debug build under `make test`,
//! stripped): a release build would add minutes to CI, and `make image` reports the release size.

use std::{
    ffi::OsString,
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use sluice_tests::{
    config::{
        Algorithm, ConfigFile, Listener, OnLimit, Resource, Rule, ServerConfig, SidecarConfig, Template, Upstream,
    },
    docker::{Engine, describe},
    harness::{binary, can_run, free_port, http_get, missing_tools},
    http::{get, http1},
    upstream::UpstreamProcess,
    wait::{eventually, eventually_blocking, lazily},
};

const IMAGE: &str = "sluice-test:image";

/// The tag deploy/image/build.sh gives the base it makes when no BASE is set.
const BASE: &str = "sluice-base:local";

/// The non-root user the image runs as (distroless' `nonroot`).
const USER: &str = "65532:65532";

/// The capacity the server grants in all: half a request a second, so that a quick series of
/// requests through the sidecar soon exhausts its lease.
const CAPACITY: f64 = 0.5;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_path_buf()
}

#[test]
fn the_dockerfile_passes_hadolint() {
    if !can_run("the Dockerfile lint", &missing_tools(&["hadolint"])) {
        return;
    }
    let out = Command::new("hadolint").arg(repo().join("deploy/Dockerfile")).output().expect("hadolint runs");
    assert!(out.status.success(), "hadolint: {}", describe(&out));
}

/// The user id of a running process, from /proc/PID/status.
/// deploy/README.md's `docker run --network host` of the server keeps it on loopback: on the host's
/// network, the image's `0.0.0.0:7777` would be every interface the host has.
#[test]
fn the_documented_host_network_server_listens_on_loopback() {
    let readme = fs::read_to_string(repo().join("deploy/README.md")).expect("deploy/README.md");
    let commands: Vec<String> = readme
        .replace("\\\n", " ")
        .lines()
        .filter(|l| l.starts_with("docker run --network host") && l.contains(" sluice-server "))
        .map(str::to_owned)
        .collect();
    assert!(!commands.is_empty(), "no `docker run --network host ... sluice-server` in deploy/README.md");
    for command in commands {
        assert!(command.contains("-e SLUICE_GRPC_ADDR=127.0.0.1:"), "{command}");
    }
}

fn uid(pid: &str) -> u32 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:")).expect("a Uid line");
    line.split_whitespace().nth(1).expect("effective uid").parse().expect("a number")
}

fn is_root() -> bool {
    uid("self") == 0
}

/// Waits until `path` on a container's admin listener answers 200, printing the container's
/// log if it does not.
fn wait_ready(engine: &Engine, container: &str, admin: SocketAddr, path: &str) {
    let why = lazily(|| {
        let logs = engine.command().args(["logs", container]).output().expect("docker logs");
        format!("{container} not ready: {}", describe(&logs))
    });
    eventually_blocking(why, || matches!(http_get(admin, path), Ok((200, _))));
}

/// `docker run` of one of the binaries from the image: on the host's network, with its
/// configuration mounted read-only.
fn run(engine: &Engine, name: &str, config: &Path, args: &[String]) {
    let mount = format!("{}:/etc/sluice/config.yaml:ro", config.display());
    let mut command = vec!["run", "--detach", "--name", name, "--network", "host", "--volume", &mount, IMAGE, name];
    command.extend(["--config", "/etc/sluice/config.yaml"]);
    command.extend(args.iter().map(String::as_str));
    engine.run(&command);
}

/// The sidecar's status for its one resource.
fn resource(admin: SocketAddr) -> serde_json::Value {
    let (_, body) = http_get(admin, "/debug/status.json").expect("sidecar status");
    let status: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
    status["resources"][0].clone()
}

#[tokio::test]
async fn the_image_runs_the_server_and_the_sidecar_as_non_root() {
    let client: OsString = std::env::var_os("DOCKER").unwrap_or_else(|| "docker".into());
    let mut missing = missing_tools(&["dockerd", &client.to_string_lossy(), "apt-get", "dpkg-deb", "strip"]);
    if !is_root() {
        missing.push("root (dockerd runs as root)".into());
    }
    if !can_run("the image test", &missing) {
        return;
    }
    let engine = Engine::start(client);

    // Built offline from the binaries next to this test, on a base made from this machine's
    // packages: nothing but the base and the image may appear in the engine (no builder image,
    // no distroless pulled).
    let bins = binary("sluice-server").parent().expect("binary directory").to_path_buf();
    let started = Instant::now();
    let out =
        engine.program(repo().join("deploy/image/build.sh")).arg(&bins).env_remove("BASE").env("IMAGE", IMAGE).output();
    let out = out.expect("build.sh runs");
    assert!(out.status.success(), "deploy/image/build.sh: {}", describe(&out));
    println!("built in {:.1?}: {}", started.elapsed(), String::from_utf8_lossy(&out.stdout).trim());
    let mut images: Vec<String> =
        engine.run(&["image", "ls", "--format", "{{.Repository}}:{{.Tag}}"]).lines().map(str::to_owned).collect();
    images.sort();
    assert_eq!(images, [BASE, IMAGE], "the offline build pulled nothing");

    // Size: a small base (glibc, libgcc, netbase, tzdata) and stripped binaries on it, nothing more.
    let size =
        |image: &str| -> u64 { engine.run(&["image", "inspect", "--format", "{{.Size}}", image]).parse().unwrap() };
    let (image_size, base_size) = (size(IMAGE), size(BASE));
    let unstripped: u64 =
        ["sluice-server", "sluice-sidecar"].iter().map(|b| fs::metadata(binary(b)).unwrap().len()).sum();
    let mb = |bytes: u64| bytes as f64 / 1e6;
    println!(
        "image {IMAGE}: {:.1} MB = base {:.1} MB + binaries {:.1} MB (unstripped {:.1} MB)",
        mb(image_size),
        mb(base_size),
        mb(image_size - base_size),
        mb(unstripped)
    );
    assert!(base_size < 30_000_000, "the base grew to {base_size} bytes");
    assert!(image_size - base_size < unstripped / 2, "the binaries are not stripped");
    assert!(image_size < 100_000_000, "the image grew to {image_size} bytes");
    assert_eq!(engine.run(&["image", "inspect", "--format", "{{.Config.User}}", IMAGE]), USER);

    // The server and the sidecar from the image, the test upstream on the host.
    let upstream = UpstreamProcess::start(None);
    let configs = tempfile::tempdir().expect("temporary directory");
    let loopback = |port: u16| -> SocketAddr { ([127, 0, 0, 1], port).into() };
    let (grpc, server_admin) = (loopback(free_port()), loopback(free_port()));
    let (listen, sidecar_admin) = (loopback(free_port()), loopback(free_port()));
    let server_config = configs.path().join("server.yaml");
    let shared = Template::catch_all(CAPACITY, Algorithm::fair_share(30, 1).learning(0));
    fs::write(&server_config, ServerConfig::new().template(shared).yaml()).unwrap();
    let sidecar_config = configs.path().join("sidecar.yaml");
    let sidecar = SidecarConfig::proxy(Listener::new("app", listen), Upstream::app(upstream.addr()))
        .leasing_from([grpc])
        .resource(Resource::new("images").burst(1.0))
        .rule(Rule::charging("images").on_limit(OnLimit::Reject));
    fs::write(&sidecar_config, sidecar.yaml()).unwrap();
    run(
        &engine,
        "sluice-server",
        &server_config,
        &["--grpc-addr".into(), grpc.to_string(), "--admin-addr".into(), server_admin.to_string()],
    );
    wait_ready(&engine, "sluice-server", server_admin, "/readyz");
    run(&engine, "sluice-sidecar", &sidecar_config, &["--admin-addr".into(), sidecar_admin.to_string()]);
    wait_ready(&engine, "sluice-sidecar", sidecar_admin, "/ready");
    for container in ["sluice-server", "sluice-sidecar"] {
        let pid = engine.run(&["inspect", "--format", "{{.State.Pid}}", container]);
        assert_eq!(uid(&pid), 65532, "{container} runs as the image's user");
    }

    // Requests until one passes on a lease (the sidecar may refuse while it has none yet).
    let (http, url) = (http1(), format!("http://{listen}/echo"));
    let why = lazily(|| format!("no request passed on a lease: {}", resource(sidecar_admin)));
    eventually(why, async || get(&http, &url).await.status == 200 && resource(sidecar_admin)["mode"] == "leased").await;
    let lease = resource(sidecar_admin)["capacity"].as_f64().expect("a leased capacity");
    assert!(lease > 0.0 && lease <= CAPACITY, "the lease comes from the server's {CAPACITY}/s: {lease}");
    // Ten at once: the bucket of 1 and half a token a second let one or two through.
    let mut codes = Vec::new();
    for _ in 0..10 {
        codes.push(get(&http, &url).await.status.as_u16());
    }
    let admitted = codes.iter().filter(|c| **c == 200).count();
    assert!(admitted <= 2 && codes.iter().all(|c| [200, 429].contains(c)), "{codes:?}");
    assert!(codes.contains(&429), "the lease was used up: {codes:?}");

    // Both stop cleanly on `docker stop` (SIGTERM to PID 1).
    for container in ["sluice-sidecar", "sluice-server"] {
        engine.run(&["stop", "--time", "15", container]);
        let code = engine.run(&["inspect", "--format", "{{.State.ExitCode}}", container]);
        assert_eq!(code, "0", "{container} exit code");
        engine.run(&["rm", container]);
    }
    engine.stop();
}
