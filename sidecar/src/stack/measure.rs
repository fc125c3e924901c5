//! Measurement as a layer above the proxy: each forwarded request timed until its response
//! headers, by listener and status, and counted in the outcomes of the resources it was charged
//! to (the signals an adaptive resource's capacity is learned from).

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Instant,
};

use http::Response;
use pin_project_lite::pin_project;
use smallvec::SmallVec;
use tower::Service;

use super::Exchange;
use crate::{
    enforce::{Gate, is_overload},
    plan::ListenerPlan,
    refusal::Refusal,
};

/// The gates a forwarded request was charged to: most rules charge one or two.
type Charged = SmallVec<[Arc<Gate>; 2]>;

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
        let gates = exchange.charged.as_ref().map(|c| c.gates().iter().cloned().collect()).unwrap_or_default();
        let start = Instant::now();
        Timed { answer: self.inner.call(exchange), listener, gates, start }
    }
}

pin_project! {
    /// A forwarded request until its response headers, then recorded; one that failed, with
    /// the status the sidecar answers it with.
    pub struct Timed<F> {
        #[pin]
        answer: F,
        listener: Arc<ListenerPlan>,
        gates: Charged,
        start: Instant,
    }
}

impl<F: Future<Output = Result<Response<B>, Refusal>>, B> Future for Timed<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let answer = ready!(this.answer.poll(cx));
        let (status, headers) = match &answer {
            Ok(response) => (response.status(), Some(response.headers())),
            Err(refusal) => (refusal.status(), None),
        };
        let elapsed = this.start.elapsed();
        this.listener.timing.record(status.as_u16(), elapsed.as_secs_f64());
        let overload = is_overload(status, headers);
        this.gates.iter().for_each(|gate| gate.record_outcome(elapsed, overload));
        Poll::Ready(answer)
    }
}
