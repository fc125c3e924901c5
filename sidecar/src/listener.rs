//! Accepting the application's connections: HTTP/1.1 and HTTP/2 prior knowledge on one port,
//! with a cap on open connections, header and idle timeouts, and a graceful drain at shutdown.

use std::{
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use pin_project_lite::pin_project;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
    time::Sleep,
};

use crate::{
    body::BoxError,
    plan::Plan,
    stack::{self, Stack},
};

/// Serves the `index`-th configured listener until `stop` turns true, then lets open
/// connections finish their requests for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    index: usize,
    live: Arc<ArcSwap<Plan>>,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) {
    // Every open connection holds a slot; all of them back means every connection has ended.
    let max_connections = u32::try_from(live.load().config.listeners[index].max_connections).unwrap_or(u32::MAX);
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
        let plan = live.load();
        let settings = &plan.config.listeners[index];
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(Ticked)
            .header_read_timeout(settings.header_read_timeout)
            // Head and body copied into one buffer and written at once: cheaper than queueing
            // them for writev for the small messages most calls are.
            .writev(false)
            .max_buf_size(settings.max_header_bytes.max(8192));
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
        let activity = Activity::default();
        let io = TokioIo::new(Tracked { stream, activity: activity.clone() });
        let service = TowerToHyperService::new(stack::stack(live.clone(), index));
        let connection = builder.serve_connection(io, service).into_owned();
        // Both deadlines are checked at ticks, so each is met within half of the shorter one.
        let tick = settings.idle_timeout.min(settings.header_read_timeout) / 2;
        let mut stop_wait = stop.clone();
        let serving = Serving {
            connection,
            peer,
            tick: tokio::time::sleep(tick),
            tick_period: tick,
            idle_timeout: settings.idle_timeout,
            activity,
            seen: 0,
            quiet_since: Instant::now(),
            stop: async move { stopped(&mut stop_wait).await },
            stop_seen: stop.clone(),
            armed: false,
            draining: false,
        };
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = serving.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, slots.acquire_many(max_connections)).await.is_err() {
        tracing::warn!(?grace, "connections still open after the grace period; closing them");
    }
}

pin_project! {
    /// One connection until it ends: closed once it moved no byte for `idle_timeout`, asked to
    /// finish its requests and close once the listener stops. A periodic tick and the stop signal
    /// wake the task themselves; between those wake-ups a poll costs only the connection's own
    /// work and two flag reads.
    struct Serving<C, S> {
        #[pin]
        connection: C,
        peer: SocketAddr,
        #[pin]
        tick: Sleep,
        tick_period: Duration,
        idle_timeout: Duration,
        activity: Activity,
        // The activity count at the last tick that saw traffic, and that tick's time.
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

/// An accepted connection, served by the listener's stack.
type Connection = auto::Connection<'static, TokioIo<Tracked>, TowerToHyperService<Stack>, TokioExecutor>;

impl<S: Future<Output = ()>> Future for Serving<Connection, S> {
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
        // At a tick, this poll is also when hyper finds a header-read deadline passed (`Ticked`).
        if let Poll::Ready(done) = this.connection.poll(cx) {
            return Poll::Ready(done);
        }
        if this.tick.is_elapsed() {
            let now = Instant::now();
            let count = this.activity.count();
            if count != *this.seen {
                *this.seen = count;
                *this.quiet_since = now;
            } else if now.duration_since(*this.quiet_since) >= *this.idle_timeout {
                tracing::debug!(peer = %this.peer, "closing an idle connection");
                return Poll::Ready(Ok(()));
            }
            this.tick.as_mut().reset((now + *this.tick_period).into());
            // The next tick registers on the next poll, with a fresh budget.
            *this.armed = false;
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

/// hyper's timer for the HTTP/1.1 header-read timeout, which it starts for every request head:
/// a bare deadline, checked whenever hyper polls it. The connection's tick (`Serving`) is what
/// wakes the task to poll it, which spares every request a registration with the runtime's timer.
#[derive(Clone)]
struct Ticked;

impl hyper::rt::Timer for Ticked {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(Deadline(deadline))
    }
}

struct Deadline(Instant);

impl Future for Deadline {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.0 { Poll::Ready(()) } else { Poll::Pending }
    }
}

impl hyper::rt::Sleep for Deadline {}

/// Resolves once `stop` turns true (or its sender is gone).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
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

/// A TCP stream that records its activity for the idle timeout.
struct Tracked {
    stream: TcpStream,
    activity: Activity,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
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
