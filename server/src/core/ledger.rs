//! The ledger: every resource a server has seen, under the current templates, and since when the
//! server has been serving (which decides learning mode).

use std::{
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
};

use hashbrown::HashMap;
use sluice_client::Answer;
use sluice_proto::{GetServerCapacityRequest, GetServerCapacityResponse};

use crate::defaults::{EXPIRY_PER_CLAIM, MAX_CLIENTS_PER_RESOURCE, MAX_LEASES};

use super::{
    parent::Parent,
    resource::{self, Claim, Grant, Resource, Supply},
    store::UnixSeconds,
    template::Repository,
};

#[derive(Debug)]
pub struct Ledger {
    repository: Arc<Repository>,
    resources: HashMap<String, Resource>,
    serving_since: UnixSeconds,
    /// Set for an intermediate server: its requests to its parent.
    parent: Option<Parent>,
    /// Fixes the shape of every band's tree, so that a simulation replays bit for bit.
    seed: Option<u64>,
    /// Demands filed over every resource's leases (see [`Ledger::leases`]).
    leases: usize,
    /// Most of them: a claim that would file more is refused ([`Ledger::room`]).
    max_leases: usize,
    /// Most clients with a lease on one resource.
    max_clients: usize,
    /// The identity each client id of a policy-bound caller holds its leases for.
    owners: HashMap<Box<str>, Owned>,
    /// How many of `owners` each identity has.
    held: HashMap<Arc<str>, usize>,
}

/// A client id's owner, and on how many resources the id holds a lease.
#[derive(Debug)]
struct Owned {
    identity: Arc<str>,
    resources: usize,
}

/// The identity a policy admitted a call for, and the most client ids it may hold.
#[derive(Clone, Copy, Debug)]
pub struct Owner<'a> {
    pub identity: &'a Arc<str>,
    pub max_client_ids: usize,
}

/// Why a request does not fit in the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// It names new resources beyond the most the server keeps (the limit).
    Resources(usize),
    /// Its new leases would file demands beyond the ledger's bound (the limit).
    Leases(usize),
    /// It would add a client to a resource that has the most clients (the limit).
    Clients(usize),
    /// It would add a client id to an identity that holds the most (the limit).
    ClientIds(usize),
}

impl Ledger {
    /// An empty root ledger that starts serving — and learning — at `now`.
    pub fn new(repository: Arc<Repository>, now: UnixSeconds) -> Ledger {
        Ledger {
            repository,
            resources: HashMap::new(),
            serving_since: now,
            parent: None,
            seed: None,
            leases: 0,
            max_leases: MAX_LEASES,
            max_clients: MAX_CLIENTS_PER_RESOURCE,
            owners: HashMap::new(),
            held: HashMap::new(),
        }
    }

    /// Bounds the clients of each resource (see [`Ledger::room`]).
    pub fn with_max_clients(self, max_clients: usize) -> Ledger {
        Ledger { max_clients, ..self }
    }

    /// Bounds the leases this ledger holds (see [`Ledger::room`]).
    pub fn with_max_leases(self, max_leases: usize) -> Ledger {
        Ledger { max_leases, ..self }
    }

    /// Makes this an intermediate server's ledger: capacity comes from the parent, asked for
    /// as `server_id`; `seed` drives the retry jitter.
    pub fn with_parent(self, server_id: String, seed: u64) -> Ledger {
        Ledger { parent: Some(Parent::new(server_id, seed)), ..self }
    }

    /// Fixes the bands' tree shapes (simulations); servers keep unguessable ones.
    pub fn with_seed(self, seed: u64) -> Ledger {
        Ledger { seed: Some(seed), ..self }
    }

    pub fn repository(&self) -> &Arc<Repository> {
        &self.repository
    }

    /// Applies a new configuration to every resource at once.
    pub fn set_repository(&mut self, repository: Arc<Repository>) {
        for (id, resource) in &mut self.resources {
            resource.set_template(repository.find(id).clone());
        }
        self.repository = repository;
    }

    pub fn serving_since(&self) -> UnixSeconds {
        self.serving_since
    }

    /// Whether a resource is still rebuilding its picture of outstanding leases (SPEC §3.4).
    pub fn is_learning(&self, resource: &Resource, now: UnixSeconds) -> bool {
        learning(self.serving_since, resource, now)
    }

