//! State shared between tasks: locks that outlive a panic, the signal to stop, and counts of
//! what is open.

use std::sync::{
    Arc, Mutex, MutexGuard, PoisonError,
    atomic::{AtomicUsize, Ordering},
};

use tokio::sync::watch;

/// Locks `mutex` even if a holder panicked. Sluice's locks guard bookkeeping that one call
/// updates whole (a limiter, a lease client, a pool's idle list); a panic in one request must
/// not turn every later request on the same state into a panic too.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Resolves once `stop` turns true (or its sender is gone).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// How many of something are open at once (the streams of an HTTP/2 connection): each [`Open`]
/// counts until it is dropped, wherever it was moved to meanwhile.
#[derive(Clone, Debug, Default)]
pub struct OpenCount(Arc<AtomicUsize>);

impl OpenCount {
    pub fn open(&self) -> Open {
        self.0.fetch_add(1, Ordering::Relaxed);
        Open(self.0.clone())
    }

    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// One open thing of an [`OpenCount`].
#[derive(Debug)]
pub struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_thing_counts_until_dropped() {
        let count = OpenCount::default();
        let (a, b) = (count.open(), count.open());
        assert_eq!(count.get(), 2);
        drop(a);
        let moved = vec![b];
        assert_eq!(count.get(), 1);
        drop(moved);
        assert_eq!(count.get(), 0);
    }
}
