//! One resource: its template and its leases, and how a claim on it becomes a grant.

use std::sync::Arc;

use super::{
    algorithm,
    store::{LeaseStore, UnixSeconds},
    template::Template,
};

/// A client's request for one resource, already validated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Claim {
    /// Finite and ≥ 0.
    pub wants: f64,
    /// The client's weight: 1 for an end client, the number of clients behind a server; > 0.
    pub subclients: f64,
    /// What the client says it holds; used in learning mode.
    pub has: Option<f64>,
}

/// The answer to a claim: a lease and the capacity to fall back on without one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grant {
    pub capacity: f64,
    pub expiry: UnixSeconds,
    pub refresh_interval: i64,
    pub safe_capacity: f64,
}

#[derive(Debug)]
pub struct Resource {
    template: Arc<Template>,
    leases: LeaseStore,
}

impl Resource {
    pub fn new(template: Arc<Template>) -> Resource {
        Resource { template, leases: LeaseStore::default() }
    }

    pub fn template(&self) -> &Arc<Template> {
        &self.template
    }

    /// Takes a new configuration; leases keep their grants and expiry and adapt at their next
    /// refresh.
    pub fn set_template(&mut self, template: Arc<Template>) {
        self.template = template;
    }

    pub fn leases(&self) -> &LeaseStore {
        &self.leases
    }

    /// Grants `client` its share (SPEC §3.2–3.4): the algorithm's target — or in learning mode
    /// what the client reports holding — capped by its wants and, for the algorithms that share
    /// one capacity, by what the other leases leave free.
    pub fn claim(&mut self, client: &str, claim: &Claim, now: UnixSeconds, learning: bool) -> Grant {
        let Template { capacity, ref algorithm, .. } = *self.template;
        let expiry = now.saturating_add(algorithm.lease_length);
        let kind = algorithm.kind;
        let reported = claim.has.unwrap_or(0.0);
        let capacity = self.leases.claim(client, claim.wants, claim.subclients, expiry, |band, me| {
            let target = if learning { reported } else { algorithm::target(kind, capacity, band, me) };
            let mut grant = target.min(me.wants);
            if kind.shares_capacity() {
                let others = band.sums().has - me.has;
                grant = grant.min(capacity - others);
            }
            grant.max(0.0)
        });
        Grant { capacity, expiry, refresh_interval: algorithm.refresh_interval, safe_capacity: self.safe_capacity() }
    }

    /// Forgets a client's lease; false if it held none.
    pub fn release(&mut self, client: &str) -> bool {
        self.leases.remove(client)
    }

    /// Forgets up to `budget` expired leases; returns how many.
    pub fn expire(&mut self, now: UnixSeconds, budget: usize) -> usize {
        self.leases.expire(now, budget)
    }

    /// SPEC §3.5: the template's value, else the capacity divided among the subclients.
    pub fn safe_capacity(&self) -> f64 {
        let capacity = self.template.capacity;
        self.template.safe_capacity.unwrap_or_else(|| {
            let subclients = self.leases.band().sums().subclients;
            if subclients > 0.0 { capacity / subclients } else { capacity }
        })
    }
}
