//! HTTP/1.1 framing (RFC 9112), shared by the server and the client side: heads parsed with
//! httparse into `http` types and written back out, the rules that say how a request's or a
//! response's body is delimited, and bodies decoded by Content-Length, chunked coding or the
//! connection's end. No I/O beyond the two poll helpers that read into a buffer.

use std::{
    fmt,
    future::Future,
    mem::MaybeUninit,
    pin::pin,
    task::{Context, Poll, ready},
};

use bytes::{Buf, Bytes, BytesMut};
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version,
    header::{CONTENT_LENGTH, TRAILER, TRANSFER_ENCODING},
};
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::Rejection;

/// Headers a head may carry, as hyper allows.
const MAX_HEADERS: usize = 100;

/// Longest chunk-size line, extensions included, and most trailer bytes: both are read whole
/// before they are understood, so they are bounded.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// How much more the read buffer takes at a time.
const READ_CHUNK: usize = 8 * 1024;

/// A message that breaks HTTP/1.1's rules; the text says which one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Malformed {}

impl From<httparse::Error> for Malformed {
    fn from(e: httparse::Error) -> Malformed {
        Malformed(match e {
            httparse::Error::HeaderName => "invalid header name",
            httparse::Error::HeaderValue => "invalid header value",
            httparse::Error::NewLine => "invalid line ending",
            httparse::Error::Status => "invalid status",
            httparse::Error::Token => "invalid method",
            httparse::Error::TooManyHeaders => "more than 100 headers",
            httparse::Error::Version => "invalid HTTP version",
        })
    }
}

/// A parsed request head.
pub struct RequestHead {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
}

/// A parsed response head.
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
}

/// Where each header's name and value lie in the head: the head's bytes are frozen once parsed,
/// and the values then point into them instead of being copied. Most heads fit in place (an
/// array of all [`MAX_HEADERS`] would be zeroed, 3 KiB, for every head).
type Fields = SmallVec<[[usize; 4]; 24]>;

/// Takes a whole request head off the front of `buf`; `None` until all of it is there, or for
/// good if it does not end within `max` bytes (the caller sees `buf` is longer than `max`): a
/// head's size does not depend on how many reads brought it.
pub fn parse_request(buf: &mut BytesMut, max: usize) -> Result<Option<RequestHead>, Malformed> {
    let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let window = &buf[..buf.len().min(max)];
    let end =
        match httparse::ParserConfig::default().parse_request_with_uninit_headers(&mut request, window, &mut slots)? {
            httparse::Status::Complete(end) => end,
            httparse::Status::Partial => return Ok(None),
        };
    let method =
        Method::from_bytes(request.method.unwrap_or_default().as_bytes()).map_err(|_| Malformed("invalid method"))?;
    let version = version(request.version)?;
    let target = span(buf, request.path.unwrap_or_default().as_bytes());
    let mut fields = Fields::new();
    locate(buf, request.headers, &mut fields);
    let head = buf.split_to(end).freeze();
    let uri =
        Uri::from_maybe_shared(head.slice(target[0]..target[1])).map_err(|_| Malformed("invalid request target"))?;
    let headers = header_map(&head, &fields)?;
    Ok(Some(RequestHead { method, uri, version, headers }))
}

/// Takes a whole response head off the front of `buf`; `None` until all of it is there, or
/// for good if it does not end within `max` bytes (as for [`parse_request`]).
pub fn parse_response(buf: &mut BytesMut, max: usize) -> Result<Option<ResponseHead>, Malformed> {
    let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let window = &buf[..buf.len().min(max)];
    let end = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        window,
        &mut slots,
    )? {
        httparse::Status::Complete(end) => end,
        httparse::Status::Partial => return Ok(None),
    };
    let status = StatusCode::from_u16(response.code.unwrap_or_default()).map_err(|_| Malformed("invalid status"))?;
    let version = version(response.version)?;
    let mut fields = Fields::new();
    locate(buf, response.headers, &mut fields);
    let head = buf.split_to(end).freeze();
    let headers = header_map(&head, &fields)?;
    Ok(Some(ResponseHead { status, version, headers }))
}

fn version(minor: Option<u8>) -> Result<Version, Malformed> {
    match minor {
        Some(1) => Ok(Version::HTTP_11),
        Some(0) => Ok(Version::HTTP_10),
        _ => Err(Malformed("invalid HTTP version")),
    }
}

/// Start and end of `part`, a slice of `buf`, as offsets into it.
fn span(buf: &[u8], part: &[u8]) -> [usize; 2] {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    [start, start + part.len()]
}