    pub fn claim(&mut self, now: UnixSeconds, client: &str, resource_id: &str, claim: &Claim) -> Grant {
        self.claim_for(now, client, None, resource_id, claim)
    }

    /// [`Ledger::claim`] for a caller a policy admitted as `identity`: a new lease makes the
    /// client id that identity's until it holds none.
    pub fn claim_for(
        &mut self,
        now: UnixSeconds,
        client: &str,
        identity: Option<&Arc<str>>,
        resource_id: &str,
        claim: &Claim,
    ) -> Grant {
        let (repository, parent, seed) = (&self.repository, &mut self.parent, self.seed);
        let resource = self.resources.entry_ref(resource_id).or_insert_with(|| {
            let template = repository.find(resource_id).clone();
            let seed = seed.map(|seed| {
                let mut hasher = DefaultHasher::new();
                (seed, resource_id).hash(&mut hasher);
                hasher.finish()
            });
            match parent {
                Some(parent) => {
                    // A resource first seen here is asked for at once (SPEC §3.6).
                    parent.wake();
                    Resource::with_supply(template, Supply::Parent(None), seed)
                }
                None => Resource::with_supply(template, Supply::Template, seed),
            }
        });
        let before = resource.leases().demands();
        let (owners, held) = (&mut self.owners, &mut self.held);
        resource.expire(now, EXPIRY_PER_CLAIM, &mut |gone| disown(owners, held, gone));
        let learning = learning(self.serving_since, resource, now);
        let had = resource.leases().demands_of(client).is_some();
        let grant = resource.claim(client, claim, now, learning);
        self.leases = self.leases - before + resource.leases().demands();
        if !had && resource.leases().demands_of(client).is_some() {
            own(owners, held, client, identity);
        }
        if let Some(parent) = parent {
            parent.changed(resource, now);
        }
        grant
    }

    /// The identity that `client` holds its leases for, if a policy bound the caller.
    pub fn owner(&self, client: &str) -> Option<&Arc<str>> {
        self.owners.get(client).map(|o| &o.identity)
    }

    /// How many client ids `identity` holds leases with.
    pub fn client_ids(&self, identity: &str) -> usize {
        self.held.get(identity).copied().unwrap_or(0)
    }

    /// Whether `client`'s claims fit: the new resources among them within `max_resources`, a
    /// new client of a resource within the ledger's most clients, a new client id of `owner`
    /// within its most, and the demands they add to its leases within the ledger's bound. A
    /// lease that files no more demands than it did always fits, so clients holding leases
    /// renew them at every bound; a new lease, or one that grows, must find room.
    pub fn room(
        &self,
        now: UnixSeconds,
        client: &str,
        owner: Option<Owner<'_>>,
        claims: &[(&str, Claim)],
        max_resources: usize,
    ) -> Result<(), Full> {
        if let Some(owner) = owner
            && !self.owners.contains_key(client)
            && self.client_ids(owner.identity) >= owner.max_client_ids
        {
            return Err(Full::ClientIds(owner.max_client_ids));
        }
        let crowded = |(id, _): &&(&str, Claim)| {
            self.resources
                .get(*id)
                .is_some_and(|r| r.leases().len() >= self.max_clients && r.leases().demands_of(client).is_none())
        };
        // A resource's clients hold a lease each: none can be crowded while all leases are fewer.
        if self.leases >= self.max_clients && claims.iter().any(|claim| crowded(&claim)) {
            return Err(Full::Clients(self.max_clients));
        }
        // Each costs a lookup or two; only needed near a limit. A claim files at most one
        // demand per entry.
        if self.resources.len() + claims.len() > max_resources {
            let new = claims.iter().filter(|(id, _)| !self.resources.contains_key(*id)).count();
            if self.resources.len() + new > max_resources {
                return Err(Full::Resources(max_resources));
            }
        }
        let most: usize = claims.iter().map(|(_, claim)| claim.wants.len()).sum();
        if self.leases.saturating_add(most) > self.max_leases {
            let grows = claims.iter().fold(0isize, |grows, (id, claim)| {
                let (filed, held) = match self.resources.get(*id) {
                    Some(r) => (r.demands(claim, now), r.leases().demands_of(client).unwrap_or(0)),
                    None => (resource::demands(&self.repository.find(id).algorithm, claim), 0),
                };
                grows + filed as isize - held as isize
            });
            if grows > 0 && self.leases.saturating_add(grows as usize) > self.max_leases {
                return Err(Full::Leases(self.max_leases));
            }
        }
        Ok(())
    }

