//! Headless Chromium, to read pages as a person's browser renders them: the DOM once a page has
//! loaded. `.ci/run` installs `chromium`; a test without it skips with a message, except in CI
//! (`CI` set), where it fails.

use std::{
    env, fs,
    io::Write,
    path::PathBuf,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

/// How long one page may take to load and be dumped (a cold start takes a few seconds).
const PAGE_TIMEOUT: Duration = Duration::from_secs(60);

/// Without these, a headless Chromium reaches for the network (updates, sync, QUIC probes) and
/// for a GPU and a sandbox a container lacks.
const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

pub struct Chromium {
    binary: PathBuf,
}

impl Chromium {
    /// `chromium` on the PATH. `None` (said on stderr) when it is missing outside CI; in CI, a
    /// missing browser fails the test.
    pub fn find() -> Option<Chromium> {
        let found = env::var_os("PATH")
            .and_then(|path| env::split_paths(&path).map(|dir| dir.join("chromium")).find(|p| p.is_file()));
        match found {
            Some(binary) => Some(Chromium { binary }),
            None if env::var_os("CI").is_some() => panic!("chromium is not installed (.ci/run installs it)"),
            None => {
                // Straight to stderr: the test harness hides what `eprintln!` says in a test that passes.
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: chromium is not installed (apt-get install -y --no-install-recommends chromium)"
                );
                None
            }
        }
    }

    /// The DOM of `url` after it loaded, serialised as HTML, from a fresh profile.
    pub fn dom(&self, url: &str) -> String {
        let profile = tempfile::tempdir().expect("temporary directory");
        let (out, err) = (profile.path().join("dom.html"), profile.path().join("chromium.log"));
        let mut child = Command::new(&self.binary)
            .args(FLAGS)
            .arg(format!("--user-data-dir={}", profile.path().join("profile").display()))
            .args(["--dump-dom", url])
            .stdin(Stdio::null())
            // To files, not pipes: a page larger than a pipe's buffer would stall the browser.
            .stdout(fs::File::create(&out).expect("output file"))
            .stderr(fs::File::create(&err).expect("log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
        let deadline = Instant::now() + PAGE_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chromium did not dump {url} within {PAGE_TIMEOUT:?}");
            }
            thread::sleep(Duration::from_millis(50));
        };
        let dom = fs::read_to_string(&out).expect("the dumped DOM");
        let log = || fs::read_to_string(&err).unwrap_or_default();
        assert!(status.success() && !dom.is_empty(), "chromium --dump-dom {url}: {status}; log:\n{}", log());
        dom
    }
}