fn locate(buf: &[u8], headers: &[httparse::Header<'_>], fields: &mut Fields) {
    for header in headers {
        let [name, name_end] = span(buf, header.name.as_bytes());
        let [value, value_end] = span(buf, header.value);
        fields.push([name, name_end, value, value_end]);
    }
}

fn header_map(head: &Bytes, fields: &[[usize; 4]]) -> Result<HeaderMap, Malformed> {
    let mut headers = HeaderMap::with_capacity(fields.len());
    for &[name, name_end, value, value_end] in fields {
        let name = HeaderName::from_bytes(&head[name..name_end]).map_err(|_| Malformed("invalid header name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(value..value_end))
            .map_err(|_| Malformed("invalid header value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// The Content-Length of a message, if it has one. Repeats of one value (`5, 5`) are one length;
/// anything else that is not a single decimal number is refused (RFC 9112 §6.3).
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Malformed> {
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        for item in value.as_bytes().split(|&b| b == b',') {
            let n = decimal(item.trim_ascii()).ok_or(Malformed("invalid content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(Malformed("conflicting content-length values"));
            }
            length = Some(n);
        }
    }
    Ok(length)
}

fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// What a message's Transfer-Encoding says (RFC 9112 §6.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    /// `chunked` alone: the one coding the sidecar decodes, and applies again on the way out.
    Chunked,
    /// Other codings under a final `chunked` (`gzip, chunked`): the sidecar would have to undo
    /// them or pass them on, and does neither.
    Layered,
    /// Not ending in `chunked`, or `chunked` twice: the framing does not say where the body ends.
    Unchunked,
}

/// The message's transfer codings, all its Transfer-Encoding fields read as one list; `None`
/// without any.
pub fn transfer_coding(headers: &HeaderMap) -> Option<Coding> {
    let mut fields = headers.get_all(TRANSFER_ENCODING).iter().peekable();
    fields.peek()?;
    let (mut codings, mut chunked, mut last_chunked) = (0, 0, false);
    for coding in fields.flat_map(|v| v.as_bytes().split(|&b| b == b',')).map(<[u8]>::trim_ascii) {
        if coding.is_empty() {
            continue;
        }
        codings += 1;
        last_chunked = coding.eq_ignore_ascii_case(b"chunked");
        chunked += usize::from(last_chunked);
    }
    Some(match (last_chunked, chunked, codings) {
        (true, 1, 1) => Coding::Chunked,
        (true, 1, _) => Coding::Layered,
        _ => Coding::Unchunked,
    })
}

/// Whether a message of `version` with `headers` lets its connection carry another one:
/// HTTP/1.1 unless `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`.
pub(super) fn keep_alive(version: Version, headers: &HeaderMap) -> bool {
    if version == Version::HTTP_11 { !connection_has(headers, "close") } else { connection_has(headers, "keep-alive") }
}

/// Whether `Connection` lists `option` (`close`, `keep-alive`).
fn connection_has(headers: &HeaderMap, option: &str) -> bool {
    headers
        .get_all(http::header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|o| o.trim_ascii().eq_ignore_ascii_case(option.as_bytes()))
}

/// How a request's body is delimited, checked against request smuggling (RFC 9112 §6.3). A
/// message with both Transfer-Encoding and Content-Length, a Transfer-Encoding not ending in
/// chunked once, or unclear Content-Length is malformed; a transfer coding other than chunked is
/// not implemented (§6.1).
pub fn request_framing(version: Version, headers: &HeaderMap) -> Result<Framing, Rejection> {
    let content_length = content_length(headers)?;
    Ok(match (transfer_coding(headers), content_length) {
        (Some(_), Some(_)) => return Err(Malformed("both transfer-encoding and content-length").into()),
        (Some(_), None) if version == Version::HTTP_10 => {
            return Err(Malformed("transfer-encoding in HTTP/1.0").into());
        }
        (Some(Coding::Chunked), None) => Framing::chunked(),
        (Some(Coding::Layered), None) => return Err(Rejection::NotImplemented("transfer codings other than chunked")),
        (Some(Coding::Unchunked), None) => {
            return Err(Malformed("transfer-encoding does not end in chunked, once").into());
        }
        (None, length) => Framing::Length(length.unwrap_or(0)),
    })
}

/// How the response body to a `method` request is delimited (RFC 9112 §6.3). A response with
/// both Transfer-Encoding and Content-Length is refused rather than guessed at: it is how
/// response splitting looks. So is one with a transfer coding other than chunked: the sidecar
/// never offers one (it sends no `TE` but `trailers`), and would pass the body on without it.
/// And so is an HTTP/1.0 response with any Transfer-Encoding, which HTTP/1.0 does not have: RFC
/// 9112 §6.1 has its framing taken as faulty (likely forwarded by something that did not decode
/// it) and its connection closed, as the refusal does.
pub fn response_framing(method: &Method, head: &ResponseHead) -> Result<Framing, Malformed> {
    let coding = transfer_coding(&head.headers);
    if coding.is_some() && head.version == Version::HTTP_10 {
        return Err(Malformed("HTTP/1.0 response with transfer-encoding"));
    }
    if method == Method::HEAD || head.status == StatusCode::NO_CONTENT || head.status == StatusCode::NOT_MODIFIED {
        return Ok(Framing::EMPTY);
    }
    match (coding, content_length(&head.headers)?) {
        (Some(_), Some(_)) => Err(Malformed("response has both transfer-encoding and content-length")),
        (Some(Coding::Chunked), None) => Ok(Framing::chunked()),
        (Some(Coding::Layered | Coding::Unchunked), None) => {
            Err(Malformed("response has a transfer coding other than chunked"))
        }
        (None, None) => Ok(Framing::UntilClose),
        (None, Some(length)) => Ok(Framing::Length(length)),
    }
}

/// Appends the header lines of a message whose body has `length` bytes, or an unknown length:
/// `headers` without their framing (Content-Length, Transfer-Encoding) and without `Trailer`,
/// which would announce trailer fields this codec does not send, then a Content-Length of the
/// sidecar's own for a known length. Rewritten rather than passed on, the length leaves
/// as one number even when it came as a list of repeats ("5, 5", which RFC 9110 §8.6 lets a
/// recipient reduce to one). Returns the body's framing; `None` for an unknown length, for the
/// caller to write chunked or close after it.
pub fn write_framed_headers(out: &mut BytesMut, headers: &HeaderMap, length: Option<u64>) -> Option<Framing> {
    let framing = |name: &HeaderName| name == CONTENT_LENGTH || name == TRANSFER_ENCODING || name == TRAILER;
    for (name, value) in headers.iter().filter(|(name, _)| !framing(name)) {
        write_header(out, name.as_str(), |out| out.extend_from_slice(value.as_bytes()));
    }
    let length = length?;
    write_header(out, CONTENT_LENGTH.as_str(), |out| write_number(out, length, 10));
    Some(Framing::Length(length))
}

/// Appends `transfer-encoding: chunked`; returns the framing it starts.
pub(super) fn write_chunked(out: &mut BytesMut) -> Framing {
    write_header(out, TRANSFER_ENCODING.as_str(), |out| out.extend_from_slice(b"chunked"));
    Framing::chunked()
}

/// Appends one `name: value` line, the value written by `value`.
fn write_header(out: &mut BytesMut, name: &str, value: impl FnOnce(&mut BytesMut)) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    value(out);
    out.extend_from_slice(b"\r\n");
}

/// Appends a `date` line for now (RFC 9110 §6.6.1), formatted once a second per thread.
pub(super) fn write_date(out: &mut BytesMut) {
    thread_local! {
        static NOW: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let now = std::time::SystemTime::now();
    let second = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    NOW.with_borrow_mut(|(at, text)| {
        if *at != second {
            *at = second;
            *text = httpdate::fmt_http_date(now);
        }
        write_header(out, "date", |out| out.extend_from_slice(text.as_bytes()));
    });
}

/// Appends `n` in `radix` (10 for lengths, 16 for chunk sizes) without allocating.
pub fn write_number(out: &mut BytesMut, mut n: u64, radix: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789ABCDEF"[(n % radix) as usize];
        n /= radix;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// How a body's end is found, and how far reading it has got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framing {
    /// This many bytes are still to come; 0 once the body is complete (or for no body at all).
    Length(u64),
    Chunked(Chunk),
    /// Everything until the peer closes (a response without a length).
    UntilClose,
}

/// Where a chunked body's decoding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer fields, dropped: the sidecar carries trailers only over HTTP/2.
    Trailers {
        read: usize,
    },
    Done,
}

/// What a look at the buffered bytes gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    Data(Bytes),
    End,
    /// Nothing until more bytes are read.
    More,
}

impl Framing {
    pub const EMPTY: Framing = Framing::Length(0);

    pub fn chunked() -> Framing {
        Framing::Chunked(Chunk::Size)
    }

    pub fn is_done(&self) -> bool {
        matches!(self, Framing::Length(0) | Framing::Chunked(Chunk::Done))
    }

    /// Takes what it can of the body off the front of `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, Malformed> {
        match self {
            Framing::Length(0) => Ok(Decoded::End),
            Framing::Length(left) => {
                if buf.is_empty() {
                    return Ok(Decoded::More);
                }
                let take = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                *left -= take as u64;
                Ok(Decoded::Data(buf.split_to(take).freeze()))
            }
            Framing::UntilClose if buf.is_empty() => Ok(Decoded::More),
            Framing::UntilClose => Ok(Decoded::Data(buf.split().freeze())),
            Framing::Chunked(chunk) => decode_chunked(chunk, buf),
        }
    }

    /// The peer closed the connection: the end of an until-close body, a truncation of others.
    pub fn at_eof(&mut self) -> Result<(), Malformed> {
        match self {
            Framing::UntilClose => {
                *self = Framing::EMPTY;
                Ok(())
            }
            _ if self.is_done() => Ok(()),
            _ => Err(Malformed("connection closed before the end of the body")),
        }
    }

    /// Bytes still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Framing::Length(left) => Some(*left),
            Framing::Chunked(Chunk::Done) => Some(0),
            _ => None,
        }
    }
}

fn decode_chunked(chunk: &mut Chunk, buf: &mut BytesMut) -> Result<Decoded, Malformed> {
    loop {
        match *chunk {
            Chunk::Size => {
                let Some(first) = buf.first() else { return Ok(Decoded::More) };
                // httparse would read a bare CRLF as a last chunk of size 0.
                if !first.is_ascii_hexdigit() {
                    return Err(Malformed("invalid chunk size"));
                }
                match httparse::parse_chunk_size(buf).map_err(|_| Malformed("invalid chunk size"))? {
                    httparse::Status::Complete((end, _)) if end > MAX_CHUNK_LINE => {
                        return Err(Malformed("chunk size line too long"));
                    }
                    // httparse takes any byte in a chunk extension up to the CRLF. A bare LF
                    // there is where a peer that ends lines at LF reads the chunk's data from,
                    // and no control belongs in one (tokens and quoted strings, §7.1.1).
                    httparse::Status::Complete((end, _))
                        if buf[..end - 2].iter().any(|&b| b.is_ascii_control() && b != b'\t') =>
                    {
                        return Err(Malformed("invalid chunk extension"));
                    }
                    httparse::Status::Complete((end, size)) => {
                        buf.advance(end);
                        *chunk = if size == 0 { Chunk::Trailers { read: 0 } } else { Chunk::Data(size) };
                    }
                    httparse::Status::Partial if buf.len() > MAX_CHUNK_LINE => {
                        return Err(Malformed("chunk size line too long"));
                    }
                    // The same, before the line's end has come.
                    httparse::Status::Partial
                        if buf.iter().any(|&b| b.is_ascii_control() && b != b'\t' && b != b'\r') =>
                    {
                        return Err(Malformed("invalid chunk extension"));
                    }
                    httparse::Status::Partial => return Ok(Decoded::More),
                }
            }
            Chunk::Data(left) => {
                if buf.is_empty() {
                    return Ok(Decoded::More);
                }
                let take = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                let left = left - take as u64;
                *chunk = if left == 0 { Chunk::DataEnd } else { Chunk::Data(left) };
                return Ok(Decoded::Data(buf.split_to(take).freeze()));
            }
            Chunk::DataEnd => {
                if buf.len() < 2 {
                    return Ok(Decoded::More);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(Malformed("chunk data longer than its size"));
                }
                buf.advance(2);
                *chunk = Chunk::Size;
            }
            Chunk::Trailers { read } => {
                let Some(newline) = buf.iter().position(|&b| b == b'\n') else {
                    if read + buf.len() > MAX_TRAILER_BYTES {
                        return Err(Malformed("trailers too large"));
                    }
                    return Ok(Decoded::More);
                };
                // Only CRLF ends a line: a bare CR is where a lax peer would see one end (RFC
                // 9112 §2.2), and so the trailers end, a line early.
                if newline == 0 || buf[newline - 1] != b'\r' || buf[..newline - 1].contains(&b'\r') {
                    return Err(Malformed("invalid line ending in trailers"));
                }
                let line = buf.split_to(newline + 1);
                *chunk = if line.len() == 2 {
                    Chunk::Done
                } else if read + line.len() > MAX_TRAILER_BYTES {
                    return Err(Malformed("trailers too large"));
                } else {
                    Chunk::Trailers { read: read + line.len() }
                };
            }
            Chunk::Done => return Ok(Decoded::End),
        }
    }
}

/// Reads more of `io` into `buf`; `Ok(0)` at the end of the stream.
pub(super) fn poll_read_more<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<usize>> {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
    pin!(io.read_buf(buf)).poll(cx)
}

/// The next piece of a body read from `io`: data, `None` at its end, or an error.
pub(super) fn poll_body<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    framing: &mut Framing,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Bytes, crate::body::BoxError>>> {
    loop {
        return Poll::Ready(match framing.decode(buf) {
            Ok(Decoded::Data(data)) => Some(Ok(data)),
            Ok(Decoded::End) => None,
            Ok(Decoded::More) => match ready!(poll_read_more(io, buf, cx)) {
                Ok(0) => framing.at_eof().err().map(|e| Err(e.into())),
                Ok(_) => continue,
                Err(e) => Some(Err(e.into())),
            },
            Err(e) => Some(Err(e.into())),
        });
    }
}

#[cfg(test)]
mod tests;
