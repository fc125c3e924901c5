//! The gRPC listener's budget of request bytes in flight (`--max-request-bytes-in-flight`). A
//! call counts [`CALL_BYTES`] and its header when it starts, then each data frame of its body as
//! it arrives, and holds them until its answer is sent; one that finds no room is refused
//! RESOURCE_EXHAUSTED at once. Nothing waits for room: a flood of large requests is refused
//! instead of queueing small calls behind it.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{
    Status,
    body::Body,
    codegen::{
        Body as HttpBody, Bytes, Service,
        http::{Request, Response},
    },
};
use tower::Layer;

use crate::{defaults::CALL_BYTES, metrics};

/// Wraps the gRPC routes with the budget; the layer of `Server::builder().layer`.
#[derive(Clone)]
pub struct InFlight {
    budget: Arc<Semaphore>,
    limit: usize,
}

impl InFlight {
    /// A budget of `limit` bytes (at most `Semaphore::MAX_PERMITS`: the flag's bounds).
    pub fn new(limit: usize) -> InFlight {
        InFlight { budget: Arc::new(Semaphore::new(limit)), limit }
    }
}

impl<S> Layer<S> for InFlight {
    type Service = Budgeted<S>;

    fn layer(&self, inner: S) -> Budgeted<S> {
        Budgeted { inner, budget: self.clone() }
    }
}

#[derive(Clone)]
pub struct Budgeted<S> {
    inner: S,
    budget: InFlight,
}

type Answer<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

impl<S> Service<Request<Body>> for Budgeted<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Answer<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Answer<S::Error> {
        let charge = Charge { budget: self.budget.clone(), held: Arc::default() };
        if let Err(refusal) = charge.add(CALL_BYTES + header_bytes(&request)) {
            return Box::pin(std::future::ready(Ok(refusal.into_http())));
        }
        let request = request.map(|body| Body::new(Charged { body, charge: charge.clone(), metered: true }));
        // The instance polled ready serves this call; its clone the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let answer = inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| Body::new(Charged { body, charge, metered: false })))
        })
    }
}

/// A call's header as HTTP/2 counts a header list: each field's name and value and 32 bytes;
/// the path too.
fn header_bytes(request: &Request<Body>) -> usize {
    let fields: usize = request.headers().iter().map(|(name, value)| name.as_str().len() + value.len() + 32).sum();
    fields + request.uri().path().len() + 32
}

/// The bytes one call holds. Its request body, its handler and its response body share it;
/// the permits go back when the last of them is dropped, after the answer is sent.
#[derive(Clone)]
struct Charge {
    budget: InFlight,
    held: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
}

impl Charge {
    /// Takes `bytes` more from the budget, or refuses the call if they are not free now.
    fn add(&self, bytes: usize) -> Result<(), Status> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let had = held.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
        let taken = u32::try_from(bytes).ok().and_then(|n| self.budget.budget.clone().try_acquire_many_owned(n).ok());
        match (taken, held.as_mut()) {
            (Some(more), Some(held)) => held.merge(more),
            (Some(more), None) => *held = Some(more),
            (None, _) => {
                metrics::record_refused_in_flight();
                let limit = self.budget.limit;
                return Err(Status::resource_exhausted(if had + bytes > limit {
                    format!(
                        "this call needs more than the {limit} request bytes this server handles at once \
                         (--max-request-bytes-in-flight); it can never be served"
                    )
                } else {
                    format!(
                        "this server is handling the most request bytes it takes at once \
                         (--max-request-bytes-in-flight, {limit}); retry later"
                    )
                }));
            }
        }
        Ok(())
    }
}

/// A body that keeps its call's charge until it is dropped; a request's (`metered`) counts each
/// data frame as it comes.
struct Charged {
    body: Body,
    charge: Charge,
    metered: bool,
}

impl HttpBody for Charged {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let frame = std::task::ready!(Pin::new(&mut self.body).poll_frame(cx));
        Poll::Ready(match frame {
            Some(Ok(frame)) => match frame.data_ref().filter(|_| self.metered) {
                Some(data) => Some(self.charge.add(data.len()).map(|()| frame)),
                None => Some(Ok(frame)),
            },
            other => other,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
