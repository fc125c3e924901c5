//! Admission for one resource: a token bucket (rate) or a semaphore (concurrency) in front of a
//! FIFO queue of waiters. The caller owns the waiters themselves; the limiter only hands out
//! [`Ticket`]s and says, through [`Limiter::poll`], whose turn has come.

use std::collections::VecDeque;

use super::{
    Seconds,
    amount::{Capacity, Cost, MAX_AMOUNT},
    demand::Demand,
};
use crate::defaults::{SURGE, SURGE_FLOOR};

/// Waiters one resource may hold. Each parks a request (and its connection) in the proxy; past
/// this, waiting longer only turns overload into memory growth and timeouts, so we refuse at once.
pub const MAX_QUEUED: usize = 10_000;

/// How a resource's capacity is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Cost admitted per second.
    Rate,
    /// Cost admitted and not yet released (in flight).
    Concurrency,
}

/// Identifies a queued waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

/// What became of an arrival.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Offer {
    Admitted,
    /// Waits its turn: [`Limiter::poll`] names the ticket when it is admitted; until then the
    /// caller may [`Limiter::cancel`] it.
    Queued(Ticket),
    /// `retry_after`: when a rate resource expects to have room; `None` when it cannot say (a
    /// concurrency limit) or never will (no capacity).
    Rejected {
        retry_after: Option<Seconds>,
    },
}

pub struct Limiter {
    kind: Kind,
    /// Rate (cost/s) or permits; 0 admits nothing, INFINITY everything.
    capacity: f64,
    burst: f64,
    /// Rate: tokens as of `updated`; negative after a cost larger than the burst (debt).
    tokens: f64,
    updated: Seconds,
    /// Concurrency: cost admitted and not yet released, and by how many requests (when none,
    /// `in_flight` is reset to exactly 0 so float drift cannot hold a permit forever).
    in_flight: f64,
    holders: u64,
    queue: VecDeque<(Ticket, f64)>,
    /// Sum of the queued costs; reset to 0 whenever the queue empties, so it cannot drift.
    queued_cost: f64,
    next_ticket: u64,
    demand: Demand,
    /// The wants last asked of a capacity server (∞: there is none to ask, standalone).
    asked: f64,
}

impl Limiter {
    /// `capacity`: rate (cost/s) or in-flight cost, INFINITY for no limit. The bucket starts full.
    /// Amounts out of range are taken as the nearest [`Capacity`] and [`Cost`].
    pub fn new(kind: Kind, capacity: f64, burst: f64, now: Seconds) -> Limiter {
        let burst = Cost::saturating(burst).get();
        Limiter {
            kind,
            capacity: Capacity::saturating(capacity).get(),
            burst,
            tokens: burst,
            updated: now,
            in_flight: 0.0,
            holders: 0,
            queue: VecDeque::new(),
            queued_cost: 0.0,
            next_ticket: 0,
            demand: Demand::new(kind, now),
            asked: f64::INFINITY,
        }
    }

    /// Capacity comes from leases: until one is asked for, any demand is a surge.
    pub fn leased(mut self) -> Limiter {
        self.asked = 0.0;
        self
    }

    /// Every arrival goes through here, whatever becomes of it, so that demand counts offered
    /// load. `max_wait` 0: admit or reject at once. A cost above [`MAX_AMOUNT`] counts as that,
    /// and no limit admits it.
    pub fn offer(&mut self, now: Seconds, cost: f64, max_wait: Seconds) -> Offer {
        let counted = Cost::saturating(cost).get();
        match self.kind {
            Kind::Rate => self.demand.record(now, counted),
            Kind::Concurrency => self.demand.record(now, self.in_flight + self.queued_cost + counted),
        }
        if self.capacity == f64::INFINITY {
            self.take(counted);
            return Offer::Admitted;
        }
        if cost > MAX_AMOUNT {
            self.demand.refused(now);
            return Offer::Rejected { retry_after: None };
        }
        let cost = counted;
        self.refill(now);
        if self.capacity > 0.0 && self.queue.is_empty() && self.fits(cost) {
            self.take(cost);
            return Offer::Admitted;
        }
        let wait = match self.kind {
            // Everyone queued pays in full before this arrival's turn comes.
            Kind::Rate if self.capacity > 0.0 => {
                Some((self.queued_cost + cost.min(self.burst) - self.tokens).max(0.0) / self.capacity)
            }
            _ => None,
        };
        // A rate waits when its turn is predicted within `max_wait` (at once: the queue is about
        // to drain); a semaphore cannot predict, so it waits whenever the caller would. Nor can
        // a resource whose demand surged past what was last asked for: a larger lease is on its
        // way, so it waits for that (up to `max_wait`) rather than be judged by the lease it
        // has. With no capacity and none coming, nothing waits.
        let waits = max_wait > 0.0
            && match wait {
                Some(wait) => wait <= max_wait || self.surged(now),
                None => self.capacity > 0.0 || self.surged(now),
            };
        if waits && self.queue.len() < MAX_QUEUED {
            let ticket = Ticket(self.next_ticket);
            self.next_ticket += 1;
            self.queue.push_back((ticket, cost));
            self.queued_cost += cost;
            self.demand.queue(now, self.queued_cost);
            Offer::Queued(ticket)
        } else {
            self.demand.refused(now);
            Offer::Rejected { retry_after: wait }
        }
    }

