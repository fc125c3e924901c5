//! Starts the real `sluice-server` and `sluice-sidecar` binaries, each by its own launcher
//! ([`ServerLaunch`], [`SidecarLaunch`]) with a configuration from [`crate::config`], on free
//! loopback ports, each in its own temporary directory, and stops them when dropped.

use std::{
    fs,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        LazyLock,
        atomic::{AtomicU32, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use sluice_proto::capacity_client::CapacityClient;
use tempfile::TempDir;
use tonic::transport::Channel;

use crate::config::{ConfigFile, Listener, Resource, Rule, ServerConfig, SidecarConfig, Upstream};

/// How long a binary may take to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A built binary of the workspace, found next to the running executable (tests run from
/// `target/<profile>/deps`, binaries from `target/<profile>`). `make test` builds them first.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current executable");
    let mut dir = exe.parent().expect("executable directory");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("target profile directory");
    }
    let path = dir.join(name);
    assert!(path.exists(), "{} is not built: run `cargo build --workspace --bins` (make test does)", path.display());
    path
}

/// A port nobody listens on right now, handed out once per test process.
///
/// It is taken below the kernel's ephemeral range: a port the kernel picked for `bind(0)` is
/// also a candidate source port for every outgoing connection, so between this call and the
/// binary's own `bind` a client elsewhere in the run could take it (CI saw "Address already in
/// use"). Below the range only explicit binds land, and a counter keeps this process's ports
/// apart; the start depends on the process id so that test binaries run side by side start
/// apart too.
pub fn free_port() -> u16 {
    static PORTS: LazyLock<(u32, u32, AtomicU32)> = LazyLock::new(|| {
        let (low, high) = explicit_port_range();
        (low, high, AtomicU32::new(std::process::id().wrapping_mul(PORT_STRIDE) % (high - low)))
    });
    let (low, high, next) = &*PORTS;
    for _ in *low..*high {
        let port = (low + next.fetch_add(1, Ordering::Relaxed) % (high - low)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {low}..{high}");
}

/// A standalone sidecar whose `listener` sends every request to `upstream`, charging it to
/// `resource` by `rule`: the sidecar and where it listens.
pub fn standalone_sidecar(
    listener: Listener,
    upstream: Upstream,
    resource: Resource,
    rule: Rule,
) -> (Sidecar, SocketAddr) {
    let sidecar = Sidecar::launch(&SidecarConfig::proxy(listener, upstream).resource(resource).rule(rule)).start();
    let listen = sidecar.listen();
    (sidecar, listen)
}

/// Spacing between the first ports of processes with consecutive ids: a prime, so that starts
/// spread over the whole range.
const PORT_STRIDE: u32 = 7_919;

/// Lowest port handed out: above the well-known and commonly configured service ports.
const LOWEST_TEST_PORT: u32 = 10_000;

/// The ports from [`LOWEST_TEST_PORT`] up to the start of the kernel's ephemeral range; if that
/// range starts too low to leave room, the ports above it.
fn explicit_port_range() -> (u32, u32) {
    let ephemeral = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok().and_then(|text| {
        let mut bounds = text.split_whitespace().map(|n| n.parse::<u32>().ok());
        Some((bounds.next()??, bounds.next()??))
    });
    match ephemeral {
        Some((first, _)) if first >= LOWEST_TEST_PORT + 1_000 => (LOWEST_TEST_PORT, first),
        Some((_, last)) if last + 1_000 < 65_536 => (last + 1, 65_536),
        _ => (LOWEST_TEST_PORT, 30_000),
    }
}

/// Runs a binary to completion, for tests of start-up failures. One still running after
/// [`START_TIMEOUT`] is killed (its exit code is then `None`), so a start-up check that fails
/// to stop the process fails the test instead of hanging it.
pub fn run(name: &str, args: &[&str]) -> Output {
    let mut child = Command::new(binary(name))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    let deadline = Instant::now() + START_TIMEOUT;
    while child.try_wait().expect("wait").is_none() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().expect("output")
}

/// Starts `binary` with `--admin-addr` on a free port, `config` (YAML) as `--config`, `files`
/// (name, text) beside it, and `args`, and waits until `ready` on the admin listener answers 200.
fn spawn(binary: &Path, config: Option<&str>, files: &[(String, String)], args: &[String], ready: &str) -> Process {
    let dir = tempfile::tempdir().expect("temporary directory");
    let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let config_path = dir.path().join("config.yaml");
    let log_path = dir.path().join("process.log");
    for (name, text) in files {
        fs::write(dir.path().join(name), text).expect("write a file beside the config");
    }
    let mut command = Command::new(binary);
    command.args(["--admin-addr", &admin.to_string()]);
    if let Some(yaml) = config {
        fs::write(&config_path, yaml).expect("write config");
        command.arg("--config").arg(&config_path);
    }
    let log = fs::File::create(&log_path).expect("log file");
    command.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
    let child = command.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
    let mut process = Process { child, admin, config_path, log_path, dir };
    process.wait_ready(ready);
    process
}

/// How to start a capacity server: its configuration (else the embedded default) and flags.
pub struct ServerLaunch {
    binary: PathBuf,
    config: Option<String>,
    files: Vec<(String, String)>,
    args: Vec<String>,
}

impl ServerLaunch {
    /// A launch of `binary` (another build, e.g. a release build for measurements).
    pub fn of(binary: PathBuf) -> Self {
        ServerLaunch { binary, config: None, files: Vec::new(), args: Vec::new() }
    }

    pub fn config(mut self, config: &ServerConfig) -> Self {
        self.config = Some(config.yaml());
        self
    }

    /// The configuration as written elsewhere (a chart's rendering).
    pub fn config_text(mut self, text: &str) -> Self {
        self.config = Some(text.into());
        self
    }

    /// A file beside the configuration, named `name`, that it names (an envoyproxy/ratelimit file).
    pub fn file(mut self, name: &str, text: &str) -> Self {
        self.files.push((name.into(), text.into()));
        self
    }

    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts the server with its gRPC listener on a free port; waits until `/readyz` answers 200.
    pub fn start(self) -> Server {
        self.start_at(([127, 0, 0, 1], free_port()).into())
    }

    /// Starts the server with its gRPC listener on `grpc` (e.g. to restart one in place).
    pub fn start_at(mut self, grpc: SocketAddr) -> Server {
        self.args.extend(["--grpc-addr".into(), grpc.to_string()]);
        let process = spawn(&self.binary, self.config.as_deref(), &self.files, &self.args, "/readyz");
        Server { process, grpc }
    }
}

/// How to start a sidecar: its configuration, which says where it listens, and flags.
pub struct SidecarLaunch {
    binary: PathBuf,
    config: String,
    listeners: Vec<SocketAddr>,
    args: Vec<String>,
}

impl SidecarLaunch {
    /// A launch of `binary` (another build, e.g. a release build for measurements).
    pub fn of(binary: PathBuf, config: &SidecarConfig) -> Self {
        SidecarLaunch { binary, config: config.yaml(), listeners: config.addresses(), args: Vec::new() }
    }

    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts the sidecar and waits until `/ready` answers 200.
    pub fn start(self) -> Sidecar {
        let process = spawn(&self.binary, Some(&self.config), &[], &self.args, "/ready");
        Sidecar { process, listeners: self.listeners }
    }
}

/// A running binary with its admin listener, configuration file and log, in a temporary
/// directory; killed when dropped.
pub struct Process {
    child: Child,
    pub admin: SocketAddr,
    config_path: PathBuf,
    log_path: PathBuf,
    /// Where the configuration, the files beside it and the log are.
    dir: TempDir,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Replaces the configuration file the way tools do: write aside, then rename over it.
    pub fn write_config(&self, config: &dyn ConfigFile) {
        self.write_raw_config(&config.yaml());
    }

    /// [`Process::write_config`] with text as it is, for tests of files the binaries refuse to read.
    pub fn write_raw_config(&self, text: &str) {
        replace(&self.config_path, text);
    }

    /// Replaces the file `name` beside the configuration as [`Process::write_config`] does.
    pub fn write_file(&self, name: &str, text: &str) {
        replace(&self.dir.path().join(name), text);
    }

    /// Sends a signal by name (e.g. "HUP", "TERM", "KILL").
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").args(["-s", name, &self.pid().to_string()]).status().expect("kill runs");
        assert!(status.success(), "kill -s {name} failed");
    }

    /// Waits for the process to exit and returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status.code();
            }
            thread::sleep(Duration::from_millis(20));
        }
        panic!("process did not exit within {timeout:?}; log:\n{}", self.logs());
    }

    /// GET on the admin listener: status code and body.
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.admin, path).unwrap_or_else(|e| panic!("GET {path}: {e}; log:\n{}", self.logs()))
    }

    /// The value of one series of /metrics, e.g. `sluice_server_config_reloads_total{result="failure"}`.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics");
        body.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    }

    fn wait_ready(&mut self, path: &str) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                panic!("process exited during start-up with {status}; log:\n{}", self.logs());
            }
            if matches!(http_get(self.admin, path), Ok((200, _))) {
                return;
            }
            assert!(Instant::now() < deadline, "not ready after {START_TIMEOUT:?}; log:\n{}", self.logs());
            thread::sleep(Duration::from_millis(25));
        }
    }
}

