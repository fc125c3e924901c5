//! The bodies on the data path. The response body the sidecar hands back is an upstream's body
//! streamed through (for HTTP/1.1, read off its pooled connection), holding the request's
//! concurrency permits and its place among the open streams of its HTTP/2 connections until it
//! ends, or is cut off when the upstream sends nothing for its `body_idle_timeout`; or a small
//! synthetic one.

use std::{
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use pin_project_lite::pin_project;

use crate::{
    classify::Charge,
    gate::{Gate, Permits},
    h1::{Http1Body, Inbound},
    listener::Progress,
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

pin_project! {
    #[project = Projection]
    pub enum Body {
        // An upstream's body holds the request's concurrency permits until it is dropped: for
        // a stream, the request is in flight until its last frame. So is the stream open on
        // the upstream's HTTP/2 connection, and on the application's. Metered when its rule
        // charges its bytes.
        Upstream {
            #[pin]
            inner: Metered<Either<Http1Body, Incoming>>,
            idle: IdleWatch,
            permits: Option<Permits>,
            upstream_stream: Option<Open>,
            app_stream: Option<(Open, Option<Arc<Progress>>)>,
        },
        Synthetic {
            #[pin]
            inner: Full<Bytes>,
        },
    }
}

impl Body {
    /// The body of a response read off an HTTP/1.1 connection, cut off after `idle` without a
    /// byte.
    pub fn http1(inner: Http1Body, idle: Duration) -> Body {
        Body::Upstream {
            inner: Metered::new(Either::Left(inner)),
            idle: IdleWatch::new(idle),
            permits: None,
            upstream_stream: None,
            app_stream: None,
        }
    }

    /// The body of a response on `stream` of an upstream's HTTP/2 connection, cut off after
    /// `idle` without a frame.
    pub fn http2(inner: Incoming, stream: Open, idle: Duration) -> Body {
        Body::Upstream {
            inner: Metered::new(Either::Right(inner)),
            idle: IdleWatch::new(idle),
            permits: None,
            upstream_stream: Some(stream),
            app_stream: None,
        }
    }

    pub fn synthetic(bytes: impl Into<Bytes>) -> Body {
        Body::Synthetic { inner: Full::new(bytes.into()) }
    }

    pub fn empty() -> Body {
        Body::synthetic(Bytes::new())
    }

    /// Keeps `permits` until this body ends.
    pub fn hold(&mut self, held: Permits) {
        if let Body::Upstream { permits, .. } = self {
            *permits = Some(held);
        }
    }

    /// Charges the bytes of an upstream's body to `charge`'s resources as they pass (after the
    /// fact).
    pub fn charge_to(&mut self, charge: Arc<Charge>, gates: Arc<[Arc<Gate>]>) {
        if let Body::Upstream { inner, .. } = self {
            inner.charge_to(charge, gates, false);
        }
    }

    /// Keeps `stream` of the application's HTTP/2 connection open until this body ends, and
    /// tells its `progress` of each piece handed over to be sent; a synthetic body is sent at
    /// once.
    pub fn hold_stream(&mut self, stream: Open, progress: Option<Arc<Progress>>) {
        if let Body::Upstream { app_stream, .. } = self {
            *app_stream = Some((stream, progress));
        }
    }
}

/// A body the upstream has sent nothing of for `timeout` fails: a stalled upstream must not
/// hold a connection, a stream and the request's permits for ever.
pub struct IdleWatch {
    timeout: Duration,
    /// Runs while the body waits for the upstream.
    timer: Timer,
    /// Whether the timer runs for the current wait; a frame ends the wait.
    armed: bool,
}

impl IdleWatch {
    fn new(timeout: Duration) -> IdleWatch {
        IdleWatch { timeout, timer: Timer::default(), armed: false }
    }

    /// The body waits for the upstream: ready once it has waited `timeout` since the last frame.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.armed {
            self.timer.start(self.timeout);
            self.armed = true;
        }
        self.timer.poll_fired(cx)
    }
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            Projection::Upstream { inner, idle, app_stream, .. } => {
                let polled = match inner.poll_frame(cx) {
                    Poll::Pending => match idle.poll_expired(cx) {
                        Poll::Ready(()) => {
                            let silent = humantime::format_duration(idle.timeout);
                            tracing::debug!(%silent, "the upstream's response body stalled; cut off");
                            Poll::Ready(Some(Err(format!("the upstream sent nothing for {silent}").into())))
                        }
                        Poll::Pending => Poll::Pending,
                    },
                    Poll::Ready(frame) => {
                        idle.armed = false;
                        Poll::Ready(frame)
                    }
                };
                if let Some((_, Some(progress))) = app_stream {
                    match &polled {
                        Poll::Ready(Some(Ok(_))) => progress.handed(),
                        _ => progress.taken(),
                    }
                }
                polled
            }
            Projection::Synthetic { inner } => inner.poll_frame(cx).map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Upstream { inner, .. } => inner.is_end_stream(),
            Body::Synthetic { inner } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Upstream { inner, .. } => inner.size_hint(),
            Body::Synthetic { inner } => inner.size_hint(),
        }
    }
}
