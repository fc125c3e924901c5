//! The simulated clock: a queue of events keyed by (time, sequence). Events at the same instant
//! run in the order they were scheduled, so a run depends only on its seed.

use std::{
    cmp::{Ordering, Reverse},
    collections::BinaryHeap,
};

/// Simulated seconds since the start of the run.
pub type Time = f64;

pub struct Clock<E> {
    now: Time,
    seq: u64,
    queue: BinaryHeap<Reverse<Scheduled<E>>>,
}

struct Scheduled<E> {
    at: Time,
    seq: u64,
    event: E,
}

impl<E> Ord for Scheduled<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.total_cmp(&other.at).then(self.seq.cmp(&other.seq))
    }
}

impl<E> PartialOrd for Scheduled<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> PartialEq for Scheduled<E> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<E> Eq for Scheduled<E> {}

impl<E> Default for Clock<E> {
    fn default() -> Self {
        Clock { now: 0.0, seq: 0, queue: BinaryHeap::new() }
    }
}

impl<E> Clock<E> {
    pub fn now(&self) -> Time {
        self.now
    }

    /// Schedules `event` at `at`, or now if `at` has passed (an event never runs in the past).
    pub fn at(&mut self, at: Time, event: E) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled { at: at.max(self.now), seq: self.seq, event }));
    }

    pub fn after(&mut self, delay: Time, event: E) {
        self.at(self.now + delay, event);
    }

    /// The next event no later than `end`, with the clock moved to its time.
    pub fn next_until(&mut self, end: Time) -> Option<E> {
        if self.queue.peek().is_none_or(|Reverse(next)| next.at > end) {
            return None;
        }
        let Reverse(next) = self.queue.pop()?;
        self.now = next.at;
        Some(next.event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_run_in_time_then_schedule_order() {
        let mut clock = Clock::default();
        clock.at(2.0, "c");
        clock.at(1.0, "a");
        clock.at(1.0, "b");
        clock.at(5.0, "late");
        let mut seen = vec![];
        while let Some(event) = clock.next_until(3.0) {
            seen.push((clock.now(), event));
        }
        assert_eq!(seen, [(1.0, "a"), (1.0, "b"), (2.0, "c")]);
        clock.at(0.0, "past");
        assert_eq!(clock.next_until(3.0), Some("past"));
        assert_eq!(clock.now(), 2.0);
    }
}
