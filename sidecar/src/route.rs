//! Routing: which configured upstream a request goes to — the listener's own, or the one whose
//! `hosts` list the request's Host/`:authority`. Anything else is answered here and never
//! forwarded: the sidecar is not an open proxy. Nor does it open tunnels: CONNECT is answered
//! 501 (Envoy too refuses it unless configured for it).

use std::{
    convert::Infallible,
    future::{Ready, ready},
    sync::Arc,
    task::{Context, Poll},
};

use arc_swap::ArcSwap;
use futures_util::future::Either;
use http::{Method, Request, Response};
use tower::Service;

use crate::{
    body::{Body, RequestBody},
    classify::host,
    plan::{Plan, Target},
    respond,
    stack::Exchange,
};

/// Tower service at the top of a listener's stack: reads the configuration in force once per
/// request, so a reload applies to open connections from their next request on.
#[derive(Clone)]
pub struct Route<S> {
    inner: S,
    live: Arc<ArcSwap<Plan>>,
    listener: usize,
}

impl<S> Route<S> {
    /// `listener` indexes the configuration's listeners, which a reload cannot reorder.
    pub fn new(inner: S, live: Arc<ArcSwap<Plan>>, listener: usize) -> Route<S> {
        Route { inner, live, listener }
    }
}

impl<S> Service<Request<RequestBody>> for Route<S>
where
    S: Service<Exchange, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response<Body>, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        if request.method() == Method::CONNECT {
            return Either::Left(ready(Ok(respond::not_implemented("CONNECT"))));
        }
        let listener = self.live.load().listeners[self.listener].clone();
        let upstream = match &listener.target {
            Target::Fixed(upstream) => Some(upstream.clone()),
            Target::ByHost(hosts) => hosts.get(&host(&request).to_ascii_lowercase()).cloned(),
        };
        let Some(upstream) = upstream else {
            let response = respond::no_route(respond::is_grpc(request.headers()), host(&request));
            return Either::Left(ready(Ok(response)));
        };
        Either::Right(self.inner.call(Exchange { request, listener, upstream, charged: None }))
    }
}
