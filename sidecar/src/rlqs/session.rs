//! One RLQS stream's buckets: the usage Envoy reports charged to their gates as demand, and the
//! assignment each would get now pushed when it is new, when it moved (the lease changed) and
//! again before Envoy's copy runs out. No I/O: the stream's task feeds it reports and ticks and
//! sends what it answers.

use std::{collections::HashMap, sync::Arc, time::Instant};

use sluice_proto::envoy::{
    service::rate_limit_quota::v3::{
        RateLimitQuotaUsageReports,
        rate_limit_quota_response::{
            BucketAction,
            bucket_action::{self, QuotaAssignmentAction},
        },
    },
    r#type::v3::RateLimitStrategy,
};
use tonic::Status;

use super::assign::{self, Entries};
use crate::{core::Cost, defaults, enforce::Gate, plan::Plan};

pub struct Session {
    /// The stream's domain, from its first report on.
    domain: Option<String>,
    buckets: HashMap<Entries, Bucket>,
    max_buckets: usize,
    /// When the assignments were last looked at.
    checked_at: Option<Instant>,
}

struct Bucket {
    /// The load the last report told of, in requests a second, charged from `charged_at` on.
    rate: f64,
    reported_at: Instant,
    charged_at: Instant,
    /// The gate the load is charged to, as of the last look at the bucket's assignment.
    gate: Option<Arc<Gate>>,
    /// What was last pushed, and when.
    pushed: Option<(RateLimitStrategy, Instant)>,
}

impl Session {
    pub fn new(max_buckets: usize) -> Session {
        Session { domain: None, buckets: HashMap::new(), max_buckets, checked_at: None }
    }

    /// Takes a usage report; answers with the assignments of the buckets it reports for the
    /// first time. Bad input (no domain, another domain than the stream's, a bucket without
    /// entries) is INVALID_ARGUMENT, a bucket past the stream's bound RESOURCE_EXHAUSTED: the
    /// stream ends with it.
    pub fn report(
        &mut self,
        report: &RateLimitQuotaUsageReports,
        now: Instant,
        plan: &Plan,
    ) -> Result<Vec<BucketAction>, Status> {
        if report.domain.is_empty() {
            return Err(Status::invalid_argument("domain: must not be empty"));
        }
        match &self.domain {
            Some(domain) if *domain != report.domain => {
                return Err(Status::invalid_argument(format!(
                    "domain: a stream serves one domain ({domain:?}), got {:?}",
                    report.domain
                )));
            }
            Some(_) => {}
            None => self.domain = Some(report.domain.clone()),
        }
        let mut new = Vec::new();
        for (i, usage) in report.bucket_quota_usages.iter().enumerate() {
            let entries = assign::entries(usage.bucket_id.as_ref())
                .map_err(|e| Status::invalid_argument(format!("bucket_quota_usages[{i}].{e}")))?;
            let count = usage.num_requests_allowed.saturating_add(usage.num_requests_denied) as f64;
            if let Some(bucket) = self.buckets.get_mut(&entries) {
                // What the previous report told of is charged up to now, then this one's load
                // from now on, over the time since the previous report as measured here
                // (Envoy's `time_elapsed` is in whole seconds).
                bucket.charge(now);
                bucket.rate = count / now.duration_since(bucket.reported_at).as_secs_f64().max(1.0);
                bucket.reported_at = now;
                continue;
            }
            if self.buckets.len() >= self.max_buckets {
                return Err(Status::resource_exhausted(format!("at most {} buckets per stream", self.max_buckets)));
            }
            let elapsed = usage.time_elapsed.map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9);
            let mut bucket = Bucket { rate: 0.0, reported_at: now, charged_at: now, gate: None, pushed: None };
            let strategy = bucket.look(plan, self.domain.as_deref(), &entries);
            if elapsed >= 1.0 {
                // A bucket Envoy knew before this stream (it reconnected): its counts span
                // `time_elapsed`, spread over the time to come as any report's.
                bucket.rate = count / elapsed;
            } else if let Some(gate) = &bucket.gate {
                // A new bucket's first requests (usually the one that made it): charged at
                // once, so that its resource is leased at once.
                gate.report(Cost::saturating(count));
            }
            new.push(bucket.pushing(&entries, strategy, now));
            self.buckets.insert(entries, bucket);
        }
        Ok(new)
    }

    /// Every [`defaults::RLQS_TICK`]: the load reported is charged up to `now` and buckets not
    /// reported for [`defaults::RLQS_STALE_AFTER`] are forgotten; every
    /// [`defaults::RLQS_CHECK_INTERVAL`] the assignments that moved, or are due again, are
    /// answered.
    pub fn tick(&mut self, now: Instant, plan: &Plan) -> Vec<BucketAction> {
        self.buckets.values_mut().for_each(|bucket| bucket.charge(now));
        // Envoy 1.40 reports every bucket it holds every 5 s: one it stopped reporting is gone
        // from it. Forgotten here too (its key may then be swept); reported again, it is new.
        self.buckets.retain(|_, bucket| now.saturating_duration_since(bucket.reported_at) < defaults::RLQS_STALE_AFTER);
        if self.checked_at.is_some_and(|at| now.duration_since(at) < defaults::RLQS_CHECK_INTERVAL) {
            return Vec::new();
        }
        self.checked_at = Some(now);
        let domain = self.domain.as_deref();
        let mut due = Vec::new();
        for (entries, bucket) in &mut self.buckets {
            let strategy = bucket.look(plan, domain, entries);
            let moved = match &bucket.pushed {
                None => true,
                Some((pushed, at)) => *pushed != strategy || now.duration_since(*at) >= defaults::RLQS_REPUSH_AFTER,
            };
            if moved {
                due.push(bucket.pushing(entries, strategy, now));
            }
        }
        due
    }
}

