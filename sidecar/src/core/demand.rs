//! What a resource wants from the capacity server, estimated from the load offered to it (every
//! arrival, admitted or not): quick to rise, so a surge is asked for at the next refresh, and
//! slow to fall, so a lull between bursts does not give the capacity away.
//!
//! Arrivals are summed (rate) or maxed (concurrency) into fixed slots of time counted from the
//! limiter's creation, so the estimate depends only on the arrivals and `now`, not on how often
//! it is read. Two things the arrivals alone would hide:
//! - a resource's first requests (or its first after it wanted nothing): their rate is measured
//!   over the time since the first of them, not over the whole rise window, so the first lease
//!   asks for what they show;
//! - callers that wait for each answer before they send the next (a closed loop, in `delay`
//!   mode): their arrivals come only as fast as they are admitted, so the time requests spend
//!   queued counts as demand too.

use super::{Kind, Seconds};

/// Demand is asked for with this much on top, so a client can grow into capacity it does not
/// yet use; without it a client would only ever be granted what it was already held to.
pub const HEADROOM: f64 = 1.1;
/// Granularity of the record: fine enough to see a surge within a second, coarse enough that
/// the hot path adds to a number instead of computing a decay.
const SLOT: Seconds = 0.5;
/// Slots remembered: the concurrency peak is taken over the last `SLOTS - 1` whole slots (4.5 s)
/// and the current one.
const SLOTS: usize = 10;
/// The rate's quick part: the last `RISE_SLOTS` whole slots (1 s) and the current one.
const RISE_SLOTS: usize = 2;
/// The rate's slow part: a moving average with this time constant, which holds demand through
/// gaps between bursts and lets it fade when they stop.
const FALL_TIME_CONSTANT: Seconds = 5.0;
/// The shortest time a rate is measured over, at the start of an active period: one arrival is
/// then taken for at most this rate of it.
const MIN_SPAN: Seconds = 0.1;
/// Rate: a queue of `q` cost units on average is taken for `q / HELD_BACK` cost units a second
/// more that callers would send if they did not wait (a caller that waits this long for each
/// answer would send twice as often without the wait), up to the rate of the arrivals itself:
/// demand held back by a lease at most doubles per request to the server. Not while arrivals
/// are refused, which then show the demand themselves (an open loop over its lease).
const HELD_BACK: Seconds = 0.1;
/// Below this (cost per second, or in flight) a resource wants nothing, so an idle one decays
/// to exactly 0 instead of asking for ever smaller slivers.
const NEGLIGIBLE: f64 = 1e-3;

pub(crate) struct Demand {
    kind: Kind,
    origin: Seconds,
    /// Number of the current slot since `origin` (a whole number, kept as f64 for arithmetic).
    slot: f64,
    /// The current slot's sum (rate) or peak (concurrency).
    current: f64,
    /// Closed slots, indexed by slot number modulo `SLOTS`.
    closed: [f64; SLOTS],
    /// Rate: moving average of the closed slots' cost per second.
    average: f64,
    /// Rate: the first arrival of the active period, one after the resource wanted nothing.
    since: Seconds,
    /// Rate: the cost queued since `queued_at`, and the queue's cost-seconds in the current
    /// slot up to then (its integral over time) and in the closed slots.
    queued: f64,
    queued_at: Seconds,
    waited: f64,
    closed_waited: [f64; SLOTS],
    /// Rate: when an arrival was last refused.
    refused_at: Seconds,
}

impl Demand {
    pub(crate) fn new(kind: Kind, now: Seconds) -> Demand {
        Demand {
            kind,
            origin: now,
            slot: 0.0,
            current: 0.0,
            closed: [0.0; SLOTS],
            average: 0.0,
            since: now,
            queued: 0.0,
            queued_at: now,
            waited: 0.0,
            closed_waited: [0.0; SLOTS],
            refused_at: f64::NEG_INFINITY,
        }
    }

