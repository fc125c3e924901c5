//! When a lease holder asks again: after the refresh interval on success, at once (or at a time
//! it names) when something new needs asking for, and after a jittered exponential backoff on
//! failure, no longer than the last refresh interval — never so late that a valid lease runs
//! out unasked. Shared by the sidecar's lease client and an
//! intermediate server's requests to its parent. Times are unix seconds (f64).

use crate::defaults::{BACKOFF_BASE, BACKOFF_CAP, EXPIRY_MARGIN};

/// Refreshes come at least this far apart, whatever interval a server names.
const MIN_REFRESH: f64 = 1.0;

/// How far a caller has got through a replicated node's addresses since its last answer: after
/// an error it moves on to the next address and asks at once while one is untried in this round
/// ([`Schedule::failed_over`]); once every address has failed in a row, the round starts over
/// and the caller backs off ([`Schedule::failed`]). The binaries' `discovery::Servers` and the
/// simulator's links share it.
#[derive(Debug, Default)]
pub struct Round {
    failed: usize,
}

impl Round {
    /// An address of the `addresses` failed; returns whether another is untried in this round.
    pub fn failed(&mut self, addresses: usize) -> bool {
        self.failed += 1;
        let untried = self.failed < addresses;
        if !untried {
            self.failed = 0;
        }
        untried
    }

    /// A call was answered: the next failure starts a new round.
    pub fn answered(&mut self) {
        self.failed = 0;
    }
}

#[derive(Debug)]
pub struct Schedule {
    /// When the next request is due; −∞: at once.
    due: f64,
    in_flight: bool,
    /// Something new came up while a request was in flight: ask again as soon as it ends.
    woken: bool,
    /// The refresh interval of the last answer with leases (∞ before one): retries back off no
    /// longer than this.
    refresh: f64,
    /// Consecutive failed attempts (errors and redirects).
    failures: u32,
    /// The last answer was a redirect.
    redirected: bool,
    /// When the last request was answered with leases.
    answered: f64,
    rng: fastrand::Rng,
}

