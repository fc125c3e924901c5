//! Accepting the application's connections: HTTP/1.1 and HTTP/2 prior knowledge on one port,
//! with a cap on open connections, header and idle timeouts, and a graceful drain at shutdown.

use std::{
    io,
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
    server::{conn::auto, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
};

use crate::{plan::Plan, stack};

/// Serves the `index`-th configured listener until `stop` turns true, then lets open
/// connections finish their requests for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    index: usize,
    live: Arc<ArcSwap<Plan>>,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) {
    let max_connections = live.load().config.listeners[index].max_connections;
    let slots = Arc::new(Semaphore::new(max_connections));
    let graceful = GracefulShutdown::new();
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
            .timer(TokioTimer::new())
            .header_read_timeout(settings.header_read_timeout)
            .max_buf_size(settings.max_header_bytes.max(8192));
        builder.http2().timer(TokioTimer::new()).max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
        let idle_timeout = settings.idle_timeout;
        let activity = Activity::default();
        let io = TokioIo::new(Tracked { stream, activity: activity.clone() });
        let service = TowerToHyperService::new(stack::stack(live.clone(), index));
        let connection = builder.serve_connection(io, service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _slot = slot;
            tokio::pin!(connection);
            loop {
                let idle_for = activity.idle();
                if idle_for >= idle_timeout {
                    tracing::debug!(%peer, "closing an idle connection");
                    break;
                }
                tokio::select! {
                    done = &mut connection => {
                        if let Err(e) = done {
                            tracing::debug!(%peer, error = %e, "connection ended with an error");
                        }
                        return;
                    }
                    _ = tokio::time::sleep(idle_timeout - idle_for) => {}
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(?grace, "connections still open after the grace period; closing them");
    }
}

/// Resolves once `stop` turns true (or its sender is gone).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// When a connection last moved a byte.
#[derive(Clone)]
struct Activity {
    origin: Instant,
    /// Milliseconds since `origin`.
    last: Arc<AtomicU64>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity { origin: Instant::now(), last: Arc::new(AtomicU64::new(0)) }
    }
}

impl Activity {
    fn touch(&self) {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(now, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        self.origin.elapsed().saturating_sub(Duration::from_millis(self.last.load(Ordering::Relaxed)))
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
