//! The application's HTTP/1.1 connections, served on the connection's task: a request head is
//! read, handed to the connection's service with its body ([`inbound`](super::inbound)), and the
//! response is written back ([`outbound`](super::outbound)), one exchange after the other
//! (pipelined requests wait in the read buffer). A connection that opens with the HTTP/2 preface
//! is handed back, for hyper's HTTP/2 server.

use std::{
    convert::Infallible,
    future::{Future, poll_fn},
    io,
    pin::pin,
    task::Poll,
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use http::{
    Method, Request, Response, Version,
    header::{EXPECT, HOST},
};
use http_body::Body as HttpBody;
use http_body_util::Either;
use tokio::{io::AsyncWriteExt, net::TcpStream, sync::watch};
use tower::Service;

use super::{
    codec::{self, Framing, Malformed, RequestHead},
    inbound::{Inbound, Input, Reader},
    outbound::{Timed, Writer, write_response},
    spare,
};
use crate::{
    Rejection,
    body::{BoxError, Downstream},
    defaults,
    sync::stopped,
    time,
};

/// What every HTTP/2 prior-knowledge connection starts with (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection's limits, from its listener's configuration.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A request head must arrive within this, from its first byte.
    pub header_read_timeout: Duration,
    /// A connection that moves no byte (HTTP/2: with no stream open) is closed; a request body
    /// that stops arriving is cut off.
    pub idle_timeout: Duration,
    /// An answer the application takes no byte of for this long is cut off.
    pub send_timeout: Duration,
    /// Largest request head (HTTP/1.1) or header list (HTTP/2).
    pub max_header_bytes: usize,
}

/// How a request head's wait ended.
enum Next {
    Request(RequestHead),
    /// The peer closed, the connection idled out or the listener is stopping.
    Close,
    /// The connection sent the HTTP/2 preface.
    Http2,
    /// A refusal to send before closing.
    Refuse(Rejection),
}

/// Serves `stream` with `service` until it closes; returns it, with what was read of it, if it
/// speaks HTTP/2. `reject` renders what the server refuses itself.
pub async fn serve<S, B>(
    stream: TcpStream,
    mut service: S,
    limits: Limits,
    stop: watch::Receiver<bool>,
    reject: fn(Rejection) -> Response<B>,
) -> Result<Option<(TcpStream, Bytes)>, BoxError>
where
    S: Service<Request<Downstream>, Response = Response<B>, Error = Infallible>,
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let (read, write) = stream.into_split();
    // Buffers are taken when there is something to read, and to write.
    let mut reader = Reader::new(read);
    let mut writer = Writer { io: Timed::new(write, limits.send_timeout), out: BytesMut::new() };
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
                        reader.input = spare::take();
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
                            break Next::Refuse(Rejection::HeadTimeout);
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
                refuse(&mut writer, &mut input, reject(why), Version::HTTP_11).await?;
                return Ok(None);
            }
        };
        let version = head.version;
        let framing = match framing(&head) {
            Ok(framing) => framing,
            Err(refused) => {
                let mut input = Input::holding(reader, limits.max_header_bytes);
                refuse(&mut writer, &mut input, reject(refused), version).await?;
                return Ok(None);
            }
        };
        let keep_alive = codec::keep_alive(version, &head.headers);
        let continues = version == Version::HTTP_11
            && head.headers.get(EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let (body, mut input) = Input::lend(reader, framing, continues, limits.idle_timeout, limits.max_header_bytes);
        let request = request(head, body);
        let head_only = request.method() == Method::HEAD;
        let _ = poll_fn(|cx| service.poll_ready(cx)).await;
        let response = match wait(service.call(request), &mut input, &mut writer.io).await? {
            Ok(response) => response,
            Err(Unanswered::Gone) => {
                tracing::debug!("the application closed its connection before the answer; request dropped");
                return Ok(None);
            }
            Err(Unanswered::Stalled) => {
                tracing::debug!("the request body stopped arriving for the idle timeout; request dropped");
                refuse(&mut writer, &mut input, reject(Rejection::BodyTimeout), version).await?;
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
            spare::give_back(std::mem::take(&mut reader.input));
            spare::give_back(std::mem::take(&mut writer.out));
        }
        idle_since = Instant::now();
    }
}

/// Answers with `refusal` and closes the connection, lingering for what the application still
/// sends.
async fn refuse<B>(writer: &mut Writer, input: &mut Input, refusal: Response<B>, version: Version) -> io::Result<()>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    write_response(writer, input, refusal, false, version, true).await?;
    linger(input, writer).await;
    Ok(())
}

/// Waits for the service's answer to a request, while it writes `100 Continue` when the service
/// reads a body that asked for it, and watches for the application closing its connection and
/// for a body that stops arriving; the service's call is dropped, and with it any upstream
/// exchange, as soon as the wait ends.
async fn wait<B>(
    call: impl Future<Output = Result<Response<B>, Infallible>>,
    input: &mut Input,
    write: &mut Timed,
) -> io::Result<Result<Response<B>, Unanswered>> {
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
    /// The request body the service was reading stopped arriving for the idle timeout.
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
        Ok(None) if input.len() > max_header_bytes => Some(Next::Refuse(Rejection::HeadTooLarge)),
        Ok(None) => None,
        Err(malformed) => Some(Next::Refuse(Rejection::from(malformed))),
    }
}

/// How the request's body is delimited, if the request may be served.
fn framing(head: &RequestHead) -> Result<Framing, Rejection> {
    let framing = codec::request_framing(head.version, &head.headers)?;
    if head.version == Version::HTTP_11 && head.headers.get_all(HOST).iter().count() != 1 {
        return Err(Malformed("an HTTP/1.1 request needs exactly one host header").into());
    }
    Ok(framing)
}

/// The request for the service.
fn request(head: RequestHead, body: Inbound) -> Request<Downstream> {
    let RequestHead { method, uri, version, headers } = head;
    let mut request = Request::new(Either::Left(body));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    request
}
