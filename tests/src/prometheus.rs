//! A real Prometheus for the observability tests: the `prometheus` and `promtool` binaries of
//! Debian's `prometheus` package, the server on a free loopback port with a configuration and a
//! TSDB of its own, scraping the binaries under test. Killed when dropped.

use std::{
    fs,
    io::Write,
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use tempfile::TempDir;

use crate::harness::{free_port, http_get};

/// How long Prometheus may take to answer `/-/ready` (it usually needs well under a second).
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// Whether every tool in `tools` is on the PATH. Where one is missing, a local run skips with a
/// loud message; under CI (which installs them) it fails.
pub fn tools_present(tools: &[&str]) -> bool {
    let missing: Vec<_> = tools.iter().filter(|tool| which(tool).is_none()).collect();
    if missing.is_empty() {
        return true;
    }
    let message = format!("{missing:?} not installed (apt-get install -y --no-install-recommends prometheus)");
    assert!(std::env::var_os("CI").is_none(), "{message}: CI must run this test");
    eprintln!("SKIPPED: {message}");
    false
}

fn which(tool: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(tool)).find(|candidate| candidate.is_file())
}

/// Runs `promtool` with `args` in `dir`, feeding it `stdin`.
pub fn promtool(dir: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write to promtool");
    child.wait_with_output().expect("promtool output")
}

pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    dir: TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping each `(job, targets)` every second and evaluating
    /// `rule_files` every second, and waits until it is ready.
    pub fn start(jobs: &[(&str, Vec<SocketAddr>)], rule_files: &[&Path]) -> Prometheus {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut config = String::from("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n");
        for file in rule_files {
            config += &format!("  - {:?}\n", file.canonicalize().expect("rule file").display().to_string());
        }
        config += "scrape_configs:\n";
        for (job, targets) in jobs {
            let targets: Vec<_> = targets.iter().map(|t| format!("\"{t}\"")).collect();
            config += &format!("  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n", targets.join(", "));
        }
        let config_path = dir.path().join("prometheus.yml");
        fs::write(&config_path, config).expect("write the configuration");
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let log = fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start prometheus: {e}"));
        let mut prometheus = Prometheus { child, addr, dir };
        prometheus.wait_ready();
        prometheus
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                panic!("prometheus exited with {status}; log:\n{}", self.logs());
            }
            if matches!(http_get(self.addr, "/-/ready"), Ok((200, _))) {
                return;
            }
            assert!(Instant::now() < deadline, "prometheus not ready after {START_TIMEOUT:?}; log:\n{}", self.logs());
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// GET on the HTTP API: the `data` of a successful answer, or why there is none.
    pub fn api(&self, path: &str) -> Result<Value, String> {
        let (code, body) = http_get(self.addr, path).map_err(|e| format!("GET {path}: {e}"))?;
        let answer: Value = serde_json::from_str(&body).map_err(|e| format!("GET {path}: {code} {body}: {e}"))?;
        match answer["status"].as_str() {
            Some("success") => Ok(answer["data"].clone()),
            _ => Err(format!("GET {path}: {code} {}: {}", answer["errorType"], answer["error"])),
        }
    }

    /// An instant query: the series of its vector result.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let encoded: String = form_urlencoded::byte_serialize(expr.as_bytes()).collect();
        let data = self.api(&format!("/api/v1/query?query={encoded}"))?;
        match (data["resultType"].as_str(), data["result"].as_array()) {
            (Some("vector"), Some(series)) => Ok(series.clone()),
            _ => Err(format!("{expr}: not a vector: {data}")),
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
