//! The bodies on the data path, one concern per wrapper: an upstream's body streamed through
//! ([`UpstreamBody`]: off a pooled HTTP/1.1 connection, or an HTTP/2 stream that keeps its place
//! among its connection's open streams while the body lives) and cut off when the upstream sends
//! nothing for its `body_idle_timeout` ([`IdleTimeout`]); held with the request's concurrency
//! permits until it ends and metered when its rule charges bytes ([`Admitted`]); or a small
//! synthetic one ([`Body`]). Guards ride on a body with [`Guarded`], so that a body dropped early
//! (an application that left) gives them back at once.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use pin_project_lite::pin_project;

use crate::{
    gate::Permits,
    h1::{Http1Body, Inbound},
    metered::Metered,
    sync::Open,
    time::Timer,
};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Reading the application's request body failed (malformed chunked coding, a connection that
/// broke off): the request is at fault, not the upstream, so it is answered 400 rather than 502.
#[derive(Debug)]
pub struct RequestBodyFailed(pub BoxError);

impl fmt::Display for RequestBodyFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reading the request body: {}", self.0)
    }
}

impl std::error::Error for RequestBodyFailed {}

/// The body of a request on its way upstream, as the application's connection delivers it:
/// from the own HTTP/1.1 codec, or from hyper's HTTP/2 server; metered when its rule charges
/// its bytes.
pub type RequestBody = Metered<Either<Inbound, Incoming>>;

/// An upstream's response body: read off its HTTP/1.1 connection, or off its HTTP/2 stream,
/// which stays open on the upstream's connection until the body is dropped.
pub type UpstreamBody = IdleTimeout<Either<Http1Body, Guarded<Incoming, Open>>>;

/// A response body as admission hands it back: holding the request's concurrency permits until
/// it is dropped — for a stream, the request is in flight until its last frame — and metered
/// when its rule charges response bytes.
pub type Admitted<B> = Metered<Guarded<B, Permits>>;

/// The body of the stack's answers: made up by the sidecar, or the upstream's.
pub type Body = Either<Full<Bytes>, Admitted<UpstreamBody>>;

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
