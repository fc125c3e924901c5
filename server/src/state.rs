//! What the server's tasks share: the ledger behind one lock, the published configuration, and
//! readiness.

use std::{
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use arc_swap::ArcSwap;

use crate::core::{Ledger, Repository, UnixSeconds};

/// The wall clock, in the protocol's whole seconds. The core never reads a clock itself.
pub fn now() -> UnixSeconds {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as UnixSeconds)
}

pub struct State {
    ledger: Mutex<Ledger>,
    /// The configuration in force. A reload swaps it without waiting for the ledger; the ledger
    /// adopts it the next time anyone takes the lock.
    config: ArcSwap<Repository>,
    advertise_address: String,
    ready: AtomicBool,
}

impl State {
    pub fn new(repository: Repository, advertise_address: String, now: UnixSeconds) -> State {
        let repository = Arc::new(repository);
        State {
            ledger: Mutex::new(Ledger::new(repository.clone(), now)),
            config: ArcSwap::new(repository),
            advertise_address,
            ready: AtomicBool::new(false),
        }
    }

    /// The ledger, under the current configuration.
    pub fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // A panic while holding the lock is a bug; the ledger's operations leave it consistent
        // between calls, so serving on beats failing every later request.
        let mut ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        let config = self.config.load();
        if !Arc::ptr_eq(ledger.repository(), &config) {
            ledger.set_repository(Arc::clone(&config));
        }
        ledger
    }

    /// Puts a new, already validated configuration in force.
    pub fn publish(&self, repository: Repository) {
        self.config.store(Arc::new(repository));
    }

    /// In the embedded mode, the only one so far, a server is always its own master
    /// (SPEC §3.8); an elected mode will change this answer.
    pub fn is_master(&self) -> bool {
        true
    }

    /// The address clients should use to reach this server.
    pub fn advertise_address(&self) -> &str {
        &self.advertise_address
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}
