//! The HTTP debug listener: `/metrics`, `/healthz`, `/readyz`, `/debug/status` (HTML, with a page
//! per resource) and `/debug/status.json`. It runs on its own thread and runtime
//! (`sluice_runtime::admin`) so it answers while the gRPC side is saturated.

use std::sync::{Arc, Mutex, PoisonError};

use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode,
    body::{Bytes, Incoming},
};
use metrics_exporter_prometheus::PrometheusHandle;
use sluice_runtime::{
    admin::{json, query, reply, serve},
    procstat,
};

use crate::{
    defaults::STATUS_LEASES_SHOWN,
    metrics,
    state::{self, State},
    status::{self, ResourceHistory},
};

/// Serves the server's admin listener (and its debug pages on `debug`, when given) on a thread
/// of its own until the process exits.
pub fn spawn(
    listener: std::net::TcpListener,
    debug: Option<std::net::TcpListener>,
    state: Arc<State>,
    history: Arc<Mutex<ResourceHistory>>,
    handle: PrometheusHandle,
) -> std::io::Result<()> {
    serve(listener, debug, &["/healthz", "/readyz"], move |req| route(req, &state, &history, &handle))
}

fn route(
    req: &Request<Incoming>,
    state: &State,
    history: &Mutex<ResourceHistory>,
    handle: &PrometheusHandle,
) -> Response<Full<Bytes>> {
    let resource = query(req, "resource");
    match req.uri().path() {
        "/metrics" => {
            let snapshot = status_of(state);
            metrics::publish(&snapshot);
            let page = handle.render() + &procstat::exposition("sluice-server", env!("CARGO_PKG_VERSION"));
            reply(StatusCode::OK, "text/plain; version=0.0.4", page)
        }
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" if state.is_ready() => reply(StatusCode::OK, "text/plain", "ready\n".into()),
        "/readyz" => reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n".into()),
        "/debug/status" => {
            let (now, end) = (state::now(), state::precise_now());
            let page = match resource {
                None => {
                    status::server_html(&status_of(state), &history.lock().unwrap_or_else(PoisonError::into_inner), end)
                }
                Some(id) => match detail(state, &id) {
                    Some(d) => {
                        status::resource_html(&d, &history.lock().unwrap_or_else(PoisonError::into_inner), now, end)
                    }
                    None => return unknown(&id),
                },
            };
            reply(StatusCode::OK, "text/html; charset=utf-8", page)
        }
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
