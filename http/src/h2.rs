//! The application's HTTP/2 prior-knowledge connections, served by hyper with a service of its
//! user's: each stream on a task of its own under the send timeout, the connection under its
//! idle timeout, and asked to finish and close when the listener stops.

use std::{
    convert::Infallible,
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::Either;
use hyper::{body::Incoming, server::conn::http2};
use hyper_util::rt::{TokioIo, TokioTimer};
use pin_project_lite::pin_project;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    sync::watch,
    task::futures::TaskLocalFuture,
    time::Sleep,
};
use tower::{Service, ServiceExt, util::Oneshot};

use crate::{
    body::{BoxError, Downstream, Guarded},
    defaults::{HTTP2_SEND_BUFFER, HTTP2_WINDOW, MAX_HTTP2_STREAMS},
    h1::Limits,
    sync::{Open, OpenCount, stopped},
    time::{self, Timer},
};

/// Serves an HTTP/2 prior-knowledge connection with `service`; `preface` is what was read of it
/// to tell it from HTTP/1.1.
pub async fn serve<S, B>(
    stream: TcpStream,
    preface: Bytes,
    peer: SocketAddr,
    service: S,
    limits: Limits,
    stop: watch::Receiver<bool>,
) -> Result<(), BoxError>
where
    S: Service<Request<Downstream>, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut builder = http2::Builder::new(StreamExecutor { send_timeout: limits.send_timeout });
    builder
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(MAX_HTTP2_STREAMS)
        .initial_stream_window_size(HTTP2_WINDOW)
        .initial_connection_window_size(HTTP2_WINDOW)
        .max_send_buf_size(HTTP2_SEND_BUFFER);
    let activity = Activity::default();
    let io = TokioIo::new(Tracked { stream, preface, activity: activity.clone() });
    let streams = OpenCount::default();
    let connection = builder.serve_connection(io, Http2Service { service, streams: streams.clone() });
    let tick = limits.idle_timeout / 2;
    let mut stop_wait = stop.clone();
    Serving {
        connection,
        peer,
        tick: tokio::time::sleep(tick),
        tick_period: tick,
        idle_timeout: limits.idle_timeout,
        activity,
        streams,
        seen: 0,
        quiet_since: Instant::now(),
        stop: async move { stopped(&mut stop_wait).await },
        stop_seen: stop,
        armed: false,
        draining: false,
    }
    .await
}

/// The service as hyper's HTTP/2 server calls it, counting the connection's open streams: a
/// request is open from its call until its response body ends.
#[derive(Clone)]
struct Http2Service<S> {
    service: S,
    streams: OpenCount,
}

/// A response body on an application's HTTP/2 stream: it keeps the stream counted open until it
/// is dropped, and tells the stream's progress of each piece it hands hyper to send.
type StreamBody<B> = Guarded<Reported<B>, Option<Open>>;

impl<S, B> hyper::service::Service<Request<Incoming>> for Http2Service<S>
where
    S: Service<Request<Downstream>, Response = Response<B>, Error = Infallible> + Clone,
{
    type Response = Response<StreamBody<B>>;
    type Error = Infallible;
    type Future = Counted<S>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let call = self.service.clone().oneshot(request.map(Either::Right));
        Counted { call, stream: Some(self.streams.open()) }
    }
}

pin_project! {
    /// A call of the service that counts as an open stream, and hands that count to the
    /// response body.
    struct Counted<S: Service<Request<Downstream>>> {
        #[pin]
        call: Oneshot<S, Request<Downstream>>,
        stream: Option<Open>,
    }
}

impl<S, B> Future for Counted<S>
where
    S: Service<Request<Downstream>, Response = Response<B>, Error = Infallible>,
{
    type Output = Result<Response<StreamBody<B>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.call.poll(cx))?;
        // Polled on the stream's task: the head goes to hyper to send, and the application has
        // to take it (and the body after it) within the send timeout.
        let progress = Progress::current();
        if let Some(progress) = &progress {
            progress.handed();
        }
        let stream = this.stream.take();
        Poll::Ready(Ok(response.map(|inner| Guarded::new(Reported { inner, progress }, stream))))
    }
}

pin_project! {
    /// A body that tells its stream's `progress` of each piece it hands over to be sent.
    struct Reported<B> {
        #[pin]
        inner: B,
        progress: Option<Arc<Progress>>,
    }
}