    /// Admits queued waiters whose turn has come, in order. Returns when the head's turn comes
    /// (rate), or `None` when the queue is empty or only a release or more capacity can help.
    pub fn poll(&mut self, now: Seconds, mut admit: impl FnMut(Ticket)) -> Option<Seconds> {
        self.refill(now);
        while let Some(&(ticket, cost)) = self.queue.front() {
            if !(self.capacity == f64::INFINITY || self.capacity > 0.0 && self.fits(cost)) {
                break;
            }
            self.queue.pop_front();
            self.queued_cost -= cost;
            self.take(cost);
            admit(ticket);
        }
        if self.queue.is_empty() {
            self.queued_cost = 0.0;
        }
        self.demand.queue(now, self.queued_cost);
        match (self.kind, self.queue.front()) {
            (_, None) => None,
            (Kind::Rate, Some(&(_, cost))) if self.capacity > 0.0 => Some(self.turn(cost)),
            _ => None,
        }
    }

    /// A waiter gave up: it leaves the queue and is not charged. Its demand counts it queued
    /// until the next [`Self::poll`].
    pub fn cancel(&mut self, ticket: Ticket) {
        if let Some(at) = self.queue.iter().position(|&(queued, _)| queued == ticket) {
            self.queue.remove(at);
            // Recomputed rather than subtracted: the queue is short and the sum stays exact.
            self.queued_cost = self.queue.iter().map(|&(_, cost)| cost).sum();
        }
    }

    /// An admitted concurrency request finished (nothing to do for a rate).
    pub fn release(&mut self, _now: Seconds, cost: f64) {
        if self.kind == Kind::Concurrency {
            self.holders = self.holders.saturating_sub(1);
            self.in_flight =
                if self.holders == 0 { 0.0 } else { (self.in_flight - Cost::saturating(cost).get()).max(0.0) };
        }
    }

    /// An admitted request will not use what it was given (another of its resources said no):
    /// the tokens go back to the bucket, or the permits are released.
    pub fn refund(&mut self, now: Seconds, cost: f64) {
        match self.kind {
            Kind::Rate => {
                if self.capacity < f64::INFINITY {
                    self.refill(now);
                    self.tokens = (self.tokens + Cost::saturating(cost).get()).min(self.burst);
                }
            }
            Kind::Concurrency => self.release(now, cost),
        }
    }

    /// Charges `cost` after the fact, whatever the bucket holds: bytes that have passed already
    /// (a response body, a request body not paced). The bucket may go into debt, which later
    /// arrivals wait out, but never deeper than `max_debt` below empty, so that one large body
    /// cannot close the resource for longer than `max_debt` takes to repay; what would go
    /// deeper is not owed. Counts as offered load. A semaphore has nothing to charge after the
    /// fact.
    pub fn charge(&mut self, now: Seconds, cost: f64, max_debt: f64) {
        if self.kind != Kind::Rate {
            return;
        }
        let cost = Cost::saturating(cost).get();
        self.demand.record(now, cost);
        if self.capacity < f64::INFINITY {
            self.refill(now);
            // A bucket already deeper in debt (charged under a larger bound) stays where it is.
            self.tokens = self.tokens.min((self.tokens - cost).max(-Cost::saturating(max_debt).get()));
        }
    }

    /// Changes the capacity in place. A rate's tokens accrue at the old rate up to `now` and at
    /// the new one after, never beyond the new burst, so a change never releases a burst of its
    /// own. Permits held above a smaller semaphore just drain.
    pub fn set_capacity(&mut self, now: Seconds, capacity: f64, burst: f64) {
        if self.capacity == f64::INFINITY {
            // Nothing was counted while unlimited: start from a full bucket, as `new` does.
            self.tokens = f64::INFINITY;
        }
        self.refill(now);
        self.capacity = Capacity::saturating(capacity).get();
        self.burst = Cost::saturating(burst).get();
        self.tokens = self.tokens.min(self.burst);
    }

    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    pub fn burst(&self) -> f64 {
        self.burst
    }

