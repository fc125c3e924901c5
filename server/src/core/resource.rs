//! One resource: its template, its leases, where its capacity comes from, and how a claim on it
//! becomes a grant.

use std::sync::Arc;

use smallvec::SmallVec;

use super::{
    adaptive::{Controller, Decision, Fleet, Report},
    algorithm::{Algorithm, Choice, Kind},
    band::Demand,
    priority::{self, Bands, PriorityMode, SubtreeWants, Wants},
    store::{Holds, LeaseStore, UnixSeconds},
    template::Template,
};
use crate::defaults::{LAPSED_LEASE_LENGTHS, MIN_REFRESH_INTERVAL, REFRESH_DECAY, TRANSIT_SHARE};

/// A client's request for one resource, already validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// One entry per priority band: an end client has one, a child server one per
    /// priority among its clients. Never empty.
    pub wants: SmallVec<[Wants; 1]>,
    /// What the client says it holds; used in learning mode.
    pub has: Option<f64>,
    /// What the claimant's own clients hold: nothing beyond its lease for an end client.
    pub holds: Holds,
    /// What the claimant's calls met at the service since its last claim, if it says: boxed,
    /// as most claims have none and a request of many resources holds a claim each.
    pub signals: Option<Box<Report>>,
}

impl Claim {
    /// An end client's claim: one band.
    pub fn single(priority: i64, wants: f64, has: Option<f64>) -> Claim {
        Claim {
            wants: smallvec::smallvec![Wants { priority, wants, subclients: 1.0 }],
            has,
            holds: Holds::Own,
            signals: None,
        }
    }

    pub fn total_wants(&self) -> f64 {
        self.wants.iter().map(|w| w.wants).sum()
    }
}

/// The answer to a claim: a lease and the capacity to fall back on without one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grant {
    pub capacity: f64,
    pub expiry: UnixSeconds,
    pub refresh_interval: i64,
    pub safe_capacity: f64,
}

/// The lease an intermediate server holds from its parent for one resource (SPEC §3.6).
#[derive(Clone, Debug, PartialEq)]
pub struct ParentLease {
    pub capacity: f64,
    pub expiry: UnixSeconds,
    pub refresh_interval: i64,
    /// How the parent shares the resource; the server shares its lease the same way.
    pub algorithm: Option<Algorithm>,
    pub safe_capacity: Option<f64>,
}

/// Where a resource's capacity comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Supply {
    /// A root server: the template's capacity.
    Template,
    /// An intermediate server: what its parent leased it, once it has answered.
    Parent(Option<ParentLease>),
}

/// The terms a claim is decided under at one moment.
struct Terms {
    capacity: f64,
    kind: Kind,
    mode: PriorityMode,
    subtree: SubtreeWants,
    expiry: UnixSeconds,
    refresh_interval: i64,
}

#[derive(Debug)]
pub struct Resource {
    template: Arc<Template>,
    leases: LeaseStore,
    supply: Supply,
    /// What this intermediate server last reported to its parent for the resource, while it
    /// has clients: what a claim's change is measured against.
    reported: Option<Reported>,
    /// A client's lease ran out, rather than being released, since the parent last answered a
    /// report of the resource: that client may be cut off and living on its fallback.
    expired_since_report: bool,
    /// A root's learned capacity, for an adaptive template.
    controller: Option<Box<Controller>>,
    /// An intermediate server's clients' signals since it last passed them up, and when that was.
    upward: Option<Box<(Fleet, UnixSeconds)>>,
}

/// What an intermediate server told its parent of one resource.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reported {
    /// Σ wants over its bands.
    pub wants: f64,
    /// The capacity it said it holds (0 while learning, when it says nothing).
    pub has: f64,
}

impl Resource {
    pub fn new(template: Arc<Template>) -> Resource {
        Resource::with_supply(template, Supply::Template, None)
    }

    /// A resource with the given supply; `seed` fixes its bands' tree shapes (simulations).
    pub fn with_supply(template: Arc<Template>, supply: Supply, seed: Option<u64>) -> Resource {
        let controller = controller(&template, &supply);
        Resource {
            template,
            leases: LeaseStore::seeded(seed),
            supply,
            reported: None,
            expired_since_report: false,
            controller,
            upward: None,
        }
    }

    pub fn template(&self) -> &Arc<Template> {
        &self.template
    }

