//! A rate limit service domain as enforced: each limit of its envoyproxy/ratelimit file
//! (`sluice_ratelimit`) with the resource it became, and what a call's descriptor meets.

use std::sync::Arc;

use sluice_ratelimit::{Domain, Limit};

use super::{gate::Gate, keyed::Keyed};

pub struct DomainLimits {
    pub domain: Arc<Domain>,
    /// In the place of each of the domain's limits.
    enforced: Vec<Enforced>,
}

/// What a limit became.
pub enum Enforced {
    /// `unlimited`: matched, never limited.
    Unlimited,
    Fixed(Arc<Gate>),
    Keyed(Arc<Keyed>),
}

/// What one descriptor meets.
pub enum Met<'a> {
    /// No limit of the domain.
    Nothing,
    /// The limit, and its gate (`None`: unlimited).
    Limit(&'a Limit, Option<Arc<Gate>>),
    /// The limit, whose key for the values matched would not fit in a resource id: refused, as the
    /// sidecar refuses an HTTP request whose key does not fit.
    TooLong(&'a Limit),
}

impl DomainLimits {
    /// `enforced` says what each limit became, in the domain's order.
    pub fn new(domain: Arc<Domain>, enforced: impl FnMut(&Limit) -> Enforced) -> DomainLimits {
        let enforced = domain.limits.iter().map(enforced).collect();
        DomainLimits { domain, enforced }
    }

    pub fn meet<'a>(&'a self, entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Met<'a> {
        let Some(found) = self.domain.find(entries) else { return Met::Nothing };
        let limit = &self.domain.limits[found.limit];
        match &self.enforced[found.limit] {
            Enforced::Unlimited => Met::Limit(limit, None),
            Enforced::Fixed(gate) => Met::Limit(limit, Some(gate.clone())),
            Enforced::Keyed(keyed) => match keyed.gate(found.key.as_deref().map(str::as_bytes)) {
                Ok(gate) => Met::Limit(limit, Some(gate)),
                Err(_) => Met::TooLong(limit),
            },
        }
    }
}