/// Writes `text` aside, then renames it over `path`, as tools replace a file.
fn replace(path: &Path, text: &str) {
    let aside = path.with_extension("new");
    fs::write(&aside, text).unwrap_or_else(|e| panic!("write {}: {e}", aside.display()));
    fs::rename(&aside, path).unwrap_or_else(|e| panic!("replace {}: {e}", path.display()));
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `sluice-server`.
pub struct Server {
    process: Process,
    pub grpc: SocketAddr,
}

impl Server {
    pub fn launch() -> ServerLaunch {
        ServerLaunch::of(binary("sluice-server"))
    }

    pub async fn client(&self) -> CapacityClient<Channel> {
        CapacityClient::connect(format!("http://{}", self.grpc)).await.expect("connect to the server")
    }
}

/// A running `sluice-sidecar`.
pub struct Sidecar {
    process: Process,
    /// Where its listeners listen, in the order of its configuration.
    pub listeners: Vec<SocketAddr>,
}

impl Sidecar {
    pub fn launch(config: &SidecarConfig) -> SidecarLaunch {
        SidecarLaunch::of(binary("sluice-sidecar"), config)
    }

    /// Where its first listener listens.
    pub fn listen(&self) -> SocketAddr {
        self.listeners[0]
    }
}

macro_rules! process_deref {
    ($($t:ty),*) => {$(
        impl std::ops::Deref for $t {
            type Target = Process;
            fn deref(&self) -> &Process {
                &self.process
            }
        }
        impl std::ops::DerefMut for $t {
            fn deref_mut(&mut self) -> &mut Process {
                &mut self.process
            }
        }
    )*};
}
process_deref!(Server, Sidecar);

/// A minimal HTTP/1.0 GET, enough for the debug listener.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, body.to_owned()))
}

