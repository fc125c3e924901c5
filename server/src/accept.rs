//! The gRPC listener's accept loop, feeding tonic's `serve_with_incoming_shutdown`. Each
//! connection gets TCP_NODELAY and is set up (a TLS handshake, or nothing) on a task of its own,
//! so that a slow handshake holds up no other. A failed accept (out of file descriptors, say)
//! pauses the loop instead of spinning it, unless only that connection failed. Accepting stops,
//! and the socket closes, when tonic drops the stream at shutdown.

use std::{
    future::Future,
    io::{self, ErrorKind},
    net::SocketAddr,
    time::Instant,
};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_stream::wrappers::ReceiverStream;

use crate::defaults::{ACCEPT_ERROR_PAUSE, ACCEPT_WARNING_INTERVAL};

/// The connections `listener` accepts, each once `setup` made it ready (`None`: dropped).
pub fn incoming<T, F, Fut>(listener: TcpListener, setup: F) -> ReceiverStream<io::Result<T>>
where
    T: Send + 'static,
    F: Fn(TcpStream, SocketAddr) -> Fut + Send + 'static,
    Fut: Future<Output = Option<T>> + Send + 'static,
{
    let (sender, receiver) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut warned = None::<Instant>;
        loop {
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
                if let Some(connection) = ready.await {
                    let _ = sender.send(Ok(connection)).await;
                }
            });
        }
    });
    ReceiverStream::new(receiver)
}
