//! Durations and deadlines from numbers anyone may name (a setting, a header, a limiter's
//! prediction at a sliver of a rate): they saturate where `Duration::from_secs_f64` and
//! `Instant + Duration` would panic.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use tokio::time::Sleep;

/// The furthest ahead a deadline is set: "never", in practice (tokio's far future, 30 years).
pub const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// `seconds` as a duration: NaN and negatives are 0, anything longer than [`FAR`] is that.
pub fn seconds(seconds: f64) -> Duration {
    match Duration::try_from_secs_f64(seconds) {
        Ok(duration) => duration.min(FAR),
        Err(_) if seconds > 0.0 => FAR,
        Err(_) => Duration::ZERO,
    }
}

/// `by` after `at`, and no further than [`FAR`].
pub fn after(at: Instant, by: Duration) -> Instant {
    // A clock that cannot reach `at + FAR` has run for centuries: `at` will do.
    at.checked_add(by.min(FAR)).unwrap_or(at)
}

/// A timeout for a wait that is often renewed (between two writes, two reads): armed on
/// demand, and re-armed in place rather than allocated again.
#[derive(Default)]
pub struct Timer(Option<Pin<Box<Sleep>>>);

impl Timer {
    /// (Re)starts it, to fire `timeout` from now.
    pub fn start(&mut self, timeout: Duration) {
        let deadline = after(Instant::now(), timeout).into();
        match &mut self.0 {
            Some(sleep) => sleep.as_mut().reset(deadline),
            None => self.0 = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    /// Ready once it has fired; until then the task is woken when it does. Never started, it
    /// never fires.
    pub fn poll_fired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().map_or(Poll::Pending, |sleep| sleep.as_mut().poll(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_times_saturate() {
        assert_eq!(seconds(1.5), Duration::from_millis(1500));
        assert_eq!(seconds(1e25), FAR);
        assert_eq!(seconds(f64::INFINITY), FAR);
        assert_eq!(seconds(-1.0), Duration::ZERO);
        assert_eq!(seconds(f64::NAN), Duration::ZERO);
        let now = Instant::now();
        assert_eq!(after(now, Duration::MAX), now + FAR);
        assert_eq!(after(now, Duration::from_secs(1)), now + Duration::from_secs(1));
    }
}
