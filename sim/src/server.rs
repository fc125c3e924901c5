//! A capacity server: a group of replicas of which at most one is master and holds a
//! [`Ledger`]. A new master starts with a fresh ledger, so learning mode follows from the core
//! itself; a replica that loses mastership (or dies) drops its state (SPEC §3.8).
//!
//! An intermediate server's ledger has a parent (SPEC §3.6): the ledger says when its bulk
//! `GetServerCapacity` is due and what it asks, and takes the answer, as the binary's parent
//! task (`parent.rs`) drives it; the master reaches its parent's master through a [`Link`],
//! as the binary does through `discovery::Servers`. The link belongs to the master's process:
//! a new master starts with a fresh one.

use std::sync::Arc;

use sluice_client::Answer;
use sluice_proto::GetServerCapacityRequest;
use sluice_server::{
    core::{Ledger, Repository, UnixSeconds},
    defaults::SWEEP_BATCH,
};

use crate::{
    clock::Time,
    protocol::{self, Reply, Request},
    routing::{Link, Outgoing, Settled},
    topology::ServerId,
};

pub struct Server {
    pub name: String,
    /// The server this one leases its capacity from; `None` for the root.
    pub parent: Option<ServerId>,
    /// Each replica's address.
    addresses: Vec<String>,
    up: Vec<bool>,
    master: Option<usize>,
    /// The master's state; `None` while there is no master.
    ledger: Option<Ledger>,
    repository: Arc<Repository>,
    /// The master's way to its parent's master (intermediate servers).
    uplink: Link<GetServerCapacityRequest>,
    /// Seeds each new ledger (its bands' trees and its retry jitter).
    seeds: fastrand::Rng,
    /// When the pending wake-up is scheduled, so earlier ones left in the queue are ignored.
    pub wake_at: Option<Time>,
    /// RPCs received by live replicas.
    pub rpcs: u64,
}

/// The server clock: whole unix seconds, like `state::now()` in the binary.
pub fn unix(now: Time) -> UnixSeconds {
    now.floor() as UnixSeconds
}

impl Server {
    /// A server whose first replica is master from `now`; `parent` (with its number of
    /// replicas) for an intermediate server; `seed` fixes every ledger it will make.
    pub fn new(
        name: String,
        replicas: usize,
        parent: Option<(ServerId, usize)>,
        repository: Arc<Repository>,
        now: Time,
        seed: u64,
    ) -> Server {
        let addresses = (0..replicas).map(|replica| format!("{name}/{replica}")).collect();
        let mut server = Server {
            name,
            parent: parent.map(|(parent, _)| parent),
            addresses,
            up: vec![true; replicas],
            master: Some(0),
            ledger: None,
            repository,
            uplink: Link::new(parent.map_or(1, |(_, replicas)| replicas)),
            seeds: fastrand::Rng::with_seed(seed),
            wake_at: None,
            rpcs: 0,
        };
        server.ledger = Some(server.fresh_ledger(now));
        server
    }

