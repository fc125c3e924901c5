//! How a caller reaches a replicated server, as `sluice_client::discovery::Servers` does for the
//! binaries — the sidecar toward its capacity servers (`leasing.rs`) and an intermediate server
//! toward its parent (`parent.rs`): Discovery at the current address when no master is known,
//! the master a redirect names, the next address after an error. It also keeps the one RPC the
//! caller awaits, told from stale answers and timeouts by its attempt number. Clients and
//! intermediate servers share it.

use sluice_client::Round;
use sluice_proto::DiscoveryResponse;

use crate::protocol::Request;

pub struct Link<R> {
    replicas: usize,
    /// The address tried when no master is known.
    index: usize,
    master: Option<usize>,
    /// How far through the addresses the failures since the last answer have gone.
    round: Round,
    /// The RPC awaited, if any.
    pending: Option<Pending<R>>,
    /// Never reset, so that an answer meant for an earlier incarnation is never taken.
    attempts: u64,
}

struct Pending<R> {
    attempt: u64,
    /// Discovery first, holding the request for the master it names: (replica asked, request).
    discovering: Option<(usize, R)>,
}

/// An RPC to send: to which replica, what, and the attempt its answer will carry.
pub struct Outgoing {
    pub replica: usize,
    pub request: Request,
    pub attempt: u64,
}

/// The awaited answer has come: to the request itself, or to the Discovery before it.
pub enum Settled<R> {
    Answered,
    Discovering { asked: usize, request: R },
}

impl<R: Into<Request>> Link<R> {
    /// A link to a server with `replicas` addresses, none known as master yet.
    pub fn new(replicas: usize) -> Link<R> {
        Link { replicas, index: 0, master: None, round: Round::default(), pending: None, attempts: 0 }
    }

    /// Whether an RPC is awaited.
    pub fn busy(&self) -> bool {
        self.pending.is_some()
    }

    /// Sends `request` to the master, or Discovery first if no master is known.
    pub fn call(&mut self, request: R) -> Outgoing {
        match self.master {
            Some(master) => self.send(master, request.into(), None),
            None => self.send(self.index, Request::Discovery, Some(request)),
        }
    }

    /// Takes the answer to `attempt`; `None` if it is not the one awaited (stale, or timed out).
    pub fn settle(&mut self, attempt: u64) -> Option<Settled<R>> {
        let pending = self.pending.take_if(|pending| pending.attempt == attempt)?;
        Some(match pending.discovering {
            Some((asked, request)) => Settled::Discovering { asked, request },
            None => Settled::Answered,
        })
    }

    /// Discovery at `asked` answered: sends the held request to the master it names; `None`
    /// if it names none (the caller fails the attempt).
    /// `replica_at` finds a replica by its address.
    pub fn follow(
        &mut self,
        asked: usize,
        request: R,
        found: DiscoveryResponse,
        replica_at: impl Fn(&str) -> Option<usize>,
    ) -> Option<Outgoing> {
        let master = match found.mastership.master_address.and_then(|address| replica_at(&address)) {
            _ if found.is_master => asked,
            Some(master) if master != asked => master,
            _ => return None,
        };
        self.master = Some(master);
        Some(self.send(master, request.into(), None))
    }

    /// The request was answered (leases or a redirect): the next failure starts a new round.
    pub fn answered(&mut self) {
        self.round.answered();
    }

    /// Follows a master redirect; an unknown master means asking Discovery again.
    pub fn redirect(&mut self, master: Option<String>, replica_at: impl Fn(&str) -> Option<usize>) {
        self.master = master.and_then(|address| replica_at(&address));
    }

    /// After an error: forget the master and try the next address. Returns whether it is
    /// untried in this round ([`Round`]), as `Servers::move_on` does.
    pub fn move_on(&mut self) -> bool {
        self.master = None;
        self.index = (self.index + 1) % self.replicas;
        self.round.failed(self.replicas)
    }

    /// Where a message that awaits no answer goes: the master if known, else the current
    /// address.
    pub fn target(&self) -> usize {
        self.master.unwrap_or(self.index)
    }

    /// A new process on the calling side: nothing known, nothing awaited.
    pub fn reset(&mut self) {
        *self = Link { attempts: self.attempts, ..Link::new(self.replicas) };
    }

    /// Stops awaiting an answer (the caller is gone).
    pub fn abandon(&mut self) {
        self.pending = None;
    }

    fn send(&mut self, replica: usize, request: Request, discovering: Option<R>) -> Outgoing {
        self.attempts += 1;
        let attempt = self.attempts;
        self.pending = Some(Pending { attempt, discovering: discovering.map(|r| (replica, r)) });
        Outgoing { replica, request, attempt }
    }
}