    /// The demands filed over every resource's leases: one per end client's lease, one per
    /// band or profile group of a child server's. What `--max-leases` bounds.
    pub fn leases(&self) -> usize {
        self.leases
    }

    pub fn max_leases(&self) -> usize {
        self.max_leases
    }

    /// Forgets a client's lease on a resource; false if it held none. At an intermediate server
    /// the report to the parent may come early, as after a claim.
    pub fn release(&mut self, now: UnixSeconds, client: &str, resource_id: &str) -> bool {
        let Some(resource) = self.resources.get_mut(resource_id) else { return false };
        let before = resource.leases().demands();
        let released = resource.release(client);
        self.leases = self.leases - before + resource.leases().demands();
        if released {
            disown(&mut self.owners, &mut self.held, client);
        }
        if let Some(parent) = self.parent.as_mut() {
            parent.changed(resource, now);
        }
        released
    }

    /// Forgets up to `budget` expired leases, and resources left without leases (at an
    /// intermediate server, once they no longer remember their parent's lease); returns how many
    /// leases.
    pub fn expire(&mut self, now: UnixSeconds, budget: usize) -> usize {
        let (mut done, mut leases) = (0, 0);
        let (owners, held) = (&mut self.owners, &mut self.held);
        self.resources.retain(|_, resource| {
            if done < budget {
                done += resource.expire(now, budget - done, &mut |gone| disown(owners, held, gone));
            }
            leases += resource.leases().demands();
            !resource.leases().is_empty() || resource.remembers_parent(now)
        });
        self.leases = leases;
        done
    }

    /// How many resources the ledger holds.
    pub fn len(&self) -> usize {
        self.resources.len()
    }

    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }

    pub fn resource(&self, id: &str) -> Option<&Resource> {
        self.resources.get(id)
    }

    pub fn resources(&self) -> impl Iterator<Item = (&str, &Resource)> {
        self.resources.iter().map(|(id, r)| (id.as_str(), r))
    }

    /// The parent side, for an intermediate server.
    pub fn parent(&self) -> Option<&Parent> {
        self.parent.as_ref()
    }

    /// When the next request to the parent is due (−∞: at once); `None` for a root, while a
    /// request is in flight, or while no resource has clients.
    pub fn parent_due(&self) -> Option<f64> {
        let due = self.parent.as_ref()?.schedule().due()?;
        self.resources.values().any(|r| !r.leases().is_empty() || r.gives_back()).then_some(due)
    }

    /// The bulk request to the parent for every resource with clients; marks it in flight.
    pub fn parent_request(&mut self, now: f64) -> Option<GetServerCapacityRequest> {
        let (now, serving_since) = (now as UnixSeconds, self.serving_since);
        let resources = self.resources.iter_mut().map(|(id, r)| (id.as_str(), r));
        self.parent.as_mut()?.request(now, resources, |r| learning(serving_since, r, now))
    }

    /// Takes the parent's answer to the request in flight.
    pub fn on_parent_response(&mut self, now: f64, response: GetServerCapacityResponse) -> Answer {
        match self.parent.as_mut() {
            Some(parent) => parent.on_response(now, response, &mut self.resources),
            None => Answer::Updated,
        }
    }

    /// What made requests to the parent fail may be gone (new TLS settings): the next one goes
    /// at once instead of after the backoff.
    pub fn retry_parent(&mut self) {
        if let Some(parent) = self.parent.as_mut() {
            parent.wake();
        }
    }

    /// The request in flight to the parent failed; `untried`: at one of its addresses, and
    /// another is still untried in this round, so it is asked at once rather than after a
    /// backoff (see [`Schedule::failed_over`](sluice_client::Schedule::failed_over)).
    pub fn on_parent_error(&mut self, now: f64, untried: bool) {
        if let Some(parent) = self.parent.as_mut() {
            parent.on_error(now, untried, &self.resources);
        }
    }
}

