//! Routing: which configured upstream a request goes to — the listener's own, or the one whose
//! `hosts` list the request's Host/`:authority`. Anything else is answered here and never
//! forwarded: the sidecar is not an open proxy. Nor does it open tunnels: CONNECT is answered
//! 501 (Envoy too refuses it unless configured for it). Nor does it forward a path it cannot read
//! as the upstream will: one with a stray `%` gets 400, and so does one malformed as the
//! protocol that carried it defines it (see [`canonical::malformed`]).

use std::{
    future::{Ready, ready},
    sync::Arc,
    task::{Context, Poll},
};

use arc_swap::ArcSwap;
use futures_util::future::Either;
use http::{Method, Request, Response};
use tokio::sync::Semaphore;
use tower::Service;

use sluice_http::body::Downstream;

use super::Exchange;
use crate::{
    canonical,
    enforce::Metered,
    metrics,
    plan::{Plan, Target},
    refusal::Refusal,
};

/// Tower service at the top of a listener's stack: reads the configuration in force once per
/// request, so a reload applies to open connections from their next request on.
#[derive(Clone)]
pub struct Route<S> {
    inner: S,
    live: Arc<ArcSwap<Plan>>,
    listener: usize,
    in_flight: Arc<Semaphore>,
}

impl<S> Route<S> {
    /// `listener` indexes the configuration's listeners, which a reload cannot reorder; each
    /// request takes one of `in_flight`'s places (its `max_requests`) or is refused.
    pub fn new(inner: S, live: Arc<ArcSwap<Plan>>, listener: usize, in_flight: Arc<Semaphore>) -> Route<S> {
        Route { inner, live, listener, in_flight }
    }
}

impl<S, B> Service<Request<Downstream>> for Route<S>
where
    S: Service<Exchange, Response = Response<B>, Error = Refusal>,
{
    type Response = Response<B>;
    type Error = Refusal;
    type Future = Either<Ready<Result<Response<B>, Refusal>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Downstream>) -> Self::Future {
        let Ok(slot) = self.in_flight.clone().try_acquire_owned() else {
            let listener = &self.live.load().config.listeners[self.listener];
            metrics::record_shed(&listener.name);
            return Either::Left(ready(Err(Refusal::Overloaded { most: listener.max_requests })));
        };
        if request.method() == Method::CONNECT {
            return Either::Left(ready(Err(Refusal::NotImplemented("CONNECT"))));
        }
        if !canonical::escapes_valid(request.uri().path()) {
            return Either::Left(ready(Err(Refusal::Malformed("a stray % in the path".to_owned()))));
        }
        if let Some(why) = canonical::malformed(&request) {
            return Either::Left(ready(Err(Refusal::Malformed(why))));
        }
        let listener = self.live.load().listeners[self.listener].clone();
        let upstream = match &listener.target {
            Target::Fixed(upstream) => Some(upstream.clone()),
            Target::ByHost(hosts) => hosts.get(&*canonical::host(&request)).cloned(),
        };
        let Some(upstream) = upstream else {
            return Either::Left(ready(Err(Refusal::NoRoute { host: canonical::host(&request).into_owned() })));
        };
        Either::Right(self.inner.call(Exchange {
            request: request.map(Metered::new),
            listener,
            upstream,
            charged: None,
            slot: Some(slot),
        }))
    }
}
