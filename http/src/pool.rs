//! Connections to one upstream: the dialer (TCP, then TLS for `https://` upstreams) and the
//! pools. HTTP/1.1 connections carry one exchange at a time and are spoken by the own
//! codec ([`crate::h1`]); HTTP/2 connections multiplex: one, spoken by hyper, is shared by every
//! request and runs on a task of its own.

use std::{
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use http::{Request, Response, Uri, uri::Scheme};
use hyper::{
    body::Incoming,
    client::conn::{TrySendError, http2},
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::{AlertDescription, pki_types::ServerName};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tokio_rustls::{TlsConnector, client::TlsStream};

use crate::{
    body::{BoxError, Outgoing},
    defaults,
    h1::Http1Pool,
    sync::{self, Open, OpenCount},
};

/// Opens connections to the upstream: TCP, then TLS for `https://` upstreams.
pub(crate) struct Dialer {
    host: String,
    port: u16,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    /// HTTP/2 over TLS: the upstream must agree to `h2` by ALPN. (Many HTTP/1.1 servers ignore
    /// ALPN, so agreeing to nothing is fine for `http/1.1`.)
    h2: bool,
}

impl Dialer {
    /// `tls` has ALPN set to exactly the protocol of the pool that dials.
    fn new(url: &Uri, tls: rustls::ClientConfig) -> Result<Dialer, String> {
        let https = url.scheme() == Some(&Scheme::HTTPS);
        let host = url.host().ok_or("the url has no host")?;
        // Bracketed IPv6 literals connect and verify without their brackets.
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let h2 = tls.alpn_protocols.iter().any(|p| p == b"h2");
        let tls = if https {
            let name = ServerName::try_from(host.clone()).map_err(|e| format!("{host}: {e}"))?;
            Some((TlsConnector::from(Arc::new(tls)), name))
        } else {
            None
        };
        Ok(Dialer { host, port, tls, h2 })
    }

    pub(crate) async fn dial(&self) -> Result<Stream, BoxError> {
        let connect = TcpStream::connect((self.host.as_str(), self.port));
        let tcp = tokio::time::timeout(defaults::UPSTREAM_CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| format!("connecting to {}:{} timed out", self.host, self.port))?
            .map_err(|e| format!("cannot connect to {}:{}: {e}", self.host, self.port))?;
        // Requests are written whole: Nagle would only hold their last segment back.
        tcp.set_nodelay(true)?;
        match &self.tls {
            None => Ok(Stream::Plain(tcp)),
            Some((connector, name)) => {
                let no_h2 = || format!("{}:{} did not agree to HTTP/2 (ALPN h2) over TLS", self.host, self.port);
                let tls = connector.connect(name.clone(), tcp).await.map_err(|e| {
                    let refused = rustls::Error::AlertReceived(AlertDescription::NoApplicationProtocol);
                    match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
                        Some(e) if self.h2 && *e == refused => no_h2(),
                        _ => format!("TLS handshake: {e}"),
                    }
                })?;
                // An upstream that ignores ALPN would get an HTTP/2 preface it cannot read.
                if self.h2 && tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                    return Err(no_h2().into());
                }
                Ok(Stream::Tls(Box::new(tls)))
            }
        }
    }
}

/// A connection to the upstream, with or without TLS.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The HTTP/2 connections requests share: the first that has fewer than
/// [`STREAMS_PER_HTTP2_CONNECTION`](defaults::STREAMS_PER_HTTP2_CONNECTION) streams open takes
/// the next request, and a new one opens when all are that busy — so that long streams (gRPC
/// watches) cannot take up every stream an upstream allows one connection and keep the other
/// requests waiting. A spare connection left with no stream open is let go.
pub struct Http2Pool<B> {
    dialer: Dialer,
    connections: Mutex<Vec<Http2Connection<B>>>,
}

struct Http2Connection<B> {
    sender: http2::SendRequest<B>,
    streams: OpenCount,
}

// Not derived: a request body need not be `Clone` for its connection's handles to be.
impl<B> Clone for Http2Connection<B> {
    fn clone(&self) -> Self {
        Http2Connection { sender: self.sender.clone(), streams: self.streams.clone() }
    }
}

impl<B: Outgoing> Http2Pool<B> {
    fn new(dialer: Dialer) -> Http2Pool<B> {
        Http2Pool { dialer, connections: Mutex::new(Vec::new()) }
    }

    /// A connection with a stream to spare, and that stream, counted under the lock so that
    /// concurrent requests never take a connection past the limit; forgets closed connections,
    /// and spare ones with nothing open (checked as requests come).
    fn spare(&self) -> Option<(Http2Connection<B>, Open)> {
        let mut connections = sync::lock(&self.connections);
        connections.retain(|c| !c.sender.is_closed());
        let free = connections.iter().position(|c| c.streams.get() < defaults::STREAMS_PER_HTTP2_CONNECTION)?;
        let chosen = connections[free].clone();
        let stream = chosen.streams.open();
        let mut index = 0;
        connections.retain(|c| {
            index += 1;
            index <= free + 1 || c.streams.get() > 0
        });
        Some((chosen, stream))
    }

    /// Sends `req`; a request a shared connection refused before sending it (it was closing) is
    /// sent once more, on another. The response comes with its place among the connection's open
    /// streams, for its body to hold.
    pub async fn send(&self, mut req: Request<B>) -> Result<(Response<Incoming>, Open), BoxError> {
        let mut retried = false;
        loop {
            let ((Http2Connection { mut sender, .. }, stream), reused) = match self.spare() {
                Some(spare) => (spare, true),
                None => (Box::pin(self.connect()).await?, false),
            };
            match sender.try_send_request(req).await {
                Ok(response) => return Ok((response, stream)),
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) if reused && !retried => {
                        req = unsent;
                        retried = true;
                    }
                    _ => return Err(TrySendError::into_error(failed).into()),
                },
            }
        }
    }

    /// A new connection, shared from now on, with the first of its streams. Requests that find
    /// every connection busy at once each open one; those left without streams are let go.
    async fn connect(&self) -> Result<(Http2Connection<B>, Open), BoxError> {
        let io = TokioIo::new(self.dialer.dial().await?);
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .max_header_list_size(u32::try_from(defaults::UPSTREAM_MAX_HEADER_BYTES).unwrap_or(u32::MAX))
            .initial_stream_window_size(defaults::UPSTREAM_HTTP2_STREAM_WINDOW)
            .initial_connection_window_size(defaults::UPSTREAM_HTTP2_CONNECTION_WINDOW)
            .handshake(io)
            .await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream HTTP/2 connection failed");
            }
        });
        let connection = Http2Connection { sender, streams: OpenCount::default() };
        let stream = connection.streams.open();
        sync::lock(&self.connections).push(connection.clone());
        Ok((connection, stream))
    }
}

/// Both pools of one upstream; `tls` is the trust for `https://` urls.
pub fn pools<B: Outgoing>(url: &Uri, tls: &rustls::ClientConfig) -> Result<(Arc<Http1Pool>, Http2Pool<B>), String> {
    // ALPN offers exactly the version each pool speaks.
    let alpn = |protocol: &[u8]| {
        let mut config = tls.clone();
        config.alpn_protocols = vec![protocol.to_vec()];
        config
    };
    let http1 = Http1Pool::new(Dialer::new(url, alpn(b"http/1.1"))?);
    let http2 = Http2Pool::new(Dialer::new(url, alpn(b"h2"))?);
    Ok((Arc::new(http1), http2))
}
