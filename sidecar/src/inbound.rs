//! The application's HTTP/1.1 connections, spoken by the sidecar's own codec (h1.rs) on the
//! connection's task: a request head is read, handed to the listener's stack with a body that
//! reads itself off the same connection, and the response is written back, one exchange after
//! the other (pipelined requests wait in the read buffer). A connection that opens with the
//! HTTP/2 preface is handed back, for hyper's HTTP/2 server.

use std::{
    convert::Infallible,
    future::{Future, poll_fn},
    io,
    pin::{Pin, pin},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use http::{
    HeaderMap, Method, Request, Response, StatusCode, Version,
    header::{DATE, EXPECT, HOST},
};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::Either;
use tokio::{
    io::{AsyncWrite, AsyncWriteExt},
    net::{
        TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::watch,
};
use tower::Service;

use crate::{
    body::{Body, BoxError},
    config, defaults,
    h1::{self, Coding, Framing, Malformed, RequestHead},
    listener::stopped,
    respond::Refusal,
    stack::Stack,
    sync,
    time::{self, Timer},
};

/// What every HTTP/2 prior-knowledge connection starts with (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Body data up to this size is copied behind the head (or the previous data) to go out in one
/// write; larger pieces are written on their own.
const COPY_LIMIT: usize = 16 * 1024;

/// The read side of a connection, which the connection reads heads from and a request's body
/// reads itself from; both run on the connection's task, so the lock is never contended.
struct Reader {
    read: OwnedReadHalf,
    input: BytesMut,
    /// The current request's body.
    framing: Framing,
    expect: Expect,
    /// Since when the stack has been waiting for body bytes that have not come.
    starved: Option<Instant>,
}

/// Where a request that asked for `100 Continue` stands: the interim response goes out when the
/// stack first reads the body, so a request refused before that never has its body sent.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    Nothing,
    /// Not yet read.
    Continue,
    /// The body was read: the connection writes `100 Continue` and wakes it.
    Asked,
}

type Shared = Arc<Mutex<Reader>>;

fn lock(shared: &Shared) -> MutexGuard<'_, Reader> {
    sync::lock(shared)
}

/// A request body on an HTTP/1.1 connection of the application; `None` for a request without one.
pub struct Inbound(Option<Shared>);

