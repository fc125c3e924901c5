//! Costs in bytes (`cost: request_bytes` or `response_bytes`): a body that charges its rule's
//! rate resources for each piece of data as it passes, so that bandwidth can be leased as
//! requests are.
//!
//! - A request body of known length (Content-Length, or an HTTP/2 stream that says it) within
//!   what its rule takes at once (`max_cost`, else the burst) is charged up front by admission,
//!   as any cost is; it is not metered again.
//! - A request body that streams (chunked, or HTTP/2 without a length), or whose length is
//!   above that, is admitted at a cost of
//!   0 — it waits out, or is refused for, any debt of its resources — and then metered. In
//!   `delay` mode each piece (at most a burst) waits its turn at every gate, in FIFO order with
//!   the resource's requests, before it goes on: the stream is paced to the rate, and nothing
//!   but the frame being passed on is held. A piece whose turn is further off than the rule's
//!   `max_wait` ends the body with [`Limited`]. In `reject` and `shadow` mode nothing waits: the
//!   pieces are charged as they pass, after the fact.
//! - A response body is charged as it passes, after the fact.
//!
//! What is charged after the fact may leave a resource in debt, which the requests after it
//! wait out, but no deeper than the rule's `max_cost`, or else the resource's burst: one large
//! body then closes the resource for no longer than that takes to repay, however large it is.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, OnceLock},
    task::{Context, Poll, ready},
    time::Instant,
};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use sluice_http::{body::BoxError, time};

use super::{
    gate::{Gate, Permits},
    pass::{Limited, pass},
    rules::{Charge, Charged, Costed},
};
use crate::{
    config::{CostRule, Side},
    core::Cost,
};

/// A body that charges `charge`'s resources for its bytes once [`Metered::charge_to`] says so;
/// until then it only passes its inner body's frames on.
pub struct Metered<B> {
    inner: B,
    meter: Option<Box<Meter>>,
}

/// Paced pieces are at most what each resource takes at once (its burst), so that none leaves
/// a debt the next piece could not wait out; but no smaller than this, so that a tiny burst
/// does not cut a body into single bytes.
const SMALLEST_PIECE: f64 = 1024.0;

struct Meter {
    charge: Arc<Charge>,
    /// The gates it charges: the rule's, each keyed resource's the request's key.
    gates: Gates,
    /// Pieces wait their turn at the gates, else they are charged after the fact.
    paced: bool,
    /// How deep into debt a charge after the fact may leave a resource (`None`: its burst).
    max_debt: Option<Cost>,
    /// Paced: data taken from the inner body and not passed on yet, and the turn its first
    /// piece of that many bytes waits for.
    held: Bytes,
    turn: Option<(usize, Turn)>,
    /// Set when a paced piece is refused, for the proxy to answer as a refused request is.
    cut: CutOff,
}

type Gates = Arc<[Arc<Gate>]>;

type Turn = Pin<Box<dyn Future<Output = Result<(), Limited>> + Send>>;

impl<B> Metered<B> {
    pub fn new(inner: B) -> Metered<B> {
        Metered { inner, meter: None }
    }

    /// From now on, charges `gates`, the resources of `charge` (a rule's, which charges bytes)
    /// for each piece of data: paced pieces wait their turn, the others are charged after the
    /// fact.
    pub fn charge_to(&mut self, charge: Arc<Charge>, gates: Gates, paced: bool) {
        let max_debt = match charge.cost {
            CostRule::Bytes { max, .. } => max,
            _ => None,
        };
        let cut = CutOff::default();
        self.meter = Some(Box::new(Meter { charge, gates, paced, max_debt, held: Bytes::new(), turn: None, cut }));
    }

    /// Where a paced body tells why it was cut off, if it is metered.
    pub fn cut_off(&self) -> Option<CutOff> {
        self.meter.as_ref().map(|m| m.cut.clone())
    }
}

impl<B> HttpBody for Metered<B>
where
    B: HttpBody<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(meter) = &mut this.meter else { return Pin::new(&mut this.inner).poll_frame(cx) };
        loop {
            if let Some((length, turn)) = &mut meter.turn {
                let passed = ready!(turn.as_mut().poll(cx));
                let length = *length;
                meter.turn = None;
                return Poll::Ready(Some(match passed {
                    Ok(()) => Ok(Frame::data(meter.held.split_to(length))),
                    Err(limited) => {
                        let _ = meter.cut.0.set(limited.clone());
                        Err(Box::new(limited))
                    }
                }));
            }
            if !meter.held.is_empty() {
                let largest = meter.gates.iter().map(|g| g.largest_cost().get()).fold(f64::INFINITY, f64::min);
                let length = meter.held.len().min(largest.max(SMALLEST_PIECE) as usize);
                let bytes = Cost::saturating(length as f64);
                meter.turn = Some((length, Box::pin(turn(meter.charge.clone(), meter.gates.clone(), bytes))));
                continue;
            }
            let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                other => return Poll::Ready(other),
            };
            let bytes = match frame.data_ref() {
                Some(data) if !data.is_empty() => Cost::saturating(data.len() as f64),
                _ => return Poll::Ready(Some(Ok(frame))),
            };
            if meter.paced {
                meter.held = frame.into_data().expect("a data frame");
                continue;
            }
            for gate in meter.gates.iter() {
                gate.charge(bytes, meter.max_debt);
                gate.metrics.record_cost(bytes);
            }
            return Poll::Ready(Some(Ok(frame)));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.meter.as_ref().is_none_or(|m| m.held.is_empty()) && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let held = self.meter.as_ref().map_or(0, |m| m.held.len() as u64);
        if held == 0 {
            return inner;
        }
        // The data held is still to come.
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(held));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(held));
        }
        hint
    }
}

/// A paced piece of `bytes` waits its turn at each gate in order, as a request would, within
/// the rule's `max_wait`; refused by one, it gives back what the gates before took.
async fn turn(charge: Arc<Charge>, gates: Gates, bytes: Cost) -> Result<(), Limited> {
    let deadline = Some(time::after(Instant::now(), charge.max_wait));
    pass(&charge.rule, &gates, bytes, deadline, false, &mut Permits::default(), |_, _| {}).await?;
    for gate in gates.iter() {
        gate.metrics.record_cost(bytes);
    }
    Ok(())
}

/// For a rule that charges bytes: makes a request body's known length its cost (charged up
/// front, as a declared cost) when the charge takes that much at once; returns which body is to
/// be metered once the request is admitted, if any. A body metered as it streams — of unknown
/// length, or longer than that — is admitted at a cost of 0.
pub fn up_front(charged: &mut Charged, body: &impl HttpBody) -> Option<Side> {
    let CostRule::Bytes { of, .. } = charged.charge.cost else { return None };
    match (of, body.size_hint().exact()) {
        (Side::Request, Some(length)) if Cost::saturating(length as f64) <= charged.most() => {
            charged.cost = Costed::Declared(length as f64);
            None
        }
        (of, _) => Some(of),
    }
}

/// Why a paced body was cut off, once it was — its next piece could not have its turn within
/// the rule's `max_wait`, and the request is answered as a refused one is, when it still can
/// be. The body's error reaches the proxy over HTTP/1.1
/// but not through hyper's HTTP/2 client, which resets the stream instead, so it is kept here.
#[derive(Clone, Default)]
pub struct CutOff(Arc<OnceLock<Limited>>);

impl CutOff {
    pub fn limited(&self) -> Option<&Limited> {
        self.0.get()
    }
}
