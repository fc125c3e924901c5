//! Connections to one upstream. An HTTP/1.1 connection carries one request at a time: the request
//! checks it out, drives it on its own task (no hand-off to a connection task and back) and, once
//! the response body has been read to its end, returns it idle. HTTP/2 connections multiplex: one
//! is shared by every request and runs on a task of its own.

use std::{
    collections::VecDeque,
    future::{Future, poll_fn},
    pin::{Pin, pin},
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll},
    time::Instant,
};

use http::{Request, Response, Uri};
use http_body::Body as _;
use hyper::{
    body::Incoming,
    client::conn::{TrySendError, http1, http2},
};
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::{
    client::legacy::connect::HttpConnector,
    rt::{TokioExecutor, TokioIo},
};
use tokio::net::TcpStream;
use tower::Service;

use crate::{body::BoxError, defaults};

pub type Connector = HttpsConnector<HttpConnector>;
type Io = MaybeHttpsStream<TokioIo<TcpStream>>;

/// Opens connections: TCP, then TLS for `https://` upstreams with ALPN offering exactly the
/// protocol of the pool that asks.
struct Dialer {
    connector: Connector,
    target: Uri,
}

impl Dialer {
    async fn dial(&self) -> Result<Io, BoxError> {
        self.connector.clone().call(self.target.clone()).await
    }
}

/// Idle HTTP/1.1 connections, most recently used last.
pub struct Http1Pool {
    dialer: Dialer,
    idle: Mutex<VecDeque<Idle>>,
}

struct Idle {
    connection: Box<Http1>,
    since: Instant,
}

/// One HTTP/1.1 connection: the handle requests are sent on and the state machine that does the
/// connection's I/O, which only runs while someone polls it. Boxed, as it moves between the pool,
/// a request and its response body.
struct Http1 {
    sender: http1::SendRequest<Incoming>,
    driver: http1::Connection<Io, Incoming>,
    /// The driver has finished: the connection is closed.
    closed: bool,
}

impl Http1 {
    /// Moves the connection's I/O along; true while it is open.
    fn poll_open(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.closed && Pin::new(&mut self.driver).poll(cx).is_ready() {
            self.closed = true;
        }
        !self.closed
    }

    /// Whether an idle connection can take a request now: still open (the upstream may have
    /// closed it while it sat in the pool) and done with its previous exchange.
    async fn usable(&mut self) -> bool {
        poll_fn(|cx| Poll::Ready(self.poll_open(cx) && matches!(self.sender.poll_ready(cx), Poll::Ready(Ok(()))))).await
    }

    /// Sends `req` and drives the connection until the response head arrives.
    async fn send(&mut self, req: Request<Incoming>) -> Result<Response<Incoming>, TrySendError<Request<Incoming>>> {
        let mut answer = pin!(self.sender.try_send_request(req));
        // The driver first: it writes the request and reads the response that `answer` yields.
        poll_fn(|cx| {
            self.poll_open(cx);
            answer.as_mut().poll(cx)
        })
        .await
    }
}

impl Http1Pool {
    pub fn new(connector: Connector, target: Uri) -> Http1Pool {
        Http1Pool { dialer: Dialer { connector, target }, idle: Mutex::new(VecDeque::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Idle>> {
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends `req` on an idle connection or a new one. A request the upstream never saw (its idle
    /// connection had closed) is sent again on the next one.
    pub async fn send(self: &Arc<Self>, mut req: Request<Incoming>) -> Result<(Response<Incoming>, Lease), BoxError> {
        loop {
            let (mut connection, reused) = match self.checkout().await {
                Some(connection) => (connection, true),
                // Boxed: opening a connection is rare, and its future would otherwise make every
                // request's future larger.
                None => (Box::pin(self.connect()).await?, false),
            };
            match connection.send(req).await {
                Ok(response) => {
                    let finished = response.body().is_end_stream();
                    let lease = Lease { connection: Some(connection), pool: self.clone(), finished };
                    return Ok((response, lease));
                }
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) if reused => req = unsent,
                    _ => return Err(failed.into_error().into()),
                },
            }
        }
    }

    async fn checkout(&self) -> Option<Box<Http1>> {
        loop {
            let Idle { mut connection, since } = self.lock().pop_back()?;
            if since.elapsed() <= defaults::UPSTREAM_POOL_IDLE_TIMEOUT && connection.usable().await {
                return Some(connection);
            }
        }
    }

    async fn connect(&self) -> Result<Box<Http1>, BoxError> {
        let io = self.dialer.dial().await?;
        // One flat write buffer, as for the application's connections (listener.rs).
        let (sender, driver) = http1::Builder::new().writev(false).handshake(io).await?;
        Ok(Box::new(Http1 { sender, driver, closed: false }))
    }

    /// Keeps a connection whose exchange is complete. Nobody polls an idle connection, so the
    /// ones idle past the timeout are closed here, as the next one comes back.
    fn check_in(&self, connection: Box<Http1>) {
        let now = Instant::now();
        let mut idle = self.lock();
        while idle.front().is_some_and(|i| now.duration_since(i.since) > defaults::UPSTREAM_POOL_IDLE_TIMEOUT) {
            idle.pop_front();
        }
        if idle.len() < defaults::UPSTREAM_POOL_IDLE {
            idle.push_back(Idle { connection, since: now });
        }
    }
}

/// An HTTP/1.1 connection checked out for one response, which its body drives. It goes back to
/// the pool if the body was read to its end, and is closed otherwise (HTTP/1.1 has no other way
/// to abandon a response).
pub struct Lease {
    connection: Option<Box<Http1>>,
    pool: Arc<Http1Pool>,
    finished: bool,
}

impl Lease {
    /// Reads more of the response (and writes more of the request body) into the connection's
    /// buffers and channels.
    pub fn poll_connection(&mut self, cx: &mut Context<'_>) {
        if let Some(connection) = &mut self.connection {
            connection.poll_open(cx);
        }
    }

    /// The response body has ended.
    pub fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take().filter(|c| self.finished && !c.closed) {
            self.pool.check_in(connection);
        }
    }
}

/// The HTTP/2 connection every request shares, opened on first use and again once it closes.
pub struct Http2Pool {
    dialer: Dialer,
    shared: Mutex<Option<http2::SendRequest<Incoming>>>,
}

impl Http2Pool {
    pub fn new(connector: Connector, target: Uri) -> Http2Pool {
        Http2Pool { dialer: Dialer { connector, target }, shared: Mutex::new(None) }
    }

    fn shared(&self) -> Option<http2::SendRequest<Incoming>> {
        let shared = self.shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        shared.as_ref().filter(|s| !s.is_closed()).cloned()
    }

    /// Sends `req`; a request the shared connection refused before sending it (it was closing) is
    /// sent again on a new connection.
    pub async fn send(&self, mut req: Request<Incoming>) -> Result<Response<Incoming>, BoxError> {
        loop {
            let (mut sender, reused) = match self.shared() {
                Some(sender) => (sender, true),
                None => (Box::pin(self.connect()).await?, false),
            };
            match sender.try_send_request(req).await {
                Ok(response) => return Ok(response),
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) if reused => req = unsent,
                    _ => return Err(failed.into_error().into()),
                },
            }
        }
    }

    /// Concurrent first requests may each open a connection; the last one opened is shared and
    /// the others close when their requests end.
    async fn connect(&self) -> Result<http2::SendRequest<Incoming>, BoxError> {
        let io = self.dialer.dial().await?;
        let (sender, connection) = http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream HTTP/2 connection failed");
            }
        });
        *self.shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(sender.clone());
        Ok(sender)
    }
}