impl http_body::Body for Inbound {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(shared) = &self.0 else { return Poll::Ready(None) };
        let mut reader = lock(shared);
        match reader.expect {
            Expect::Nothing => {}
            Expect::Continue => {
                reader.expect = Expect::Asked;
                return Poll::Pending;
            }
            Expect::Asked => return Poll::Pending,
        }
        let Reader { read, input, framing, starved, .. } = &mut *reader;
        let polled = h1::poll_body(read, input, framing, cx);
        if polled.is_pending() {
            starved.get_or_insert_with(Instant::now);
        } else {
            *starved = None;
        }
        polled.map(|data| data.map(|data| data.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(|shared| lock(shared).framing.is_done())
    }

    fn size_hint(&self) -> SizeHint {
        let remaining = self.0.as_ref().map_or(Some(0), |shared| lock(shared).framing.remaining());
        remaining.map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// A connection's limits, from its listener's configuration.
#[derive(Clone, Copy)]
pub struct Limits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub send_timeout: Duration,
    pub max_header_bytes: usize,
}

impl From<&config::Listener> for Limits {
    fn from(l: &config::Listener) -> Limits {
        Limits {
            header_read_timeout: l.header_read_timeout,
            idle_timeout: l.idle_timeout,
            send_timeout: l.send_timeout,
            max_header_bytes: l.max_header_bytes,
        }
    }
}

/// The write side of a connection: what is to go out, and the socket under the send timeout.
struct Writer {
    io: Timed,
    out: BytesMut,
}

/// The connection's write half, failing with `TimedOut` once a write has waited for the
/// application to take more for `timeout` (between two writes, not for a whole answer, as
/// nginx's `send_timeout`): an application that stops reading its answer must not hold the
/// connection and the request's permits for ever.
struct Timed {
    write: OwnedWriteHalf,
    timeout: Duration,
    timer: Timer,
    /// The timer runs for the write that waits now.
    armed: bool,
}

impl Timed {
    fn watch<T>(&mut self, polled: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.armed = false;
            return polled;
        }
        if !self.armed {
            self.timer.start(self.timeout);
            self.armed = true;
        }
        match self.timer.poll_fired(cx) {
            Poll::Ready(()) => {
                let waited = humantime::format_duration(self.timeout);
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the application took nothing for {waited}"),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for Timed {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.write).poll_write(cx, buf);
        this.watch(polled, cx)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.write).poll_flush(cx);
        this.watch(polled, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.write).poll_shutdown(cx);
        this.watch(polled, cx)
    }
}

/// The application's side of a connection while its answer is written: its reader, watched for
/// it leaving while the answer waits on the upstream (see [`gone`]).
#[derive(Clone, Copy)]
struct Peer<'a> {
    shared: &'a Shared,
    max_header_bytes: usize,
}

/// How a request head's wait ended.
enum Next {
    Request(RequestHead),
    /// The peer closed, the connection idled out or the listener is stopping.
    Close,
    /// The connection sent the HTTP/2 preface.
    Http2,
    /// A refusal to send before closing.
    Refuse(Response<Body>),
}

/// Serves `stream` until it closes; returns it, with what was read of it, if it speaks HTTP/2.
pub async fn serve(
    stream: TcpStream,
    mut stack: Stack,
    limits: Limits,
    stop: watch::Receiver<bool>,
) -> Result<Option<(TcpStream, Bytes)>, BoxError> {
    let (read, write) = stream.into_split();
    let shared = Arc::new(Mutex::new(Reader {
        read,
        input: BytesMut::with_capacity(8 * 1024),
        framing: Framing::EMPTY,
        expect: Expect::Nothing,
        starved: None,
    }));
    let mut writer = Writer {
        io: Timed { write, timeout: limits.send_timeout, timer: Timer::default(), armed: false },
        out: BytesMut::with_capacity(8 * 1024),
    };
    let peer = Peer { shared: &shared, max_header_bytes: limits.max_header_bytes };
    let mut stop_wait = stop.clone();
    let mut stopping = pin!(stopped(&mut stop_wait));
    // Both deadlines are checked at ticks, so each is met within half of the shorter one; that
    // spares every request a registration with the runtime's timer.
    let period = limits.idle_timeout.min(limits.header_read_timeout) / 2;
    let mut tick = pin!(tokio::time::sleep(period));
    let mut idle_since = Instant::now();
    let mut http1 = false;
    loop {
        let mut head_since = None;
        let next = loop {
            {
                let mut reader = lock(&shared);
                if let Some(next) = read_head(&mut reader.input, &mut http1, limits.max_header_bytes) {
                    break next;
                }
                if !reader.input.is_empty() && head_since.is_none() {
                    head_since = Some(Instant::now());
                }
            }
            tokio::select! {
                biased;
                read = poll_fn(|cx| {
                    let Reader { read, input, .. } = &mut *lock(&shared);
                    h1::poll_read_more(read, input, cx)
                }) => {
                    if read? == 0 {
                        break Next::Close;
                    }
                }
                () = &mut tick => {
                    let now = Instant::now();
                    match head_since {
                        Some(since) if now - since >= limits.header_read_timeout => {
                            break Next::Refuse(Refusal::HeadTimeout.render(false));
                        }
                        None if now - idle_since >= limits.idle_timeout => break Next::Close,
                        _ => tick.as_mut().reset(time::after(now, period).into()),
                    }
                }
                // A stopping listener closes connections between requests.
                () = &mut stopping, if head_since.is_none() => break Next::Close,
            }
        };
        let head = match next {
            Next::Request(head) => head,
            Next::Close => return Ok(None),
            Next::Http2 => {
                let Reader { read, input, .. } = Arc::into_inner(shared)
                    .ok_or("no body outlives its head")?
                    .into_inner()
                    .unwrap_or_else(PoisonError::into_inner);
                return Ok(Some((read.reunite(writer.io.write)?, input.freeze())));
            }
            Next::Refuse(response) => {
                write_response(&mut writer, peer, response, false, Version::HTTP_11, true).await?;
                linger(&shared, &mut writer).await;
                return Ok(None);
            }
        };
        let version = head.version;
        let (request, keep_alive) = match request(head, &shared) {
            Ok(request) => request,
            Err(response) => {
                write_response(&mut writer, peer, *response, false, version, true).await?;
                linger(&shared, &mut writer).await;
                return Ok(None);
            }
        };
        let head_only = request.method() == Method::HEAD;
        let _ = poll_fn(|cx| stack.poll_ready(cx)).await;
        let waited = wait(stack.call(request), &shared, &mut writer.io, &limits).await?;
        let response = match waited {
            Ok(response) => response,
            Err(Unanswered::Gone) => {
                tracing::debug!("the application closed its connection before the answer; request dropped");
                return Ok(None);
            }
            Err(Unanswered::Stalled) => {
                tracing::debug!("the request body stopped arriving for the idle timeout; request dropped");
                write_response(&mut writer, peer, Refusal::BodyTimeout.render(false), false, version, true).await?;
                linger(&shared, &mut writer).await;
                return Ok(None);
            }
        };
        // A body left unread (a refused request) would be taken for the next head.
        let unread = !finish_body(&shared);
        let close = !keep_alive || unread || *stop.borrow();
        if write_response(&mut writer, peer, response, head_only, version, close).await? {
            if unread {
                linger(&shared, &mut writer).await;
            }
            return Ok(None);
        }
        idle_since = Instant::now();
    }
}

/// Waits for the stack's answer to a request, while it writes `100 Continue` when the stack
/// reads a body that asked for it, and watches for the application closing its connection and
/// for a body that stops arriving; the stack's call is dropped, and with it any upstream
/// exchange, as soon as the wait ends.
async fn wait(
    call: impl Future<Output = Result<Response<Body>, Infallible>>,
    shared: &Shared,
    write: &mut Timed,
    limits: &Limits,
) -> io::Result<Result<Response<Body>, Unanswered>> {
    let mut call = pin!(call);
    let mut continued = 0;
    // Armed once the request's body is awaited and does not come.
    let mut stall = None::<Pin<Box<tokio::time::Sleep>>>;
    poll_fn(|cx| {
        if let Poll::Ready(Ok(response)) = call.as_mut().poll(cx) {
            return Poll::Ready(Ok(Ok(response)));
        }
        let asked = {
            let reader = &mut *lock(shared);
            if gone(reader, limits.max_header_bytes, cx) {
                return Poll::Ready(Ok(Err(Unanswered::Gone)));
            }
            if let Some(since) = reader.starved {
                let deadline = time::after(since, limits.idle_timeout).into();
                let timer = stall.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ok(Err(Unanswered::Stalled)));
                }
            }
            reader.expect == Expect::Asked
        };
        if asked {
            while continued < CONTINUE.len() {
                match Pin::new(&mut *write).poll_write(cx, &CONTINUE[continued..]) {
                    Poll::Ready(Ok(n)) => continued += n,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            lock(shared).expect = Expect::Nothing;
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    })
    .await
}

/// Why the wait for a response ended without one.
enum Unanswered {
    /// The application closed its connection.
    Gone,
    /// The request body the stack was reading stopped arriving for the idle timeout.
    Stalled,
}

/// Ends the current request's body once its answer is in: skips what of it has already arrived,
/// which a refused request's small body usually has, so the connection can serve the next one;
/// not a body that waits for `100 Continue`, which the application may never send. Whether the
/// body is all read.
fn finish_body(shared: &Shared) -> bool {
    let Reader { input, framing, expect, starved, .. } = &mut *lock(shared);
    *starved = None;
    if *expect != Expect::Continue {
        while let Ok(h1::Decoded::Data(_)) = framing.decode(input) {}
    }
    framing.is_done()
}

/// Whether the application has closed its connection while its request waits for an answer
/// (queued by a limit, or at the upstream): the caller then drops the request, which leaves the
/// queue or abandons the upstream exchange, as nginx and Envoy do. Only once the request body
/// is read; what arrives meanwhile (a pipelined request) is kept, up to `max_header_bytes`.
fn gone(reader: &mut Reader, max_header_bytes: usize, cx: &mut Context<'_>) -> bool {
    let Reader { read, input, framing, .. } = reader;
    while framing.is_done() && input.len() <= max_header_bytes {
        match h1::poll_read_more(read, input, cx) {
            Poll::Ready(Ok(0) | Err(_)) => return true,
            Poll::Ready(Ok(_)) => {}
            Poll::Pending => break,
        }
    }
    false
}

/// Closes a connection that may have unread input — a request body, or the rest of a refused
/// head (`defaults::LINGER_TIME`): the write side first, then what the application still sends
/// is read and dropped until it closes too, or for a bounded time and size.
async fn linger(shared: &Shared, writer: &mut Writer) {
    let _ = writer.io.shutdown().await;
    let mut left = defaults::LINGER_BYTES;
    let drained = async {
        loop {
            let read = poll_fn(|cx| {
                let Reader { read, input, .. } = &mut *lock(shared);
                input.clear();
                h1::poll_read_more(read, input, cx)
            })
            .await;
            match read {
                Ok(n) if n > 0 && n < left => left -= n,
                _ => return,
            }
        }
    };
    let _ = tokio::time::timeout(defaults::LINGER_TIME, drained).await;
}

/// What the bytes in `input` decide, once `http1` says the connection is not HTTP/2; `None`
/// until more are read.
fn read_head(input: &mut BytesMut, http1: &mut bool, max_header_bytes: usize) -> Option<Next> {
    if !*http1 {
        if input.len() < PREFACE.len() && PREFACE.starts_with(input) {
            return None;
        }
        if input.starts_with(PREFACE) {
            return Some(Next::Http2);
        }
        *http1 = true;
    }
    match h1::parse_request(input, max_header_bytes) {
        Ok(Some(head)) => Some(Next::Request(head)),
        Ok(None) if input.len() > max_header_bytes => Some(Next::Refuse(Refusal::HeadTooLarge.render(false))),
        Ok(None) => None,
        Err(malformed) => Some(Next::Refuse(Refusal::from(malformed).render(false))),
    }
}

/// The request for the stack, and whether the connection may carry another one after it; else
/// the refusal to answer with before closing.
fn request(
    head: RequestHead,
    shared: &Shared,
) -> Result<(Request<crate::body::RequestBody>, bool), Box<Response<Body>>> {
    let RequestHead { method, uri, version, headers } = head;
    let malformed = |why: Malformed| Box::new(Refusal::from(why).render(false));
    let framing = request_framing(version, &headers)?;
    if version == Version::HTTP_11 && headers.get_all(HOST).iter().count() != 1 {
        return Err(malformed(Malformed("an HTTP/1.1 request needs exactly one host header")));
    }
    let keep_alive = h1::keep_alive(version, &headers);
    let body = if framing.is_done() {
        Inbound(None)
    } else {
        let continues = version == Version::HTTP_11
            && headers.get(EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let mut reader = lock(shared);
        reader.framing = framing;
        reader.expect = if continues { Expect::Continue } else { Expect::Nothing };
        Inbound(Some(shared.clone()))
    };
    let mut request = Request::new(crate::body::RequestBody::new(Either::Left(body)));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    Ok((request, keep_alive))
}

/// How a request's body is delimited, checked against request smuggling (RFC 9112 §6.3); else
/// the refusal to answer with. A message with both Transfer-Encoding and Content-Length, a
/// Transfer-Encoding not ending in chunked once, or unclear Content-Length is refused (400); a
/// transfer coding other than chunked is not implemented (501, §6.1).
pub fn request_framing(version: Version, headers: &HeaderMap) -> Result<Framing, Box<Response<Body>>> {
    let malformed = |why: Malformed| Box::new(Refusal::from(why).render(false));
    let content_length = h1::content_length(headers).map_err(malformed)?;
    Ok(match (h1::transfer_coding(headers), content_length) {
        (Some(_), Some(_)) => return Err(malformed(Malformed("both transfer-encoding and content-length"))),
        (Some(_), None) if version == Version::HTTP_10 => {
            return Err(malformed(Malformed("transfer-encoding in HTTP/1.0")));
        }
        (Some(Coding::Chunked), None) => Framing::chunked(),
        (Some(Coding::Layered), None) => {
            return Err(Box::new(Refusal::NotImplemented("transfer codings other than chunked").render(false)));
        }
        (Some(Coding::Unchunked), None) => {
            return Err(malformed(Malformed("transfer-encoding does not end in chunked, once")));
        }
        (None, length) => Framing::Length(length.unwrap_or(0)),
    })
}

/// Writes `response`, its body framed by its length, else chunked for HTTP/1.1 clients, else by
/// closing. Returns whether the connection is to close: asked to, or the body could not be
/// delimited or failed midway. Trailers are dropped (gRPC, which needs them, is HTTP/2).
async fn write_response(
    writer: &mut Writer,
    peer: Peer<'_>,
    response: Response<Body>,
    head_only: bool,
    version: Version,
    mut close: bool,
) -> io::Result<bool> {
    let (parts, mut body) = response.into_parts();
    let out = &mut writer.out;
    let status = parts.status;
    let bodiless = head_only
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    // The sidecar's own answers have none, and an upstream may have left it out.
    if !parts.headers.contains_key(DATE) {
        h1::write_date(out);
    }
    // A bodiless answer's Content-Length describes the body a GET would have had: it goes on, as
    // one number — except on a 1xx or 204, which must not carry one (RFC 9110 §8.6). Otherwise
    // the body's own length: an upstream's declared length, which its body is held to.
    let framing = if bodiless {
        let never = status.is_informational() || status == StatusCode::NO_CONTENT;
        let length = if never { None } else { h1::content_length(&parts.headers).ok().flatten() };
        h1::write_framed_headers(out, &parts.headers, length);
        Some(Framing::EMPTY)
    } else {
        h1::write_framed_headers(out, &parts.headers, body.size_hint().exact())
    };
    let mut framing = match framing {
        Some(framing) => framing,
        None if version == Version::HTTP_11 => h1::write_chunked(out),
        None => {
            close = true;
            Framing::UntilClose
        }
    };
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if version == Version::HTTP_10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !bodiless {
        close |= !write_body(writer, peer, &mut body, &mut framing).await?;
    }
    writer.io.write_all(&writer.out).await?;
    Ok(close)
}

/// Streams `body` behind what the writer holds; false if it broke its framing or failed. While
/// the upstream keeps it waiting, the application is watched: one that leaves ends the answer
/// (an error), and with it the request's hold on its permits, the upstream's connection or
/// stream, at once rather than when the upstream next sends something.
async fn write_body(writer: &mut Writer, peer: Peer<'_>, body: &mut Body, framing: &mut Framing) -> io::Result<bool> {
    let chunked = matches!(framing, Framing::Chunked(_));
    loop {
        // What is ready now joins the head; only a wait for more sends what is buffered.
        let frame = match poll_fn(|cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx))).await {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                writer.io.write_all(&writer.out).await?;
                writer.out.clear();
                poll_fn(|cx| match Pin::new(&mut *body).poll_frame(cx) {
                    Poll::Ready(frame) => Poll::Ready(Ok(frame)),
                    Poll::Pending if gone(&mut lock(peer.shared), peer.max_header_bytes, cx) => Poll::Ready(Err(
                        io::Error::new(io::ErrorKind::ConnectionAborted, "the application left mid-answer"),
                    )),
                    Poll::Pending => Poll::Pending,
                })
                .await?
            }
        };
        let data = match frame {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if !data.is_empty() => data,
                _ => continue,
            },
            Some(Err(e)) => {
                tracing::debug!(error = %e, "response body failed midway; closing the connection");
                return Ok(false);
            }
        };
        let mut data = data;
        if let Framing::Length(left) = framing {
            if data.len() as u64 > *left {
                tracing::debug!("response body longer than its content-length; closing the connection");
                data.truncate(usize::try_from(*left).unwrap_or(usize::MAX));
                *left = 0;
                append(writer, &data).await?;
                return Ok(false);
            }
            *left -= data.len() as u64;
        }
        if chunked {
            h1::write_number(&mut writer.out, data.len() as u64, 16);
            writer.out.extend_from_slice(b"\r\n");
            append(writer, &data).await?;
            writer.out.extend_from_slice(b"\r\n");
        } else {
            append(writer, &data).await?;
        }
    }
    if chunked {
        writer.out.extend_from_slice(b"0\r\n\r\n");
    }
    Ok(match framing {
        Framing::Length(left) => *left == 0,
        _ => true,
    })
}

/// Adds `data` to what goes out: copied when small, else written after what the writer holds.
/// What it holds goes out once it reaches [`COPY_LIMIT`], so a body the upstream sends faster
/// than the application reads is not gathered in memory.
async fn append(writer: &mut Writer, data: &Bytes) -> io::Result<()> {
    let large = data.len() > COPY_LIMIT;
    if !large {
        writer.out.extend_from_slice(data);
    }
    if large || writer.out.len() >= COPY_LIMIT {
        writer.io.write_all(&writer.out).await?;
        writer.out.clear();
    }
    if large { writer.io.write_all(data).await } else { Ok(()) }
}
