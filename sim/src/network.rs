//! The simulated network: every message takes a delay and may be lost, at the scenario's base
//! rate or at a higher one during a loss window (an outage is a window at rate 1).

use crate::{clock::Time, scenario::NetworkSpec, topology::ServerId};

pub struct Network {
    spec: NetworkSpec,
    rng: fastrand::Rng,
    windows: Vec<Window>,
}

struct Window {
    /// `None`: every server.
    server: Option<ServerId>,
    rate: f64,
    until: Time,
}

impl Network {
    pub fn new(spec: NetworkSpec, seed: u64) -> Network {
        Network { spec, rng: fastrand::Rng::with_seed(seed), windows: Vec::new() }
    }

    /// Messages to and from `server` (all, if `None`) are lost at `rate` until `until`.
    pub fn lose(&mut self, server: Option<ServerId>, rate: f64, until: Time) {
        self.windows.push(Window { server, rate, until });
    }

    /// How long a message sent at `now` between `ends` (the servers at either end: one for a
    /// client's message, two between servers) travels; `None` if it is lost. A window at
    /// either end applies.
    pub fn transit(&mut self, now: Time, ends: &[ServerId]) -> Option<Time> {
        self.windows.retain(|window| window.until > now);
        let loss = self
            .windows
            .iter()
            .filter(|window| window.server.is_none_or(|s| ends.contains(&s)))
            .map(|window| window.rate)
            .fold(self.spec.loss, f64::max);
        // Both draws are always taken, so a loss window does not shift later delays.
        let (lost, jitter) = (self.rng.f64() < loss, self.rng.f64());
        (!lost).then_some(self.spec.delay + self.spec.jitter * jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_lose_messages_of_their_server_until_they_end() {
        let mut network = Network::new(NetworkSpec { delay: 0.01, jitter: 0.0, loss: 0.0 }, 7);
        assert_eq!(network.transit(0.0, &[0]), Some(0.01));
        network.lose(Some(1), 1.0, 10.0);
        assert_eq!(network.transit(5.0, &[0]), Some(0.01));
        assert_eq!(network.transit(5.0, &[1]), None);
        assert_eq!(network.transit(5.0, &[0, 1]), None, "either end");
        assert_eq!(network.transit(5.0, &[2, 0]), Some(0.01));
        assert_eq!(network.transit(10.0, &[1]), Some(0.01));
    }
}
