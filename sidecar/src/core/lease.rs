//! The Doorman client half as a state machine: which resources to ask for and when, what the
//! answers grant, and what applies when there is no valid lease. Times are unix seconds (f64),
//! because leases carry unix expiry times.

use std::collections::BTreeMap;

pub use sluice_client::Answer;
use sluice_client::{Granted, Schedule, defaults::MAX_AMOUNT, safe_capacity};
use sluice_proto::{GetCapacityRequest, GetCapacityResponse, Lease, ResourceRequest};

use super::Capacity;
use crate::defaults::{DEMAND_CHANGE, DENIED_RETRY, EARLY_REFRESH, FIRST_ASK_AFTER};

/// What a resource enforces while it holds no valid lease (`when_unreachable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// The last safe capacity a server sent, else the configured one.
    Safe,
    /// No limit.
    Optimistic,
    /// Nothing passes.
    Pessimistic,
}

impl Fallback {
    /// The capacity it enforces, given the safe capacity in force (INFINITY: no limit).
    pub fn capacity(self, safe: f64) -> f64 {
        match self {
            Fallback::Safe => safe,
            Fallback::Optimistic => f64::INFINITY,
            Fallback::Pessimistic => 0.0,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ResourceSpec {
    pub id: String,
    pub priority: i64,
    pub fallback: Fallback,
    /// Capacity under [`Fallback::Safe`] until a server names one; INFINITY: no limit.
    pub safe_capacity: f64,
}

/// Where a resource's capacity comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Not yet asked for, or the first answer is awaited: the fallback applies meanwhile. So
    /// too after a resource wanted nothing and its lease came down to 0 (it is no longer asked
    /// for), until it is used again and leased anew.
    Pending,
    Leased,
    /// Asked for, and no valid lease came or the last one expired: the fallback applies.
    Fallback,
    /// The server's policy does not let this client ask for it: nothing passes until a lease
    /// comes; it is asked for again after [`DENIED_RETRY`].
    Denied,
}

/// The lease a resource currently enforces, for status and metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    pub capacity: Capacity,
    /// e.g. "leased", "standalone", "fallback_safe".
    pub mode: &'static str,
    /// Unix seconds, when leased.
    pub expiry: Option<i64>,
}

/// The capacity a resource should enforce now.
#[derive(Clone, Debug, PartialEq)]
pub struct Effective {
    /// INFINITY: no limit.
    pub capacity: f64,
    pub mode: Mode,
    pub fallback: Fallback,
    /// Unix seconds, while leased.
    pub expiry: Option<i64>,
    pub refresh_interval: Option<i64>,
}

impl Effective {
    /// The mode as a metric label: "pending", "leased", "fallback_safe", "fallback_optimistic",
    /// "fallback_pessimistic" or "denied".
    pub fn label(&self) -> &'static str {
        match (self.mode, self.fallback) {
            (Mode::Pending, _) => "pending",
            (Mode::Leased, _) => "leased",
            (Mode::Fallback, Fallback::Safe) => "fallback_safe",
            (Mode::Fallback, Fallback::Optimistic) => "fallback_optimistic",
            (Mode::Fallback, Fallback::Pessimistic) => "fallback_pessimistic",
            (Mode::Denied, _) => "denied",
        }
    }
}

struct Entry {
    spec: ResourceSpec,
    /// Touched, and not idle since: it is asked for in every request.
    used: bool,
    /// When it was last touched.
    touched: f64,
    /// In the request in flight.
    requested: bool,
    /// An attempt that included it has concluded, so its fallback is decided.
    asked: bool,
    lease: Option<Granted>,
    /// The last safe capacity a server sent (negative: no limit).
    server_safe: Option<f64>,
    /// The wants in the last request.
    reported: f64,
    /// When a resource the server's policy refused is asked for again; `None`: not refused,
    /// or a lease came since.
    denied: Option<f64>,
}

impl Entry {
    fn new(spec: ResourceSpec) -> Entry {
        Entry {
            spec,
            used: false,
            touched: f64::NEG_INFINITY,
            requested: false,
            asked: false,
            lease: None,
            server_safe: None,
            reported: 0.0,
            denied: None,
        }
    }

    fn valid_lease(&self, now: f64) -> Option<&Granted> {
        self.lease.as_ref().filter(|lease| lease.is_valid(now))
    }

