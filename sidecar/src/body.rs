//! The bodies on the data path. The response body the sidecar hands back is an upstream's body
//! streamed through (for HTTP/1.1, read off its pooled connection), holding the request's
//! concurrency permits until it ends, or a small synthetic one.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use pin_project_lite::pin_project;

use crate::{gate::Permits, inbound::Inbound, pool::Http1Body};

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

/// The body of a request on its way upstream, as the application's connection delivers it.
pub enum RequestBody {
    Http1(Inbound),
    Http2(Incoming),
}

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Http1(inner) => Pin::new(inner).poll_frame(cx),
            RequestBody::Http2(inner) => Pin::new(inner).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Http1(inner) => inner.is_end_stream(),
            RequestBody::Http2(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Http1(inner) => inner.size_hint(),
            RequestBody::Http2(inner) => inner.size_hint(),
        }
    }
}

pin_project! {
    #[project = Projection]
    pub enum Body {
        // Both upstream kinds hold the request's concurrency permits until they are dropped: for
        // a stream, the request is in flight until its last frame.
        Http1 {
            #[pin]
            inner: Http1Body,
            permits: Option<Permits>,
        },
        Http2 {
            #[pin]
            inner: Incoming,
            permits: Option<Permits>,
        },
        Synthetic {
            #[pin]
            inner: Full<Bytes>,
        },
    }
}

impl Body {
    pub fn http1(inner: Http1Body) -> Body {
        Body::Http1 { inner, permits: None }
    }

    pub fn http2(inner: Incoming) -> Body {
        Body::Http2 { inner, permits: None }
    }

    pub fn synthetic(bytes: impl Into<Bytes>) -> Body {
        Body::Synthetic { inner: Full::new(bytes.into()) }
    }

    pub fn empty() -> Body {
        Body::synthetic(Bytes::new())
    }

    /// Keeps `permits` until this body ends.
    pub fn hold(&mut self, held: Permits) {
        if let Body::Http1 { permits, .. } | Body::Http2 { permits, .. } = self {
            *permits = Some(held);
        }
    }
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            Projection::Http1 { inner, .. } => inner.poll_frame(cx),
            Projection::Http2 { inner, .. } => inner.poll_frame(cx).map_err(Into::into),
            Projection::Synthetic { inner } => inner.poll_frame(cx).map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Http1 { inner, .. } => inner.is_end_stream(),
            Body::Http2 { inner, .. } => inner.is_end_stream(),
            Body::Synthetic { inner } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Http1 { inner, .. } => inner.size_hint(),
            Body::Http2 { inner, .. } => inner.size_hint(),
            Body::Synthetic { inner } => inner.size_hint(),
        }
    }
}