/// `client` took a lease on one more resource: for `identity`, if it is not yet someone's.
fn own(
    owners: &mut HashMap<Box<str>, Owned>,
    held: &mut HashMap<Arc<str>, usize>,
    client: &str,
    identity: Option<&Arc<str>>,
) {
    if let Some(owned) = owners.get_mut(client) {
        owned.resources += 1;
    } else if let Some(identity) = identity {
        *held.entry_ref(identity).or_insert(0) += 1;
        owners.insert(client.into(), Owned { identity: identity.clone(), resources: 1 });
    }
}

/// `client` let go of, or lost, its lease on one resource: the id is no one's once it holds
/// none.
fn disown(owners: &mut HashMap<Box<str>, Owned>, held: &mut HashMap<Arc<str>, usize>, client: &str) {
    if owners.is_empty() {
        return;
    }
    let Some(owned) = owners.get_mut(client) else { return };
    owned.resources -= 1;
    if owned.resources == 0 {
        let owned = owners.remove(client).expect("just found");
        if let Some(count) = held.get_mut(&owned.identity) {
            *count -= 1;
            if *count == 0 {
                held.remove(&owned.identity);
            }
        }
    }
}

fn learning(serving_since: UnixSeconds, resource: &Resource, now: UnixSeconds) -> bool {
    now < serving_since.saturating_add(resource.template().algorithm.learning_seconds())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::core::{Algorithm, Holds, Kind, Template, Wants};

    /// A ledger of one catch-all FAIR_SHARE template (lease length 10, no learning) from 0.
    fn ledger() -> Ledger {
        let template = Template {
            identifier_glob: "*".into(),
            capacity: 1e9,
            adaptive: None,
            safe_capacity: None,
            description: None,
            algorithm: Algorithm {
                kind: Kind::FairShare,
                lease_length: 10,
                refresh_interval: 1,
                parameters: vec![],
                learning_mode_duration: Some(0),
            },
        };
        Ledger::new(Arc::new(Repository::new(vec![template]).unwrap()), 0)
    }

    #[test]
    fn a_claim_forgets_a_bounded_number_of_expired_leases() {
        let mut ledger = ledger();
        let claim = Claim::single(0, 1.0, None);
        let expired = EXPIRY_PER_CLAIM + 500;
        for i in 0..expired {
            ledger.claim(0, &format!("c{i}"), "r", &claim);
        }
        ledger.claim(10, "late", "r", &claim);
        assert_eq!(ledger.resource("r").unwrap().leases().len(), expired - EXPIRY_PER_CLAIM + 1);
        assert_eq!(ledger.leases(), expired - EXPIRY_PER_CLAIM + 1);
        // The sweep takes the rest, and drops resources left without leases.
        assert_eq!(ledger.expire(10, usize::MAX), 500);
        assert_eq!(ledger.expire(20, usize::MAX), 1);
        assert!(ledger.is_empty());
        assert_eq!(ledger.leases(), 0);
    }

    #[test]
    fn a_full_ledger_refuses_new_leases_and_renews_those_it_holds() {
        let mut ledger = ledger().with_max_leases(3);
        let one = Claim::single(0, 1.0, None);
        let on = |id, claim: &Claim| [(id, claim.clone())];
        for client in ["a", "b", "c"] {
            assert_eq!(ledger.room(0, client, None, &on("r", &one), 100), Ok(()));
            ledger.claim(0, client, "r", &one);
        }
        assert_eq!(ledger.leases(), 3);
        assert_eq!(ledger.room(0, "d", None, &on("r", &one), 100), Err(Full::Leases(3)), "a newcomer");
        assert_eq!(ledger.room(0, "a", None, &on("s", &one), 100), Err(Full::Leases(3)), "a new lease of a holder");
        assert_eq!(ledger.room(1, "a", None, &on("r", &one), 100), Ok(()), "a renewal");
        let both = [("r", one.clone()), ("s", one.clone())];
        assert_eq!(ledger.room(1, "a", None, &both, 100), Err(Full::Leases(3)), "a renewal with a new lease");
        // A child server's lease counts once per band: renewed with as many it fits, with more not.
        ledger.release(1, "b", "r");
        ledger.release(1, "c", "r");
        let bands = |n: i64| Claim {
            wants: (0..n).map(|priority| Wants { priority, wants: 1.0, subclients: 1.0 }).collect(),
            has: None,
            holds: Holds::Unknown,
            signals: None,
        };
        assert_eq!(ledger.room(1, "leaf", None, &on("r", &bands(2)), 100), Ok(()));
        ledger.claim(1, "leaf", "r", &bands(2));
        assert_eq!(ledger.leases(), 3);
        assert_eq!(ledger.room(2, "leaf", None, &on("r", &bands(2)), 100), Ok(()));
        assert_eq!(ledger.room(2, "leaf", None, &on("r", &bands(3)), 100), Err(Full::Leases(3)));
        // Leases that run out make room; a child server's lapses into one demand for a while.
        assert_eq!(ledger.expire(20, usize::MAX), 2);
        assert_eq!(ledger.leases(), 1);
        assert_eq!(ledger.expire(100, usize::MAX), 1);
        assert_eq!(ledger.leases(), 0);
        assert_eq!(ledger.room(100, "d", None, &on("r", &one), 100), Ok(()));
        // And the resource bound: a new resource beyond it, not a known one.
        ledger.claim(100, "d", "r", &one);
        assert_eq!(ledger.room(100, "e", None, &on("s", &one), 1), Err(Full::Resources(1)));
        assert_eq!(ledger.room(100, "e", None, &on("r", &one), 1), Ok(()));
    }

    #[test]
    fn a_crowded_resource_refuses_new_clients_and_renews_those_it_has() {
        let mut ledger = ledger().with_max_clients(2);
        let one = Claim::single(0, 1.0, None);
        let on = |id, claim: &Claim| [(id, claim.clone())];
        for client in ["a", "b"] {
            ledger.claim(0, client, "r", &one);
        }
        assert_eq!(ledger.room(0, "c", None, &on("r", &one), 100), Err(Full::Clients(2)));
        assert_eq!(ledger.room(0, "c", None, &on("s", &one), 100), Ok(()), "another resource has room");
        assert_eq!(ledger.room(0, "a", None, &on("r", &one), 100), Ok(()), "a renewal");
        ledger.release(0, "b", "r");
        assert_eq!(ledger.room(0, "c", None, &on("r", &one), 100), Ok(()));
    }

    #[test]
    fn an_identity_holds_at_most_its_client_ids_until_they_let_go() {
        let mut ledger = ledger();
        let one = Claim::single(0, 1.0, None);
        let on = |id, claim: &Claim| [(id, claim.clone())];
        let (pod, other): (Arc<str>, Arc<str>) = ("pod".into(), "other".into());
        let owner = Some(Owner { identity: &pod, max_client_ids: 2 });
        for client in ["p1", "p2"] {
            assert_eq!(ledger.room(0, client, owner, &on("r", &one), 100), Ok(()));
            ledger.claim_for(0, client, Some(&pod), "r", &one);
        }
        // The same ids on more resources are no more ids.
        ledger.claim_for(0, "p1", Some(&pod), "s", &one);
        assert_eq!(ledger.client_ids("pod"), 2);
        assert_eq!(ledger.room(0, "p3", owner, &on("r", &one), 100), Err(Full::ClientIds(2)));
        assert_eq!(ledger.room(0, "p1", owner, &on("t", &one), 100), Ok(()), "a held id takes a new resource");
        assert_eq!(ledger.owner("p1"), Some(&pod));
        // Another identity's ids do not count against this one, nor are they its.
        ledger.claim_for(0, "o1", Some(&other), "r", &one);
        assert_eq!(ledger.owner("o1"), Some(&other));
        // An id is no one's once it holds no lease: released here, expired there.
        ledger.release(1, "p1", "r");
        assert_eq!(ledger.client_ids("pod"), 2, "p1 still holds s");
        ledger.release(1, "p1", "s");
        assert_eq!((ledger.owner("p1"), ledger.client_ids("pod")), (None, 1));
        assert_eq!(ledger.room(1, "p3", owner, &on("r", &one), 100), Ok(()));
        ledger.expire(20, usize::MAX);
        assert_eq!((ledger.owner("p2"), ledger.owner("o1"), ledger.client_ids("pod")), (None, None, 0));
        // Trusted callers' ids are no one's.
        ledger.claim(20, "t", "r", &one);
        assert_eq!(ledger.owner("t"), None);
    }
}