    /// Takes a new configuration; leases keep their grants and expiry and adapt at their next
    /// refresh.
    pub fn set_template(&mut self, template: Arc<Template>) {
        match (&mut self.controller, &template.adaptive) {
            (Some(c), Some(settings)) => c.set_settings(settings.clone()),
            _ => self.controller = controller(&template, &self.supply),
        }
        self.template = template;
    }

    /// The controller of an adaptive resource at the server that owns it.
    pub fn controller(&self) -> Option<&Controller> {
        self.controller.as_deref()
    }

    /// Takes a claimant's signals: into the controller at a root, else kept to pass up.
    fn observe(&mut self, client: &str, report: Report, now: UnixSeconds) {
        match (&mut self.controller, &self.supply) {
            (Some(c), _) => c.observe(client, report, now),
            (None, Supply::Parent(_)) => {
                // The first report up spans what the first report in does.
                let start = now.saturating_sub(report.seconds.ceil() as UnixSeconds);
                self.upward.get_or_insert_with(|| Box::new((Fleet::default(), start))).0.add(client, report, now)
            }
            (None, Supply::Template) => {}
        }
    }

    /// Lets an adaptive resource's controller decide, if its interval has passed.
    pub fn tick(&mut self, now: UnixSeconds) -> Option<Decision> {
        let wants = self.leases.bands().sums().wants;
        self.controller.as_mut()?.tick(now, wants)
    }

    /// The signals an intermediate server passes up with its next report: its clients' since
    /// the last, once a whole second has passed.
    pub fn take_signals(&mut self, now: UnixSeconds) -> Option<Report> {
        let (signals, since) = self.upward.as_deref_mut()?;
        let seconds = now.saturating_sub(*since);
        if seconds < 1 {
            return None;
        }
        *since = now;
        signals.report(now, seconds as f64)
    }

    pub fn leases(&self) -> &LeaseStore {
        &self.leases
    }

    pub fn bands(&self) -> &Bands {
        self.leases.bands()
    }

    /// Records the lease the parent granted this resource, in answer to a report of it: what
    /// ran out before that report is the parent's to know.
    pub fn set_parent_lease(&mut self, lease: ParentLease) {
        self.supply = Supply::Parent(Some(lease));
        self.expired_since_report = false;
    }

    pub fn reported(&self) -> Option<Reported> {
        self.reported
    }

    pub fn set_reported(&mut self, reported: Option<Reported>) {
        self.reported = reported;
    }

    /// The parent's lease while it is valid.
    pub fn parent_lease(&self, now: UnixSeconds) -> Option<&ParentLease> {
        match &self.supply {
            Supply::Parent(Some(lease)) if now < lease.expiry => Some(lease),
            _ => None,
        }
    }

    /// Whether this intermediate server holds capacity from its parent that its clients have
    /// all released: its next request gives it back, rather than keeping it until its lease
    /// lapses, which the parent keeps reserved for three lease lengths as if the subtree were
    /// cut off. Not when a client's lease ran out since the last report: that client may well
    /// be cut off, living on its fallback, and the reservation is what covers it.
    pub fn gives_back(&self) -> bool {
        self.leases.is_empty()
            && !self.expired_since_report
            && matches!(&self.supply, Supply::Parent(Some(lease)) if lease.capacity > 0.0)
    }

    /// Whether an intermediate server should keep this resource although no client holds a
    /// lease: for a lease length after its own lease from the parent expired, so that clients
    /// coming back meanwhile still get the safe capacity the parent named.
    pub fn remembers_parent(&self, now: UnixSeconds) -> bool {
        matches!(&self.supply, Supply::Parent(Some(lease))
            if now < lease.expiry.saturating_add(self.template.algorithm.lease_length))
    }

    /// The algorithm in force: the parent's once it named one, else the template's.
    pub fn algorithm(&self) -> &Algorithm {
        match &self.supply {
            Supply::Parent(Some(ParentLease { algorithm: Some(algorithm), .. })) => algorithm,
            _ => &self.template.algorithm,
        }
    }

    /// The capacity this resource shares now: the template's at a root, the parent's lease at
    /// an intermediate server; `None` for an intermediate server without a valid lease, which
    /// hands out safe capacity instead.
    pub fn capacity(&self, now: UnixSeconds) -> Option<f64> {
        match self.supply {
            Supply::Template => Some(self.configured_capacity()),
            Supply::Parent(_) => self.parent_lease(now).map(|lease| lease.capacity),
        }
    }

