//! Measurement as a layer above the proxy: each forwarded request timed until its response
//! headers, by listener and status.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Instant,
};

use http::Response;
use pin_project_lite::pin_project;
use tower::Service;

use super::Exchange;
use crate::{plan::ListenerPlan, refusal::Refusal};

/// Tower layer above the proxy: times each forwarded request until its response headers.
#[derive(Clone)]
pub struct Measure<S> {
    inner: S,
}

impl<S> Measure<S> {
    pub fn layer() -> tower::layer::LayerFn<fn(S) -> Measure<S>> {
        tower::layer::layer_fn(|inner| Measure { inner })
    }
}

impl<S, B> Service<Exchange> for Measure<S>
where
    S: Service<Exchange, Response = Response<B>, Error = Refusal>,
{
    type Response = Response<B>;
    type Error = Refusal;
    type Future = Timed<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, exchange: Exchange) -> Timed<S::Future> {
        let listener = exchange.listener.clone();
        let start = Instant::now();
        Timed { answer: self.inner.call(exchange), listener, start }
    }
}

pin_project! {
    /// A forwarded request until its response headers, then recorded; one that failed, with
    /// the status the sidecar answers it with.
    pub struct Timed<F> {
        #[pin]
        answer: F,
        listener: Arc<ListenerPlan>,
        start: Instant,
    }
}

impl<F: Future<Output = Result<Response<B>, Refusal>>, B> Future for Timed<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let answer = ready!(this.answer.poll(cx));
        let status = match &answer {
            Ok(response) => response.status(),
            Err(refusal) => refusal.status(),
        };
        this.listener.timing.record(status.as_u16(), this.start.elapsed().as_secs_f64());
        Poll::Ready(answer)
    }
}
