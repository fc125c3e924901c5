//! The innermost service: forwards the request to the upstream routing chose.

use std::task::{Context, Poll};

use http::Response;
use tower::Service;

use super::{BoxFuture, Exchange};
use crate::{body::UpstreamBody, refusal::Refusal};

#[derive(Clone, Default)]
pub struct Proxy;

impl Service<Exchange> for Proxy {
    type Response = Response<UpstreamBody>;
    type Error = Refusal;
    type Future = BoxFuture<Response<UpstreamBody>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, exchange: Exchange) -> Self::Future {
        Box::pin(async move { exchange.upstream.forward(exchange.request).await })
    }
}
