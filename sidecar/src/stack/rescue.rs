//! The top of the stack: the one place where a layer's [`Refusal`] becomes the synthetic
//! response the caller gets — a gRPC one for a gRPC caller — and is logged.

use std::{
    convert::Infallible,
    future::{Future, Ready, ready},
    pin::Pin,
    task::{Context, Poll},
};

use futures_util::future;
use http::{Request, Response};
use http_body_util::Either;
use pin_project_lite::pin_project;
use sluice_http::body::Downstream;
use tower::Service;

use crate::{
    body::{Admitted, Body, UpstreamBody},
    canonical::is_grpc,
    refusal::Refusal,
};

#[derive(Clone)]
pub struct Rescue<S> {
    inner: S,
    /// Why the layers below could not take a request, for the next one to be answered with.
    unready: Option<Refusal>,
}

impl<S> Rescue<S> {
    pub fn new(inner: S) -> Rescue<S> {
        Rescue { inner, unready: None }
    }
}

impl<S> Service<Request<Downstream>> for Rescue<S>
where
    S: Service<Request<Downstream>, Response = Response<Admitted<UpstreamBody>>, Error = Refusal>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = future::Either<Ready<Result<Response<Body>, Infallible>>, Rescued<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if let Err(refusal) = std::task::ready!(self.inner.poll_ready(cx)) {
            self.unready = Some(refusal);
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Downstream>) -> Self::Future {
        let grpc = is_grpc(request.headers());
        match self.unready.take() {
            Some(refusal) => future::Either::Left(ready(Ok(answer(refusal, grpc)))),
            None => future::Either::Right(Rescued { grpc, call: self.inner.call(request) }),
        }
    }
}

/// A refusal as the caller gets it, logged.
fn answer(refusal: Refusal, grpc: bool) -> Response<Body> {
    tracing::debug!(%refusal, status = refusal.status().as_u16(), "answered by the sidecar");
    refusal.render(grpc)
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
        Poll::Ready(Ok(match std::task::ready!(this.call.poll(cx)) {
            Ok(response) => response.map(Either::Right),
            Err(refusal) => answer(refusal, *this.grpc),
        }))
    }
}