    /// A root's capacity: learned for an adaptive template, else configured.
    fn configured_capacity(&self) -> f64 {
        self.controller.as_ref().map_or(self.template.capacity, |c| c.capacity())
    }

    fn terms(&self, now: UnixSeconds) -> Option<Terms> {
        let algorithm = self.algorithm();
        let (kind, mode, subtree) = (algorithm.kind, PriorityMode::of(algorithm), SubtreeWants::of(algorithm));
        let own_expiry = now.saturating_add(algorithm.lease_length);
        match &self.supply {
            Supply::Template => Some(Terms {
                capacity: self.configured_capacity(),
                kind,
                mode,
                subtree,
                expiry: own_expiry,
                refresh_interval: algorithm.refresh_interval,
            }),
            Supply::Parent(_) => self.parent_lease(now).map(|lease| Terms {
                capacity: lease.capacity,
                kind,
                mode,
                subtree,
                // A client's lease never outlives this server's own.
                expiry: own_expiry.min(lease.expiry),
                // One level further from the root, clients refresh twice as often, so that the
                // wants this server passes to its parent are fresh when it asks.
                refresh_interval: ((lease.refresh_interval as f64 * REFRESH_DECAY) as i64).max(MIN_REFRESH_INTERVAL),
            }),
        }
    }

    /// Grants `client` its share (SPEC §3.2–3.4, §3.7): the algorithm's target band by band —
    /// or in learning mode what the client reports holding — capped by its wants and, for the
    /// algorithms that share one capacity, by what the other leases leave free ([`room`]). An
    /// intermediate server without a valid lease from its parent hands out safe capacity.
    pub fn claim(&mut self, client: &str, claim: &Claim, now: UnixSeconds, learning: bool) -> Grant {
        if let Some(report) = claim.signals.as_deref() {
            self.observe(client, *report, now);
        }
        self.tick(now);
        let reported = claim.has.unwrap_or(0.0);
        let Some(Terms { capacity, kind, mode, subtree, expiry, refresh_interval }) = self.terms(now) else {
            return self.claim_safe(client, claim, now, learning.then_some(reported));
        };
        let filed = priority::file(mode, subtree, &claim.wants);
        debug_assert_eq!(filed.len(), self.demands(claim, now));
        let mut due = 0.0;
        let capacity = self.leases.claim(client, &filed, claim.holds, now, expiry, |bands, mine, others, before| {
            let wants: f64 = mine.iter().map(|(_, d)| d.wants).sum();
            let target = if learning { reported } else { bands.target(kind, capacity, mine) };
            due = target.min(wants);
            let mut grant = due;
            if kind.shares_capacity() {
                grant = grant.min(room(capacity, others, before, learning));
            }
            grant.max(0.0)
        });
        let held = match claim.holds {
            Holds::Reported(holds) => holds,
            Holds::Own | Holds::Unknown => capacity,
        };
        let refresh_interval = if in_transit(capacity, due, held) { MIN_REFRESH_INTERVAL } else { refresh_interval };
        // After the claim, so that a new client counts among the subclients.
        Grant { capacity, expiry, refresh_interval, safe_capacity: self.safe_capacity(now) }
    }

    /// How many demands `claim` would file here at `now` (see [`priority::file`]): what its
    /// lease counts against the ledger's bound.
    pub fn demands(&self, claim: &Claim, now: UnixSeconds) -> usize {
        let algorithm = if self.terms(now).is_some() { self.algorithm() } else { &self.template.algorithm };
        demands(algorithm, claim)
    }

    /// Without a lease of its own, a server grants each client at most the safe capacity per
    /// subclient — what the client would allow itself if it could not reach any server — under
    /// the template's lease terms. A new master that has not heard from its parent yet does
    /// not know that value: while learning, it grants what the client holds (`learned`).
    fn claim_safe(&mut self, client: &str, claim: &Claim, now: UnixSeconds, learned: Option<f64>) -> Grant {
        let safe_capacity = self.safe_capacity(now);
        let algorithm = &self.template.algorithm;
        let expiry = now.saturating_add(algorithm.lease_length);
        let filed = priority::file(PriorityMode::of(algorithm), SubtreeWants::of(algorithm), &claim.wants);
        let capacity = self.leases.claim(client, &filed, claim.holds, now, expiry, |_, mine, _, _| {
            let (wants, subclients) = mine.iter().fold((0.0, 0.0), |(w, s), (_, d)| (w + d.wants, s + d.subclients));
            match learned {
                Some(has) => wants.min(has),
                None if safe_capacity < 0.0 => wants,
                None => wants.min(safe_capacity * subclients),
            }
        });
        Grant { capacity, expiry, refresh_interval: algorithm.refresh_interval, safe_capacity }
    }

