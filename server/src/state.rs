//! What the server's tasks share: the ledger behind one lock, the published configuration, this
//! server's role in the election, and readiness.

use std::sync::{
    Arc, Mutex, MutexGuard, PoisonError,
    atomic::{AtomicBool, Ordering},
};

use arc_swap::{ArcSwap, Guard};
use sluice_client::discovery::Servers;
/// The wall clock, read here and passed to the core, which never reads one itself.
pub use sluice_runtime::clock::{now, precise_now};
use sluice_runtime::reload::SharedConfigStatus;
use tokio::sync::Notify;

use crate::core::{Ledger, Repository, UnixSeconds};

/// An empty ledger that starts serving — and learning — at `now`: a root's, or an intermediate
/// server's that asks its parent for capacity. The only place a ledger is made: at start, on
/// winning an election, and on losing one.
fn fresh_ledger(repository: Arc<Repository>, parent: Option<&ParentLink>, bounds: Bounds, now: UnixSeconds) -> Ledger {
    let ledger = Ledger::new(repository, now).with_max_leases(bounds.max_leases).with_max_clients(bounds.max_clients);
    match parent {
        Some(link) => ledger.with_parent(link.server_id.clone(), now as u64 ^ u64::from(std::process::id())),
        None => ledger,
    }
}

/// What every ledger of this server holds at most.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Leases over every resource (`--max-leases`).
    pub max_leases: usize,
    /// Clients of one resource (`--max-clients-per-resource`).
    pub max_clients: usize,
}

/// Where an intermediate server gets its capacity.
pub struct ParentLink {
    /// The parent node's replicas.
    pub servers: Arc<Servers>,
    /// This server's id in its requests to the parent.
    pub server_id: String,
}

/// Whether this server hands out capacity (SPEC §3.8).
#[derive(Clone, Debug, PartialEq)]
pub enum Role {
    Master,
    /// Answers every RPC with who the master is: `leader`, or unknown.
    Follower {
        leader: Option<String>,
    },
}

/// A role and when this server took it.
#[derive(Clone, Debug, PartialEq)]
pub struct Standing {
    pub role: Role,
    pub since: UnixSeconds,
}

pub struct State {
    ledger: Mutex<Ledger>,
    /// The configuration in force. A reload swaps it without waiting for the ledger; the ledger
    /// adopts it the next time anyone takes the lock.
    config: ArcSwap<Repository>,
    /// Read on every RPC, changed only by the election task and always under the ledger lock, so
    /// that the ledger a master serves from is the one it started with when it won.
    standing: ArcSwap<Standing>,
    advertise_address: String,
    /// The etcd key the replicas campaign on; `None` in the embedded mode.
    election_key: Option<String>,
    /// Set for an intermediate server.
    parent: Option<ParentLink>,
    /// Every ledger's bounds.
    bounds: Bounds,
    /// Tells the parent task that a request is due at once (a resource appeared).
    parent_wanted: Notify,
    ready: AtomicBool,
    /// Where the configuration came from, and the last file rejected.
    config_status: SharedConfigStatus,
}

impl State {
    /// In the embedded mode (no `election_key`) the server is the master from `now`; otherwise
    /// it follows an unknown leader until the election says more.
    pub fn new(
        repository: Repository,
        advertise_address: String,
        election_key: Option<String>,
        parent: Option<ParentLink>,
        config_status: SharedConfigStatus,
        bounds: Bounds,
        now: UnixSeconds,
    ) -> State {
        let repository = Arc::new(repository);
        let role = match election_key {
            None => Role::Master,
            Some(_) => Role::Follower { leader: None },
        };
        State {
            ledger: Mutex::new(fresh_ledger(repository.clone(), parent.as_ref(), bounds, now)),
            config: ArcSwap::new(repository),
            standing: ArcSwap::from_pointee(Standing { role, since: now }),
            advertise_address,
            election_key,
            parent,
            bounds,
            parent_wanted: Notify::new(),
            ready: AtomicBool::new(false),
            config_status,
        }
    }

