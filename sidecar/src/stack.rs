//! A listener's data path, read top to bottom: route → classify → admit → measure → proxy.

use std::{convert::Infallible, future::Future, pin::Pin, sync::Arc};

use arc_swap::ArcSwap;
use http::{Request, Response};
use tower::ServiceBuilder;

use crate::{
    admission::Admit,
    body::{Body, RequestBody},
    classify::{Charged, Classify},
    metrics::Measure,
    plan::{ListenerPlan, Plan},
    proxy::{Proxy, UpstreamClient},
    route::Route,
};

/// The future of a layer that has to await something of its own: boxed, as an `async` block's
/// type cannot be named.
pub type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

/// A routed request on its way down the stack, with what the layers above found out about it.
pub struct Exchange {
    pub request: Request<RequestBody>,
    pub listener: Arc<ListenerPlan>,
    pub upstream: Arc<UpstreamClient>,
    /// What the request is charged, once classification found a matching rule.
    pub charged: Option<Charged>,
}

pub type Stack = Route<Classify<Admit<Measure<Proxy>>>>;

/// The service for the `listener`-th listener of the configuration in force.
pub fn stack(live: Arc<ArcSwap<Plan>>, listener: usize) -> Stack {
    let inner =
        ServiceBuilder::new().layer(Classify::layer()).layer(Admit::layer()).layer(Measure::layer()).service(Proxy);
    Route::new(inner, live, listener)
}
