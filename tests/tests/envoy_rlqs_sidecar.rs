//! A real Envoy 1.40 whose `envoy.filters.http.rate_limit_quota` filter asks a real standalone
//! `sluice-sidecar` (its `rate_limit_service`, which serves RLQS on the RLS's port): the
//! sidecar assigns the bucket a token bucket of the limit's rate, Envoy enforces it, and the
//! load Envoy reports reaches the resource's demand. Skipped (with the reason printed) where
//! there is no Envoy binary.

use std::{
    net::SocketAddr,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use sluice_tests::{
    envoy,
    harness::{binary, free_port, http_get},
    rlqs::{Envoy, QuotaFilter, drive},
    upstream::UpstreamProcess,
};

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: name
    value: sluice
    descriptors:
      - key: tenant
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 20}
"#;

/// A standalone sidecar serving only the rate limit service (and so RLQS) on `rls`; killed
/// when dropped.
struct Sidecar {
    child: Child,
    admin: SocketAddr,
    rls: SocketAddr,
    dir: tempfile::TempDir,
}

impl Sidecar {
    fn start() -> Sidecar {
        let rls = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(dir.path().join("limits.yaml"), LIMITS).expect("limits.yaml");
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, format!("rate_limit_service: {{address: \"{rls}\", files: [limits.yaml]}}\n"))
            .expect("config.yaml");
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = std::fs::File::create(dir.path().join("sidecar.log")).expect("sidecar.log");
        let child = Command::new(binary("sluice-sidecar"))
            .args(["--admin-addr", &admin.to_string()])
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sluice-sidecar");
        let sidecar = Sidecar { child, admin, rls, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(http_get(admin, "/ready"), Ok((200, _))) {
            assert!(Instant::now() < deadline, "sidecar not ready; log:\n{}", sidecar.logs());
            thread::sleep(Duration::from_millis(50));
        }
        sidecar
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sidecar.log")).unwrap_or_default()
    }

    /// `sluice_sidecar_wants` of the resource whose id contains `id` (a key's own series:
    /// `detailed_metric`).
    fn wants(&self, id: &str) -> Option<f64> {
        let (_, body) = http_get(self.admin, "/metrics").ok()?;
        body.lines()
            .filter(|line| line.starts_with("sluice_sidecar_wants{") && line.contains(id))
            .find_map(|line| line.rsplit(' ').next()?.parse().ok())
    }
}

impl Sidecar {
    /// SIGTERM, then how long it took to exit (`None`: not within `limit`).
    fn terminate(&mut self, limit: Duration) -> Option<Duration> {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args(["-s", "TERM", &pid]).status().expect("kill runs");
        assert!(status.success(), "kill -s TERM failed");
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.child.try_wait().expect("wait").is_some() {
                return Some(start.elapsed());
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn envoy_enforces_the_token_bucket_the_sidecar_assigns_from_its_limit() {
    let Some(envoy_binary) = envoy::required("envoy_enforces_the_token_bucket_the_sidecar_assigns_from_its_limit")
    else {
        return;
    };
    let upstream = UpstreamProcess::start(None);
    let mut sidecar = Sidecar::start();
    let mut filter = QuotaFilter::new("edge", sidecar.rls);
    filter.from_headers = vec![("tenant".into(), "x-tenant".into())];
    filter.reporting_interval = Duration::from_secs(1);
    // Until the sidecar's assignment comes, nothing passes: every request that passes is the
    // sidecar's token bucket's.
    filter.no_assignment = "{blanket_rule: DENY_ALL}".into();
    let envoy = Envoy::start(&envoy_binary, upstream.addr(), &filter);

    let seconds = 10;
    let started = Instant::now();
    let (passed, denied, other) = drive(&envoy, "/", &[("x-tenant", "a")], 60, Duration::from_secs(seconds));
    let took = started.elapsed().as_secs_f64();
    let offered = f64::from(passed + denied) / took;
    // The bucket starts full (20, one second of the limit) and fills at 20 a second.
    let expected = 20.0 + 20.0 * took;
    println!(
        "{passed} passed, {denied} denied, {other} other in {took:.1} s ({offered:.1}/s offered); \
         expected about {expected:.0}"
    );
    assert_eq!(other, 0, "envoy log:\n{}", envoy.logs());
    assert!(offered > 40.0, "the driver offered {offered:.1}/s, too little to test a limit of 20/s");
    assert!(
        (f64::from(passed) - expected).abs() <= 0.25 * expected,
        "{passed} passed, expected {expected:.0} ± 25%; envoy log:\n{}\nsidecar log:\n{}",
        envoy.logs(),
        sidecar.logs()
    );
    // Envoy's reports (every 5 s) reached the resource's demand: what it offered, with headroom.
    let wants = sidecar.wants("tenant").expect("the resource's wants");
    println!("sidecar wants {wants:.1}/s for the bucket");
    assert!(wants > 0.9 * offered && wants < 1.4 * offered, "wants {wants:.1} for {offered:.1}/s offered");

    // Past the assignment's time to live (15 s) from its first push, the bucket still has it:
    // the sidecar pushed it again in time (without, Envoy would fall back to DENY_ALL).
    let ttl = Duration::from_secs(15);
    thread::sleep((ttl + Duration::from_secs(2)).saturating_sub(started.elapsed()));
    let (passed, denied, _) = drive(&envoy, "/", &[("x-tenant", "a")], 60, Duration::from_secs(2));
    println!("after the time to live: {passed} passed, {denied} denied in 2 s");
    assert!((40..=80).contains(&passed), "{passed} passed in 2 s, expected 20 + 2 × 20");

    // Envoy's stream stays open as long as the sidecar lets it: stopping, the sidecar ends it
    // rather than wait for it through its drain.
    let took = sidecar.terminate(Duration::from_secs(5));
    assert!(took.is_some(), "the sidecar did not stop within 5 s with a stream open; log:\n{}", sidecar.logs());
}