impl Bucket {
    /// Charges the reported load from `charged_at` to `now` to the bucket's gate (none after
    /// [`defaults::RLQS_STALE_AFTER`] without a report).
    ///
    /// Why spread, not charged as each report comes: Envoy 1.40 reports every 5 s, and five
    /// seconds of requests charged at once would look like five times the rate to the demand
    /// estimate (which takes the last second's arrivals as the rate), so the lease client would
    /// ask for five times the load after each report. Spread over the ticks that follow (a
    /// tenth of a second apart: coarser lumps would still show a larger rate over the
    /// estimate's one-second window), the load reaches the estimate as the rate it was, a report
    /// late; `wants` follows it, 10% headroom on top, like proxied traffic. Allowed and denied
    /// both count: demand is what was offered, not what the lease let through.
    fn charge(&mut self, now: Instant) {
        let until = now.min(self.reported_at + defaults::RLQS_STALE_AFTER);
        let seconds = until.saturating_duration_since(self.charged_at).as_secs_f64();
        self.charged_at = self.charged_at.max(now);
        if let Some(gate) = &self.gate
            && self.rate > 0.0
            && seconds > 0.0
        {
            gate.report(Cost::saturating(self.rate * seconds));
        }
    }

    /// The assignment the bucket gets now; its gate looked up again (a reload may have
    /// replaced it; a key's lookup keeps it from being swept as idle).
    fn look(&mut self, plan: &Plan, domain: Option<&str>, entries: &Entries) -> RateLimitStrategy {
        let Some(limits) = domain.and_then(|d| plan.domains.get(d)) else {
            // As the RLS answers a domain it does not know: no limit applies.
            self.gate = None;
            return assign::allow_all();
        };
        let (gate, strategy) = assign::assignment(limits.meet(entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))));
        self.gate = gate;
        strategy
    }

    /// Answers `strategy` for the bucket, remembered as pushed at `now`.
    fn pushing(&mut self, entries: &Entries, strategy: RateLimitStrategy, now: Instant) -> BucketAction {
        self.pushed = Some((strategy, now));
        BucketAction {
            bucket_id: Some(assign::bucket_id(entries)),
            bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(assign::time_to_live()),
                rate_limit_strategy: Some(strategy),
            })),
        }
    }
}
