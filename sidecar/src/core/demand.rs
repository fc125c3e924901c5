//! What a resource wants from the capacity server, estimated from the load offered to it (every
//! arrival, admitted or not): quick to rise, so a surge is asked for at the next refresh, and
//! slow to fall, so a lull between bursts does not give the capacity away.
//!
//! Arrivals are summed (rate) or maxed (concurrency) into fixed slots of time counted from the
//! limiter's creation, so the estimate depends only on the arrivals and `now`, not on how often
//! it is read.

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
}

impl Demand {
    pub(crate) fn new(kind: Kind, now: Seconds) -> Demand {
        Demand { kind, origin: now, slot: 0.0, current: 0.0, closed: [0.0; SLOTS], average: 0.0 }
    }

    /// Rate: `amount` is an arrival's cost. Concurrency: the in-flight cost it wanted (held and
    /// queued cost, and its own).
    pub(crate) fn record(&mut self, now: Seconds, amount: f64) {
        self.advance(now);
        match self.kind {
            Kind::Rate => self.current += amount,
            Kind::Concurrency => self.current = self.current.max(amount),
        }
    }

    /// `floor`: what is wanted right now regardless of arrivals (held and queued cost).
    pub(crate) fn wants(&mut self, now: Seconds, floor: f64) -> f64 {
        self.advance(now);
        let estimate = match self.kind {
            Kind::Rate => {
                let recent: f64 = (1..=RISE_SLOTS).map(|back| self.closed_slot(back)).sum();
                let span = RISE_SLOTS as f64 * SLOT + (now - self.slot_start()).max(0.0);
                ((recent + self.current) / span).max(self.average)
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

    /// Closes the slots that ended by `now`.
    fn advance(&mut self, now: Seconds) {
        let slot = ((now - self.origin) / SLOT).floor();
        // A clock that went back (or NaN) leaves the current slot open.
        if slot.is_nan() || slot <= self.slot {
            return;
        }
        let decay = (-SLOT / FALL_TIME_CONSTANT).exp();
        self.closed[index(self.slot)] = self.current;
        self.average = self.average * decay + (1.0 - decay) * self.current / SLOT;
        let empty = slot - self.slot - 1.0;
        for back in 1..=(empty.min(SLOTS as f64) as usize) {
            self.closed[index(slot - back as f64)] = 0.0;
        }
        self.average *= decay.powf(empty);
        self.slot = slot;
        self.current = 0.0;
    }
}

fn index(slot: f64) -> usize {
    slot as usize % SLOTS
}
