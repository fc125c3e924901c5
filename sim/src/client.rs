//! A simulated sidecar with one rate resource, wired as the real one is: every arrival is offered
//! to the core's [`Limiter`] (whose demand estimate says what the resource wants), the core's
//! [`LeaseClient`] decides when to ask and what it holds, and its effective capacity is applied
//! to the limiter after every answer (`gate.rs`, `leasing.rs`). The server choice — Discovery,
//! master redirects, the next address after an error — is [`Link`]'s, as it is `Servers`' in
//! `leasing.rs`. With a service behind the resource, the calls its limiter admits go there, and
//! what they met goes with each request as the sidecar's signals.

use sluice_proto::GetCapacityRequest;
use sluice_sidecar::{
    core::{Answer, Fallback, Kind, LeaseClient, Limiter, Mode, Offer, ResourceSpec},
    defaults::BURST_SECONDS,
};

use crate::{
    clock::Time,
    load::{Arrivals, Boost, Load},
    protocol::{Reply, Request},
    routing::{Link, Outgoing, Settled},
    scenario::{ClientGroup, FallbackSpec},
    server::Server,
    service::{self, Outcomes},
    topology::ServerId,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not yet joined.
    Waiting,
    Active,
    Left,
}

pub struct Client {
    pub phase: Phase,
    pub server: ServerId,
    resource: String,
    lease: LeaseClient,
    limiter: Limiter,
    load: Load,
    arrivals: Arrivals,
    /// Bumped by each spike, so the end of an earlier one leaves a later one alone.
    pub spikes: u64,
    /// Cost admitted since the last [`Client::take_admitted`].
    admitted: f64,
    /// With a service behind the resource: the times of the calls admitted and not yet handed
    /// to it, and what the answered ones met.
    calls: Vec<Time>,
    outcomes: Option<Outcomes>,
    link: Link<GetCapacityRequest>,
    /// When the pending wake-up is scheduled, so earlier ones left in the queue are ignored.
    pub wake_at: Option<Time>,
}

impl Client {
    /// A client of `server`, which has `replicas` addresses; `calling`: with a service behind
    /// the resource.
    pub fn new(
        id: String,
        group: &ClientGroup,
        resource: &str,
        server: ServerId,
        replicas: usize,
        calling: bool,
        seed: u64,
    ) -> Client {
        let mut seeds = fastrand::Rng::with_seed(seed);
        let mut lease = LeaseClient::new(id, seeds.u64(..));
        lease.configure([ResourceSpec {
            id: resource.to_owned(),
            priority: group.priority,
            fallback: match group.fallback {
                FallbackSpec::Safe => Fallback::Safe,
                FallbackSpec::Optimistic => Fallback::Optimistic,
                FallbackSpec::Pessimistic => Fallback::Pessimistic,
            },
            safe_capacity: group.safe_capacity,
        }]);
        Client {
            phase: Phase::Waiting,
            server,
            resource: resource.to_owned(),
            lease,
            // A gate with servers configured starts at capacity 0 until a lease or fallback applies.
            limiter: Limiter::new(Kind::Rate, 0.0, burst(0.0), group.join),
            load: Load::new(group.load.clone(), seeds.u64(..)),
            arrivals: Arrivals::new(group.request_cost, group.join),
            spikes: 0,
            admitted: 0.0,
            calls: Vec::new(),
            outcomes: calling.then(|| Outcomes::new(group.join)),
            link: Link::new(replicas),
            wake_at: None,
        }
    }

    pub fn id(&self) -> &str {
        self.lease.client_id()
    }

    /// The first request arrives: the resource is in use and asked for at once.
    pub fn join(&mut self, now: Time) {
        self.phase = Phase::Active;
        self.feed(now);
        self.lease.touch(now, &self.resource);
        self.apply(now);
    }

    /// Shutdown: stops the load and returns the release to send, if anything was held.
    pub fn leave(&mut self, now: Time) -> Option<Request> {
        self.feed(now);
        self.phase = Phase::Left;
        self.link.abandon();
        let ids = self.lease.release_all();
        (!ids.is_empty()).then(|| {
            Request::Release(sluice_proto::ReleaseCapacityRequest { client_id: self.id().to_owned(), resource_id: ids })
        })
    }

    /// Where a release goes: the master if known, else the current address.
    pub fn release_to(&self) -> usize {
        self.link.target()
    }

    pub fn load(&self) -> &Load {
        &self.load
    }

    /// Offered cost per second now (the true demand).
    pub fn demand(&self) -> f64 {
        self.load.rate()
    }

    /// Arrivals up to now happen at the current rate, then the load moves.
    pub fn step(&mut self, now: Time) {
        self.feed(now);
        self.load.step();
    }

