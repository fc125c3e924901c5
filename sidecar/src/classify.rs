//! Request → resources (SPEC §4.2): the first rule whose match holds names what the request is
//! charged, how much, and what happens when a limit says no. A tower layer puts the answer in the
//! request's extensions for admission.

use std::{
    convert::Infallible,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use tower::Service;

use crate::{
    body::Body,
    config::{Cost, Match, OnLimit, PathMatch},
    gate::Gate,
    respond,
    route::Routed,
    stack::ResponseFuture,
};

/// What a matching rule charges: compiled once per configuration.
pub struct Charge {
    pub rule: String,
    /// The rule's resource first, then its `also` resources.
    pub gates: Vec<Arc<Gate>>,
    pub cost: Cost,
    pub on_limit: OnLimit,
    pub max_wait: Duration,
}

/// The charge for one request, as classification found it.
#[derive(Clone)]
pub struct Charged {
    pub charge: Arc<Charge>,
    pub cost: f64,
}

/// One listener's rules, in order.
#[derive(Default)]
pub struct Rules {
    rules: Vec<(Match, Arc<Charge>)>,
}

impl Rules {
    pub fn new(rules: Vec<(Match, Arc<Charge>)>) -> Rules {
        Rules { rules }
    }

    /// The first rule matching `req`, if any.
    pub fn classify<B>(&self, req: &Request<B>) -> Option<Charged> {
        let host = host(req);
        let grpc = respond::is_grpc(req.headers());
        let (_, charge) = self.rules.iter().find(|(m, _)| matches(m, req, host, grpc))?;
        let cost = match &charge.cost {
            Cost::Constant(c) => *c,
            Cost::Header { name, default } => header_cost(req.headers(), name).unwrap_or(*default),
        };
        Some(Charged { charge: charge.clone(), cost })
    }
}

fn matches<B>(m: &Match, req: &Request<B>, host: &str, grpc: bool) -> bool {
    let path = req.uri().path();
    (m.methods.is_empty() || m.methods.contains(req.method()))
        && m.path.as_ref().is_none_or(|p| match p {
            PathMatch::Exact(e) => path == e,
            PathMatch::Prefix(prefix) => path.starts_with(prefix.as_str()),
            PathMatch::Glob(g) => g.is_match(path),
        })
        && m.host.as_ref().is_none_or(|g| g.is_match(host.to_ascii_lowercase()))
        && (m.grpc_service.is_none() && m.grpc_method.is_none() || grpc && grpc_matches(m, path))
        && m.headers.iter().all(|(name, value)| req.headers().get(name).is_some_and(|v| v.as_bytes() == value.as_bytes()))
}

/// gRPC paths are `/package.Service/Method`.
fn grpc_matches(m: &Match, path: &str) -> bool {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return false;
    };
    m.grpc_service.as_deref().is_none_or(|s| s == service) && m.grpc_method.as_deref().is_none_or(|x| x == method)
}

/// The request's host without port: `:authority` for HTTP/2, the Host header for HTTP/1.
pub fn host<B>(req: &Request<B>) -> &str {
    let authority = req.uri().host().or_else(|| req.headers().get(http::header::HOST)?.to_str().ok());
    let authority = authority.unwrap_or_default();
    // Strip a port, but not the colons of a bracketed IPv6 literal.
    match authority.rsplit_once(':') {
        Some((h, port)) if !h.is_empty() && !port.contains(']') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    }
}

fn header_cost(headers: &HeaderMap, name: &http::HeaderName) -> Option<f64> {
    let cost: f64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
    (cost >= 0.0 && cost.is_finite()).then_some(cost)
}

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

impl<S> Service<Request<Incoming>> for Classify<S>
where
    S: Service<Request<Incoming>, Response = Response<Body>, Error = Infallible, Future = ResponseFuture>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Incoming>) -> ResponseFuture {
        let charged = req.extensions().get::<Routed>().and_then(|routed| routed.listener.rules.classify(&req));
        if let Some(charged) = charged {
            req.extensions_mut().insert(charged);
        }
        self.inner.call(req)
    }
}
