//! Enforcement (SPEC §4.4): a classified request passes every gate of its charge in order, waits
//! its turn when its rule says `delay` (never past `max_wait` or its own gRPC deadline), is
//! answered at once when it says `reject`, and is forwarded anyway — but counted — under
//! `shadow`. Concurrency permits ride on the response body until it ends. A gRPC call that
//! waited goes upstream with what is left of its deadline.

use std::{
    future::{Future, Ready, ready as resolved},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use futures_util::{FutureExt, future::Either};
use http::{HeaderMap, Response};
use pin_project_lite::pin_project;
use tokio::sync::OwnedSemaphorePermit;
use tower::Service;

use sluice_http::{body::Guarded, time};

use super::{BoxFuture, Exchange};
use crate::{
    body::Admitted,
    config::{OnLimit, Side},
    core::Cost,
    enforce::{Charge, Charged, Costed, Gate, Metered, Permits, Resolved, pass, up_front},
    refusal::Refusal,
};

#[derive(Clone)]
pub struct Admit<S> {
    inner: S,
}

impl<S> Admit<S> {
    pub fn layer() -> tower::layer::LayerFn<fn(S) -> Admit<S>> {
        tower::layer::layer_fn(|inner| Admit { inner })
    }
}

pin_project! {
    /// A request on its way upstream, its answer to hold what the request was granted — its
    /// place in flight and its concurrency permits — until it ends, and, for a rule that charges
    /// response bytes, to be metered.
    pub struct Held<F> {
        #[pin]
        call: F,
        permits: Option<Permits>,
        meter: Option<(Arc<Charge>, Gates)>,
    }
}

/// The gates a metered body charges.
type Gates = Arc<[Arc<Gate>]>;

impl<F> Held<F> {
    fn new(call: F, permits: Permits, meter: Option<(Arc<Charge>, Gates)>) -> Held<F> {
        Held { call, permits: Some(permits), meter }
    }
}

impl<F, B> Future for Held<F>
where
    F: Future<Output = Result<Response<B>, Refusal>>,
{
    type Output = Result<Response<Admitted<B>>, Refusal>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.call.poll(cx))?;
        let permits = this.permits.take().unwrap_or_default();
        let meter = this.meter.take();
        Poll::Ready(Ok(response.map(|body| {
            let mut body = Metered::new(Guarded::new(body, permits));
            if let Some((charge, gates)) = meter {
                body.charge_to(charge, gates, false);
            }
            body
        })))
    }
}

impl<S, B> Service<Exchange> for Admit<S>
where
    S: Service<Exchange, Response = Response<B>, Error = Refusal> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Response<Admitted<B>>;
    type Error = Refusal;
    /// Requests that may not wait (unclassified, or under `reject` or `shadow`) are admitted or
    /// refused at once and go on without a task of their own; those that may wait are boxed.
    type Future = Either<
        Held<S::Future>,
        Either<Ready<Result<Response<Admitted<B>>, Refusal>>, BoxFuture<Response<Admitted<B>>>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut exchange: Exchange) -> Self::Future {
        let slot = exchange.slot.take();
        let Some(mut charged) = exchange.charged.take() else {
            return Either::Left(Held::new(self.inner.call(exchange), Permits::holding(slot), None));
        };
        let metered = up_front(&mut charged, exchange.request.body());
        let paced = charged.charge.on_limit == OnLimit::Delay;
        let meter = move |charged: &Charged, side| {
            (metered == Some(side)).then(|| (charged.charge.clone(), Gates::from(charged.gates())))
        };
        if !paced {
            // Without a deadline no gate waits: the first poll settles it.
            let admitted = admit(&charged, exchange.request.headers(), slot).now_or_never();
            let permits = match admitted.expect("no gate waits without a deadline") {
                Ok((permits, _)) => permits,
                Err(refusal) => return Either::Right(Either::Left(resolved(Err(refusal)))),
            };
            if let Some((charge, gates)) = meter(&charged, Side::Request) {
                exchange.request.body_mut().charge_to(charge, gates, false);
            }
            let response = meter(&charged, Side::Response);
            // Passed on for measurement, which counts each forwarded call in its gates' outcomes.
            exchange.charged = Some(charged);
            return Either::Left(Held::new(self.inner.call(exchange), permits, response));
        }
        // The clone is ready, not `self.inner` (tower's rule for services driven in a future).
        let inner = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, inner);
        Either::Right(Either::Right(Box::pin(async move {
            let (permits, waited) = admit(&charged, exchange.request.headers(), slot).await?;
            if !waited.is_zero() {
                shorten_grpc_timeout(exchange.request.headers_mut(), waited);
            }
            if let Some((charge, gates)) = meter(&charged, Side::Request) {
                exchange.request.body_mut().charge_to(charge, gates, true);
            }
            let response = meter(&charged, Side::Response);
            exchange.charged = Some(charged);
            Held::new(inner.call(exchange), permits, response).await
        })))
    }
}

