//! What a capacity server's answer grants, cleaned once for every caller: a server is a peer, and
//! a capacity of NaN or 1e300, a refresh interval of 0 or an expiry a century away must not reach
//! a limiter's or a schedule's arithmetic.

use sluice_proto::Lease;

use crate::defaults::{MAX_AMOUNT, MAX_LEASE_SECONDS};

/// How an answer was taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Leases recorded.
    Updated,
    /// The server asked is not the master. `Some(address)`: ask there; `None`: unknown, ask
    /// Discovery again after a backoff.
    Redirect(Option<String>),
}

/// A lease as a server granted it, within what a caller can enforce and schedule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Granted {
    /// 0 ..= [`MAX_AMOUNT`]: NaN and negative amounts grant nothing, larger ones the most a
    /// request may state.
    pub capacity: f64,
    /// Unix seconds, at most [`MAX_LEASE_SECONDS`] after the answer came.
    pub expiry: i64,
    /// Seconds, 1 ..= [`MAX_LEASE_SECONDS`].
    pub refresh_interval: i64,
}

impl Granted {
    /// `lease` as answered at unix time `now`.
    pub fn clean(now: f64, lease: &Lease) -> Granted {
        let capacity = if lease.capacity.is_nan() { 0.0 } else { lease.capacity.clamp(0.0, MAX_AMOUNT) };
        // Saturating: `now` is a wall-clock reading far below i64's range.
        let latest = (now as i64).saturating_add(MAX_LEASE_SECONDS);
        Granted {
            capacity,
            expiry: lease.expiry_time.min(latest),
            refresh_interval: lease.refresh_interval.clamp(1, MAX_LEASE_SECONDS),
        }
    }

    pub fn is_valid(&self, now: f64) -> bool {
        now < self.expiry as f64
    }

    /// The lease to report holding: Doorman's `has`.
    pub fn to_wire(self) -> Lease {
        Lease { capacity: self.capacity, expiry_time: self.expiry, refresh_interval: self.refresh_interval }
    }
}

/// A server's safe capacity for when its lease runs out: `None` if it sent none or nothing
/// usable (NaN, ±∞); −1 for no limit (any negative value); else at most [`MAX_AMOUNT`].
pub fn safe_capacity(sent: Option<f64>) -> Option<f64> {
    sent.filter(|safe| safe.is_finite()).map(|safe| if safe < 0.0 { -1.0 } else { safe.min(MAX_AMOUNT) })
}

/// The metadata key under which a server names, one value each, the resources a policy does not
/// let the caller ask for (a Sluice extension to PERMISSION_DENIED; Doorman's clients see only
/// the status).
const DENIED_RESOURCE: &str = "sluice-denied-resource-bin";

/// Names `ids` in `status`, as many as fit in `budget` bytes (one at least): a client learns
/// the rest on its next try.
pub fn name_denied(status: &mut tonic::Status, ids: &[String], budget: usize) {
    let mut used = 0;
    for id in ids {
        used += id.len();
        if used > budget && used > id.len() {
            break;
        }
        status.metadata_mut().append_bin(DENIED_RESOURCE, tonic::metadata::MetadataValue::from_bytes(id.as_bytes()));
    }
}

/// The resources a PERMISSION_DENIED names as outside the caller's policy (none for another
/// status, or from a server that names none). Ids that are not UTF-8 are no one's resources.
pub fn denied(status: &tonic::Status) -> Vec<String> {
    if status.code() != tonic::Code::PermissionDenied {
        return Vec::new();
    }
    status
        .metadata()
        .get_all_bin(DENIED_RESOURCE)
        .iter()
        .filter_map(|value| value.to_bytes().ok())
        .filter_map(|bytes| String::from_utf8(bytes.to_vec()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(capacity: f64, expiry_time: i64, refresh_interval: i64) -> Lease {
        Lease { capacity, expiry_time, refresh_interval }
    }

    #[test]
    fn amounts_no_caller_can_act_on_are_cleaned() {
        let now = 1_000.0;
        let clean = |l| Granted::clean(now, &l);
        assert_eq!(clean(lease(f64::NAN, 1_010, 5)).capacity, 0.0);
        assert_eq!(clean(lease(-3.0, 1_010, 5)).capacity, 0.0);
        assert_eq!(clean(lease(1e300, 1_010, 5)).capacity, MAX_AMOUNT);
        assert_eq!(clean(lease(f64::INFINITY, 1_010, 5)).capacity, MAX_AMOUNT);
        assert_eq!(clean(lease(7.5, 1_010, 5)), Granted { capacity: 7.5, expiry: 1_010, refresh_interval: 5 });
        assert_eq!(clean(lease(1.0, 1_010, 0)).refresh_interval, 1);
        assert_eq!(clean(lease(1.0, 1_010, i64::MIN)).refresh_interval, 1);
        assert_eq!(clean(lease(1.0, 1_010, i64::MAX)).refresh_interval, MAX_LEASE_SECONDS);
        assert_eq!(clean(lease(1.0, i64::MAX, 5)).expiry, 1_000 + MAX_LEASE_SECONDS);
        assert!(!clean(lease(1.0, i64::MIN, 5)).is_valid(now));
    }

    #[test]
    fn a_safe_capacity_is_a_limit_no_limit_or_nothing() {
        assert_eq!(safe_capacity(None), None);
        assert_eq!(safe_capacity(Some(f64::NAN)), None);
        assert_eq!(safe_capacity(Some(f64::INFINITY)), None);
        assert_eq!(safe_capacity(Some(-1.0)), Some(-1.0));
        assert_eq!(safe_capacity(Some(-0.5)), Some(-1.0));
        assert_eq!(safe_capacity(Some(4.0)), Some(4.0));
        assert_eq!(safe_capacity(Some(1e300)), Some(MAX_AMOUNT));
    }

    #[test]
    fn denied_resources_travel_in_the_status_as_far_as_the_budget_goes() {
        let ids: Vec<String> = ["a", "b/ü", "ccc"].map(str::to_owned).into();
        let mut status = tonic::Status::permission_denied("no");
        name_denied(&mut status, &ids, 5);
        assert_eq!(denied(&status), ["a", "b/ü"]);
        let mut one = tonic::Status::permission_denied("no");
        name_denied(&mut one, &ids[2..], 1);
        assert_eq!(denied(&one), ["ccc"], "one at least");
        let mut other = tonic::Status::unavailable("no");
        name_denied(&mut other, &ids, 100);
        assert!(denied(&other).is_empty());
    }
}
