//! A private Docker engine for the image test: Debian's `dockerd` with its data, state and socket
//! in a temporary directory, no bridge and no iptables rules, so containers can only use the
//! host's network or none. Stopped (containers first) and its directory removed when dropped.

use std::{
    ffi::{OsStr, OsString},
    fs,
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use tempfile::TempDir;

/// How long dockerd may take to answer (it usually needs a second or two).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long dockerd may take to exit once signalled: it stops containers and its containerd.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Engine {
    child: Option<Child>,
    client: OsString,
    dir: TempDir,
}

impl Engine {
    /// Starts dockerd and waits until `client` (a docker CLI) gets answers from it.
    pub fn start(client: OsString) -> Engine {
        let dir = tempfile::tempdir().expect("temporary directory");
        let log = fs::File::create(dir.path().join("dockerd.log")).expect("log file");
        let child = Command::new("dockerd")
            .arg("--data-root")
            .arg(dir.path().join("root"))
            .arg("--exec-root")
            .arg(dir.path().join("exec"))
            .arg("--pidfile")
            .arg(dir.path().join("dockerd.pid"))
            .arg("--host")
            .arg(format!("unix://{}", dir.path().join("docker.sock").display()))
            .args(["--bridge=none", "--iptables=false", "--ip6tables=false"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start dockerd ({e}): apt-get install -y docker.io"));
        let mut engine = Engine { child: Some(child), client, dir };
        engine.wait_ready();
        engine
    }

    /// A command line of the docker client, talking to this engine.
    pub fn command(&self) -> Command {
        self.program(&self.client)
    }

    /// A command line of `program`, with the environment that points docker clients (`$DOCKER`
    /// for scripts) at this engine.
    pub fn program(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new(program);
        command.env("DOCKER_HOST", self.host()).env("DOCKER", &self.client).stdin(Stdio::null());
        command
    }

    /// Runs the docker client with `args` and returns its standard output, panicking (with both
    /// outputs) when it fails.
    pub fn run(&self, args: &[&str]) -> String {
        let out = self.command().args(args).output().expect("docker client runs");
        assert!(out.status.success(), "docker {}: {}", args.join(" "), describe(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(self.dir.path().join("dockerd.log")).unwrap_or_default()
    }

    /// Removes every container, stops dockerd, and checks that it exited, left nothing mounted
    /// and that its directory could be removed.
    pub fn stop(mut self) {
        assert!(self.shut_down(), "dockerd did not exit within {STOP_TIMEOUT:?} of SIGTERM; log:\n{}", self.logs());
        // dockerd binds the host's network namespace here for host-network containers and never
        // unmounts it (moby/moby#32712); anything else left mounted is a failure.
        let netns = self.dir.path().join("exec/netns/default");
        if self.mounts().contains(&netns) {
            let status = Command::new("umount").arg(&netns).status().expect("umount runs");
            assert!(status.success(), "umount {}: {status}", netns.display());
        }
        let left = self.mounts();
        assert!(left.is_empty(), "dockerd left mounts behind: {left:?}");
        fs::remove_dir_all(self.dir.path()).expect("remove the engine's directory");
    }

    fn host(&self) -> String {
        format!("unix://{}", self.dir.path().join("docker.sock").display())
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().expect("dockerd is running").try_wait().expect("wait") {
                panic!("dockerd exited during start-up with {status}; log:\n{}", self.logs());
            }
            let out = self.command().args(["info", "--format", "{{.ServerVersion}}"]).output();
            if out.is_ok_and(|out| out.status.success()) {
                return;
            }
            assert!(Instant::now() < deadline, "dockerd not ready after {START_TIMEOUT:?}; log:\n{}", self.logs());
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Removes the containers (their shims would outlive dockerd, holding their mounts), then
    /// stops dockerd; false if it had to be killed.
    fn shut_down(&mut self) -> bool {
        let Some(mut child) = self.child.take() else { return true };
        let ids = self.command().args(["ps", "--all", "--quiet"]).output().map(|o| o.stdout).unwrap_or_default();
        let ids: Vec<String> = String::from_utf8_lossy(&ids).split_whitespace().map(str::to_owned).collect();
        if !ids.is_empty() {
            let _ = self.command().args(["rm", "--force"]).args(&ids).output();
        }
        let _ = Command::new("kill").args(["-s", "TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        while child.try_wait().expect("wait for dockerd").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// Mount points under the engine's directory, from this process's mount table.
    fn mounts(&self) -> Vec<PathBuf> {
        let table = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        table
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .map(PathBuf::from)
            .filter(|point| point.starts_with(self.dir.path()))
            .collect()
    }
}

impl Drop for Engine {
    /// After a failure: stop what still runs, and detach what is still mounted so that the
    /// directory can be removed.
    fn drop(&mut self) {
        self.shut_down();
        for point in self.mounts().iter().rev() {
            let _ = Command::new("umount").arg("--lazy").arg(point).status();
        }
    }
}

/// A command's exit status and both outputs, for failure messages.
pub fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
