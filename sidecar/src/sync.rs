//! Locking the sidecar's shared state.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex` even if a holder panicked. The sidecar's locks guard bookkeeping that one call
/// updates whole (a limiter, a lease client, a pool's idle list, a connection's reader); a panic
/// in one request must not turn every later request on the same state into a panic too.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