    /// An empty ledger that starts serving — and learning — at `now`, as the binary's
    /// `fresh_ledger` makes one; seeded, so that a run replays bit for bit. Replicas share the
    /// node's name as their id toward the parent, so a new master takes over the old one's
    /// lease there.
    fn fresh_ledger(&mut self, now: Time) -> Ledger {
        let ledger = Ledger::new(self.repository.clone(), unix(now)).with_seed(self.seeds.u64(..));
        match self.parent {
            Some(_) => ledger.with_parent(self.name.clone(), self.seeds.u64(..)),
            None => ledger,
        }
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
            (Request::GetServerCapacity(req), Some(ledger)) => {
                Some(Reply::GetServerCapacity(protocol::get_server_capacity(ledger, unix(now), req)))
            }
            (Request::GetServerCapacity(_), None) => {
                Some(Reply::GetServerCapacity(Ok(protocol::not_master_to_server(master()))))
            }
            (Request::Release(req), ledger) => {
                // The sidecar only logs how a release went; a standby has nothing to release.
                if let Some(ledger) = ledger {
                    let _ = protocol::release_capacity(ledger, unix(now), req);
                }
                None
            }
        }
    }

    /// When the master's next request to its parent is due (−∞: at once): the ledger's
    /// `parent_due`, `None` for a root, without a master, or while a request is in flight.
    pub fn parent_due(&self) -> Option<Time> {
        self.ledger.as_ref()?.parent_due()
    }

    /// The request to the parent that is due, as the binary's parent task sends it: through
    /// the link, preceded by Discovery if the parent's master is not known.
    pub fn ask_parent(&mut self, now: Time) -> Option<Outgoing> {
        let request = self.ledger.as_mut()?.parent_request(now)?;
        Some(self.uplink.call(request))
    }

    /// Takes the parent's answer to `attempt` (`parent` is the parent server, for the
    /// addresses it names); returns the request to send after a successful Discovery.
    pub fn on_parent_reply(&mut self, now: Time, attempt: u64, reply: Reply, parent: &Server) -> Option<Outgoing> {
        let settled = self.uplink.settle(attempt)?;
        let ledger = self.ledger.as_mut().expect("a link with an answer awaited has a master");
        match (settled, reply) {
            (Settled::Discovering { asked, request }, Reply::Discovery(found)) => {
                let outgoing = self.uplink.follow(asked, request, found, |a| parent.replica_at(a));
                if outgoing.is_none() {
                    ledger.on_parent_error(now, self.uplink.move_on());
                }
                return outgoing;
            }
            (Settled::Answered, Reply::GetServerCapacity(Ok(response))) => {
                self.uplink.answered();
                if let Answer::Redirect(master) = ledger.on_parent_response(now, response) {
                    self.uplink.redirect(master, |a| parent.replica_at(a));
                }
            }
            // An error status, or an answer of the wrong kind.
            _ => {
                ledger.on_parent_error(now, self.uplink.move_on());
            }
        }
        None
    }

    /// The request `attempt` to the parent got no answer in time.
    pub fn on_parent_timeout(&mut self, now: Time, attempt: u64) {
        if self.uplink.settle(attempt).is_some()
            && let Some(ledger) = &mut self.ledger
        {
            ledger.on_parent_error(now, self.uplink.move_on());
        }
    }

    /// The master dies and its state with it; returns it, or `None` if there was no master.
    pub fn crash(&mut self) -> Option<usize> {
        let master = self.master.take()?;
        self.up[master] = false;
        self.ledger = None;
        self.uplink.reset();
        Some(master)
    }

    /// The election after `dead` died: the next live replica wins, or `dead` itself restarted
    /// if none is up. The winner starts empty, in learning mode, and knows nothing of its
    /// parent's master yet.
    pub fn elect(&mut self, now: Time, dead: usize) {
        let n = self.replicas();
        let winner = (1..=n).map(|i| (dead + i) % n).find(|&r| self.up[r]).unwrap_or(dead);
        self.up[winner] = true;
        self.master = Some(winner);
        self.ledger = Some(self.fresh_ledger(now));
        self.uplink.reset();
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

    /// The capacity an adaptive resource's controller has learned, at the root's master.
    pub fn learned(&self, resource: &str) -> Option<f64> {
        Some(self.ledger.as_ref()?.resource(resource)?.controller()?.capacity())
    }

    /// Σ capacity of the unexpired leases on `resource`, as the master's ledger records them:
    /// for a root, what it has reserved for its clients (servers or end clients).
    pub fn granted(&self, resource: &str, now: Time) -> f64 {
        let now = unix(now);
        let Some(resource) = self.ledger.as_ref().and_then(|ledger| ledger.resource(resource)) else { return 0.0 };
        resource.leases().iter().filter(|lease| lease.expiry > now).map(|lease| lease.demand.has).sum()
    }
}
