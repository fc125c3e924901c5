//! The HTTP admin listener both binaries run (`/metrics`, probes, status pages): every GET is
//! answered by the caller's route, on a thread and runtime of its own so that it answers while
//! the data path is saturated. The `/debug/` pages, which show every client and its demand, can
//! have a listener of their own (`--debug-addr`, e.g. on loopback for `kubectl port-forward`)
//! while probes and `/metrics` stay where the kubelet and Prometheus reach them.
//!
//! Its memory is bounded whatever clients do: at most [`ADMIN_MAX_CONNECTIONS`] connections,
//! each with small buffers, let go when idle ([`ADMIN_HEADER_TIMEOUT`]) or when they stop
//! taking their answer ([`ADMIN_WRITE_TIMEOUT`], [`ADMIN_ANSWER_TIMEOUT`]); and at most
//! [`ADMIN_ANSWERS_AT_ONCE`] answers rendered and in flight, however many ask.

use std::{
    convert::Infallible,
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    thread,
    time::{Duration, Instant},
};

use http_body_util::{BodyExt, Full};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Body, Bytes, Frame, Incoming, SizeHint},
    header::{CONTENT_TYPE, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpListener,
    sync::{OwnedSemaphorePermit, Semaphore, oneshot},
    time::Sleep,
};

use crate::defaults::{
    ADMIN_ACCEPT_PAUSE, ADMIN_ANSWER_TIMEOUT, ADMIN_ANSWERS_AT_ONCE, ADMIN_BUFFER_BYTES, ADMIN_CHUNK_BYTES,
    ADMIN_HEADER_TIMEOUT, ADMIN_MAX_CONNECTIONS, ADMIN_WRITE_TIMEOUT,
};

/// The pages under this prefix go to the debug listener when there is one.
const DEBUG_PAGES: &str = "/debug/";

/// Which of the routes one listener answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Share {
    All,
    /// The `/debug/` pages only (the debug listener).
    Debug,
    /// All but the `/debug/` pages (the admin listener beside a debug listener).
    NotDebug,
}

impl Share {
    fn serves(self, path: &str) -> bool {
        let debug = path.starts_with(DEBUG_PAGES);
        match self {
            Share::All => true,
            Share::Debug => debug,
            Share::NotDebug => !debug,
        }
    }
}

/// Answers every GET on `admin` with `route` until the process exits, the `/debug/` pages on
/// `debug` instead when given (and nothing else there). The `probes` (paths whose answers are a
/// few bytes: liveness and readiness) are answered at once; every other page is rendered on a
/// thread of its own, one at a time, once one of the [`ADMIN_ANSWERS_AT_ONCE`] turns is free, so
/// that probes and accepting go on while a large page renders and a kubelet's probe is never
/// queued behind large pages.
pub fn serve<F>(
    admin: std::net::TcpListener,
    debug: Option<std::net::TcpListener>,
    probes: &'static [&'static str],
    route: F,
) -> std::io::Result<()>
where
    F: Fn(&Request<Incoming>) -> Response<Full<Bytes>> + Send + Sync + 'static,
{
    let route = Arc::new(route);
    match debug {
        None => serve_share(admin, probes, Share::All, route),
        Some(debug) => {
            serve_share(admin, probes, Share::NotDebug, route.clone())?;
            serve_share(debug, &[], Share::Debug, route)
        }
    }
}

fn serve_share<F>(
    listener: std::net::TcpListener,
    probes: &'static [&'static str],
    share: Share,
    route: Arc<F>,
) -> std::io::Result<()>
where
    F: Fn(&Request<Incoming>) -> Response<Full<Bytes>> + Send + Sync + 'static,
{
    let (renderer, to_render) = std::sync::mpsc::channel::<(Request<Incoming>, Rendered)>();
    let rendering = route.clone();
    thread::Builder::new().name("sluice-admin-pages".into()).spawn(move || {
        for (req, rendered) in to_render {
            let _ = rendered.send(rendering(&req));
        }
    })?;
    let turns = Arc::new(Semaphore::new(ADMIN_ANSWERS_AT_ONCE));
    let pages = Arc::new(Pages { route, probes, share, turns, renderer });
    let connections = Arc::new(Semaphore::new(ADMIN_MAX_CONNECTIONS));
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
                // Over the cap, closed at once: waiting in the backlog instead would hold up
                // probes behind connections that may never end.
                let Ok(held) = connections.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, "admin connection refused: {ADMIN_MAX_CONNECTIONS} open");
                    continue;
                };
                let pages = pages.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| pages.clone().answer(req));
                    let mut http = http1::Builder::new();
                    // A client that stops half-way through its request head, or sends none, is
                    // let go.
                    http.timer(TokioTimer::new())
                        .header_read_timeout(ADMIN_HEADER_TIMEOUT)
                        .max_buf_size(ADMIN_BUFFER_BYTES);
                    let io = TokioIo::new(Patient::new(stream, ADMIN_WRITE_TIMEOUT));
                    if let Err(e) = http.serve_connection(io, service).await {
                        tracing::debug!(%peer, error = %e, "admin connection ended");
                    }
                    drop(held);
                });
            }
        })
    })?;
    Ok(())
}

