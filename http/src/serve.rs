//! A listener's accept loop: each connection served on a task of its own, over HTTP/1.1 by the
//! own server or, if it opens with the HTTP/2 preface, by hyper's; at most `max_connections` at
//! once (beyond it accepting stops, so that the kernel's backlog pushes back); once told to
//! stop, accepting ends and open connections get a grace period to finish their requests.

use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body as HttpBody;
use tokio::{
    net::TcpListener,
    sync::{Semaphore, watch},
};
use tower::Service;

use crate::{
    Rejection,
    body::{BoxError, Downstream},
    h1::{self, Limits},
    h2,
    sync::stopped,
};

/// Serves `listener` until `stop` turns true, then lets open connections finish their requests
/// for up to `grace`. Each connection is served by the service and under the limits that
/// `connection` gives when it is accepted; `reject` renders what the HTTP layer refuses itself.
pub async fn serve<C, S, B>(
    listener: TcpListener,
    max_connections: usize,
    connection: C,
    reject: fn(Rejection) -> Response<B>,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) where
    C: Fn() -> (S, Limits),
    S: Service<Request<Downstream>, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + Send,
{
    // Every open connection holds a slot; all of them back means every connection has ended.
    let max_connections = u32::try_from(max_connections).unwrap_or(u32::MAX);
    let slots = Arc::new(Semaphore::new(max_connections as usize));
    loop {
        // Stop accepting at the cap: the kernel's backlog then pushes back on the application.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            _ = stopped(&mut stop) => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, typically: back off instead of spinning.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        let _ = stream.set_nodelay(true);
        let (service, limits) = connection();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let served = match h1::serve(stream, service.clone(), limits, stop.clone(), reject).await {
                Ok(Some((stream, preface))) => h2::serve(stream, preface, peer, service, limits, stop).await,
                other => other.map(drop),
            };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, slots.acquire_many(max_connections)).await.is_err() {
        tracing::warn!(?grace, "connections still open after the grace period; closing them");
    }
}
