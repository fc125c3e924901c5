//! A capacity server: a group of replicas of which at most one is master and holds a
//! [`Ledger`]. A new master starts with a fresh ledger, so learning mode follows from the core
//! itself; a replica that loses mastership (or dies) drops its state (SPEC §3.8).

use std::sync::Arc;

use sluice_server::{
    core::{Ledger, Repository, UnixSeconds},
    defaults::SWEEP_BATCH,
};

use crate::{
    clock::Time,
    protocol::{self, Reply, Request},
};

pub struct Server {
    pub name: String,
    /// Each replica's address.
    addresses: Vec<String>,
    /// Whether each replica is up.
    up: Vec<bool>,
    master: Option<usize>,
    /// The master's ledger.
    ledger: Option<Ledger>,
    repository: Arc<Repository>,
    /// RPCs received by live replicas.
    pub rpcs: u64,
}

/// The server clock: whole unix seconds, like `state::now()` in the binary.
pub fn unix(now: Time) -> UnixSeconds {
    now.floor() as UnixSeconds
}

impl Server {
    /// A server whose first replica is master from `now`.
    pub fn new(name: String, replicas: usize, repository: Arc<Repository>, now: Time) -> Server {
        let ledger = Ledger::new(repository.clone(), unix(now));
        let addresses = (0..replicas).map(|replica| format!("{name}/{replica}")).collect();
        Server { name, addresses, up: vec![true; replicas], master: Some(0), ledger: Some(ledger), repository, rpcs: 0 }
    }

    pub fn replicas(&self) -> usize {
        self.up.len()
    }

    pub fn address(&self, replica: usize) -> &str {
        &self.addresses[replica]
    }

    /// The replica an address names.
    pub fn replica_at(&self, address: &str) -> Option<usize> {
        self.addresses.iter().position(|a| a == address)
    }

    /// Answers an RPC that reached `replica`; `None` if the replica is down (the caller times
    /// out) or the RPC has no answer to wait for.
    pub fn handle(&mut self, now: Time, replica: usize, request: &Request) -> Option<Reply> {
        if !self.up[replica] {
            return None;
        }
        self.rpcs += 1;
        let master = || self.master.map(|m| self.addresses[m].clone());
        let is_master = self.master == Some(replica);
        let ledger = self.ledger.as_mut().filter(|_| is_master);
        match (request, ledger) {
            (Request::Discovery, _) => Some(Reply::Discovery(protocol::discovery(master(), is_master))),
            (Request::GetCapacity(req), Some(ledger)) => {
                Some(Reply::GetCapacity(protocol::get_capacity(ledger, unix(now), req)))
            }
            (Request::GetCapacity(_), None) => Some(Reply::GetCapacity(Ok(protocol::not_master(master())))),
            (Request::Release(req), ledger) => {
                // The sidecar only logs how a release went; a standby has nothing to release.
                if let Some(ledger) = ledger {
                    let _ = protocol::release_capacity(ledger, req);
                }
                None
            }
        }
    }

    /// The master dies and its state with it; returns it, or `None` if there was no master.
    pub fn crash(&mut self) -> Option<usize> {
        let master = self.master.take()?;
        self.up[master] = false;
        self.ledger = None;
        Some(master)
    }

    /// The election after `dead` died: the next live replica wins, or `dead` itself restarted
    /// if none is up. The winner starts empty, in learning mode.
    pub fn elect(&mut self, now: Time, dead: usize) {
        let n = self.replicas();
        let winner = (1..=n).map(|i| (dead + i) % n).find(|&r| self.up[r]).unwrap_or(dead);
        self.up[winner] = true;
        self.master = Some(winner);
        self.ledger = Some(Ledger::new(self.repository.clone(), unix(now)));
    }

    /// A dead replica comes back as a standby.
    pub fn restart(&mut self, replica: usize) {
        self.up[replica] = true;
    }

    /// The binary's sweeper: forgets expired leases in batches.
    pub fn sweep(&mut self, now: Time) {
        if let Some(ledger) = &mut self.ledger {
            while ledger.expire(unix(now), SWEEP_BATCH) == SWEEP_BATCH {}
        }
    }

    /// Σ capacity of the unexpired leases on `resource`, as the master's ledger records them.
    pub fn granted(&self, resource: &str, now: Time) -> f64 {
        let now = unix(now);
        let Some(resource) = self.ledger.as_ref().and_then(|ledger| ledger.resource(resource)) else { return 0.0 };
        resource.leases().iter().filter(|lease| lease.expiry > now).map(|lease| lease.demand.has).sum()
    }
}
