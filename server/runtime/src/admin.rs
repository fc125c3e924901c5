//! The HTTP admin listener both binaries run (`/metrics`, probes, status pages): every GET is
//! answered by the caller's route, on a thread and runtime of its own so that it answers while
//! the data path is saturated.

use std::{convert::Infallible, sync::Arc, thread};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::{CONTENT_TYPE, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::defaults::{ADMIN_ACCEPT_PAUSE, ADMIN_HEADER_TIMEOUT};

/// Answers every GET on `listener` with `route` until the process exits.
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
                        tokio::time::sleep(ADMIN_ACCEPT_PAUSE).await;
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
