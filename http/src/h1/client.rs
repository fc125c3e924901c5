//! The HTTP/1.1 client toward an upstream. A connection carries one exchange at a time on the
//! request's task: the request checks a connection out of the pool, writes itself, reads the
//! response head, and hands the connection to the response body, which reads the body and, at
//! its end, returns the connection idle. A request that an idle connection failed before the
//! upstream can have acted on it goes once more, on a new connection.

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
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, header::CONTENT_LENGTH};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::codec::{self, Framing, Malformed, ResponseHead, response_framing};
use crate::{
    body::{BoxError, Outgoing, RequestBodyFailed},
    defaults,
    pool::{Dialer, Stream},
    sync,
};

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
enum Failure<B> {
    // Boxed: the rare way out should not make every exchange's result larger.
    Unsent(Box<Request<B>>),
    Failed(BoxError),
}

macro_rules! failed_from {
    ($($error:ty),*) => {$(
        impl<B> From<$error> for Failure<B> {
            fn from(e: $error) -> Failure<B> {
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
        Poll::Ready(codec::poll_read_more(&mut self.io, &mut self.input, cx).is_pending())
    }

    /// Writes `req` and reads the response head. An upstream may answer before it has read the
    /// request body (413, 401) and then stop reading or close: its answer is watched for while the
    /// body goes out, and ends the sending.
    async fn exchange<B: Outgoing>(&mut self, req: Request<B>) -> Result<(ResponseHead, Framing), Failure<B>> {
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
                let read = poll_fn(|cx| codec::poll_read_more(&mut self.io, &mut self.input, cx)).await;
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
        self.reusable = whole && framing != Framing::UntilClose && codec::keep_alive(head.version, &head.headers);
        Ok((head, framing))
    }

    /// Takes the final response head off `input` once it is all there, dropping the interim
    /// responses before it (100 Continue and the like).
    fn final_head(&mut self) -> Result<Option<ResponseHead>, Malformed> {
        loop {
            match codec::parse_response(&mut self.input, defaults::UPSTREAM_MAX_HEADER_BYTES)? {
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
    fn write_head(&mut self, method: &Method, uri: &Uri, headers: &HeaderMap, body: &impl HttpBody) -> Framing {
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
        let framing = match codec::write_framed_headers(out, headers, length) {
            Some(framing) => framing,
            None if body.is_end_stream() => Framing::EMPTY,
            None => codec::write_chunked(out),
        };
        out.extend_from_slice(b"\r\n");
        framing
    }

    /// Streams the request body as `framing` says (its trailers are dropped) while watching the
    /// connection for the upstream's answer, which stops the sending if it comes first. Reads and
    /// writes take turns within one poll, so neither waits on the other.
    async fn write_body<B: Outgoing>(&mut self, body: &mut B, framing: Framing) -> Result<Sent, Failure<B>> {
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
                match codec::poll_read_more(&mut self.io, &mut self.input, cx) {
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
                    Some(Err(e)) => return Poll::Ready(Err(Failure::Failed(Box::new(RequestBodyFailed(e.into()))))),
                    Some(Ok(frame)) => {
                        let Ok(next) = frame.into_data() else { continue };
                        if next.is_empty() {
                            continue;
                        }
                        if chunked {
                            self.output.clear();
                            codec::write_number(&mut self.output, next.len() as u64, 16);
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

impl Http1Pool {
    pub(crate) fn new(dialer: Dialer) -> Http1Pool {
        Http1Pool { dialer, idle: Mutex::new(VecDeque::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Idle>> {
        sync::lock(&self.idle)
    }

    /// Sends `req` on an idle connection or a new one. A request that an idle connection failed
    /// before the upstream can have acted on it (see [`Failure::Unsent`]) goes once more, on a
    /// new connection — once only (RFC 9112 §9.3.1: no retry of a retry): an upstream that drops
    /// every request must not get each of them once per pooled connection.
    pub async fn send<B: Outgoing>(self: &Arc<Self>, mut req: Request<B>) -> Result<Response<Http1Body>, BoxError> {
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
        let polled = ready!(codec::poll_body(&mut connection.io, &mut connection.input, &mut this.framing, cx));
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
