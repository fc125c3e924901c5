//! The simulated clock: a queue of events keyed by (time, sequence). Events at the same instant
//! run in the order they were scheduled, so a run depends only on its seed.

use std::{cmp::Reverse, collections::BinaryHeap};

/// Simulated seconds since the start of the run.
pub type Time = f64;

pub struct Clock<E> {
    now: Time,
    seq: u64,
    /// Keys only, so that a pop moves 24 bytes per level however large the events are: a scale
    /// run keeps tens of thousands queued and pops tens of millions.
    queue: BinaryHeap<Reverse<Key>>,
    /// The events, by slot; a popped slot is reused.
    events: Vec<Option<E>>,
    free: Vec<u32>,
}

/// When an event runs: its time (as the bits of a non-negative `f64`, which order like the
/// numbers), then the order it was scheduled in; and where it waits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    at: u64,
    seq: u64,
    slot: u32,
}

impl<E> Default for Clock<E> {
    fn default() -> Self {
        Clock { now: 0.0, seq: 0, queue: BinaryHeap::new(), events: Vec::new(), free: Vec::new() }
    }
}

impl<E> Clock<E> {
    pub fn now(&self) -> Time {
        self.now
    }

    /// Schedules `event` at `at`, or now if `at` has passed (an event never runs in the past).
    pub fn at(&mut self, at: Time, event: E) {
        self.seq += 1;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.events[slot as usize] = Some(event);
                slot
            }
            None => {
                self.events.push(Some(event));
                u32::try_from(self.events.len() - 1).expect("fewer than 2^32 events queued")
            }
        };
        // `now` starts at 0 and only grows, so the time is never negative.
        let at = at.max(self.now).to_bits();
        self.queue.push(Reverse(Key { at, seq: self.seq, slot }));
    }

    pub fn after(&mut self, delay: Time, event: E) {
        self.at(self.now + delay, event);
    }

    /// The next event no later than `end`, with the clock moved to its time.
    pub fn next_until(&mut self, end: Time) -> Option<E> {
        if self.queue.peek().is_none_or(|Reverse(next)| f64::from_bits(next.at) > end) {
            return None;
        }
        let Reverse(next) = self.queue.pop()?;
        self.now = f64::from_bits(next.at);
        self.free.push(next.slot);
        self.events[next.slot as usize].take()
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
