//! The application's HTTP/1.1 connections, served on the connection's task: a request head is
//! read, handed to the listener's stack with its body, and the response is written back, one
//! exchange after the other (pipelined requests wait in the read buffer). A connection that
//! opens with the HTTP/2 preface is handed back, for hyper's HTTP/2 server.
//!
//! The read half has one owner at a time. A request body is lent it, with what was read past the
//! head, and hands it back over a oneshot channel once it has read its end, stalled for the idle
//! timeout, or is dropped; the loop watches the application (leaving, the next head) only while
//! it holds it. `100 Continue` is asked for and granted over two more, when the body is first read.

use std::{
    convert::Infallible,
    future::{Future, poll_fn},
    io,
    pin::{Pin, pin},
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use http::{
    Method, Request, Response, StatusCode, Version,
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
    sync::{oneshot, watch},
};
use tower::Service;

use super::codec::{self, Decoded, Framing, Malformed, Refused, RequestHead};
use crate::{
    body::{Body, BoxError, RequestBody},
    config, defaults,
    listener::stopped,
    respond::Refusal,
    stack::Stack,
    time::{self, Timer},
};

/// What every HTTP/2 prior-knowledge connection starts with (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Body data up to this size is copied behind the head (or the previous data) to go out in one
/// write; larger pieces are written on their own.
const COPY_LIMIT: usize = 16 * 1024;

/// What a connection's read and write buffers start at. A connection waiting for its next request
/// with nothing of it read gives both back, and takes them again when the application sends (as
/// nginx frees its keep-alive connections' buffers): held, they would be most of what an idle
/// connection costs.
const BUFFER: usize = 8 * 1024;

/// The read side of a connection: its read half, and what was read of it and not yet taken.
struct Reader {
    read: OwnedReadHalf,
    input: BytesMut,
}

impl Reader {
    fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        codec::poll_read_more(&mut self.read, &mut self.input, cx)
    }
}

/// What a request body hands back.
struct Returned {
    reader: Reader,
    /// How far the body was decoded.
    framing: Framing,
    /// The body was to wait for `100 Continue` and was never read: the application may never
    /// send it.
    unasked: bool,
    /// The body stopped arriving for the idle timeout while it was read.
    stalled: bool,
}

/// A request body on an HTTP/1.1 connection of the application; `None` for a request without one.
pub struct Inbound(Option<Box<Lent>>);

/// A body that has the connection's reader, or had it.
struct Lent {
    /// The reader, and where it goes back: taken when it does.
    held: Option<(Reader, oneshot::Sender<Returned>)>,
    framing: Framing,
    /// Until `100 Continue` has gone out, for a request that asked for it.
    expect: Option<Continue>,
    idle_timeout: Duration,
    /// Runs while the body waits for bytes that have not come.
    stall: Timer,
    armed: bool,
}

/// A body's side of `Expect: 100-continue`: it asks when first read, then waits for the interim
/// response to have gone out.
struct Continue {
    ask: Option<oneshot::Sender<()>>,
    go: oneshot::Receiver<()>,
}

impl Lent {
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BoxError>>> {
        if let Some(Continue { ask, go }) = &mut self.expect {
            if let Some(ask) = ask.take() {
                let _ = ask.send(());
            }
            if ready!(Pin::new(go).poll(cx)).is_err() {
                return Poll::Ready(Some(Err("the answer came before the request body was read".into())));
            }
            self.expect = None;
        }
        let Some((reader, _)) = &mut self.held else {
            // Handed back at its end, or stalled: the connection then answers and closes.
            return if self.framing.is_done() { Poll::Ready(None) } else { Poll::Pending };
        };
        let polled = codec::poll_body(&mut reader.read, &mut reader.input, &mut self.framing, cx);
        if polled.is_pending() {
            if !self.armed {
                self.stall.start(self.idle_timeout);
                self.armed = true;
            }
            if self.stall.poll_fired(cx).is_ready() {
                self.hand_back(true);
            }
            return Poll::Pending;
        }
        self.armed = false;
        if self.framing.is_done() {
            self.hand_back(false);
        }
        polled
    }

