//! The HTTP debug listener: `/metrics`, `/healthz`, `/readyz`, `/debug/status` (HTML, with a page
//! per resource) and `/debug/status.json`. It runs on its own thread and runtime so it answers
//! while the gRPC side is saturated.

use std::{
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
    thread,
};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::{CONTENT_TYPE, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::{
    defaults::{ADMIN_HEADER_TIMEOUT, STATUS_LEASES_SHOWN},
    metrics,
    state::{self, State},
    status::{self, ResourceHistory},
};

/// Serves the server's debug listener on a thread of its own until the process exits.
pub fn spawn(
    listener: std::net::TcpListener,
    state: Arc<State>,
    history: Arc<Mutex<ResourceHistory>>,
    handle: PrometheusHandle,
) -> std::io::Result<()> {
    serve(listener, move |req| route(req, &state, &history, &handle))
}

/// Answers every GET on `listener` with `route`, on a thread and runtime of its own so that it
/// answers while the data path is saturated. Shared with the sidecar's admin listener.
pub fn serve<F>(listener: std::net::TcpListener, route: F) -> std::io::Result<()>
where
    F: Fn(&Request<Incoming>) -> Response<Full<Bytes>> + Send + Sync + 'static,
{
    let route = Arc::new(route);
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    thread::Builder::new().name("sluice-admin".into()).spawn(move || {
        runtime.block_on(async move {
            let listener = TcpListener::from_std(listener).expect("a non-blocking listener");
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors, typically: back off instead of spinning.
                        tracing::warn!(error = %e, "admin listener cannot accept");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let route = route.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        // hyper leaves out the body of an answer to HEAD.
                        let response = if req.method() == Method::GET || req.method() == Method::HEAD {
                            route(&req)
                        } else {
                            let mut refused = reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n".into());
                            refused
                                .headers_mut()
                                .insert(hyper::header::ALLOW, "GET, HEAD".parse().expect("a header value"));
                            refused
                        };
                        async move { Ok::<_, Infallible>(response) }
                    });
                    // A client that stops half-way through its request head is let go.
                    let mut http = http1::Builder::new();
                    http.timer(TokioTimer::new()).header_read_timeout(ADMIN_HEADER_TIMEOUT);
                    if let Err(e) = http.serve_connection(TokioIo::new(stream), service).await {
                        tracing::debug!(%peer, error = %e, "admin connection ended");
                    }
                });
            }
        })
    })?;
    Ok(())
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
            reply(StatusCode::OK, "text/plain; version=0.0.4", handle.render())
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

/// The value of one query parameter.
pub fn query(req: &Request<Incoming>, name: &str) -> Option<String> {
    let q = req.uri().query()?;
    form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
}

pub fn json(value: &impl serde::Serialize) -> Response<Full<Bytes>> {
    let body = serde_json::to_string_pretty(value).expect("status serialises");
    reply(StatusCode::OK, "application/json", body)
}

pub fn reply(code: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = code;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
