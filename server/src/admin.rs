//! The HTTP debug listener: `/metrics`, `/healthz`, `/readyz`, `/debug/status` (HTML, with a page
//! per resource) and `/debug/status.json`. It runs on its own thread and runtime
//! (`sluice_runtime::admin`) so it answers while the gRPC side is saturated.

use std::sync::Arc;

use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode,
    body::{Bytes, Incoming},
};
use metrics_exporter_prometheus::PrometheusHandle;
use sluice_runtime::admin::{json, query, reply, serve};

use crate::{
    defaults::STATUS_LEASES_SHOWN,
    metrics,
    state::{self, State},
    status,
};

/// Serves the server's debug listener on a thread of its own until the process exits.
pub fn spawn(listener: std::net::TcpListener, state: Arc<State>, handle: PrometheusHandle) -> std::io::Result<()> {
    serve(listener, move |req| route(req, &state, &handle))
}

fn route(req: &Request<Incoming>, state: &State, handle: &PrometheusHandle) -> Response<Full<Bytes>> {
    let resource = query(req, "resource");
    match req.uri().path() {
        "/metrics" => {
            let snapshot = status_of(state);
            metrics::publish(&snapshot);
            reply(StatusCode::OK, "text/plain; version=0.0.4", handle.render())
        }
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" if state.is_ready() => reply(StatusCode::OK, "text/plain", "ready\n".into()),
        "/readyz" => reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n".into()),
        "/debug/status" => match resource {
            None => reply(StatusCode::OK, "text/html; charset=utf-8", status::server_html(&status_of(state))),
            Some(id) => match detail(state, &id) {
                Some(d) => reply(StatusCode::OK, "text/html; charset=utf-8", status::resource_html(&d)),
                None => unknown(&id),
            },
        },
        "/debug/status.json" => match resource {
            None => json(&status_of(state)),
            Some(id) => match detail(state, &id) {
                Some(d) => json(&d),
                None => unknown(&id),
            },
        },
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

fn status_of(state: &State) -> status::ServerStatus {
    let ledger = state.ledger();
    status::server(&ledger, state::now(), state)
}

fn detail(state: &State, id: &str) -> Option<status::ResourceDetail> {
    status::resource_detail(&state.ledger(), id, state::now(), STATUS_LEASES_SHOWN)
}

fn unknown(id: &str) -> Response<Full<Bytes>> {
    reply(StatusCode::NOT_FOUND, "text/plain", format!("no resource {id:?} (no unexpired leases)\n"))
}
