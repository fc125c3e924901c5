//! The write side of an application's HTTP/1.1 connection: the socket under the send timeout,
//! and responses written with their bodies framed.

use std::{
    future::poll_fn,
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use http::{Response, StatusCode, Version, header::DATE};
use http_body::Body as HttpBody;
use tokio::{
    io::{AsyncWrite, AsyncWriteExt},
    net::tcp::OwnedWriteHalf,
};

use super::{
    codec::{self, Framing},
    spare,
};
use crate::{body::BoxError, time::Timer};

/// Body data up to this size is copied behind the head (or the previous data) to go out in one
/// write; larger pieces are written on their own.
const COPY_LIMIT: usize = 16 * 1024;

/// What a response being written watches while its body waits for the upstream.
pub(super) trait Watch {
    /// Whether the application has left: the answer then ends at once, and with it the
    /// request's hold on its permits and the upstream's connection or stream.
    fn left(&mut self, cx: &mut Context<'_>) -> bool;
}

/// The write side of a connection: what is to go out, and the socket under the send timeout.
pub(super) struct Writer {
    pub(super) io: Timed,
    pub(super) out: BytesMut,
}

/// The connection's write half, failing with `TimedOut` once a write has waited for the
/// application to take more for `timeout` (between two writes, not for a whole answer, as
/// nginx's `send_timeout`): an application that stops reading its answer must not hold the
/// connection and the request's permits for ever.
pub(super) struct Timed {
    pub(super) write: OwnedWriteHalf,
    timeout: Duration,
    timer: Timer,
    /// The timer runs for the write that waits now.
    armed: bool,
}

impl Timed {
    pub(super) fn new(write: OwnedWriteHalf, timeout: Duration) -> Timed {
        Timed { write, timeout, timer: Timer::default(), armed: false }
    }
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

/// Writes `response`, its body framed by its length, else chunked for HTTP/1.1 clients, else by
/// closing. Returns whether the connection is to close: asked to, or the body could not be
/// delimited or failed midway. Trailers are dropped (gRPC, which needs them, is HTTP/2).
pub(super) async fn write_response<B>(
    writer: &mut Writer,
    input: &mut impl Watch,
    response: Response<B>,
    head_only: bool,
    version: Version,
    mut close: bool,
) -> io::Result<bool>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let (parts, mut body) = response.into_parts();
    let out = &mut writer.out;
    let status = parts.status;
    let bodiless = head_only
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    out.clear();
    if out.capacity() == 0 {
        *out = spare::take();
    }
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
async fn write_body<B>(
    writer: &mut Writer,
    input: &mut impl Watch,
    body: &mut B,
    framing: &mut Framing,
) -> io::Result<bool>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
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
                        if input.left(cx) {
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
                let e: BoxError = e.into();
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
