//! A client's offered load: a rate that walks at random and may be spiked, and the arrivals it
//! makes, evenly spaced requests of a fixed cost.

use crate::{clock::Time, scenario::LoadSpec};

/// A spike: the load is set to, or raised by, an amount for a while.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Boost {
    To(f64),
    Add(f64),
}

pub struct Load {
    spec: LoadSpec,
    walked: f64,
    boost: Option<Boost>,
    rng: fastrand::Rng,
}

impl Load {
    pub fn new(spec: LoadSpec, seed: u64) -> Load {
        Load { walked: spec.base, spec, boost: None, rng: fastrand::Rng::with_seed(seed) }
    }

    /// Offered cost per second now.
    pub fn rate(&self) -> f64 {
        match self.boost {
            None => self.walked,
            Some(Boost::To(rate)) => rate,
            Some(Boost::Add(extra)) => self.walked + extra,
        }
    }

    /// Seconds between walk steps, if the load walks.
    pub fn step_every(&self) -> Option<Time> {
        self.spec.walk.as_ref().map(|walk| walk.every)
    }

    pub fn step(&mut self) {
        if let Some(walk) = &self.spec.walk {
            let moved = self.walked + walk.step * (2.0 * self.rng.f64() - 1.0);
            self.walked = moved.clamp(walk.min, walk.max);
        }
    }

    /// A new spike replaces one in progress; `None` ends it.
    pub fn boost(&mut self, boost: Option<Boost>) {
        self.boost = boost;
    }
}

/// Requests of cost `cost` at a steady rate: the next one comes once a whole request's worth of
/// load has accrued since the previous one, so a change of rate takes effect at once.
pub struct Arrivals {
    cost: f64,
    /// Arrivals are generated up to here.
    until: Time,
    /// Fraction of the next request accrued by `until`.
    accrued: f64,
}

impl Arrivals {
    pub fn new(cost: f64, start: Time) -> Arrivals {
        // The first request comes at the start, so the client is in use from its first moment.
        Arrivals { cost, until: start, accrued: 1.0 }
    }

    /// Calls `arrive(time, cost)` for each request in (`self.until`, `to`] at `rate` cost per
    /// second (and one at the start).
    pub fn run(&mut self, to: Time, rate: f64, mut arrive: impl FnMut(Time, f64)) {
        if to < self.until {
            return;
        }
        let per_second = rate / self.cost;
        if self.accrued >= 1.0 {
            arrive(self.until, self.cost);
            self.accrued -= 1.0;
        }
        if per_second > 0.0 {
            let mut next = self.until + (1.0 - self.accrued) / per_second;
            while next <= to {
                arrive(next, self.cost);
                next += 1.0 / per_second;
            }
            self.accrued = 1.0 - (next - to) * per_second;
        }
        self.until = to;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Walk;

    #[test]
    fn arrivals_follow_the_rate_across_changes() {
        let mut arrivals = Arrivals::new(2.0, 10.0);
        let mut seen = vec![];
        arrivals.run(11.0, 4.0, |t, cost| seen.push((t, cost)));
        assert_eq!(seen, [(10.0, 2.0), (10.5, 2.0), (11.0, 2.0)]);
        let mut seen = vec![];
        // Half a request accrues by 11.5 at the old rate, the other half by 11.75 at the new.
        arrivals.run(11.5, 2.0, |t, _| seen.push(t));
        arrivals.run(12.0, 4.0, |t, _| seen.push(t));
        assert_eq!(seen, [11.75]);
        let mut total = 0.0;
        arrivals.run(112.0, 3.0, |_, cost| total += cost);
        assert!((total - 300.0).abs() <= 2.0, "{total}");
    }

    #[test]
    fn the_walk_stays_within_bounds_and_spikes_override_it() {
        let walk = Walk { every: 1.0, step: 50.0, min: 80.0, max: 120.0 };
        let mut load = Load::new(LoadSpec { base: 100.0, walk: Some(walk) }, 3);
        for _ in 0..100 {
            load.step();
            assert!((80.0..=120.0).contains(&load.rate()));
        }
        let walked = load.rate();
        load.boost(Some(Boost::Add(100.0)));
        assert_eq!(load.rate(), walked + 100.0);
        load.boost(Some(Boost::To(1000.0)));
        assert_eq!(load.rate(), 1000.0);
        load.boost(None);
        assert_eq!(load.rate(), walked);
    }
}