    /// The last safe capacity a server sent, else the configured one (INFINITY: no limit).
    fn safe_capacity(&self) -> f64 {
        // A server's safe capacity of −1 means no limit.
        self.server_safe.map_or(self.spec.safe_capacity, |safe| if safe < 0.0 { f64::INFINITY } else { safe })
    }

    /// What applies without a valid lease (INFINITY: no limit).
    fn fallback_capacity(&self) -> f64 {
        self.spec.fallback.capacity(self.safe_capacity())
    }

    /// What to report holding: the valid lease, or once the fallback is decided, the fallback
    /// as a lease of the moment — so that a server in learning mode (one that restarted after
    /// an outage longer than a lease) grants what the client holds itself to, not nothing. No
    /// more than the safe capacity, though (an optimistic fallback holds to no limit, and would
    /// take whatever is free), and no more than a server takes.
    fn has(&self, now: f64) -> Option<Lease> {
        match self.valid_lease(now) {
            Some(lease) => Some(lease.to_wire()),
            None if self.asked => Some(Lease {
                capacity: match self.spec.fallback {
                    Fallback::Pessimistic => 0.0,
                    Fallback::Safe | Fallback::Optimistic => self.safe_capacity().min(MAX_AMOUNT),
                },
                expiry_time: now as i64,
                refresh_interval: 0,
            }),
            None => None,
        }
    }
}

/// Seconds after a resource's first use in which its demand is still being learned (the first
/// ask and the demand estimate's rise window): a move in its wants is asked for
/// [`FIRST_ASK_AFTER`] after the last answer, not after [`EARLY_REFRESH`] of the interval.
const LEARNING: f64 = FIRST_ASK_AFTER + 1.0;

pub struct LeaseClient {
    client_id: String,
    /// Ordered, so requests and releases come out the same way every time.
    entries: BTreeMap<String, Entry>,
    schedule: Schedule,
}