impl<B: HttpBody> HttpBody for Reported<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let Some(progress) = this.progress {
            match &polled {
                Poll::Ready(Some(Ok(_))) => progress.handed(),
                _ => progress.taken(),
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

tokio::task_local! {
    /// The progress of the HTTP/2 stream whose task is running.
    static STREAM: Arc<Progress>;
}

/// How an HTTP/2 stream's response is getting on: whether what it last handed hyper to send (its
/// head, a piece of its body) still waits for the application to make room for it.
#[derive(Default)]
pub struct Progress {
    /// Pieces handed over so far.
    handed: AtomicU64,
    /// The last one has not been taken yet: hyper has not asked for the next.
    waiting: AtomicBool,
}

impl Progress {
    /// The progress of the HTTP/2 stream this runs on, if any.
    fn current() -> Option<Arc<Progress>> {
        STREAM.try_with(Arc::clone).ok()
    }

    /// A piece went to hyper to send: it waits for the application's flow-control window.
    pub fn handed(&self) {
        self.handed.fetch_add(1, Ordering::Relaxed);
        self.waiting.store(true, Ordering::Relaxed);
    }

    /// Hyper asked the body for more (it found room for what it had): the body waits for the
    /// upstream now, or has ended.
    pub fn taken(&self) {
        self.waiting.store(false, Ordering::Relaxed);
    }
}

/// Runs each HTTP/2 stream of an application's connection on a task of its own, as hyper's
/// `TokioExecutor` does, and ends it (hyper resets the stream, its response body and the
/// request's permits go) once what it handed over has waited for the application for
/// `send_timeout`. The body cannot time this out itself: hyper polls it only when the stream's
/// flow-control window has room, so a window the application keeps shut leaves it unpolled.
#[derive(Clone)]
struct StreamExecutor {
    send_timeout: Duration,
}

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for StreamExecutor {
    fn execute(&self, stream: F) {
        let progress = Arc::new(Progress::default());
        tokio::spawn(SendTimed {
            stream: STREAM.scope(progress.clone(), stream),
            progress,
            timeout: self.send_timeout,
            timer: Timer::default(),
            armed_for: 0,
        });
    }
}

pin_project! {
    /// An HTTP/2 stream's task under its send timeout.
    struct SendTimed<F: Future> {
        #[pin]
        stream: TaskLocalFuture<Arc<Progress>, F>,
        progress: Arc<Progress>,
        timeout: Duration,
        timer: Timer,
        // The hand-over the timer runs for (0: none, the first is 1).
        armed_for: u64,
    }
}

impl<F: Future<Output = ()>> Future for SendTimed<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        if this.stream.poll(cx).is_ready() {
            return Poll::Ready(());
        }
        if !this.progress.waiting.load(Ordering::Relaxed) {
            return Poll::Pending;
        }
        let handed = this.progress.handed.load(Ordering::Relaxed);
        if *this.armed_for != handed {
            *this.armed_for = handed;
            this.timer.start(*this.timeout);
        }
        if this.timer.poll_fired(cx).is_ready() {
            tracing::debug!(timeout = ?this.timeout, "an HTTP/2 answer waited for the application past the send timeout; stream reset");
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

pin_project! {
    /// One connection until it ends: once it has had no stream open and moved no byte for
    /// `idle_timeout` it is sent a GOAWAY and closes (as Envoy's `idle_timeout`: a long call or
    /// a quiet stream is not idle), and it is asked to finish its requests and close once the
    /// listener stops. A periodic tick and the stop signal wake the task themselves; between
    /// those wake-ups a poll costs only the connection's own work and two flag reads.
    struct Serving<C, S> {
        #[pin]
        connection: C,
        peer: SocketAddr,
        #[pin]
        tick: Sleep,
        tick_period: Duration,
        idle_timeout: Duration,
        activity: Activity,
        streams: OpenCount,
        // The activity count at the last tick that saw traffic or an open stream, and that
        // tick's time.
        seen: u64,
        quiet_since: Instant,
        #[pin]
        stop: S,
        stop_seen: watch::Receiver<bool>,
        // The tick and the stop signal have registered this task's waker.
        armed: bool,
        draining: bool,
    }
}

/// An HTTP/2 connection, served by its user's service.
type Connection<S> = http2::Connection<TokioIo<Tracked>, Http2Service<S>, StreamExecutor>;

impl<T, B, S> Future for Serving<Connection<T>, S>
where
    T: Service<Request<Downstream>, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    T::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    S: Future<Output = ()>,
{
    type Output = Result<(), BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // Both before the connection spends the task's budget: a timer or channel polled
        // without budget does not register the waker.
        let stop_due = !*this.armed || this.stop_seen.has_changed().unwrap_or(true);
        if !*this.draining && stop_due && this.stop.as_mut().poll(cx).is_ready() {
            *this.draining = true;
            this.connection.as_mut().graceful_shutdown();
        }
        if !*this.armed {
            let _ = this.tick.as_mut().poll(cx);
            *this.armed = true;
        }
        if let Poll::Ready(done) = this.connection.as_mut().poll(cx) {
            return Poll::Ready(done.map_err(Into::into));
        }
        if this.tick.is_elapsed() {
            let now = Instant::now();
            let count = this.activity.count();
            if count != *this.seen || this.streams.get() > 0 {
                *this.seen = count;
                *this.quiet_since = now;
            } else if now.duration_since(*this.quiet_since) >= *this.idle_timeout {
                if *this.draining {
                    // Told to go away (the GOAWAY itself restarted the quiet time), or asked to
                    // stop with the listener, and quiet since for `idle_timeout`: close.
                    return Poll::Ready(Ok(()));
                }
                tracing::debug!(peer = %this.peer, "closing an idle connection");
                *this.draining = true;
                this.connection.as_mut().graceful_shutdown();
                // The GOAWAY goes out as the connection is polled again.
                cx.waker().wake_by_ref();
            }
            this.tick.as_mut().reset(time::after(now, *this.tick_period).into());
            // The next tick registers on the next poll, with a fresh budget.
            *this.armed = false;
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

/// How many reads and writes a connection has done.
#[derive(Clone, Default)]
struct Activity(Arc<AtomicU64>);

impl Activity {
    fn touch(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A TCP stream that records its activity for the idle timeout, and first gives back what was
/// read of it before.
struct Tracked {
    stream: TcpStream,
    preface: Bytes,
    activity: Activity,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.preface.is_empty() {
            let n = self.preface.len().min(buf.remaining());
            buf.put_slice(&self.preface.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if polled.is_ready() {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        if polled.is_ready() {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if polled.is_ready() {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
