//! The last minutes of a few figures per resource, for the charts of the status pages: a ring of
//! a fixed number of samples per resource, for a bounded number of resources. Nothing here
//! reads a clock: each round of samples comes with its time.

use std::collections::HashMap;

/// The last `capacity` items pushed, oldest first; the oldest goes when a new one comes.
pub struct Ring<T> {
    items: Vec<T>,
    capacity: usize,
    /// Where the next push goes once full: the oldest item.
    next: usize,
}

impl<T> Ring<T> {
    /// A ring of `capacity` items (at least one), allocated at once.
    pub fn new(capacity: usize) -> Ring<T> {
        let capacity = capacity.max(1);
        Ring { items: Vec::with_capacity(capacity), capacity, next: 0 }
    }

    pub fn push(&mut self, item: T) {
        if self.items.len() < self.capacity {
            self.items.push(item);
        } else {
            self.items[self.next] = item;
            self.next = (self.next + 1) % self.capacity;
        }
    }

    /// Oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        let (newer, older) = self.items.split_at(self.next);
        older.iter().chain(newer)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// `N` figures taken together at `at` (seconds, on whatever clock the caller uses).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample<const N: usize> {
    pub at: f64,
    pub values: [f64; N],
}

/// A ring of samples per key (a resource id), for at most `max_keys` keys.
pub struct History<const N: usize> {
    length: usize,
    interval: f64,
    max_keys: usize,
    /// Each key's ring and the round that last named it.
    rings: HashMap<String, (Ring<Sample<N>>, u64)>,
    round: u64,
}

impl<const N: usize> History<N> {
    /// Keeps `length` samples per key, taken every `interval` seconds, for at most `max_keys`
    /// keys. Memory: about `max_keys × length × 8 × (N + 1)` bytes.
    pub fn new(length: usize, interval: f64, max_keys: usize) -> History<N> {
        History { length, interval, max_keys, rings: HashMap::new(), round: 0 }
    }

    /// Records one round of samples taken at `at`, most important key first. Only the first
    /// `max_keys` keys of a round are kept; a key the round leaves out (or cuts off) is
    /// forgotten with its samples, so that memory follows what is charted now.
    pub fn record<'a>(&mut self, at: f64, round: impl IntoIterator<Item = (&'a str, [f64; N])>) {
        self.round += 1;
        for (key, values) in round.into_iter().take(self.max_keys) {
            let sample = Sample { at, values };
            match self.rings.get_mut(key) {
                Some((ring, seen)) => {
                    ring.push(sample);
                    *seen = self.round;
                }
                None => {
                    let mut ring = Ring::new(self.length);
                    ring.push(sample);
                    self.rings.insert(key.to_owned(), (ring, self.round));
                }
            }
        }
        let round = self.round;
        self.rings.retain(|_, (_, seen)| *seen == round);
    }

    pub fn get(&self, key: &str) -> Option<&Ring<Sample<N>>> {
        self.rings.get(key).map(|(ring, _)| ring)
    }

    /// Keys with samples.
    pub fn len(&self) -> usize {
        self.rings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rings.is_empty()
    }

    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// The span a full ring covers, in seconds.
    pub fn window(&self) -> f64 {
        self.length as f64 * self.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_the_last_items_oldest_first() {
        let mut ring = Ring::new(3);
        assert!(ring.is_empty());
        ring.push(1);
        ring.push(2);
        assert_eq!(ring.iter().copied().collect::<Vec<_>>(), [1, 2]);
        for i in 3..=7 {
            ring.push(i);
        }
        assert_eq!(ring.iter().copied().collect::<Vec<_>>(), [5, 6, 7]);
        assert_eq!(ring.len(), 3);
        let mut one = Ring::new(0);
        one.push('a');
        one.push('b');
        assert_eq!(one.iter().collect::<Vec<_>>(), [&'b'], "a ring holds at least one item");
    }

    #[test]
    fn history_keeps_bounded_rings_for_the_keys_of_the_last_round() {
        let mut history = History::<2>::new(4, 5.0, 2);
        assert_eq!(history.window(), 20.0);
        history.record(100.0, [("a", [1.0, 2.0]), ("b", [3.0, 4.0]), ("c", [5.0, 6.0])]);
        assert_eq!(history.len(), 2, "only the first max_keys keys of a round");
        assert!(history.get("c").is_none());
        for t in 1..=6 {
            history.record(100.0 + 5.0 * f64::from(t), [("a", [f64::from(t), 0.0]), ("c", [0.0, 0.0])]);
        }
        let a: Vec<_> = history.get("a").unwrap().iter().map(|s| (s.at, s.values[0])).collect();
        assert_eq!(a, [(115.0, 3.0), (120.0, 4.0), (125.0, 5.0), (130.0, 6.0)]);
        assert!(history.get("b").is_none(), "left out of a round: forgotten");
        assert_eq!(history.get("c").unwrap().len(), 4);
        history.record(135.0, std::iter::empty());
        assert!(history.is_empty());
    }
}
