//! A listener's data path, read top to bottom: route → classify → admit → measure → proxy.

use std::{convert::Infallible, future::Future, pin::Pin, sync::Arc};

use arc_swap::ArcSwap;
use http::Response;
use tower::ServiceBuilder;

use crate::{
    admission::Admit, body::Body, classify::Classify, metrics::Measure, plan::Plan, proxy::Proxy, route::Route,
};

/// The future every layer of the stack returns.
pub type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

pub type Stack = Route<Classify<Admit<Measure<Proxy>>>>;

/// The service for the `listener`-th listener of the configuration in force.
pub fn stack(live: Arc<ArcSwap<Plan>>, listener: usize) -> Stack {
    let inner =
        ServiceBuilder::new().layer(Classify::layer()).layer(Admit::layer()).layer(Measure::layer()).service(Proxy);
    Route::new(inner, live, listener)
}