impl Schedule {
    /// `seed` drives the backoff jitter, so a simulation replays exactly.
    pub fn new(seed: u64) -> Schedule {
        Schedule {
            due: f64::NEG_INFINITY,
            in_flight: false,
            woken: false,
            refresh: f64::INFINITY,
            failures: 0,
            redirected: false,
            answered: f64::NEG_INFINITY,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// Something new needs asking for: at once, or as soon as the request in flight ends.
    pub fn wake(&mut self) {
        self.wake_at(f64::NEG_INFINITY);
    }

    /// Something new needs asking for by `at`, or as soon as the request in flight ends.
    pub fn wake_at(&mut self, at: f64) {
        if self.in_flight {
            self.woken = true;
        } else {
            self.due = self.due.min(at);
        }
    }

    /// Nothing needs asking for until the next [`Self::wake_at`], which then names the time.
    pub fn rest(&mut self) {
        if !self.in_flight {
            self.due = f64::INFINITY;
        }
    }

    /// Something changed enough to ask before the refresh interval is up: no sooner than
    /// `spacing` after the last answer. Not while a request is in flight or failing.
    pub fn hasten(&mut self, spacing: f64) {
        self.hasten_after(spacing.max(MIN_REFRESH));
    }

    /// As [`Self::hasten`] without its one-second floor, for demand still being learned (a
    /// resource's first moments), which a caller asks for a few times at most.
    pub fn hasten_after(&mut self, spacing: f64) {
        if !self.in_flight && self.failures == 0 {
            self.due = self.due.min(self.answered + spacing);
        }
    }

    /// When the next request is due (−∞: at once); `None` while one is in flight.
    pub fn due(&self) -> Option<f64> {
        (!self.in_flight).then_some(self.due)
    }

    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// A request goes out; false if one is already in flight.
    pub fn begin(&mut self) -> bool {
        !std::mem::replace(&mut self.in_flight, true)
    }

    /// The request in flight was answered with leases; the next is due after `refresh` (the
    /// shortest refresh interval among them).
    pub fn succeeded(&mut self, now: f64, refresh: f64) {
        self.end();
        self.failures = 0;
        self.redirected = false;
        self.answered = now;
        self.refresh = refresh.max(MIN_REFRESH);
        self.due = if std::mem::take(&mut self.woken) { f64::NEG_INFINITY } else { now + self.refresh };
    }

    /// The request in flight failed (transport error, error status, or nothing valid came
    /// back). The next one backs off: equal jitter over `BACKOFF_BASE · 2^(failures−1)`
    /// capped at `BACKOFF_CAP` and at the last refresh interval (so that a caller is back
    /// within a refresh interval of a fault's end, and asks a server that is down at most
    /// twice as often as it refreshes when all is well), brought forward to `EXPIRY_MARGIN`
    /// before `earliest_expiry` (the first valid lease to run out) but no sooner than half the
    /// base.
    pub fn failed(&mut self, now: f64, earliest_expiry: Option<f64>) {
        self.end();
        self.woken = false;
        self.redirected = false;
        self.failures = self.failures.saturating_add(1);
        let ceiling = (BACKOFF_BASE * 2f64.powi(self.failures.min(32) as i32 - 1)).min(BACKOFF_CAP).min(self.refresh);
        let mut due = now + ceiling * (0.5 + 0.5 * self.rng.f64());
        if let Some(expiry) = earliest_expiry {
            due = due.min((expiry - EXPIRY_MARGIN).max(now + BACKOFF_BASE / 2.0));
        }
        self.due = due;
    }

    /// The request in flight failed at one address of a replicated node, and another has not
    /// been tried since the last answer or backoff: ask there at once, without adding to the
    /// backoff. A dead replica — a crashed master's address — then costs its timeout and not a
    /// backoff as well, as a gRPC channel tries every address before it backs off; the backoff
    /// grows once every address has failed in a row (see [`Self::failed`]).
    pub fn failed_over(&mut self) {
        self.end();
        self.woken = false;
        self.redirected = false;
        self.due = f64::NEG_INFINITY;
    }

    /// The server was not the master. A named master is asked at once, failures before or not:
    /// after an outage or a failover, the replica that answered is alive and knows who leads,
    /// and a backoff would only keep the caller away from a new master's learning mode. An
    /// unknown master, or a second redirect in a row (replicas naming each other), backs off
    /// like a failure. Returns whether the request is due at once.
    pub fn redirected(&mut self, now: f64, master_named: bool, earliest_expiry: Option<f64>) -> bool {
        let at_once = master_named && !self.redirected;
        self.failed(now, earliest_expiry);
        self.redirected = true;
        if at_once {
            self.due = f64::NEG_INFINITY;
        }
        at_once
    }

    fn end(&mut self) {
        self.in_flight = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_waits_the_refresh_and_a_wake_in_flight_asks_again_at_once() {
        let mut s = Schedule::new(1);
        assert_eq!(s.due(), Some(f64::NEG_INFINITY));
        assert!(s.begin());
        assert!(!s.begin(), "one request at a time");
        assert_eq!(s.due(), None);
        s.succeeded(100.0, 5.0);
        assert_eq!(s.due(), Some(105.0));
        s.begin();
        s.wake();
        s.succeeded(105.0, 5.0);
        assert_eq!(s.due(), Some(f64::NEG_INFINITY));
        s.begin();
        s.succeeded(106.0, 0.2);
        assert_eq!(s.due(), Some(107.0), "refreshes at least a second apart");
    }

    #[test]
    fn hastening_brings_the_next_request_forward_but_not_before_the_spacing() {
        let mut s = Schedule::new(1);
        s.begin();
        s.succeeded(100.0, 10.0);
        s.hasten(4.0);
        assert_eq!(s.due(), Some(104.0));
        s.hasten(20.0);
        assert_eq!(s.due(), Some(104.0), "never later than already due");
        s.begin();
        s.hasten(0.0);
        s.failed(104.0, None);
        let backoff = s.due();
        s.hasten(0.0);
        assert_eq!(s.due(), backoff, "a failing parent is not asked sooner");
    }

    #[test]
    fn failures_back_off_with_jitter_but_not_past_a_lease_expiry() {
        let mut s = Schedule::new(7);
        let mut ceilings = Vec::new();
        for _ in 0..8 {
            s.begin();
            s.failed(0.0, None);
            ceilings.push(s.due().unwrap());
        }
        for (i, due) in ceilings.iter().enumerate() {
            let ceiling = (BACKOFF_BASE * 2f64.powi(i as i32)).min(BACKOFF_CAP);
            assert!(
                *due >= ceiling / 2.0 && *due <= ceiling,
                "attempt {i}: {due} outside [{}, {ceiling}]",
                ceiling / 2.0
            );
        }
        s.begin();
        s.failed(0.0, Some(4.0));
        assert_eq!(s.due(), Some(4.0 - EXPIRY_MARGIN));
        s.begin();
        s.failed(0.0, Some(1.0));
        assert_eq!(s.due(), Some(BACKOFF_BASE / 2.0), "never a tight loop");
    }

    #[test]
    fn a_wake_names_its_time_and_a_rest_waits_for_one() {
        let mut s = Schedule::new(1);
        s.rest();
        assert_eq!(s.due(), Some(f64::INFINITY));
        s.wake_at(10.0);
        s.wake_at(12.0);
        assert_eq!(s.due(), Some(10.0), "the earliest wake");
        s.begin();
        s.wake_at(20.0);
        s.succeeded(11.0, 5.0);
        assert_eq!(s.due(), Some(f64::NEG_INFINITY), "woken in flight: at once after it");
    }

    #[test]
    fn after_an_answer_the_backoff_is_capped_at_its_refresh_interval() {
        let mut s = Schedule::new(7);
        s.begin();
        s.succeeded(0.0, 3.0);
        for attempt in 0..8 {
            s.begin();
            s.failed(100.0, None);
            let ceiling = (BACKOFF_BASE * 2f64.powi(attempt)).min(3.0);
            let delay = s.due().unwrap() - 100.0;
            assert!(delay >= ceiling / 2.0 && delay <= ceiling, "attempt {attempt}: {delay}");
        }
    }

    #[test]
    fn a_round_ends_when_every_address_failed_in_a_row_or_one_answered() {
        let mut round = Round::default();
        assert_eq!([round.failed(3), round.failed(3), round.failed(3), round.failed(3)], [true, true, false, true]);
        round.answered();
        assert_eq!([round.failed(3), round.failed(3), round.failed(3)], [true, true, false]);
        // One address (a name balancing over the replicas): every error backs off.
        assert!(!round.failed(1) && !round.failed(1));
    }

    #[test]
    fn a_failover_to_an_untried_address_goes_at_once_and_leaves_the_backoff_as_it_was() {
        let mut s = Schedule::new(7);
        for _ in 0..3 {
            s.begin();
            s.failed(0.0, None);
        }
        s.begin();
        s.failed_over();
        assert_eq!(s.due(), Some(f64::NEG_INFINITY));
        assert_eq!(s.failures(), 3);
        s.begin();
        s.failed(10.0, None);
        let ceiling = BACKOFF_BASE * 8.0;
        assert!((10.0 + ceiling / 2.0..=10.0 + ceiling).contains(&s.due().unwrap()), "the fourth failure's backoff");
    }

    #[test]
    fn a_named_master_is_asked_at_once_unless_the_last_answer_was_a_redirect_too() {
        let mut s = Schedule::new(3);
        s.begin();
        assert!(s.redirected(0.0, true, None));
        assert_eq!(s.due(), Some(f64::NEG_INFINITY));
        s.begin();
        assert!(!s.redirected(0.0, true, None), "a second redirect in a row backs off");
        assert!(s.due().unwrap() > 0.0);
        s.begin();
        s.succeeded(1.0, 5.0);
        s.begin();
        assert!(!s.redirected(2.0, false, None), "an unknown master backs off");
        // An outage: errors back off; the first answer after it names the master.
        for _ in 0..5 {
            s.begin();
            s.failed(3.0, None);
        }
        s.begin();
        assert!(s.redirected(40.0, true, None), "failures before do not keep the caller from the master");
        assert_eq!(s.due(), Some(f64::NEG_INFINITY));
        // A replica naming a master that then fails: each redirect is followed at once, each
        // error backs off, so the pair costs one backoff and never loops.
        for round in 0..4 {
            s.begin();
            s.failed(50.0, None);
            let backoff = s.due().unwrap();
            assert!(backoff > 50.0, "round {round}: the error backs off");
            s.begin();
            assert!(s.redirected(backoff, true, None), "round {round}: the redirect after it is followed");
        }
    }
}