impl LeaseClient {
    /// `seed` drives the backoff jitter, so a simulation replays exactly.
    pub fn new(client_id: String, seed: u64) -> Self {
        let mut schedule = Schedule::new(seed);
        // Nothing is due until a resource is used.
        schedule.rest();
        LeaseClient { client_id, entries: BTreeMap::new(), schedule }
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// Sets the configured resources, keeping the leases of those that stay. Returns the ids
    /// that were in use and are no longer configured, to release.
    pub fn configure(&mut self, specs: impl IntoIterator<Item = ResourceSpec>) -> Vec<String> {
        let mut previous = std::mem::take(&mut self.entries);
        for spec in specs {
            let entry = match previous.remove(&spec.id) {
                Some(kept) => Entry { spec: spec.clone(), ..kept },
                None => Entry::new(spec.clone()),
            };
            self.entries.insert(spec.id, entry);
        }
        previous.into_values().filter(|entry| entry.used || entry.lease.is_some()).map(|entry| entry.spec.id).collect()
    }

    /// A resource that came into being between configurations (a keyed resource's new key),
    /// unless it is known.
    pub fn add(&mut self, spec: ResourceSpec) {
        self.entries.entry(spec.id.clone()).or_insert_with(|| Entry::new(spec));
    }

    /// Forgets resources (a keyed resource's idle keys); returns those to release.
    pub fn remove(&mut self, ids: impl IntoIterator<Item = String>) -> Vec<String> {
        ids.into_iter()
            .filter(|id| self.entries.remove(id).is_some_and(|entry| entry.used || entry.lease.is_some()))
            .collect()
    }

    /// First use of a configured resource (or its first after it was idle): it joins the
    /// requests. The next one goes [`FIRST_ASK_AFTER`] later while its fallback admits
    /// requests, so that its first lease asks for the rate they show rather than for one
    /// arrival's; at once if the fallback admits nothing.
    pub fn touch(&mut self, now: f64, id: &str) {
        if let Some(entry) = self.entries.get_mut(id)
            && !entry.used
        {
            entry.used = true;
            entry.touched = now;
            let at = if entry.fallback_capacity() > 0.0 { now + FIRST_ASK_AFTER } else { f64::NEG_INFINITY };
            self.schedule.wake_at(at);
        }
    }

    /// What made requests fail may be gone (new TLS settings): the next one goes at once
    /// instead of after the backoff.
    pub fn retry_now(&mut self) {
        self.schedule.wake();
    }

    /// Unix time the next request is due (−∞: at once); `None` while one is in flight or no
    /// resource is in use.
    pub fn next_due(&self) -> Option<f64> {
        let due = self.schedule.due()?;
        self.entries.values().any(|entry| entry.used).then_some(due)
    }

    /// One request for every resource in use, each with its valid lease and `wants(id)`; marks
    /// it in flight until [`Self::on_response`] or [`Self::on_error`]. A resource that wants
    /// nothing and whose lease is already down to 0 is idle: it is no longer asked for, and is
    /// pending again (its lease of 0 lapses at the server) until it is touched again.
    pub fn request(&mut self, now: f64, mut wants: impl FnMut(&str) -> f64) -> Option<GetCapacityRequest> {
        if self.schedule.in_flight() {
            return None;
        }
        let resource: Vec<ResourceRequest> = self
            .entries
            .values_mut()
            .filter(|entry| entry.used && entry.denied.is_none_or(|retry| retry <= now))
            .filter_map(|entry| {
                let wants = wants(&entry.spec.id);
                if wants == 0.0 && entry.valid_lease(now).is_some_and(|lease| lease.capacity == 0.0) {
                    *entry = Entry { server_safe: entry.server_safe, ..Entry::new(entry.spec.clone()) };
                    return None;
                }
                entry.requested = true;
                entry.reported = wants;
                Some(ResourceRequest {
                    resource_id: entry.spec.id.clone(),
                    priority: entry.spec.priority,
                    has: entry.has(now),
                    // A server refuses NaN, ∞ and amounts above MAX_AMOUNT at the door: ask for
                    // nothing, or the most it takes, rather than fail the whole request.
                    wants: if wants.is_nan() { 0.0 } else { wants.clamp(0.0, MAX_AMOUNT) },
                    signals: None,
                })
            })
            .collect();
        if resource.is_empty() {
            self.schedule.rest();
            // Asked for again once the policy's refusal is over.
            let retries = self.entries.values().filter(|entry| entry.used).filter_map(|entry| entry.denied);
            if let Some(retry) = retries.min_by(f64::total_cmp) {
                self.schedule.wake_at(retry);
            }
            return None;
        }
        self.schedule.begin();
        Some(GetCapacityRequest { client_id: self.client_id.clone(), resource })
    }

    /// Demand changed between refreshes: if a leased resource's `wants(id)` moved by more than
    /// [`DEMAND_CHANGE`] since it was last reported, the next request comes early (see
    /// [`EARLY_REFRESH`]), so that a surge is served, and capacity given back, without waiting
    /// for the whole refresh interval. A resource not in use that wants something now is used
    /// again (see [`Self::touch`]).
    pub fn demand_moved(&mut self, now: f64, mut wants: impl FnMut(&str) -> f64) {
        let idle: Vec<String> = self
            .entries
            .values()
            .filter(|entry| !entry.used)
            .map(|entry| entry.spec.id.clone())
            .filter(|id| wants(id) > 0.0)
            .collect();
        for id in idle {
            self.touch(now, &id);
        }
        let early = self.entries.values().filter(|entry| entry.used).find_map(|entry| {
            let lease = entry.lease.as_ref()?;
            let moved = (wants(&entry.spec.id) - entry.reported).abs() > DEMAND_CHANGE * entry.reported.max(1.0);
            moved.then_some((lease.refresh_interval, now < entry.touched + LEARNING))
        });
        match early {
            // Its first requests' rate is still being measured: the first lease asked for a
            // quarter of a second's worth, which may fall short by a fifth (Poisson arrivals).
            Some((_, true)) => self.schedule.hasten_after(FIRST_ASK_AFTER),
            Some((refresh, false)) => self.schedule.hasten(refresh as f64 * EARLY_REFRESH),
            None => {}
        }
    }

    /// Takes the answer to the request in flight.
    pub fn on_response(&mut self, now: f64, response: GetCapacityResponse) -> Answer {
        if let Some(mastership) = response.mastership {
            let address = mastership.master_address;
            let at_once = self.schedule.redirected(now, address.is_some(), self.earliest_expiry(now));
            // Followed at once, the redirect does not decide the fallbacks yet.
            self.conclude(!at_once);
            return Answer::Redirect(address);
        }
        for granted in response.response {
            // Leases for resources no longer configured are ignored: they are being released.
            if let Some(entry) = self.entries.get_mut(&granted.resource_id) {
                entry.lease = Some(Granted::clean(now, &granted.gets));
                entry.denied = None;
                if let Some(safe) = safe_capacity(granted.safe_capacity) {
                    entry.server_safe = Some(safe);
                }
            }
        }
        self.conclude(true);
        let refresh = self
            .entries
            .values()
            .filter(|entry| entry.used)
            .filter_map(|entry| entry.valid_lease(now))
            .map(|lease| lease.refresh_interval as f64)
            .min_by(f64::total_cmp);
        match refresh {
            Some(refresh) => self.schedule.succeeded(now, refresh),
            // Nothing valid came back for what is in use: as good as an error.
            None => self.schedule.failed(now, self.earliest_expiry(now)),
        }
        Answer::Updated
    }

    /// The request in flight failed (transport error, timeout, error status); the next one
    /// backs off (see [`Schedule::failed`]) — unless `untried`: the failure was at one of the
    /// servers' addresses and another is still untried in this round, which is asked at once
    /// (see [`Schedule::failed_over`]).
    pub fn on_error(&mut self, now: f64, untried: bool) {
        self.conclude(true);
        if untried {
            self.schedule.failed_over();
        } else {
            self.schedule.failed(now, self.earliest_expiry(now));
        }
    }

    /// The request in flight was refused PERMISSION_DENIED for these resources, which the
    /// server's policy does not let this client ask for: they let nothing pass until a lease
    /// comes, and are left out of requests for [`DENIED_RETRY`]; the others are asked for again
    /// at once. `false` (an
    /// error, backed off) if none of them is configured here.
    pub fn on_denied(&mut self, now: f64, ids: &[String]) -> bool {
        let mut any = false;
        for id in ids {
            if let Some(entry) = self.entries.get_mut(id) {
                entry.denied = Some(now + DENIED_RETRY);
                entry.lease = None;
                any = true;
            }
        }
        if !any {
            self.on_error(now, false);
            return false;
        }
        self.conclude(true);
        self.schedule.failed_over();
        true
    }

    /// What a resource should enforce now; `None` if it is not configured.
    pub fn effective(&self, now: f64, id: &str) -> Option<Effective> {
        let entry = self.entries.get(id)?;
        let fallback = entry.spec.fallback;
        if entry.denied.is_some() {
            let mode = Mode::Denied;
            return Some(Effective { capacity: 0.0, mode, fallback, expiry: None, refresh_interval: None });
        }
        if let Some(lease) = entry.valid_lease(now) {
            return Some(Effective {
                capacity: lease.capacity,
                mode: Mode::Leased,
                fallback,
                expiry: Some(lease.expiry),
                refresh_interval: Some(lease.refresh_interval),
            });
        }
        let mode = if entry.asked { Mode::Fallback } else { Mode::Pending };
        Some(Effective { capacity: entry.fallback_capacity(), mode, fallback, expiry: None, refresh_interval: None })
    }

    /// Shutdown: the ids to release. Forgets their leases, so nothing is due any more.
    pub fn release_all(&mut self) -> Vec<String> {
        let mut released = Vec::new();
        for (id, entry) in &mut self.entries {
            if entry.used || entry.lease.is_some() {
                released.push(id.clone());
            }
            entry.used = false;
            entry.lease = None;
        }
        released
    }

    /// The request in flight is over; `decided`: its resources' fallbacks now apply in earnest
    /// (not for a redirect followed at once).
    fn conclude(&mut self, decided: bool) {
        for entry in self.entries.values_mut().filter(|entry| entry.used) {
            entry.asked |= decided && entry.requested;
            entry.requested = false;
        }
    }

    /// When the first valid lease of a resource in use runs out.
    fn earliest_expiry(&self, now: f64) -> Option<f64> {
        self.entries
            .values()
            .filter(|entry| entry.used)
            .filter_map(|entry| entry.valid_lease(now))
            .map(|lease| lease.expiry as f64)
            .min_by(f64::total_cmp)
    }
}
