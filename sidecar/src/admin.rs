//! The sidecar's admin listener (SPEC §4.5): `/metrics`, `/live` (never depends on the capacity
//! servers), `/ready`, `/debug/status` and `/debug/status.json`, on a thread of its own.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use arc_swap::ArcSwap;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Bytes, body::Incoming};
use metrics_exporter_prometheus::PrometheusHandle;
use sluice_runtime::{
    admin::{json, reply, serve},
    reload::{ConfigStatus, SharedConfigStatus},
};

use crate::{plan::Plan, status};

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
}

impl Admin {
    /// Ready from when the listeners are bound until they drain. Every resource always has a
    /// decided policy (a lease, or its `when_unreachable` fallback while it has none, including
    /// before the first answer), so readiness never waits on a capacity server: a pod taken out
    /// of its Service as its first requests arrive would only see them fail elsewhere.
    pub fn is_ready(&self) -> bool {
        self.started.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed)
    }
}

pub fn spawn(listener: std::net::TcpListener, admin: Arc<Admin>) -> std::io::Result<()> {
    serve(listener, move |req| route(req, &admin))
}

fn route(req: &Request<Incoming>, admin: &Admin) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/metrics" => {
            admin.live.load().gates.iter().for_each(|gate| gate.show_metrics());
            crate::metrics::publish_config(&ConfigStatus::now(&admin.config));
            admin.handle.run_upkeep();
            reply(StatusCode::OK, "text/plain; version=0.0.4", admin.handle.render())
        }
        "/live" => reply(StatusCode::OK, "text/plain", "live\n".into()),
        "/ready" if admin.is_ready() => reply(StatusCode::OK, "text/plain", "ready\n".into()),
        "/ready" => reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n".into()),
        "/debug/status" => reply(
            StatusCode::OK,
            "text/html; charset=utf-8",
            status::html(&status::snapshot(&admin.live.load(), &admin.client_id, ConfigStatus::now(&admin.config))),
        ),
        "/debug/status.json" => {
            json(&status::snapshot(&admin.live.load(), &admin.client_id, ConfigStatus::now(&admin.config)))
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}