    fn hand_back(&mut self, stalled: bool) {
        if let Some((reader, back)) = self.held.take() {
            let unasked = self.expect.as_ref().is_some_and(|c| c.ask.is_some());
            let _ = back.send(Returned { reader, framing: self.framing.clone(), unasked, stalled });
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.hand_back(false);
    }
}

impl http_body::Body for Inbound {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(lent) = &mut self.get_mut().0 else { return Poll::Ready(None) };
        lent.poll_data(cx).map(|data| data.map(|data| data.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(|lent| lent.framing.is_done())
    }

    fn size_hint(&self) -> SizeHint {
        let remaining = self.0.as_ref().map_or(Some(0), |lent| lent.framing.remaining());
        remaining.map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// The read side as the connection's loop holds it during an exchange: the reader, unless the
/// request's body has it.
struct Input {
    reader: Option<Reader>,
    /// The request's body as far as it was decoded, once the reader is here.
    framing: Framing,
    unasked: bool,
    /// Where a lent reader comes back.
    back: Option<oneshot::Receiver<Returned>>,
    /// The loop's side of `Expect: 100-continue`.
    expect: Option<Continuing>,
    max_header_bytes: usize,
}

/// The loop's side of `Expect: 100-continue`: once the body asks, the interim response is
/// written, then the body may read.
struct Continuing {
    ask: oneshot::Receiver<()>,
    go: oneshot::Sender<()>,
    /// How much of the interim response has gone out, once asked.
    written: Option<usize>,
}

impl Input {
    fn holding(reader: Reader, max_header_bytes: usize) -> Input {
        Input {
            reader: Some(reader),
            framing: Framing::EMPTY,
            unasked: false,
            back: None,
            expect: None,
            max_header_bytes,
        }
    }

    /// The body of a request framed by `framing`, lent the reader if it has bytes to read;
    /// `continues` if it waits for `100 Continue`.
    fn lend(reader: Reader, framing: Framing, continues: bool, limits: &Limits) -> (Inbound, Input) {
        let mut input = Input::holding(reader, limits.max_header_bytes);
        if framing.is_done() {
            return (Inbound(None), input);
        }
        let (back, returns) = oneshot::channel();
        input.back = Some(returns);
        let expect = continues.then(|| {
            let ((ask, asked), (go, gone)) = (oneshot::channel(), oneshot::channel());
            input.expect = Some(Continuing { ask: asked, go, written: None });
            Continue { ask: Some(ask), go: gone }
        });
        let lent = Lent {
            held: input.reader.take().map(|reader| (reader, back)),
            framing,
            expect,
            idle_timeout: limits.idle_timeout,
            stall: Timer::default(),
            armed: false,
        };
        (Inbound(Some(Box::new(lent))), input)
    }

    /// Takes the reader back when the body returns it; whether the body had stalled.
    fn poll_back(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let Some(back) = &mut self.back else { return Poll::Pending };
        let returned = ready!(Pin::new(back).poll(cx));
        self.back = None;
        // A body returns the reader when dropped at the latest; were it lost, the connection
        // would close, its reader never here.
        Poll::Ready(returned.is_ok_and(|returned| self.take_back(returned)))
    }

    /// Whether the body had stalled.
    fn take_back(&mut self, returned: Returned) -> bool {
        self.reader = Some(returned.reader);
        self.framing = returned.framing;
        self.unasked = returned.unasked;
        returned.stalled
    }

    /// Writes `100 Continue` once the body asks for it, then lets the body read; an error if
    /// the write failed.
    fn poll_continue(&mut self, write: &mut Timed, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(continuing) = &mut self.expect else { return Ok(()) };
        let mut written = match continuing.written {
            Some(written) => written,
            None => match Pin::new(&mut continuing.ask).poll(cx) {
                Poll::Ready(Ok(())) => 0,
                // Dropped unread.
                Poll::Ready(Err(_)) => {
                    self.expect = None;
                    return Ok(());
                }
                Poll::Pending => return Ok(()),
            },
        };
        while written < CONTINUE.len() {
            continuing.written = Some(written);
            match Pin::new(&mut *write).poll_write(cx, &CONTINUE[written..]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => written += n,
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => return Ok(()),
            }
        }
        if let Some(continuing) = self.expect.take() {
            let _ = continuing.go.send(());
        }
        Ok(())
    }

    /// Whether the application has closed its connection while its request waits for an answer
    /// (queued by a limit, or at the upstream): the caller then drops the request, which leaves
    /// the queue or abandons the upstream exchange, as nginx and Envoy do. Only once the request
    /// body is read; what arrives meanwhile (a pipelined request) is kept, up to
    /// `max_header_bytes`.
    fn gone(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(reader) = &mut self.reader else { return false };
        while self.framing.is_done() && reader.input.len() <= self.max_header_bytes {
            match reader.poll_read_more(cx) {
                Poll::Ready(Ok(0) | Err(_)) => return true,
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => break,
            }
        }
        false
    }

    /// Ends the request's body once its answer is in: skips what of it has already arrived,
    /// which a refused request's small body usually has, so the connection can serve the next
    /// one; not a body that waits for `100 Continue`, which the application may never send, nor
    /// one still read elsewhere. Whether the body is all read, and the reader here.
    fn finish_body(&mut self) -> bool {
        // A body read from now on gets no `100 Continue`: the answer is in.
        self.expect = None;
        if let Some(back) = &mut self.back {
            let Ok(returned) = back.try_recv() else { return false };
            self.back = None;
            self.take_back(returned);
        }
        let Some(reader) = &mut self.reader else { return false };
        if !self.unasked {
            while let Ok(Decoded::Data(_)) = self.framing.decode(&mut reader.input) {}
        }
        self.framing.is_done()
    }
}

/// A connection's limits, from its listener's configuration.
#[derive(Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) header_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) send_timeout: Duration,
    pub(crate) max_header_bytes: usize,
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

/// How a request head's wait ended.
enum Next {
    Request(RequestHead),
    /// The peer closed, the connection idled out or the listener is stopping.
    Close,
    /// The connection sent the HTTP/2 preface.
    Http2,
    /// A refusal to send before closing.
    Refuse(Refusal),
}

/// Serves `stream` until it closes; returns it, with what was read of it, if it speaks HTTP/2.
pub(crate) async fn serve(
    stream: TcpStream,
    mut stack: Stack,
    limits: Limits,
    stop: watch::Receiver<bool>,
) -> Result<Option<(TcpStream, Bytes)>, BoxError> {
    let (read, write) = stream.into_split();
    // Buffers are taken when there is something to read, and to write.
    let mut reader = Reader { read, input: BytesMut::new() };
    let mut writer = Writer {
        io: Timed { write, timeout: limits.send_timeout, timer: Timer::default(), armed: false },
        out: BytesMut::new(),
    };
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
            if let Some(next) = read_head(&mut reader.input, &mut http1, limits.max_header_bytes) {
                break next;
            }
            if !reader.input.is_empty() && head_since.is_none() {
                head_since = Some(Instant::now());
            }
            tokio::select! {
                biased;
                read = async {
                    if reader.input.capacity() == 0 {
                        // Given back while idle: taken again once there is something to read.
                        reader.read.readable().await?;
                    }
                    poll_fn(|cx| reader.poll_read_more(cx)).await
                } => {
                    if read? == 0 {
                        break Next::Close;
                    }
                }
                () = &mut tick => {
                    let now = Instant::now();
                    match head_since {
                        Some(since) if now - since >= limits.header_read_timeout => {
                            break Next::Refuse(Refusal::HeadTimeout);
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
            Next::Http2 => return Ok(Some((reader.read.reunite(writer.io.write)?, reader.input.freeze()))),
            Next::Refuse(why) => {
                let mut input = Input::holding(reader, limits.max_header_bytes);
                refuse(&mut writer, &mut input, why, Version::HTTP_11).await?;
                return Ok(None);
            }
        };
        let version = head.version;
        let framing = match framing(&head) {
            Ok(framing) => framing,
            Err(refused) => {
                let mut input = Input::holding(reader, limits.max_header_bytes);
                refuse(&mut writer, &mut input, Refusal::from(refused), version).await?;
                return Ok(None);
            }
        };
        let keep_alive = codec::keep_alive(version, &head.headers);
        let continues = version == Version::HTTP_11
            && head.headers.get(EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let (body, mut input) = Input::lend(reader, framing, continues, &limits);
        let request = request(head, body);
        let head_only = request.method() == Method::HEAD;
        let _ = poll_fn(|cx| stack.poll_ready(cx)).await;
        let response = match wait(stack.call(request), &mut input, &mut writer.io).await? {
            Ok(response) => response,
            Err(Unanswered::Gone) => {
                tracing::debug!("the application closed its connection before the answer; request dropped");
                return Ok(None);
            }
            Err(Unanswered::Stalled) => {
                tracing::debug!("the request body stopped arriving for the idle timeout; request dropped");
                refuse(&mut writer, &mut input, Refusal::BodyTimeout, version).await?;
                return Ok(None);
            }
        };
        // A body left unread (a refused request) would be taken for the next head.
        let unread = !input.finish_body();
        let close = !keep_alive || unread || *stop.borrow();
        let close = write_response(&mut writer, &mut input, response, head_only, version, close).await?;
        // A body all read has given the reader back.
        match input.reader.take() {
            Some(next) if !close => reader = next,
            taken => {
                input.reader = taken;
                if unread {
                    linger(&mut input, &mut writer).await;
                }
                return Ok(None);
            }
        }
        if reader.input.is_empty() {
            reader.input = BytesMut::new();
            writer.out = BytesMut::new();
        }
        idle_since = Instant::now();
    }
}

/// Answers `why` and closes the connection, lingering for what the application still sends.
async fn refuse(writer: &mut Writer, input: &mut Input, why: Refusal, version: Version) -> io::Result<()> {
    // The application speaks HTTP/1.1 here, never gRPC (which needs HTTP/2).
    write_response(writer, input, why.render(false), false, version, true).await?;
    linger(input, writer).await;
    Ok(())
}

/// Waits for the stack's answer to a request, while it writes `100 Continue` when the stack
/// reads a body that asked for it, and watches for the application closing its connection and
/// for a body that stops arriving; the stack's call is dropped, and with it any upstream
/// exchange, as soon as the wait ends.
async fn wait(
    call: impl Future<Output = Result<Response<Body>, Infallible>>,
    input: &mut Input,
    write: &mut Timed,
) -> io::Result<Result<Response<Body>, Unanswered>> {
    let mut call = pin!(call);
    poll_fn(|cx| {
        if let Poll::Ready(Ok(response)) = call.as_mut().poll(cx) {
            return Poll::Ready(Ok(Ok(response)));
        }
        if input.poll_back(cx) == Poll::Ready(true) {
            return Poll::Ready(Ok(Err(Unanswered::Stalled)));
        }
        if input.gone(cx) {
            return Poll::Ready(Ok(Err(Unanswered::Gone)));
        }
        input.poll_continue(write, cx)?;
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

/// Closes a connection that may have unread input — a request body, or the rest of a refused
/// head (`defaults::LINGER_TIME`): the write side first, then what the application still sends
/// is read and dropped until it closes too, or for a bounded time and size. A body still read
/// elsewhere is waited for, to give the reader back.
async fn linger(input: &mut Input, writer: &mut Writer) {
    let _ = writer.io.shutdown().await;
    let mut left = defaults::LINGER_BYTES;
    let drained = async {
        if input.reader.is_none() {
            poll_fn(|cx| input.poll_back(cx)).await;
        }
        let Some(reader) = &mut input.reader else { return };
        loop {
            reader.input.clear();
            match poll_fn(|cx| reader.poll_read_more(cx)).await {
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
    match codec::parse_request(input, max_header_bytes) {
        Ok(Some(head)) => Some(Next::Request(head)),
        Ok(None) if input.len() > max_header_bytes => Some(Next::Refuse(Refusal::HeadTooLarge)),
        Ok(None) => None,
        Err(malformed) => Some(Next::Refuse(Refusal::from(malformed))),
    }
}

/// How the request's body is delimited, if the request may be served.
fn framing(head: &RequestHead) -> Result<Framing, Refused> {
    let framing = codec::request_framing(head.version, &head.headers)?;
    if head.version == Version::HTTP_11 && head.headers.get_all(HOST).iter().count() != 1 {
        return Err(Malformed("an HTTP/1.1 request needs exactly one host header").into());
    }
    Ok(framing)
}

/// The request for the stack.
fn request(head: RequestHead, body: Inbound) -> Request<RequestBody> {
    let RequestHead { method, uri, version, headers } = head;
    let mut request = Request::new(RequestBody::new(Either::Left(body)));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    request
}

/// Writes `response`, its body framed by its length, else chunked for HTTP/1.1 clients, else by
/// closing. Returns whether the connection is to close: asked to, or the body could not be
/// delimited or failed midway. Trailers are dropped (gRPC, which needs them, is HTTP/2).
async fn write_response(
    writer: &mut Writer,
    input: &mut Input,
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
    out.reserve(BUFFER);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    // The sidecar's own answers have none, and an upstream may have left it out.
    if !parts.headers.contains_key(DATE) {
        codec::write_date(out);
    }
    // A bodiless answer's Content-Length describes the body a GET would have had: it goes on, as
    // one number — except on a 1xx or 204, which must not carry one (RFC 9110 §8.6). Otherwise
    // the body's own length: an upstream's declared length, which its body is held to.
    let framing = if bodiless {
        let never = status.is_informational() || status == StatusCode::NO_CONTENT;
        let length = if never { None } else { codec::content_length(&parts.headers).ok().flatten() };
        codec::write_framed_headers(out, &parts.headers, length);
        Some(Framing::EMPTY)
    } else {
        codec::write_framed_headers(out, &parts.headers, body.size_hint().exact())
    };
    let mut framing = match framing {
        Some(framing) => framing,
        None if version == Version::HTTP_11 => codec::write_chunked(out),
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
        close |= !write_body(writer, input, &mut body, &mut framing).await?;
    }
    writer.io.write_all(&writer.out).await?;
    Ok(close)
}

/// Streams `body` behind what the writer holds; false if it broke its framing or failed. While
/// the upstream keeps it waiting, the application is watched: one that leaves ends the answer
/// (an error), and with it the request's hold on its permits, the upstream's connection or
/// stream, at once rather than when the upstream next sends something.
async fn write_body(
    writer: &mut Writer,
    input: &mut Input,
    body: &mut Body,
    framing: &mut Framing,
) -> io::Result<bool> {
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
                    Poll::Pending => {
                        // A request body read to its end since gives the reader back.
                        let _ = input.poll_back(cx);
                        if input.gone(cx) {
                            let left =
                                io::Error::new(io::ErrorKind::ConnectionAborted, "the application left mid-answer");
                            return Poll::Ready(Err(left));
                        }
                        Poll::Pending
                    }
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
            codec::write_number(&mut writer.out, data.len() as u64, 16);
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