/// The `/debug/status.json` of a server or sidecar by its admin address; `None` while it does
/// not answer (e.g. killed), for tests that sample it through a fault.
pub fn status_json(admin: SocketAddr) -> Option<serde_json::Value> {
    match http_get(admin, "/debug/status.json") {
        Ok((200, body)) => serde_json::from_str(&body).ok(),
        _ => None,
    }
}

/// Clock ticks per second of the CPU times in /proc/PID/stat: Linux's USER_HZ, fixed at 100 in
/// its user-space ABI whatever the kernel's own tick rate.
const USER_HZ: f64 = 100.0;

/// User and system CPU time a process has used so far, in seconds, from /proc/PID/stat.
pub fn cpu_seconds(pid: u32) -> Result<(f64, f64), String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| format!("cannot read CPU time: {e}"))?;
    parse_cpu(&stat).ok_or_else(|| format!("no CPU times in /proc/{pid}/stat"))
}

/// utime and stime, the 14th and 15th fields; the command name before them is in parentheses
/// and may hold spaces, so fields are counted from its closing parenthesis.
pub fn parse_cpu(stat: &str) -> Option<(f64, f64)> {
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().skip(11);
    let mut ticks = || fields.next()?.parse::<u64>().ok();
    Some((ticks()? as f64 / USER_HZ, ticks()? as f64 / USER_HZ))
}

/// Whether a test that needs outside tools can run. On a developer's machine without them it
/// is skipped with a loud message; where `CI` is set it fails instead, since `.ci/run` installs
/// them and a check that silently does not run there protects nothing.
pub fn can_run(test: &str, missing: &[String]) -> bool {
    if missing.is_empty() {
        return true;
    }
    let message = format!("{test} needs {} (`.ci/run` installs what it needs)", missing.join(", "));
    assert!(std::env::var_os("CI").is_none(), "{message}");
    eprintln!("SKIPPED: {message}");
    false
}

/// Those of `tools` that are not on PATH (a name with a slash is taken as a path).
pub fn missing_tools(tools: &[&str]) -> Vec<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = |tool: &str| {
        if tool.contains('/') {
            return Path::new(tool).is_file();
        }
        std::env::split_paths(&path).any(|dir| dir.join(tool).is_file())
    };
    tools.iter().filter(|tool| !found(tool)).map(|tool| tool.to_string()).collect()
}