    /// Forgets a client's lease; false if it held none.
    pub fn release(&mut self, client: &str) -> bool {
        self.leases.remove(client)
    }

    /// Takes up to `budget` expired leases, telling `gone` each client forgotten; returns how
    /// many. A child server's lease
    /// that ran out without a release stays reserved for [`LAPSED_LEASE_LENGTHS`] more lease
    /// lengths as the safe capacity its cut-off subtree hands out meanwhile (its subclients'
    /// worth, even where that is more than the lease it last held), so that giving its share to
    /// others does not overshoot the capacity. The ledger may then hold more than the capacity
    /// until the others have shrunk: so do the clients.
    pub fn expire(&mut self, now: UnixSeconds, budget: usize, gone: &mut dyn FnMut(&str)) -> usize {
        let safe = self.safe_capacity(now);
        let fallback = |demand: &Demand| if safe < 0.0 { demand.has } else { safe * demand.subclients };
        let grace = self.algorithm().lease_length.saturating_mul(LAPSED_LEASE_LENGTHS);
        let expired = self.leases.expire(now, budget, grace, fallback, gone);
        self.expired_since_report |= expired > 0;
        expired
    }

    /// SPEC §3.5: the template's value; at an intermediate server, else the parent's; else the
    /// capacity shared now divided among the subclients.
    pub fn safe_capacity(&self, now: UnixSeconds) -> f64 {
        if let Some(safe) = self.template.safe_capacity {
            return safe;
        }
        if let Supply::Parent(Some(ParentLease { safe_capacity: Some(safe), .. })) = self.supply {
            return safe;
        }
        let capacity = self.capacity(now).unwrap_or_else(|| self.configured_capacity());
        let subclients = self.leases.bands().sums().subclients;
        if subclients > 0.0 { capacity / subclients } else { capacity }
    }
}

/// A controller for an adaptive template at a root.
fn controller(template: &Template, supply: &Supply) -> Option<Box<Controller>> {
    match (supply, &template.adaptive) {
        (Supply::Template, Some(settings)) => Some(Box::new(Controller::new(settings.clone()))),
        _ => None,
    }
}

/// How many demands `claim` files under `algorithm`'s priority settings.
pub fn demands(algorithm: &Algorithm, claim: &Claim) -> usize {
    priority::file(PriorityMode::of(algorithm), SubtreeWants::of(algorithm), &claim.wants).len()
}

/// The most a claim on a shared capacity may be granted: what the other leases leave free — but
/// never less than the claimant held before. Where the leases already add up to more than the
/// capacity (an intermediate server whose lease its parent cut, a root whose capacity was
/// lowered), a claimant due less than it holds is cut to its due, not squeezed below it to
/// make room that the others still hold: they give it back as they refresh, each onto its own
/// due. Squeezing would free that room at once, but the squeezed claimant then stays below its
/// due until it asks again, after the others have shrunk, and the capacity between is idle;
/// in the simulator's tree that gap was, by an estimate, about half of all capacity not handed
/// out (`docs/simulation.md`). The sum of the leases never grows this way, so a root whose
/// leases fit its capacity never exceeds it, and an intermediate server's excess is still held
/// at its parent, which keeps reserving what the server reports its clients hold. Learning mode
/// keeps the strict bound: what clients report holding is not known to fit.
fn room(capacity: f64, others: f64, before: f64, learning: bool) -> f64 {
    let free = capacity - others;
    if learning { free } else { free.max(before) }
}

/// Whether a claim's grant is on its way to its share: short of what it is due because others
/// still hold that capacity, or below what the claimant's own clients still hold. Either way the
/// grant changes as soon as those holders refresh, so the claimant is asked back at the
/// shortest interval; a server's clients inherit that interval (halved, floored), so capacity
/// moving between subtrees crosses each level in about a second instead of a refresh interval.
fn in_transit(grant: f64, due: f64, held: f64) -> bool {
    let off = (due - grant).max(held - grant);
    off > TRANSIT_SHARE * due.max(grant)
}
