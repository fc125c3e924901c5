//! Connections to one upstream. An HTTP/1.1 connection carries one exchange at a time and is
//! spoken by the sidecar's own codec (h1.rs) on the request's task: the request checks a connection
//! out, writes itself, reads the response head, and hands the connection to the response body,
//! which reads the body and, at its end, returns the connection idle. HTTP/2 connections
//! multiplex: one, spoken by hyper, is shared by every request and runs on a task of its own.

use std::{
    collections::VecDeque,
    future::poll_fn,
    io,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll, ready},
    time::Instant,
};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version, header::CONTENT_LENGTH, uri::Scheme};
use http_body::{Body as _, Frame, SizeHint};
use hyper::{
    body::Incoming,
    client::conn::{TrySendError, http2},
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::{AlertDescription, pki_types::ServerName};
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf},
    net::TcpStream,
};
use tokio_rustls::{TlsConnector, client::TlsStream};

use crate::{
    body::{BoxError, RequestBody, RequestBodyFailed},
    defaults,
    h1::{self, Coding, Framing, Malformed, ResponseHead},
    sync::{self, Open, OpenCount},
};

/// Opens connections to the upstream: TCP, then TLS for `https://` upstreams.
struct Dialer {
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

    async fn dial(&self) -> Result<Stream, BoxError> {
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
pub enum Stream {
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

/// Idle HTTP/1.1 connections, most recently used last.
pub struct Http1Pool {
    dialer: Dialer,
    idle: Mutex<VecDeque<Idle>>,
}

struct Idle {
    connection: Box<Http1>,
    since: Instant,
}

/// One HTTP/1.1 connection. Boxed, as it moves between the pool, a request and its response body.
struct Http1 {
    io: Stream,
    /// Bytes read and not yet taken: between exchanges, always empty.
    input: BytesMut,
    /// The request head being written, kept to spare each request an allocation.
    output: BytesMut,
    /// The last response allows another exchange on this connection.
    reusable: bool,
}

/// How sending a request body ended.
enum Sent {
    Whole,
    /// The upstream's final response came before the body's end, whose rest is not sent.
    Answered(ResponseHead),
    /// The connection failed or closed: the upstream may have answered before, refusing the rest.
    Broken(io::Error),
}

/// An exchange that failed; `Unsent` gives the request back when RFC 9112 §9.3.1 lets it go
/// again: its head never went out whole, so the upstream cannot have acted on it; or the
/// connection closed without a byte of answer to a bodiless request of a method that may be
/// repeated (idempotent, RFC 9110 §9.2.2), which the upstream may have seen.
enum Failure {
    // Boxed: the rare way out should not make every exchange's result larger.
    Unsent(Box<Request<RequestBody>>),
    Failed(BoxError),
}

macro_rules! failed_from {
    ($($error:ty),*) => {$(
        impl From<$error> for Failure {
            fn from(e: $error) -> Failure {
                Failure::Failed(e.into())
            }
        }
    )*};
}

failed_from!(io::Error, Malformed, &'static str, String);

impl Http1 {
    fn new(io: Stream) -> Http1 {
        Http1 { io, input: BytesMut::new(), output: BytesMut::with_capacity(512), reusable: true }
    }

    /// Whether an idle connection is still open: the upstream may have closed it, or sent bytes
    /// nobody asked for, while it sat in the pool. A read that would block says it is fine.
    fn poll_still_open(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        Poll::Ready(h1::poll_read_more(&mut self.io, &mut self.input, cx).is_pending())
    }

    /// Writes `req` and reads the response head. An upstream may answer before it has read the
    /// request body (413, 401) and then stop reading or close: its answer is watched for while the
    /// body goes out, and ends the sending.
    async fn exchange(&mut self, req: Request<RequestBody>) -> Result<(ResponseHead, Framing), Failure> {
        let (parts, mut body) = req.into_parts();
        let framing = self.write_head(&parts.method, &parts.uri, &parts.headers, &body);
        let untouched = body.is_end_stream();
        if let Err(e) = self.io.write_all(&self.output).await {
            tracing::debug!(error = %e, "upstream connection failed before the request was written");
            return Err(Failure::Unsent(Box::new(Request::from_parts(parts, body))));
        }
        let sent = if untouched {
            self.io.flush().await?;
            Sent::Whole
        } else {
            self.write_body(&mut body, framing).await?
        };
        // The upstream takes whatever follows a body cut short for more of it: the connection
        // carries nothing after this response.
        let whole = matches!(sent, Sent::Whole);
        let (answered, broken) = match sent {
            Sent::Whole => (None, None),
            Sent::Answered(head) => (Some(head), None),
            Sent::Broken(e) => (None, Some(e)),
        };
        let head = match answered {
            Some(head) => head,
            None => loop {
                if let Some(head) = self.final_head()? {
                    break head;
                }
                let read = poll_fn(|cx| h1::poll_read_more(&mut self.io, &mut self.input, cx)).await;
                match read {
                    // The upstream closed an idle connection as the request went out: it never
                    // handled a request that could be repeated safely.
                    Ok(0) | Err(_) if self.input.is_empty() && untouched && idempotent(&parts.method) => {
                        return Err(Failure::Unsent(Box::new(Request::from_parts(parts, body))));
                    }
                    Ok(0) | Err(_) => {
                        // Nothing came after the body failed to go out: that failure is the story.
                        if let Some(e) = broken {
                            return Err(format!("sending the request body: {e}").into());
                        }
                        return Err(match read {
                            Err(e) => e.into(),
                            Ok(_) => "the upstream closed the connection before responding".into(),
                        });
                    }
                    Ok(_) => {}
                }
            },
        };
        if head.status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(Malformed("the upstream switched protocols unasked").into());
        }
        let framing = response_framing(&parts.method, &head)?;
        self.reusable = whole && framing != Framing::UntilClose && h1::keep_alive(head.version, &head.headers);
        Ok((head, framing))
    }

    /// Takes the final response head off `input` once it is all there, dropping the interim
    /// responses before it (100 Continue and the like).
    fn final_head(&mut self) -> Result<Option<ResponseHead>, Malformed> {
        loop {
            match h1::parse_response(&mut self.input, defaults::UPSTREAM_MAX_HEADER_BYTES)? {
                Some(head) if head.status.is_informational() && head.status != StatusCode::SWITCHING_PROTOCOLS => {}
                Some(head) => return Ok(Some(head)),
                None if self.input.len() > defaults::UPSTREAM_MAX_HEADER_BYTES => {
                    return Err(Malformed("response head too large"));
                }
                None => return Ok(None),
            }
        }
    }

    /// Puts the request head into `output`; returns how the body is framed.
    fn write_head(&mut self, method: &Method, uri: &Uri, headers: &HeaderMap, body: &RequestBody) -> Framing {
        let out = &mut self.output;
        out.clear();
        out.extend_from_slice(method.as_str().as_bytes());
        out.extend_from_slice(b" ");
        out.extend_from_slice(uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        // The body's length is what the application's request declared (the inbound side checked
        // it). An empty body keeps a declared 0, and a POST, PUT or PATCH gets one: an upstream may
        // refuse those when they say nothing of their length (411).
        let length = if body.is_end_stream() {
            let declared = headers.contains_key(CONTENT_LENGTH);
            (declared || [Method::POST, Method::PUT, Method::PATCH].contains(method)).then_some(0)
        } else {
            body.size_hint().exact()
        };
        let framing = match h1::write_framed_headers(out, headers, length) {
            Some(framing) => framing,
            None if body.is_end_stream() => Framing::EMPTY,
            None => h1::write_chunked(out),
        };
        out.extend_from_slice(b"\r\n");
        framing
    }

    /// Streams the request body as `framing` says (its trailers are dropped) while watching the
    /// connection for the upstream's answer, which stops the sending if it comes first. Reads and
    /// writes take turns within one poll, so neither waits on the other.
    async fn write_body(&mut self, body: &mut RequestBody, framing: Framing) -> Result<Sent, Failure> {
        let chunked = matches!(framing, Framing::Chunked(_));
        // What of the current piece is still to go out: a chunk's size line (in `output`, from
        // `line`), its data, then the CRLF after it or, at the end, the last chunk.
        self.output.clear();
        let mut line = 0;
        let mut data = Bytes::new();
        let mut tail: &'static [u8] = b"";
        let mut ended = false;
        poll_fn(|cx| {
            loop {
                match h1::poll_read_more(&mut self.io, &mut self.input, cx) {
                    Poll::Ready(Ok(0)) => {
                        let closed = io::Error::new(io::ErrorKind::UnexpectedEof, "the upstream closed the connection");
                        return Poll::Ready(Ok(Sent::Broken(closed)));
                    }
                    Poll::Ready(Ok(_)) => match self.final_head()? {
                        Some(head) => {
                            tracing::debug!(status = %head.status, "the upstream answered before the request body's end");
                            return Poll::Ready(Ok(Sent::Answered(head)));
                        }
                        // An interim response (100 Continue to a forwarded `Expect`) or part of
                        // a head: the body is still wanted.
                        None => continue,
                    },
                    Poll::Ready(Err(e)) => return Poll::Ready(Ok(Sent::Broken(e))),
                    Poll::Pending => {}
                }
                let piece = if line < self.output.len() {
                    &self.output[line..]
                } else if !data.is_empty() {
                    &data[..]
                } else {
                    tail
                };
                if !piece.is_empty() {
                    let n = match ready!(Pin::new(&mut self.io).poll_write(cx, piece)) {
                        Ok(0) => return Poll::Ready(Ok(Sent::Broken(io::ErrorKind::WriteZero.into()))),
                        Ok(n) => n,
                        Err(e) => return Poll::Ready(Ok(Sent::Broken(e))),
                    };
                    if line < self.output.len() {
                        line += n;
                    } else if !data.is_empty() {
                        data.advance(n);
                    } else {
                        tail = &tail[n..];
                    }
                    continue;
                }
                if ended {
                    return Poll::Ready(match ready!(Pin::new(&mut self.io).poll_flush(cx)) {
                        Ok(()) => Ok(Sent::Whole),
                        Err(e) => Ok(Sent::Broken(e)),
                    });
                }
                match ready!(Pin::new(&mut *body).poll_frame(cx)) {
                    None => {
                        ended = true;
                        if chunked {
                            tail = b"0\r\n\r\n";
                        }
                    }
                    Some(Err(e)) => return Poll::Ready(Err(Failure::Failed(Box::new(RequestBodyFailed(e))))),
                    Some(Ok(frame)) => {
                        let Ok(next) = frame.into_data() else { continue };
                        if next.is_empty() {
                            continue;
                        }
                        if chunked {
                            self.output.clear();
                            h1::write_number(&mut self.output, next.len() as u64, 16);
                            self.output.extend_from_slice(b"\r\n");
                            line = 0;
                            tail = b"\r\n";
                        }
                        data = next;
                    }
                }
            }
        })
        .await
    }
}

/// Methods a client may repeat without changing what they do (RFC 9110 §9.2.2).
fn idempotent(method: &Method) -> bool {
    [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE, Method::PUT, Method::DELETE].contains(method)
}

/// How the response body is delimited (RFC 9112 §6.3). A response with both Transfer-Encoding and
/// Content-Length is refused rather than guessed at: it is how response splitting looks. So is
/// one with a transfer coding other than chunked: the sidecar never offers one (it sends no
/// `TE` but `trailers`), and would pass the body on without it. And so is an HTTP/1.0 response
/// with any Transfer-Encoding, which HTTP/1.0 does not have: RFC 9112 §6.1 has its framing
/// taken as faulty (likely forwarded by something that did not decode it) and its connection
/// closed, as the refusal does.
pub fn response_framing(method: &Method, head: &ResponseHead) -> Result<Framing, Malformed> {
    let coding = h1::transfer_coding(&head.headers);
    if coding.is_some() && head.version == Version::HTTP_10 {
        return Err(Malformed("HTTP/1.0 response with transfer-encoding"));
    }
    if method == Method::HEAD || head.status == StatusCode::NO_CONTENT || head.status == StatusCode::NOT_MODIFIED {
        return Ok(Framing::EMPTY);
    }
    match (coding, h1::content_length(&head.headers)?) {
        (Some(_), Some(_)) => Err(Malformed("response has both transfer-encoding and content-length")),
        (Some(Coding::Chunked), None) => Ok(Framing::chunked()),
        (Some(Coding::Layered | Coding::Unchunked), None) => {
            Err(Malformed("response has a transfer coding other than chunked"))
        }
        (None, None) => Ok(Framing::UntilClose),
        (None, Some(length)) => Ok(Framing::Length(length)),
    }
}

impl Http1Pool {
    fn new(dialer: Dialer) -> Http1Pool {
        Http1Pool { dialer, idle: Mutex::new(VecDeque::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Idle>> {
        sync::lock(&self.idle)
    }

    /// Sends `req` on an idle connection or a new one. A request that an idle connection failed
    /// before the upstream can have acted on it (see [`Failure::Unsent`]) goes once more, on a
    /// new connection — once only (RFC 9112 §9.3.1: no retry of a retry): an upstream that drops
    /// every request must not get each of them once per pooled connection.
    pub async fn send(self: &Arc<Self>, mut req: Request<RequestBody>) -> Result<Response<Http1Body>, BoxError> {
        let (mut connection, mut reused) = match self.checkout().await {
            Some(connection) => (connection, true),
            // Boxed: opening a connection is rare, and its future would otherwise make every
            // request's future larger.
            None => (Box::pin(self.connect()).await?, false),
        };
        loop {
            match connection.exchange(req).await {
                Ok((head, framing)) => {
                    let mut body = Http1Body { connection: Some(connection), framing, pool: self.clone() };
                    if body.framing.is_done() {
                        body.release();
                    }
                    let mut response = Response::new(body);
                    *response.status_mut() = head.status;
                    *response.version_mut() = head.version;
                    *response.headers_mut() = head.headers;
                    return Ok(response);
                }
                // The other idle connections are as old as the one that failed: a new one.
                Err(Failure::Unsent(unsent)) if reused => {
                    req = *unsent;
                    reused = false;
                    connection = Box::pin(self.connect()).await?;
                }
                Err(Failure::Unsent(_)) => return Err("the upstream closed the connection without answering".into()),
                Err(Failure::Failed(e)) => return Err(e),
            }
        }
    }

    async fn checkout(&self) -> Option<Box<Http1>> {
        loop {
            let Idle { mut connection, since } = self.lock().pop_back()?;
            if since.elapsed() <= defaults::UPSTREAM_POOL_IDLE_TIMEOUT
                && poll_fn(|cx| connection.poll_still_open(cx)).await
            {
                return Some(connection);
            }
        }
    }

    async fn connect(&self) -> Result<Box<Http1>, BoxError> {
        Ok(Box::new(Http1::new(self.dialer.dial().await?)))
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

/// A response body read off its HTTP/1.1 connection. Read to its end, it returns the connection
/// to the pool; dropped before, it closes it (HTTP/1.1 has no other way to abandon a response).
pub struct Http1Body {
    connection: Option<Box<Http1>>,
    framing: Framing,
    pool: Arc<Http1Pool>,
}

impl Http1Body {
    /// The body is complete: the connection goes back to the pool if the upstream left it
    /// reusable and sent nothing past the response.
    fn release(&mut self) {
        if let Some(connection) = self.connection.take().filter(|c| c.reusable && c.input.is_empty()) {
            self.pool.check_in(connection);
        }
    }
}

impl http_body::Body for Http1Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(connection) = &mut this.connection else { return Poll::Ready(None) };
        let polled = ready!(h1::poll_body(&mut connection.io, &mut connection.input, &mut this.framing, cx));
        match &polled {
            Some(Ok(_)) if !this.framing.is_done() => {}
            Some(Err(_)) => this.connection = None,
            _ => this.release(),
        }
        Poll::Ready(polled.map(|data| data.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.framing.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        self.framing.remaining().map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// The HTTP/2 connections requests share: the first that has fewer than
/// [`STREAMS_PER_HTTP2_CONNECTION`](defaults::STREAMS_PER_HTTP2_CONNECTION) streams open takes
/// the next request, and a new one opens when all are that busy — so that long streams (gRPC
/// watches) cannot take up every stream an upstream allows one connection and keep the other
/// requests waiting. A spare connection left with no stream open is let go.
pub struct Http2Pool {
    dialer: Dialer,
    connections: Mutex<Vec<Http2Connection>>,
}

#[derive(Clone)]
struct Http2Connection {
    sender: http2::SendRequest<RequestBody>,
    streams: OpenCount,
}

impl Http2Pool {
    fn new(dialer: Dialer) -> Http2Pool {
        Http2Pool { dialer, connections: Mutex::new(Vec::new()) }
    }

    /// A connection with a stream to spare, and that stream, counted under the lock so that
    /// concurrent requests never take a connection past the limit; forgets closed connections,
    /// and spare ones with nothing open (checked as requests come).
    fn spare(&self) -> Option<(Http2Connection, Open)> {
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
    pub async fn send(&self, mut req: Request<RequestBody>) -> Result<(Response<Incoming>, Open), BoxError> {
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
    async fn connect(&self) -> Result<(Http2Connection, Open), BoxError> {
        let io = TokioIo::new(self.dialer.dial().await?);
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .max_header_list_size(u32::try_from(defaults::UPSTREAM_MAX_HEADER_BYTES).unwrap_or(u32::MAX))
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
pub fn pools(url: &Uri, tls: &rustls::ClientConfig) -> Result<(Arc<Http1Pool>, Http2Pool), String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn head(status: u16, fields: &[(&str, &str)]) -> ResponseHead {
        let headers = fields.iter().map(|(n, v)| (n.parse().unwrap(), v.parse().unwrap())).collect();
        ResponseHead { status: StatusCode::from_u16(status).unwrap(), version: http::Version::HTTP_11, headers }
    }

    #[test]
    fn responses_are_framed_as_rfc_9112_says() {
        let sized = [("content-length", "10")];
        assert_eq!(response_framing(&Method::HEAD, &head(200, &sized)), Ok(Framing::EMPTY));
        assert_eq!(response_framing(&Method::GET, &head(204, &[])), Ok(Framing::EMPTY));
        assert_eq!(response_framing(&Method::GET, &head(304, &sized)), Ok(Framing::EMPTY));
        assert_eq!(response_framing(&Method::GET, &head(200, &sized)), Ok(Framing::Length(10)));
        assert_eq!(
            response_framing(&Method::GET, &head(200, &[("transfer-encoding", "chunked")])),
            Ok(Framing::chunked())
        );
        // The sidecar asks for no other coding, and would pass the body on without it.
        for coding in ["gzip", "gzip, chunked"] {
            assert!(response_framing(&Method::GET, &head(200, &[("transfer-encoding", coding)])).is_err());
        }
        assert_eq!(response_framing(&Method::GET, &head(200, &[])), Ok(Framing::UntilClose));
        let both = [("transfer-encoding", "chunked"), ("content-length", "3")];
        assert!(response_framing(&Method::GET, &head(200, &both)).is_err());
        // HTTP/1.0 has no transfer codings: framing that names one is faulty, even on a 204.
        for status in [200, 204] {
            let mut old = head(status, &[("transfer-encoding", "chunked"), ("connection", "keep-alive")]);
            old.version = Version::HTTP_10;
            let refused = response_framing(&Method::GET, &old);
            assert_eq!(refused, Err(Malformed("HTTP/1.0 response with transfer-encoding")));
        }
        assert!(response_framing(&Method::GET, &head(200, &[("content-length", "3, 4")])).is_err());
    }
}
