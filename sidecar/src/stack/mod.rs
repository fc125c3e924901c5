//! A listener's data path, read top to bottom, one file a layer: [`rescue`] → [`route`] →
//! [`classify`] → [`admit`] → [`measure`] → [`proxy`]. Each layer below the rescue either passes
//! the request on or says why the sidecar answers it itself (a [`Refusal`], its error); the rescue
//! renders that answer.

mod admit;
mod classify;
mod measure;
mod proxy;
mod rescue;
mod route;

use std::{future::Future, pin::Pin, sync::Arc};

use arc_swap::ArcSwap;
use http::Request;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceBuilder;

use self::{admit::Admit, classify::Classify, measure::Measure, proxy::Proxy, rescue::Rescue, route::Route};
use crate::{
    body::RequestBody,
    enforce::Charged,
    plan::{ListenerPlan, Plan},
    refusal::Refusal,
    upstream::UpstreamClient,
};

/// The future of a layer that has to await something of its own: boxed, as an `async` block's
/// type cannot be named.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Refusal>> + Send>>;

/// A routed request on its way down the stack, with what the layers above found out about it.
pub struct Exchange {
    request: Request<RequestBody>,
    listener: Arc<ListenerPlan>,
    upstream: Arc<UpstreamClient>,
    /// What the request is charged, once classification found a matching rule.
    charged: Option<Charged>,
    /// Its place among the listener's `max_requests`, which admission moves onto the response
    /// body: held until the response ends.
    slot: Option<OwnedSemaphorePermit>,
}

pub type Stack = Rescue<Route<Classify<Admit<Measure<Proxy>>>>>;

/// The service for the `listener`-th listener of the configuration in force, whose requests in
/// flight take the places of `in_flight`.
pub fn stack(live: Arc<ArcSwap<Plan>>, listener: usize, in_flight: Arc<Semaphore>) -> Stack {
    let inner =
        ServiceBuilder::new().layer(Classify::layer()).layer(Admit::layer()).layer(Measure::layer()).service(Proxy);
    Rescue::new(Route::new(inner, live, listener, in_flight))
}