    /// Rate: `amount` is an arrival's cost. Concurrency: the in-flight cost it wanted (held and
    /// queued cost, and its own).
    pub(crate) fn record(&mut self, now: Seconds, amount: f64) {
        self.advance(now);
        match self.kind {
            Kind::Rate => {
                // Only the first arrival of a slot can be the first of an active period.
                if self.current == 0.0 && self.wants(now, 0.0) == 0.0 {
                    self.since = now;
                }
                self.current += amount
            }
            Kind::Concurrency => self.current = self.current.max(amount),
        }
    }

    /// Rate: the cost queued from `now` on.
    pub(crate) fn queue(&mut self, now: Seconds, queued: f64) {
        if queued == self.queued {
            return;
        }
        self.advance(now);
        self.waited += self.queued * (now - self.queued_at).max(0.0);
        self.queued_at = self.queued_at.max(now);
        self.queued = queued;
    }

    /// Rate: an arrival was refused.
    pub(crate) fn refused(&mut self, now: Seconds) {
        self.refused_at = now;
    }

    /// `floor`: what is wanted right now regardless of arrivals (held and queued cost).
    pub(crate) fn wants(&mut self, now: Seconds, floor: f64) -> f64 {
        self.advance(now);
        let estimate = match self.kind {
            Kind::Rate => {
                let recent: f64 = (1..=RISE_SLOTS).map(|back| self.closed_slot(back)).sum();
                let window = RISE_SLOTS as f64 * SLOT + (now - self.slot_start()).max(0.0);
                let span = (now - self.since).max(MIN_SPAN).min(window);
                let rate = ((recent + self.current) / span).max(self.average);
                let unseen = if now - self.refused_at > window {
                    let waited: f64 = (1..=RISE_SLOTS).map(|back| self.closed_waited_slot(back)).sum::<f64>()
                        + self.waited
                        + self.queued * (now - self.queued_at).max(0.0);
                    (waited / span / HELD_BACK).min(rate)
                } else {
                    0.0
                };
                rate + unseen
            }
            Kind::Concurrency => (1..SLOTS).map(|back| self.closed_slot(back)).fold(self.current, f64::max),
        };
        let wants = estimate.max(floor) * HEADROOM;
        if wants >= NEGLIGIBLE { wants } else { 0.0 }
    }

    fn slot_start(&self) -> Seconds {
        self.origin + self.slot * SLOT
    }

    /// The slot `back` slots before the current one (0 before the limiter existed).
    fn closed_slot(&self, back: usize) -> f64 {
        let back = back as f64;
        if back > self.slot { 0.0 } else { self.closed[index(self.slot - back)] }
    }

    /// The queue's cost-seconds `back` slots before the current one.
    fn closed_waited_slot(&self, back: usize) -> f64 {
        let back = back as f64;
        if back > self.slot { 0.0 } else { self.closed_waited[index(self.slot - back)] }
    }

    /// Closes the slots that ended by `now`.
    fn advance(&mut self, now: Seconds) {
        let slot = ((now - self.origin) / SLOT).floor();
        // A clock that went back (or NaN) leaves the current slot open.
        if slot.is_nan() || slot <= self.slot {
            return;
        }
        let decay = (-SLOT / FALL_TIME_CONSTANT).exp();
        let end = self.slot_start() + SLOT;
        self.closed[index(self.slot)] = self.current;
        self.closed_waited[index(self.slot)] = self.waited + self.queued * (end - self.queued_at).max(0.0);
        self.average = self.average * decay + (1.0 - decay) * self.current / SLOT;
        let empty = slot - self.slot - 1.0;
        for back in 1..=(empty.min(SLOTS as f64) as usize) {
            self.closed[index(slot - back as f64)] = 0.0;
            self.closed_waited[index(slot - back as f64)] = self.queued * SLOT;
        }
        self.average *= decay.powf(empty);
        self.slot = slot;
        self.current = 0.0;
        self.waited = 0.0;
        self.queued_at = self.slot_start();
    }
}

fn index(slot: f64) -> usize {
    slot as usize % SLOTS
}
