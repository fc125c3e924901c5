//! An intermediate server's side of the tree (SPEC §3.6): one bulk `GetServerCapacity` for
//! every resource its clients use — its own lease and its clients' wants per priority band —
//! and the leases that come back. The ledger owns one of these when the server has a parent.

use hashbrown::HashMap;
use sluice_client::{Answer, Granted, Schedule, safe_capacity};
use sluice_proto::{
    self as proto, ClientGroup, GetServerCapacityRequest, GetServerCapacityResponse, PriorityBandAggregate,
    ServerCapacityResourceRequest, WantsProfile,
};

use super::{
    algorithm::{Algorithm, Choice, Kind, Parameter},
    priority::SubtreeWants,
    resource::{ParentLease, Reported, Resource},
    store::UnixSeconds,
};
use crate::defaults::{
    MAX_AMOUNT, MAX_BANDS, MAX_PROFILE_GROUPS, MAX_SUBCLIENTS, MAX_TEMPLATE_SECONDS, REFRESH_DECAY, REPORT_CHANGE,
};

#[derive(Debug)]
pub struct Parent {
    /// This server's id towards its parent.
    server_id: String,
    schedule: Schedule,
}

impl Parent {
    pub fn new(server_id: String, seed: u64) -> Parent {
        Parent { server_id, schedule: Schedule::new(seed) }
    }

    pub fn server_id(&self) -> &str {
        &self.server_id
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// A resource appeared: ask for it now rather than at the next refresh.
    pub fn wake(&mut self) {
        self.schedule.wake();
    }

    /// A claim changed `resource`: if what this server would report has moved by
    /// [`REPORT_CHANGE`] of its lease, ask before the refresh interval is up.
    pub fn changed(&mut self, resource: &Resource, now: UnixSeconds) {
        let (Some(lease), Some(reported)) = (resource.parent_lease(now), resource.reported()) else { return };
        let sums = resource.bands().sums();
        // Wants either way; what it holds only downwards, as capacity it can give back.
        let moved = (sums.wants - reported.wants).abs().max(reported.has - sums.has.max(lease.capacity));
        if moved > REPORT_CHANGE * lease.capacity {
            let spacing = lease.refresh_interval as f64 * REFRESH_DECAY;
            self.schedule.hasten(spacing);
        }
    }

    /// One request for `resources` (those with clients, and those with a lease to give back), each with what this server holds and
    /// its clients' wants per band; `None` if one is in flight or there is nothing to
    /// ask for. What it holds is its valid lease, or what its clients actually hold when that
    /// is more (its capacity was cut and they have not all refreshed yet, or it handed out
    /// safe capacity without a lease), so that the parent keeps that much reserved meanwhile.
    /// A resource still `learning` reports nothing: a new master does not know yet what its
    /// clients hold, and the parent keeps its lease until it does.
    pub fn request<'a>(
        &mut self,
        now: UnixSeconds,
        resources: impl Iterator<Item = (&'a str, &'a mut Resource)>,
        learning: impl Fn(&Resource) -> bool,
    ) -> Option<GetServerCapacityRequest> {
        if self.schedule.in_flight() {
            return None;
        }
        let mut resource = Vec::new();
        for (id, r) in resources {
            if r.leases().is_empty() && !r.gives_back() {
                r.set_reported(None);
                continue;
            }
            // A resource that gives back its lease says it wants nothing and holds nothing.
            let idle = r.leases().is_empty();
            let has = (!learning(r)).then(|| {
                let held = r.bands().sums().has;
                match r.parent_lease(now).filter(|_| !idle) {
                    Some(lease) => proto::Lease {
                        expiry_time: lease.expiry,
                        refresh_interval: lease.refresh_interval,
                        capacity: lease.capacity.max(held).min(MAX_AMOUNT),
                    },
                    None => proto::Lease { expiry_time: now, refresh_interval: 0, capacity: held.min(MAX_AMOUNT) },
                }
            });
            let wants = aggregates(r);
            let total = wants.iter().map(|w| w.wants).sum();
            r.set_reported(Some(Reported { wants: total, has: has.as_ref().map_or(0.0, |h| h.capacity) }));
            let signals = r.take_signals(now).map(|s| {
                Box::new(proto::Signals {
                    completed: Some(s.completed.round() as i64),
                    errors: Some(s.errors.round() as i64),
                    latency_sum: Some(s.latency_sum),
                    min_latency: s.min_latency,
                    seconds: Some(s.seconds),
                })
            });
            resource.push(ServerCapacityResourceRequest { resource_id: id.to_owned(), has, wants, signals });
        }
        if resource.is_empty() {
            return None;
        }
        self.schedule.begin();
        Some(GetServerCapacityRequest { server_id: self.server_id.clone(), resource })
    }

