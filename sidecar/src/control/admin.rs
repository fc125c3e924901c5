//! The sidecar's admin listener (SPEC §4.5): `/metrics`, `/live` (never depends on the capacity
//! servers), `/ready`, `/debug/status` and `/debug/status.json`, on a thread of its own.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use arc_swap::ArcSwap;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Bytes, body::Incoming};
use metrics_exporter_prometheus::PrometheusHandle;
use sluice_runtime::{
    admin::{json, reply, serve},
    clock::precise_now,
    procstat,
    reload::{ConfigStatus, SharedConfigStatus},
};

use sluice_http::sync;

use super::{
    leasing::Leasing,
    status::{self, GateHistory},
};
use crate::{
    metrics::{self, KeyFamilies},
    plan::Plan,
};

/// What the admin listener reads.
pub struct Admin {
    pub live: Arc<ArcSwap<Plan>>,
    pub client_id: String,
    pub handle: PrometheusHandle,
    /// Where the configuration came from, and the last file rejected.
    pub config: SharedConfigStatus,
    /// Set once the listeners are bound and the first configuration is in force.
    pub started: AtomicBool,
    /// Set at SIGTERM: the listeners no longer accept connections.
    pub draining: AtomicBool,
    /// The charts' samples.
    pub history: Mutex<GateHistory>,
    /// `None` in standalone mode.
    pub leasing: Option<Arc<Leasing>>,
}

impl Admin {
    /// Ready from when the listeners are bound until they drain. Every resource always has a
    /// decided policy (a lease, or its `when_unreachable` fallback while it has none, including
    /// before the first answer), so readiness never waits on a capacity server: a pod taken out
    /// of its Service as its first requests arrive would only see them fail elsewhere.
    pub fn is_ready(&self) -> bool {
        self.started.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed)
    }

    /// Samples every resource for the status page's charts every `interval`.
    pub async fn record_history(self: Arc<Self>, interval: Duration) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let plan = self.live.load();
            let fixed = plan.gates.iter().map(|g| (g.id.clone(), status::figures(g)));
            let keyed = plan.keyed.iter().map(|k| (k.id.clone(), status::keyed_figures(k)));
            let round: Vec<_> = fixed.chain(keyed).collect();
            sync::lock(&self.history).record(precise_now(), round.iter().map(|(id, figures)| (&**id, *figures)));
        }
    }

    fn status(&self, now: f64) -> status::SidecarStatus {
        let contact = self.leasing.as_ref().map(|l| l.contact());
        status::snapshot(
            &self.live.load(),
            &self.client_id,
            ConfigStatus::now(&self.config),
            contact,
            now.floor() as i64,
        )
    }
}

pub fn spawn(
    listener: std::net::TcpListener,
    debug: Option<std::net::TcpListener>,
    admin: Arc<Admin>,
) -> std::io::Result<()> {
    serve(listener, debug, &["/live", "/ready"], move |req| route(req, &admin))
}

fn route(req: &Request<Incoming>, admin: &Admin) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/metrics" => {
            let plan = admin.live.load();
            plan.gates.iter().for_each(|gate| gate.show_metrics());
            let mut keys = KeyFamilies::default();
            plan.keyed.iter().for_each(|keyed| keyed.show_metrics(&mut keys));
            metrics::publish_config(&ConfigStatus::now(&admin.config));
            admin.handle.run_upkeep();
            let page = metrics::render(&admin.handle, keys)
                + &procstat::exposition("sluice-sidecar", env!("CARGO_PKG_VERSION"));
            reply(StatusCode::OK, "text/plain; version=0.0.4", page)
        }
        "/live" => reply(StatusCode::OK, "text/plain", "live\n".into()),
        "/ready" if admin.is_ready() => reply(StatusCode::OK, "text/plain", "ready\n".into()),
        "/ready" => reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n".into()),
        "/debug/status" => {
            let now = precise_now();
            let page = status::html(&admin.status(now), &sync::lock(&admin.history), now);
            reply(StatusCode::OK, "text/html; charset=utf-8", page)
        }
        "/debug/status.json" => json(&admin.status(precise_now())),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}