/// Where a page rendered on the pages' thread is sent back.
type Rendered = oneshot::Sender<Response<Full<Bytes>>>;

/// What the listener answers with, and what bounds it.
struct Pages<F> {
    route: Arc<F>,
    probes: &'static [&'static str],
    share: Share,
    turns: Arc<Semaphore>,
    renderer: std::sync::mpsc::Sender<(Request<Incoming>, Rendered)>,
}

impl<F> Pages<F>
where
    F: Fn(&Request<Incoming>) -> Response<Full<Bytes>>,
{
    /// `req`'s answer: a probe's at once, any other page's once a turn is free, which the
    /// answer keeps while it is handed over.
    async fn answer(self: Arc<Self>, req: Request<Incoming>) -> Result<Response<Answer>, Infallible> {
        let (response, turn) = if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut refused = reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n".into());
            refused.headers_mut().insert(hyper::header::ALLOW, "GET, HEAD".parse().expect("a header value"));
            (refused, None)
        } else if !self.share.serves(req.uri().path()) {
            let elsewhere = match self.share {
                Share::Debug => "only the /debug/ pages are served here\n",
                _ => "the /debug/ pages are served on --debug-addr\n",
            };
            (reply(StatusCode::NOT_FOUND, "text/plain", elsewhere.into()), None)
        } else if self.probes.contains(&req.uri().path()) {
            ((self.route)(&req), None)
        } else {
            let turn = self.turns.clone().acquire_owned().await.expect("the semaphore is never closed");
            let (rendered, answer) = oneshot::channel();
            let _ = self.renderer.send((req, rendered));
            let failed =
                || reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", "the page failed to render\n".into());
            (answer.await.unwrap_or_else(|_| failed()), Some(turn))
        };
        // hyper leaves out the body of an answer to HEAD.
        let (head, body) = response.into_parts();
        let whole = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(never) => match never {},
        };
        Ok(Response::from_parts(head, Answer::new(whole, turn)))
    }
}

/// A rendered answer, handed to its connection [`ADMIN_CHUNK_BYTES`] at a time as it has room;
/// it holds its turn until the last chunk is taken, then frees the whole.
struct Answer {
    whole: Bytes,
    taken: usize,
    turn: Option<OwnedSemaphorePermit>,
    deadline: Instant,
}

impl Answer {
    fn new(whole: Bytes, turn: Option<OwnedSemaphorePermit>) -> Answer {
        Answer { whole, taken: 0, turn, deadline: Instant::now() + ADMIN_ANSWER_TIMEOUT }
    }
}

impl Body for Answer {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        if this.taken == this.whole.len() {
            return Poll::Ready(None);
        }
        if Instant::now() > this.deadline {
            return Poll::Ready(Some(Err(io::Error::new(io::ErrorKind::TimedOut, "answer not taken in time"))));
        }
        let end = this.whole.len().min(this.taken + ADMIN_CHUNK_BYTES);
        let chunk = Bytes::copy_from_slice(&this.whole[this.taken..end]);
        this.taken = end;
        if end == this.whole.len() {
            this.whole = Bytes::new();
            this.taken = 0;
            this.turn = None;
        }
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.taken == self.whole.len()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact((self.whole.len() - self.taken) as u64)
    }
}

/// A connection whose writes fail once they have waited `limit` for the client to take
/// anything.
struct Patient<T> {
    io: T,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> Patient<T> {
    fn new(io: T, limit: Duration) -> Patient<T> {
        Patient { io, limit, stalled: None }
    }

    /// `polled`, unless the write has been pending for `limit`.
    fn progress<R>(&mut self, polled: Poll<io::Result<R>>, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client takes nothing"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Patient<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Patient<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.progress(polled, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.progress(polled, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.progress(polled, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.progress(polled, cx)
    }
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