    /// Takes the answer to the request in flight: the leases go to the resources this server
    /// still has.
    pub fn on_response(
        &mut self,
        now: f64,
        response: GetServerCapacityResponse,
        resources: &mut HashMap<String, Resource>,
    ) -> Answer {
        if let Some(mastership) = response.mastership {
            let named = mastership.master_address.is_some();
            self.schedule.redirected(now, named, earliest_expiry(now, resources));
            return Answer::Redirect(mastership.master_address);
        }
        let mut refresh = None::<i64>;
        for granted in response.response {
            let Some(r) = resources.get_mut(&granted.resource_id) else { continue };
            let gets = Granted::clean(now, &granted.gets);
            let lease = ParentLease {
                capacity: gets.capacity,
                expiry: gets.expiry,
                refresh_interval: gets.refresh_interval,
                algorithm: granted.algorithm.as_ref().and_then(algorithm),
                safe_capacity: safe_capacity(granted.safe_capacity),
            };
            if (lease.expiry as f64) > now {
                refresh = Some(refresh.map_or(lease.refresh_interval, |r| r.min(lease.refresh_interval)));
            }
            r.set_parent_lease(lease);
        }
        match refresh {
            Some(refresh) => self.schedule.succeeded(now, refresh as f64),
            // Nothing valid came back: as good as an error.
            None => self.schedule.failed(now, earliest_expiry(now, resources)),
        }
        Answer::Updated
    }

    /// The request in flight failed (transport error, error status): the next one backs off,
    /// unless `untried`, another of the parent's addresses, which is asked at once (see
    /// [`Schedule::failed_over`]).
    pub fn on_error(&mut self, now: f64, untried: bool, resources: &HashMap<String, Resource>) {
        if untried {
            self.schedule.failed_over();
        } else {
            self.schedule.failed(now, earliest_expiry(now, resources));
        }
    }
}

/// A resource's wants per band: one aggregate per priority, as Doorman sends them — with its
/// profile under `subtree_wants: profile` when it has more than one group
/// ([`Band::groups`](super::Band::groups)) — within what a parent accepts (`validate`) however
/// many clients add up here: the bands' total wants at most [`MAX_AMOUNT`] (scaled down
/// together, keeping their proportions), and at most [`MAX_BANDS`] bands, the least important
/// folded into one at the highest of their priorities, without a profile.
fn aggregates(r: &Resource) -> Vec<PriorityBandAggregate> {
    let mut bands = band_aggregates(r);
    if bands.len() > MAX_BANDS {
        let folded = bands.split_off(MAX_BANDS - 1);
        bands.push(PriorityBandAggregate {
            priority: folded[0].priority,
            num_clients: folded.iter().map(|b| b.num_clients).fold(0, i64::saturating_add).min(MAX_SUBCLIENTS),
            wants: folded.iter().map(|b| b.wants).sum::<f64>().min(MAX_AMOUNT),
            profile: None,
        });
    }
    bands
}

/// One aggregate per band of `r`, most important first.
fn band_aggregates(r: &Resource) -> Vec<PriorityBandAggregate> {
    let total = r.bands().sums().wants;
    let scale = if total > MAX_AMOUNT { MAX_AMOUNT / total } else { 1.0 };
    let groups = if SubtreeWants::of(r.algorithm()) == SubtreeWants::Profile { MAX_PROFILE_GROUPS } else { 1 };
    r.bands()
        .iter()
        .map(|(priority, band)| {
            let group: Vec<ClientGroup> = band
                .groups(groups)
                .into_iter()
                .map(|g| ClientGroup {
                    // Subclients are whole clients; rounding only undoes float sums.
                    num_clients: (g.subclients.round() as i64).clamp(1, MAX_SUBCLIENTS),
                    wants: (g.wants * scale).min(MAX_AMOUNT),
                })
                .collect();
            let num_clients = group.iter().map(|g| g.num_clients).fold(0, i64::saturating_add);
            // Summed from the groups, so that the parent finds they add up.
            let wants = group.iter().map(|g| g.wants).sum::<f64>().min(MAX_AMOUNT);
            let profile = (group.len() > 1 && num_clients <= MAX_SUBCLIENTS).then_some(WantsProfile { group });
            PriorityBandAggregate { priority, num_clients: num_clients.min(MAX_SUBCLIENTS), wants, profile }
        })
        .collect()
}

/// When the first of this server's valid leases from its parent runs out.
fn earliest_expiry(now: f64, resources: &HashMap<String, Resource>) -> Option<f64> {
    resources
        .values()
        .filter_map(|r| r.parent_lease(now as UnixSeconds))
        .map(|l| l.expiry as f64)
        .min_by(f64::total_cmp)
}

/// The parent's algorithm in the core's terms; `None` (keep the template's) if it names an
/// unknown kind or durations no template could have.
fn algorithm(a: &proto::Algorithm) -> Option<Algorithm> {
    let kind = proto::algorithm::Kind::try_from(a.kind).ok()?;
    let kind = Kind::from_name(kind.as_str_name())?;
    let seconds = |s: i64| (1..=MAX_TEMPLATE_SECONDS).contains(&s);
    if !(seconds(a.lease_length) && seconds(a.refresh_interval)) || a.refresh_interval > a.lease_length {
        return None;
    }
    Some(Algorithm {
        kind,
        lease_length: a.lease_length,
        refresh_interval: a.refresh_interval,
        parameters: a.parameters.iter().map(|p| Parameter { name: p.name.clone(), value: p.value.clone() }).collect(),
        learning_mode_duration: a.learning_mode_duration.filter(|d| (0..=MAX_TEMPLATE_SECONDS).contains(d)),
    })
}