    /// The largest cost this resource takes at once as it is enforced now: a rate's burst (a
    /// larger one would leave the bucket in debt), a semaphore's capacity (at least the burst,
    /// so that a resource with none still tells a cost too large from one refused for now).
    pub fn largest_cost(&self) -> f64 {
        match self.kind {
            Kind::Rate => self.burst,
            Kind::Concurrency => self.capacity.max(self.burst),
        }
    }

    /// A rate's tokens now, and the seconds until its bucket is full again (0 when it is; +∞ at
    /// a rate of 0): what a rate limit service answers as remaining and until reset.
    pub fn level(&mut self, now: Seconds) -> (f64, Seconds) {
        self.refill(now);
        let missing = (self.burst - self.tokens).max(0.0);
        let until_full = if missing == 0.0 { 0.0 } else { missing / self.capacity };
        (self.tokens, until_full)
    }

    /// Concurrency: cost admitted and not yet released (0 for a rate).
    pub fn in_flight(&self) -> f64 {
        self.in_flight
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// What to ask the capacity server for now; remembered as asked for.
    pub fn ask(&mut self, now: Seconds) -> f64 {
        self.asked = self.wants(now);
        self.asked
    }

    /// No larger lease is coming soon (the resource lives on its fallback, and its lease client
    /// backs off): demand is judged by the capacity in force until it is next asked for.
    pub fn unleased(&mut self) {
        self.asked = f64::INFINITY;
    }

    /// Whether demand has surged past what was last asked for (see [`SURGE`]); any demand is a
    /// surge when nothing was asked for.
    pub fn surged(&mut self, now: Seconds) -> bool {
        let asked = self.asked;
        if asked == f64::INFINITY {
            return false;
        }
        let wants = self.wants(now);
        wants - asked > SURGE * asked.max(SURGE_FLOOR) || asked == 0.0 && wants > 0.0
    }

    /// What the load offered lately asks for.
    pub fn wants(&mut self, now: Seconds) -> f64 {
        let floor = match self.kind {
            Kind::Rate => 0.0,
            // Requests held or waiting right now are wanted, however long ago they arrived.
            Kind::Concurrency => self.in_flight + self.queued_cost,
        };
        self.demand.wants(now, floor)
    }

    /// Whether `cost` may be admitted now. A cost larger than the burst (rate) or the whole
    /// semaphore (concurrency) goes when the bucket is full or nothing is in flight, else it
    /// would never go.
    fn fits(&self, cost: f64) -> bool {
        match self.kind {
            Kind::Rate => self.tokens >= cost.min(self.burst),
            Kind::Concurrency => self.in_flight + cost <= self.capacity || self.holders == 0,
        }
    }

    /// Rate: when the bucket will hold enough for `cost` to go.
    fn turn(&self, cost: f64) -> Seconds {
        let need = cost.min(self.burst);
        let mut at = self.updated + (need - self.tokens) / self.capacity;
        // Rounding may leave the bucket a hair short at `at`, and a poll then would find the head
        // still waiting and name the same instant again: step up to where the refill suffices.
        while self.tokens + (at - self.updated) * self.capacity < need {
            at = at.next_up();
        }
        at
    }

    fn take(&mut self, cost: f64) {
        match self.kind {
            Kind::Rate => {
                if self.capacity < f64::INFINITY {
                    self.tokens -= cost;
                }
            }
            Kind::Concurrency => {
                self.in_flight += cost;
                self.holders += 1;
            }
        }
    }

    fn refill(&mut self, now: Seconds) {
        if now > self.updated {
            if self.kind == Kind::Rate && self.capacity < f64::INFINITY {
                self.tokens = (self.tokens + (now - self.updated) * self.capacity).min(self.burst);
            }
            self.updated = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rates_level_is_its_tokens_and_the_time_to_refill() {
        let mut bucket = Limiter::new(Kind::Rate, 2.0, 10.0, 0.0);
        assert_eq!(bucket.level(0.0), (10.0, 0.0));
        assert_eq!(bucket.offer(0.0, 6.0, 0.0), Offer::Admitted);
        assert_eq!(bucket.level(1.0), (6.0, 2.0));
        assert_eq!(bucket.level(5.0), (10.0, 0.0));
        bucket.set_capacity(5.0, 0.0, 10.0);
        bucket.charge(5.0, 1.0, 10.0);
        assert_eq!(bucket.level(6.0), (9.0, f64::INFINITY));
    }
}