/// Passes the request through its charge's gates: the permits it holds and how long it waited
/// in all; on refusal, gives back what earlier gates granted.
async fn admit(
    charged: &Charged,
    headers: &HeaderMap,
    slot: Option<OwnedSemaphorePermit>,
) -> Result<(Permits, Duration), Refusal> {
    let Charged { charge, gates: resolved, .. } = charged;
    if let Resolved::Unsafe { resource, bytes } = resolved {
        return Err(Refusal::KeyTooLong { resource: resource.clone(), rule: charge.rule.clone(), bytes: *bytes });
    }
    let gates = charged.gates();
    let cost = bounded(charged).map_err(|(declared, most)| Refusal::CostTooLarge {
        rule: charge.rule.clone(),
        declared,
        most,
    })?;
    let max_wait = match charge.on_limit {
        OnLimit::Delay => grpc_timeout(headers).map_or(charge.max_wait, |d| d.min(charge.max_wait)),
        OnLimit::Reject | OnLimit::Shadow => Duration::ZERO,
    };
    // One budget for all the gates; a request that may not wait reads no clock.
    let deadline = (!max_wait.is_zero()).then(|| time::after(Instant::now(), max_wait));
    let mut permits = Permits::holding(slot);
    let mut waited_in_all = Duration::ZERO;
    let shadow = charge.on_limit == OnLimit::Shadow;
    pass(&charge.rule, gates, cost, deadline, shadow, &mut permits, |gate, waited| {
        match waited.is_zero() {
            true => gate.metrics.record_allowed(),
            false => gate.metrics.record_delayed(waited),
        }
        gate.metrics.record_cost(cost);
        waited_in_all += waited;
    })
    .await
    .map_err(Refusal::Limited)?;
    Ok((permits, waited_in_all))
}

/// The cost to charge: a declared one only up to what the charge takes at once
/// ([`Charged::most`]); else the declared cost and that bound.
fn bounded(charged: &Charged) -> Result<Cost, (f64, Cost)> {
    let declared = match charged.cost {
        Costed::Fixed(cost) => return Ok(cost),
        Costed::Declared(declared) => declared,
    };
    let most = charged.most();
    Cost::new(declared).filter(|c| *c <= most).ok_or((declared, most))
}

/// Takes `waited` off a gRPC call's `grpc-timeout`, so the upstream works to the caller's real
/// deadline (what is left of it, in milliseconds, at least one).
fn shorten_grpc_timeout(headers: &mut HeaderMap, waited: Duration) {
    let Some(timeout) = grpc_timeout(headers) else { return };
    let mut left = timeout.saturating_sub(waited).as_millis().max(1);
    // At most 8 digits: the finest unit that fits.
    let mut units = [("m", 1000), ("S", 60), ("M", 60), ("H", 1)].into_iter();
    let (mut unit, mut per_next) = units.next().expect("units");
    while left >= 100_000_000 {
        let Some((next, per)) = units.next() else { break };
        (left, unit, per_next) = (left / per_next, next, per);
    }
    let value = format!("{left}{unit}");
    if let Ok(value) = http::HeaderValue::try_from(value) {
        headers.insert("grpc-timeout", value);
    }
}

/// A gRPC call's own deadline (`grpc-timeout: 1-8 digits + H/M/S/m/u/n`).
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Plan;

    #[test]
    fn a_declared_cost_is_bounded_by_max_cost_or_what_each_resource_takes_at_once() {
        let plan = Plan::for_test(
            "resources:\n  - {id: rate, capacity: 10, burst: 2}\n  - {id: pool, kind: concurrency, capacity: 5}\n\
            rules:\n\
              - {match: {path: {prefix: /a}}, resource: pool, also: [rate], cost: {header: x-cost}}\n\
              - {match: {path: {prefix: /b}}, resource: pool, cost: {header: x-cost}}\n\
              - {match: {path: {prefix: /c}}, resource: rate, cost: {header: x-cost}, max_cost: 100}\n\
              - {resource: rate, cost: 7}\n",
        );
        let charged = |path: &str, cost: &str| {
            let request = http::Request::get(path).header("x-cost", cost).body(()).unwrap();
            let charged = plan.listeners[0].rules.classify(&request).unwrap().unwrap();
            bounded(&charged).map(Cost::get).map_err(|(declared, most)| (declared, most.get()))
        };
        // The least of a rate's burst and a semaphore's capacity.
        assert_eq!(charged("/a", "2"), Ok(2.0));
        assert_eq!(charged("/a", "2.5"), Err((2.5, 2.0)));
        assert_eq!(charged("/a", "1e300"), Err((1e300, 2.0)));
        assert_eq!(charged("/b", "5"), Ok(5.0));
        assert_eq!(charged("/b", "6"), Err((6.0, 5.0)));
        // A rule's own bound, above the burst (the bucket goes into debt, boundedly).
        assert_eq!(charged("/c", "100"), Ok(100.0));
        assert_eq!(charged("/c", "100.5"), Err((100.5, 100.0)));
        // A cost the configuration names is the operator's: never refused as too large.
        assert_eq!(charged("/d", "1e300"), Ok(7.0));
        // An unusable header is no declaration: the default applies.
        assert_eq!(charged("/a", "-1"), Ok(1.0));
    }

    #[test]
    fn grpc_timeouts_parse() {
        let parse = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("grpc-timeout", v.parse().unwrap());
            grpc_timeout(&h)
        };
        assert_eq!(parse("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse("123456789m"), None);
        assert_eq!(parse("m"), None);
        assert_eq!(parse("10x"), None);
    }

    #[test]
    fn a_wait_is_taken_off_the_grpc_deadline() {
        let shortened = |given: Option<&str>, waited: Duration| {
            let mut h = HeaderMap::new();
            if let Some(v) = given {
                h.insert("grpc-timeout", v.parse().unwrap());
            }
            shorten_grpc_timeout(&mut h, waited);
            h.get("grpc-timeout").map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(shortened(Some("2S"), Duration::from_millis(1250)).as_deref(), Some("750m"));
        assert_eq!(shortened(Some("100m"), Duration::from_millis(300)).as_deref(), Some("1m"));
        assert_eq!(shortened(Some("30H"), Duration::from_secs(3600)).as_deref(), Some("104400S"));
        assert_eq!(shortened(Some("99999999H"), Duration::from_secs(3600)).as_deref(), Some("99999998H"));
        assert_eq!(shortened(None, Duration::from_secs(1)), None);
    }
}
