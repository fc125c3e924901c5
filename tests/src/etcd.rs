//! A real single-member etcd for the election tests: the `etcd` binary of Debian's `etcd-server`
//! package on free loopback ports, with a data directory of its own. It can be stopped and
//! started again on the same ports and data, and is killed when dropped.

use std::{
    fs,
    net::SocketAddr,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use tempfile::TempDir;

use crate::harness::{free_port, http_get};

/// How long etcd may take to answer its health check (it usually needs well under a second).
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// How long etcd may take to exit once signalled.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Etcd {
    child: Option<Child>,
    client: SocketAddr,
    peer: SocketAddr,
    dir: TempDir,
}

impl Etcd {
    /// Starts etcd and waits until it reports itself healthy.
    pub fn start() -> Etcd {
        let mut etcd = Etcd {
            child: None,
            client: ([127, 0, 0, 1], free_port()).into(),
            peer: ([127, 0, 0, 1], free_port()).into(),
            dir: tempfile::tempdir().expect("temporary directory"),
        };
        etcd.restart();
        etcd
    }

    /// The client URL, for `--etcd-endpoints`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.client)
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// Starts etcd again (or for the first time) on the same ports and data directory.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "etcd is running");
        let (client, peer) = (format!("http://{}", self.client), format!("http://{}", self.peer));
        let log = fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("etcd.log")).expect("log");
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd ({e}): apt-get install -y etcd-server"));
        self.child = Some(child);
        self.wait_healthy();
    }

    /// Sends a signal by name, by PID: "STOP" freezes etcd without closing its connections,
    /// "CONT" resumes it.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("etcd is running").id();
        let status = Command::new("kill").args(["-s", signal, &pid.to_string()]).status().expect("kill runs");
        assert!(status.success(), "kill -s {signal} etcd failed");
    }

    /// Sends a signal by name ("TERM", "KILL", ...) and waits until etcd has exited, so that its
    /// ports are free for a restart.
    pub fn stop(&mut self, signal: &str) {
        self.signal(signal);
        let mut child = self.child.take().expect("etcd is running");
        let deadline = Instant::now() + STOP_TIMEOUT;
        while child.try_wait().expect("wait for etcd").is_none() {
            assert!(Instant::now() < deadline, "etcd did not exit within {STOP_TIMEOUT:?} of SIG{signal}");
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let child = self.child.as_mut().expect("etcd is running");
            if let Some(status) = child.try_wait().expect("wait for etcd") {
                panic!("etcd exited during start-up with {status}; log:\n{}", self.logs());
            }
            if matches!(http_get(self.client, "/health"), Ok((200, body)) if body.contains("\"health\":\"true\"")) {
                return;
            }
            assert!(Instant::now() < deadline, "etcd not healthy after {START_TIMEOUT:?}; log:\n{}", self.logs());
            thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
