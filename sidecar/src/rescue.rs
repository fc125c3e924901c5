//! The top of the stack: the one place where a layer's [`Refusal`] becomes the synthetic
//! response the caller gets — a gRPC one for a gRPC caller — and is logged.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
};

use http::{Request, Response};
use http_body_util::Either;
use pin_project_lite::pin_project;
use tower::Service;

use crate::{
    body::{Admitted, Body, RequestBody, UpstreamBody},
    classify::is_grpc,
    respond::Refusal,
};

#[derive(Clone)]
pub struct Rescue<S> {
    inner: S,
}

impl<S> Rescue<S> {
    pub fn new(inner: S) -> Rescue<S> {
        Rescue { inner }
    }
}

impl<S> Service<Request<RequestBody>> for Rescue<S>
where
    S: Service<Request<RequestBody>, Response = Response<Admitted<UpstreamBody>>, Error = Refusal>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Rescued<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The layers below are always ready, and never fail to be.
        let _ = ready!(self.inner.poll_ready(cx));
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<RequestBody>) -> Rescued<S::Future> {
        Rescued { grpc: is_grpc(request.headers()), call: self.inner.call(request) }
    }
}

pin_project! {
    /// A call down the stack, whose refusal is answered in the caller's protocol.
    pub struct Rescued<F> {
        #[pin]
        call: F,
        grpc: bool,
    }
}

impl<F> Future for Rescued<F>
where
    F: Future<Output = Result<Response<Admitted<UpstreamBody>>, Refusal>>,
{
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        Poll::Ready(Ok(match ready!(this.call.poll(cx)) {
            Ok(response) => response.map(Either::Right),
            Err(refusal) => {
                tracing::debug!(%refusal, status = refusal.status().as_u16(), "answered by the sidecar");
                refusal.render(*this.grpc)
            }
        }))
    }
}
