//! The response body the sidecar hands back: an upstream's body streamed through, holding the
//! request's concurrency permits and its HTTP/1.1 upstream connection until it ends, or a small
//! synthetic one.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use pin_project_lite::pin_project;

use crate::{gate::Permits, pool::Lease};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    #[project = Projection]
    pub enum Body {
        Upstream {
            #[pin]
            inner: Incoming,
            // Released when the body is dropped: for a stream, the request is in flight until
            // its last frame.
            permits: Option<Permits>,
            // The HTTP/1.1 connection the body arrives on, driven by polling the body.
            connection: Option<Lease>,
        },
        Synthetic {
            #[pin]
            inner: Full<Bytes>,
        },
    }
}

impl Body {
    pub fn upstream(inner: Incoming, connection: Option<Lease>) -> Body {
        Body::Upstream { inner, permits: None, connection }
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
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            Projection::Upstream { mut inner, connection, .. } => {
                let Some(connection) = connection else {
                    return inner.poll_frame(cx).map_err(Into::into);
                };
                // The connection first, so that what it reads is there for `inner` now.
                connection.poll_connection(cx);
                let frame = inner.as_mut().poll_frame(cx);
                match &frame {
                    Poll::Ready(None) => connection.finish(),
                    Poll::Ready(Some(Ok(_))) if inner.is_end_stream() => connection.finish(),
                    _ => {}
                }
                frame.map_err(Into::into)
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
