//! The simulated clock: a queue of events keyed by (time, sequence). Events at the same instant
//! run in the order they were scheduled, so a run depends only on its seed.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, VecDeque},
};

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
    /// Events that always run `period` after they are scheduled (every client's periodic
    /// look at its demand, most of a run's events): as the clock only moves forward they are
    /// scheduled in the order they run, so a plain queue keeps them sorted.
    periodic: VecDeque<(Key, E)>,
    period: Time,
}

/// When an event runs: its time (as the bits of a non-negative `f64`, which order like the
/// numbers), then the order it was scheduled in; and, in the heap, where it waits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    at: u64,
    seq: u64,
    slot: u32,
}

impl<E> Clock<E> {
    /// A clock at 0 whose periodic events run `period` after they are scheduled.
    pub fn new(period: Time) -> Clock<E> {
        Clock {
            now: 0.0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            free: Vec::new(),
            periodic: VecDeque::new(),
            period,
        }
    }

    pub fn now(&self) -> Time {
        self.now
    }

    /// When an event scheduled now for `at` runs, and in what order: never in the past.
    fn key(&mut self, at: Time, slot: u32) -> Key {
        self.seq += 1;
        // `now` starts at 0 and only grows, so the time is never negative.
        Key { at: at.max(self.now).to_bits(), seq: self.seq, slot }
    }

    /// Schedules `event` at `at`, or now if `at` has passed.
    pub fn at(&mut self, at: Time, event: E) {
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
        let key = self.key(at, slot);
        self.queue.push(Reverse(key));
    }

    pub fn after(&mut self, delay: Time, event: E) {
        self.at(self.now + delay, event);
    }

    /// Schedules `event` one period from now.
    pub fn after_period(&mut self, event: E) {
        let key = self.key(self.now + self.period, 0);
        self.periodic.push_back((key, event));
    }

    /// The next event no later than `end`, with the clock moved to its time.
    pub fn next_until(&mut self, end: Time) -> Option<E> {
        let order = |k: &Key| (k.at, k.seq);
        let heap = self.queue.peek().map(|Reverse(k)| order(k));
        let periodic = self.periodic.front().map(|(k, _)| order(k));
        let from_heap = match (heap, periodic) {
            (Some(h), Some(p)) => h < p,
            (h, _) => h.is_some(),
        };
        let at = if from_heap { heap? } else { periodic? }.0;
        if f64::from_bits(at) > end {
            return None;
        }
        self.now = f64::from_bits(at);
        if from_heap {
            let Reverse(next) = self.queue.pop()?;
            self.free.push(next.slot);
            self.events[next.slot as usize].take()
        } else {
            self.periodic.pop_front().map(|(_, event)| event)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_run_in_time_then_schedule_order() {
        let mut clock = Clock::new(1.0);
        clock.at(2.0, "c");
        clock.after_period("b");
        clock.at(1.0, "a");
        clock.at(1.0, "a2");
        clock.at(5.0, "late");
        let mut seen = vec![];
        while let Some(event) = clock.next_until(3.0) {
            seen.push((clock.now(), event));
            if event == "b" {
                clock.after_period("b again");
            }
        }
        assert_eq!(seen, [(1.0, "b"), (1.0, "a"), (1.0, "a2"), (2.0, "c"), (2.0, "b again")]);
        clock.at(0.0, "past");
        assert_eq!(clock.next_until(3.0), Some("past"));
        assert_eq!(clock.now(), 2.0);
    }
}
