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
use tokio::sync::Notify;

use crate::{
    core::{Ledger, Repository, UnixSeconds},
    discovery::Servers,
};

/// An empty ledger that starts serving — and learning — at `now`: a root's, or an intermediate
/// server's that asks its parent for capacity.
fn fresh_ledger(repository: Arc<Repository>, parent: Option<&ParentLink>, now: UnixSeconds) -> Ledger {
    let ledger = Ledger::new(repository, now);
    match parent {
        Some(link) => ledger.with_parent(link.server_id.clone(), now as u64 ^ u64::from(std::process::id())),
        None => ledger,
    }
}

/// The wall clock, in the protocol's whole seconds. The core never reads a clock itself.
pub fn now() -> UnixSeconds {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as UnixSeconds)
}

/// The wall clock with sub-second precision, for scheduling requests.
pub fn precise_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

pub struct State {
    ledger: Mutex<Ledger>,
    /// The configuration in force. A reload swaps it without waiting for the ledger; the ledger
    /// adopts it the next time anyone takes the lock.
    config: ArcSwap<Repository>,
    advertise_address: String,
    /// Set for an intermediate server.
    parent: Option<ParentLink>,
    /// Tells the parent task that a request is due at once (a resource appeared).
    parent_wanted: Notify,
    ready: AtomicBool,
}

/// Where an intermediate server gets its capacity.
pub struct ParentLink {
    /// The parent node's replicas.
    pub servers: Servers,
    /// This server's id in its requests to the parent.
    pub server_id: String,
}

impl State {
    pub fn new(
        repository: Repository,
        advertise_address: String,
        parent: Option<ParentLink>,
        now: UnixSeconds,
    ) -> State {
        let repository = Arc::new(repository);
        State {
            ledger: Mutex::new(fresh_ledger(repository.clone(), parent.as_ref(), now)),
            config: ArcSwap::new(repository),
            advertise_address,
            parent,
            parent_wanted: Notify::new(),
            ready: AtomicBool::new(false),
        }
    }

    pub fn parent(&self) -> Option<&ParentLink> {
        self.parent.as_ref()
    }

    /// Called after claims: wakes the parent task if they made a request due at once.
    pub fn wake_parent_if_due(&self, ledger: &Ledger) {
        if ledger.parent_due() == Some(f64::NEG_INFINITY) {
            self.parent_wanted.notify_one();
        }
    }

    /// Resolves when claims made a request to the parent due at once.
    pub async fn parent_wanted(&self) {
        self.parent_wanted.notified().await;
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
