//! The gRPC listener's accept loop, feeding tonic's `serve_with_incoming_shutdown`. Each
//! connection gets TCP_NODELAY and is set up (a TLS handshake, or nothing) on a task of its own,
//! so that a slow handshake holds up no other. A failed accept (out of file descriptors, say)
//! pauses the loop instead of spinning it, unless only that connection failed. At most
//! `--max-connections` are open at once, each holding its place until tonic drops it; at the cap
//! the loop accepts no more until one closes, so new clients wait in the kernel's backlog.
//! Accepting stops, and the socket closes, when tonic drops the stream at shutdown.

use std::{
    future::Future,
    io::{self, ErrorKind},
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore, mpsc},
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use crate::{
    defaults::{ACCEPT_ERROR_PAUSE, ACCEPT_WARNING_INTERVAL, FIRST_BYTE_TIMEOUT},
    identity::Caller,
    metrics,
};

/// The connections `listener` accepts, each once `setup` made it ready and said who its caller
/// is (`None`: dropped), at most `max_connections` open at once.
pub fn incoming<T, F, Fut>(
    listener: TcpListener,
    max_connections: usize,
    setup: F,
) -> ReceiverStream<io::Result<Counted<T>>>
where
    T: Send + 'static,
    F: Fn(TcpStream, SocketAddr) -> Fut + Send + 'static,
    Fut: Future<Output = Option<(T, Caller)>> + Send + 'static,
{
    let (sender, receiver) = mpsc::channel(64);
    let places = Arc::new(Semaphore::new(max_connections));
    tokio::spawn(async move {
        let mut warned = None::<Instant>;
        let mut full = None::<Instant>;
        loop {
            if places.available_permits() == 0 && full.is_none_or(|at| at.elapsed() >= ACCEPT_WARNING_INTERVAL) {
                tracing::warn!(
                    max_connections,
                    "the gRPC listener holds its most connections; accepting no more until one closes"
                );
                full = Some(Instant::now());
            }
            let place = tokio::select! {
                place = places.clone().acquire_owned() => place.expect("the semaphore is never closed"),
                () = sender.closed() => return,
            };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = sender.closed() => return,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                // One connection's failure: the next accept may well succeed.
                Err(error) if matches!(error.kind(), ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset) => {
                    continue;
                }
                Err(error) => {
                    if warned.is_none_or(|at| at.elapsed() >= ACCEPT_WARNING_INTERVAL) {
                        tracing::warn!(%error, "accepting a gRPC connection failed; retrying");
                        warned = Some(Instant::now());
                    }
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let ready = setup(stream, peer);
            let sender = sender.clone();
            tokio::spawn(async move {
                if let Some((io, caller)) = ready.await {
                    metrics::record_connection(true);
                    let _ = sender.send(Ok(Counted { io, caller, _place: place })).await;
                }
            });
        }
    });
    ReceiverStream::new(receiver)
}

/// A connection holding its place among the `--max-connections` until it is dropped, and who
/// is calling on it.
pub struct Counted<T> {
    io: T,
    caller: Caller,
    _place: OwnedSemaphorePermit,
}

impl<T> Drop for Counted<T> {
    fn drop(&mut self) {
        metrics::record_connection(false);
    }
}

impl<T> Connected for Counted<T> {
    type ConnectInfo = Caller;

    fn connect_info(&self) -> Caller {
        self.caller.clone()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// `stream` once its client has sent something, within [`FIRST_BYTE_TIMEOUT`]; `None` (dropped)
/// if it did not. Over plaintext, no one knows who calls.
pub async fn speaking(stream: TcpStream) -> Option<(TcpStream, Caller)> {
    let mut first = [0; 1];
    match tokio::time::timeout(FIRST_BYTE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(1..)) => Some((stream, Caller::default())),
        _ => None,
    }
}
