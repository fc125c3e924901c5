//! Waiting for what happens in the background: one `eventually`, async and blocking, with one
//! patience for every test. Where how soon something happens is what a test checks, it asserts
//! on the time `eventually` returns; the patience only keeps a test that fails from hanging.

use std::{
    fmt::{self, Display},
    thread,
    time::{Duration, Instant},
};

/// How long anything a test waits for may take: far above the slowest wait on a loaded two-core
/// machine (a capacity server killed, restarted and found again through the sidecar's backoff;
/// a root taking 15,000 keys from a leaf).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The shortest pause between two looks; after a look that took longer, the pause is as long, so
/// that a heavy look (a large status page) keeps what it watches busy half the time at most.
const PAUSE: Duration = Duration::from_millis(50);

/// Looks until `check` holds and returns how long that took; panics with `what` (see [`lazily`])
/// once [`PATIENCE`] is spent.
pub async fn eventually(what: impl Display, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    loop {
        let look = Instant::now();
        if check().await {
            return started.elapsed();
        }
        tokio::time::sleep(pause(started, look, &what)).await;
    }
}

/// [`eventually`] for tests without a runtime.
pub fn eventually_blocking(what: impl Display, mut check: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    loop {
        let look = Instant::now();
        if check() {
            return started.elapsed();
        }
        thread::sleep(pause(started, look, &what));
    }
}

fn pause(started: Instant, look: Instant, what: &dyn Display) -> Duration {
    assert!(started.elapsed() < PATIENCE, "{what}: not within {PATIENCE:?}");
    PAUSE.max(look.elapsed())
}

/// A failure message made only when it is shown, from what is there then: the last sample, a log.
pub fn lazily(message: impl Fn() -> String) -> impl Display {
    struct Lazily<F>(F);
    impl<F: Fn() -> String> Display for Lazily<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&(self.0)())
        }
    }
    Lazily(message)
}
