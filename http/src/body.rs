//! The bodies' wrappers, one concern each: [`Guarded`] holds a guard until its body is dropped
//! (a body dropped early, by an application that left, gives it back at once), and
//! [`IdleTimeout`] cuts off an upstream's body that sends nothing for too long.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::Either;
use hyper::body::Incoming;
use pin_project_lite::pin_project;

use crate::{h1::Inbound, time::Timer};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body sent upstream: any body of bytes whose errors say what went wrong.
pub trait Outgoing: HttpBody<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static {}

impl<B: HttpBody<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static> Outgoing for B {}

/// Reading the application's request body failed (malformed chunked coding, a connection that
/// broke off) while it was sent upstream: the request is at fault, not the upstream.
#[derive(Debug)]
pub struct RequestBodyFailed(pub BoxError);

impl fmt::Display for RequestBodyFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reading the request body: {}", self.0)
    }
}

impl std::error::Error for RequestBodyFailed {}

/// A request body as the application's connection delivers it: from the own HTTP/1.1 server,
/// or from hyper's HTTP/2 server.
pub type Downstream = Either<Inbound, Incoming>;

pin_project! {
    /// A body that holds `guard` until it is dropped.
    pub struct Guarded<B, G> {
        #[pin]
        inner: B,
        guard: G,
    }
}

impl<B, G> Guarded<B, G> {
    pub fn new(inner: B, guard: G) -> Guarded<B, G> {
        Guarded { inner, guard }
    }
}

impl<B: HttpBody, G> HttpBody for Guarded<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project! {
    /// A body the upstream has sent nothing of for `timeout` fails: a stalled upstream must not
    /// hold a connection, a stream and the request's permits for ever.
    pub struct IdleTimeout<B> {
        #[pin]
        inner: B,
        timeout: Duration,
        // Runs while the body waits for the upstream.
        timer: Timer,
        // Whether the timer runs for the current wait; a frame ends the wait.
        armed: bool,
    }
}

impl<B> IdleTimeout<B> {
    pub fn new(inner: B, timeout: Duration) -> IdleTimeout<B> {
        IdleTimeout { inner, timeout, timer: Timer::default(), armed: false }
    }
}

impl<B> HttpBody for IdleTimeout<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            *this.armed = false;
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        if !*this.armed {
            this.timer.start(*this.timeout);
            *this.armed = true;
        }
        this.timer.poll_fired(cx).map(|()| {
            let silent = humantime::format_duration(*this.timeout);
            tracing::debug!(%silent, "the upstream's response body stalled; cut off");
            Some(Err(format!("the upstream sent nothing for {silent}").into()))
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