    /// The ledger, under the current configuration.
    pub fn ledger(&self) -> MutexGuard<'_, Ledger> {
        let mut ledger = self.lock_ledger();
        let config = self.config.load();
        if !Arc::ptr_eq(ledger.repository(), &config) {
            ledger.set_repository(Arc::clone(&config));
        }
        ledger
    }

    /// The ledger if this server is the master, else `Err` with the master it follows (`None`:
    /// unknown). The role is read under the ledger's lock, which every change of role takes: a
    /// master deposed while a request waited for the lock answers with a redirect, instead of
    /// granting from the ledger it has just dropped.
    pub fn master_ledger(&self) -> Result<MutexGuard<'_, Ledger>, Option<String>> {
        let ledger = self.ledger();
        match &self.standing.load().role {
            Role::Master => Ok(ledger),
            Role::Follower { leader } => Err(leader.clone()),
        }
    }

    fn lock_ledger(&self) -> MutexGuard<'_, Ledger> {
        // A panic while holding the lock is a bug; the ledger's operations leave it consistent
        // between calls, so serving on beats failing every later request.
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The configuration in force, as a reload last published it.
    pub fn config(&self) -> Guard<Arc<Repository>> {
        self.config.load()
    }

    /// Puts a new, already validated configuration in force.
    pub fn publish(&self, repository: Repository) {
        self.config.store(Arc::new(repository));
    }

    /// This server's role; read on every RPC, so a guard rather than a reference count.
    pub fn standing(&self) -> Guard<Arc<Standing>> {
        self.standing.load()
    }

    /// Makes this server the master with an empty ledger, learning from `now` (SPEC §3.4): it
    /// knows nothing of the leases its predecessor granted.
    pub fn become_master(&self, now: UnixSeconds) {
        let mut ledger = self.lock_ledger();
        *ledger = fresh_ledger(self.config.load_full(), self.parent.as_ref(), self.bounds, now);
        self.standing.store(Arc::new(Standing { role: Role::Master, since: now }));
    }

    /// Makes this server a follower of `leader` (`None`: unknown). A master drops everything it
    /// knew; a follower only learns the new leader. Returns whether this server was the master.
    pub fn follow(&self, leader: Option<String>, now: UnixSeconds) -> bool {
        let mut ledger = self.lock_ledger();
        let previous = self.standing.load_full();
        let was_master = previous.role == Role::Master;
        let since = if was_master { now } else { previous.since };
        self.standing.store(Arc::new(Standing { role: Role::Follower { leader }, since }));
        if was_master {
            *ledger = fresh_ledger(self.config.load_full(), self.parent.as_ref(), self.bounds, now);
        }
        was_master
    }

    pub fn parent(&self) -> Option<&ParentLink> {
        self.parent.as_ref()
    }

    pub fn config_status(&self) -> &SharedConfigStatus {
        &self.config_status
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

    /// The address clients should use to reach this server.
    pub fn advertise_address(&self) -> &str {
        &self.advertise_address
    }

    pub fn election_key(&self) -> Option<&str> {
        self.election_key.as_deref()
    }

    /// The listeners are up.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Shutting down: no longer ready, so probes send traffic elsewhere while RPCs drain.
    pub fn set_draining(&self) {
        self.ready.store(false, Ordering::Release);
    }

    /// Ready for traffic: listening, and either the master or able to name it. A replica that
    /// cannot name the master (etcd unreachable, no leader yet) has nothing useful to answer.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !matches!(self.standing.load().role, Role::Follower { leader: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_runtime::reload::ConfigStatus;

    use crate::config;

    fn state(election_key: Option<&str>) -> State {
        let repository =
            config::parse(crate::defaults::EMBEDDED_CONFIG, std::path::Path::new("")).expect("embedded config");
        State::new(
            repository,
            "me:7777".into(),
            election_key.map(str::to_owned),
            None,
            ConfigStatus::shared(None),
            Bounds { max_leases: 10, max_clients: 10 },
            100,
        )
    }

    #[test]
    fn embedded_server_is_always_master() {
        let state = state(None);
        state.set_ready();
        assert_eq!(**state.standing(), Standing { role: Role::Master, since: 100 });
        assert!(state.is_ready());
    }

    #[test]
    fn elected_server_follows_until_it_wins_and_drops_its_ledger_when_it_loses() {
        let state = state(Some("/sluice/election/test"));
        state.set_ready();
        assert_eq!(state.standing().role, Role::Follower { leader: None });
        assert!(!state.is_ready(), "no master to name");
        assert!(!state.follow(Some("other:7777".into()), 101));
        assert_eq!(
            **state.standing(),
            Standing { role: Role::Follower { leader: Some("other:7777".into()) }, since: 100 }
        );
        assert!(state.is_ready(), "a follower that names the master is useful");

        state.become_master(110);
        assert_eq!(state.standing().role, Role::Master);
        assert_eq!(state.ledger().serving_since(), 110, "a fresh ledger, learning from the win");

        assert!(state.follow(None, 120));
        assert_eq!(**state.standing(), Standing { role: Role::Follower { leader: None }, since: 120 });
        assert_eq!(state.ledger().serving_since(), 120, "a deposed master's ledger is replaced");
    }

    #[test]
    fn a_master_keeps_its_role_while_a_request_holds_its_ledger() {
        let state = Arc::new(state(Some("/sluice/election/test")));
        state.become_master(110);
        let ledger = state.master_ledger().expect("the master's ledger");
        let deposing = std::thread::spawn({
            let state = state.clone();
            move || state.follow(None, 130)
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!deposing.is_finished(), "the role changes only once the request is done");
        assert_eq!(state.standing().role, Role::Master);
        drop(ledger);
        assert!(deposing.join().unwrap(), "was the master");
        assert_eq!(state.master_ledger().err(), Some(None), "a follower of no known master grants nothing");
    }
}
