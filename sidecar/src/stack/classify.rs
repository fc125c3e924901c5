//! Classification as a layer: each request gets the charge of the first rule of its listener
//! whose match holds (see [`Rules`](crate::enforce::Rules)); one whose attributes have no single
//! reading is refused here.

use std::{
    future::{Ready, ready},
    task::{Context, Poll},
};

use futures_util::future::Either;
use tower::Service;

use super::Exchange;
use crate::{canonical::Ambiguous, refusal::Refusal};

/// Tower layer: classifies each request with the rules of the listener it arrived on.
#[derive(Clone)]
pub struct Classify<S> {
    inner: S,
}

impl<S> Classify<S> {
    pub fn layer() -> tower::layer::LayerFn<fn(S) -> Classify<S>> {
        tower::layer::layer_fn(|inner| Classify { inner })
    }
}

impl<S> Service<Exchange> for Classify<S>
where
    S: Service<Exchange, Error = Refusal>,
{
    type Response = S::Response;
    type Error = Refusal;
    type Future = Either<Ready<Result<S::Response, Refusal>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut exchange: Exchange) -> Self::Future {
        match exchange.listener.rules.classify(&exchange.request) {
            Ok(charged) => {
                exchange.charged = charged;
                Either::Right(self.inner.call(exchange))
            }
            Err(Ambiguous(why)) => Either::Left(ready(Err(Refusal::Malformed(why)))),
        }
    }
}
