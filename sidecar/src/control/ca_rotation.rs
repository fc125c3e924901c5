//! Upstream CA bundles replaced on disk (cert-manager's trust bundles, a Secret volume): the `ca`
//! files of the plan in force are polled at the configuration's interval, and an upstream whose
//! bundle changed, once two polls in a row saw the same new content, gets a new client trusting
//! it — new connections use it, open ones finish on the old. The configuration stays as it is.
//! A bundle that cannot be used is logged once, and the upstream keeps trusting the old one.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use arc_swap::ArcSwap;
use tokio::sync::mpsc::UnboundedSender;

use sluice_http::sync;

use crate::{plan::Plan, upstream::UpstreamClient};

/// Polls until the process ends. `applying` is held while a new plan is built and put in force,
/// as the configuration reloader does, so that neither undoes the other.
pub async fn run(
    live: Arc<ArcSwap<Plan>>,
    applying: Arc<Mutex<()>>,
    cue: Option<UnboundedSender<Arc<str>>>,
    interval: Duration,
) {
    let mut rotation = Rotation::default();
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let renewed = rotation.poll(&live.load());
        if renewed.is_empty() {
            continue;
        }
        let _applying = sync::lock(&applying);
        match live.load().renew(renewed, cue.as_ref()) {
            Ok(plan) => live.store(Arc::new(plan)),
            Err(error) => tracing::error!(%error, "renewing upstreams failed"),
        }
    }
}

/// What the polls saw of the bundles that differ from what their upstream trusts.
#[derive(Default)]
struct Rotation {
    /// The last poll's content of each such file: a change is taken once it stays.
    seen: HashMap<PathBuf, Vec<u8>>,
    /// Content that could not be used, not tried again.
    rejected: HashMap<PathBuf, Vec<u8>>,
}

impl Rotation {
    /// New clients for the upstreams of `plan` whose bundle changed and settled.
    fn poll(&mut self, plan: &Plan) -> HashMap<String, Arc<UpstreamClient>> {
        let mut renewed = HashMap::new();
        let mut seen = HashMap::new();
        for client in plan.upstreams() {
            let Some((path, trusted)) = client.ca() else { continue };
            // An unreadable file may be between a tool's remove and write: the next poll sees.
            let Ok(now) = std::fs::read(path) else { continue };
            if now == trusted || self.rejected.get(path) == Some(&now) {
                continue;
            }
            if self.seen.get(path) != Some(&now) {
                seen.insert(path.to_owned(), now);
                continue;
            }
            match UpstreamClient::trusting(client.config(), Some(now.clone())) {
                Ok(new) => {
                    tracing::info!(upstream = client.name(), "CA bundle changed: new connections trust it");
                    renewed.insert(client.name().to_owned(), Arc::new(new));
                }
                Err(error) => {
                    tracing::error!(upstream = client.name(), %error, "CA bundle rejected; the previous one stays in force");
                    self.rejected.insert(path.to_owned(), now);
                }
            }
        }
        self.seen = seen;
        renewed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;

    /// One poll, its renewals put in force; the upstreams renewed.
    fn poll(rotation: &mut Rotation, plan: &mut Plan) -> Vec<String> {
        let renewed = rotation.poll(plan);
        let names = renewed.keys().cloned().collect();
        *plan = plan.renew(renewed, None).unwrap();
        names
    }

    fn bundle() -> String {
        rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap().cert.pem()
    }

    #[test]
    fn a_bundle_is_taken_once_it_settles_and_a_bad_one_is_tried_once() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, bundle()).unwrap();
        let yaml = format!(
            "listeners:\n  - name: app\n    address: 127.0.0.1:1\n    upstream: app\n\
             upstreams:\n  - name: app\n    url: https://localhost:1\n    ca: {}\n\
             resources:\n  - id: all\n    capacity: 10\n\
             rules:\n  - resource: all\n",
            ca.display()
        );
        let mut plan = Plan::build(config::parse(&yaml).unwrap(), None, None).unwrap();
        let mut rotation = Rotation::default();
        let trusted = |plan: &Plan| plan.upstreams().next().unwrap().ca().unwrap().1.to_vec();
        assert!(poll(&mut rotation, &mut plan).is_empty(), "unchanged");

        let new = bundle();
        std::fs::write(&ca, &new).unwrap();
        assert!(poll(&mut rotation, &mut plan).is_empty(), "seen once: it may still be being written");
        assert_eq!(poll(&mut rotation, &mut plan), ["app"], "seen twice: taken");
        assert_eq!(trusted(&plan), new.as_bytes());
        assert!(poll(&mut rotation, &mut plan).is_empty(), "taken once");

        std::fs::write(&ca, "not a bundle").unwrap();
        for _ in 0..4 {
            assert!(poll(&mut rotation, &mut plan).is_empty());
        }
        assert_eq!(trusted(&plan), new.as_bytes(), "a bundle that cannot be used leaves the old in force");
        assert_eq!(rotation.rejected.len(), 1, "tried once");

        let newer = bundle();
        std::fs::write(&ca, &newer).unwrap();
        poll(&mut rotation, &mut plan);
        assert_eq!(poll(&mut rotation, &mut plan), ["app"]);
        assert_eq!(trusted(&plan), newer.as_bytes());
    }
}