    pub fn boost(&mut self, now: Time, boost: Option<Boost>) {
        self.feed(now);
        self.load.boost(boost);
    }

    /// Offers every arrival up to `now` to the limiter.
    pub fn feed(&mut self, now: Time) {
        if self.phase != Phase::Active {
            return;
        }
        let (limiter, admitted, calls) = (&mut self.limiter, &mut self.admitted, &mut self.calls);
        let calling = self.outcomes.is_some();
        self.arrivals.run(now, self.load.rate(), |at, cost| {
            if limiter.offer(at, cost, 0.0) == Offer::Admitted {
                *admitted += cost;
                if calling {
                    calls.push(at);
                }
            }
        });
    }

    /// What the client would ask for now.
    pub fn wants(&mut self, now: Time) -> f64 {
        self.feed(now);
        self.limiter.wants(now)
    }

    /// The capacity the client enforces now: its lease, or its fallback.
    pub fn has(&self, now: Time) -> f64 {
        self.lease.effective(now, &self.resource).map_or(0.0, |effective| effective.capacity)
    }

    /// The capacity of the client's unexpired lease, if it holds one (not a fallback).
    pub fn leased(&self, now: Time) -> Option<f64> {
        self.lease.effective(now, &self.resource).filter(|e| e.mode == Mode::Leased).map(|e| e.capacity)
    }

    pub fn take_admitted(&mut self) -> f64 {
        std::mem::take(&mut self.admitted)
    }

    /// The calls admitted up to `now` not yet handed to the service, in order.
    pub fn take_calls(&mut self, now: Time) -> Vec<Time> {
        self.feed(now);
        std::mem::take(&mut self.calls)
    }

    /// An answer the service will give, at its time.
    pub fn expect(&mut self, answer: service::Answer) {
        if let Some(outcomes) = &mut self.outcomes {
            outcomes.expect(answer);
        }
    }

    /// Lets the lease client ask early if demand moved, as `Leasing::run` does between refreshes.
    pub fn check_demand(&mut self, now: Time) {
        let wants = self.wants(now);
        self.lease.demand_moved(now, |_| wants);
    }

    /// When the lease client next wants to ask (−∞: at once), if it does.
    pub fn due(&self) -> Option<Time> {
        if self.phase == Phase::Active && !self.link.busy() { self.lease.next_due() } else { None }
    }

    /// The refresh that is due: one GetCapacity, preceded by Discovery if no master is known;
    /// with the signals of the answers arrived since the last, as `leasing.rs` sends them (lost
    /// if the call fails). The service must have served up to `now`.
    pub fn ask(&mut self, now: Time) -> Option<Outgoing> {
        let wants = self.wants(now);
        let mut request = self.lease.request(now, |_| wants)?;
        if let Some(outcomes) = &mut self.outcomes {
            for r in &mut request.resource {
                r.signals = Some(Box::new(outcomes.take(now)));
            }
        }
        Some(self.link.call(request))
    }

    /// Takes an answer; returns the GetCapacity to send after a successful Discovery.
    pub fn on_reply(&mut self, now: Time, attempt: u64, reply: Reply, server: &Server) -> Option<Outgoing> {
        match (self.link.settle(attempt)?, reply) {
            (Settled::Discovering { asked, request }, Reply::Discovery(found)) => {
                let outgoing = self.link.follow(asked, request, found, |a| server.replica_at(a));
                if outgoing.is_none() {
                    self.fail(now);
                }
                return outgoing;
            }
            (Settled::Answered, Reply::GetCapacity(Ok(response))) => {
                self.link.answered();
                if let Answer::Redirect(master) = self.lease.on_response(now, response) {
                    self.link.redirect(master, |a| server.replica_at(a));
                }
                self.apply(now);
            }
            // An error status, or an answer of the wrong kind.
            _ => self.fail(now),
        }
        None
    }

    /// The RPC `attempt` got no answer in time.
    pub fn on_timeout(&mut self, now: Time, attempt: u64) {
        if self.link.settle(attempt).is_some() {
            self.fail(now);
        }
    }

    fn fail(&mut self, now: Time) {
        let untried = self.link.move_on();
        self.lease.on_error(now, untried);
        self.apply(now);
    }

    /// Puts the current lease or fallback into force, as `Leasing::apply` does.
    fn apply(&mut self, now: Time) {
        self.feed(now);
        let capacity = self.has(now);
        self.limiter.set_capacity(now, capacity, burst(capacity));
    }
}

/// The gate's default bucket depth (`gate.rs`, no `burst` configured).
fn burst(capacity: f64) -> f64 {
    (capacity * BURST_SECONDS).max(2.0)
}
