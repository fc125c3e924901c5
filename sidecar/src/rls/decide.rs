//! One ShouldRateLimit call decided: each descriptor's limit found and charged its hits, all or
//! nothing (refused by one limit, the others get their hits back), and the answer Envoy reads.

use std::{collections::HashSet, sync::Arc, time::Duration};

use sluice_proto::envoy::{
    config::core::v3::HeaderValue,
    extensions::common::ratelimit::v3::RateLimitDescriptor,
    service::ratelimit::v3::{
        RateLimitRequest, RateLimitResponse,
        rate_limit_response::{Code, DescriptorStatus, RateLimit},
    },
};
use sluice_ratelimit::{Limit, Quota};

use crate::{
    core::Cost,
    defaults,
    enforce::{DomainLimits, Gate, Met, Permits, pass},
    refusal::{rate_policy, rate_state},
};

/// An answer, or why the call is not one the service can answer (INVALID_ARGUMENT).
pub async fn decide(limits: Option<&DomainLimits>, call: &RateLimitRequest) -> Result<RateLimitResponse, String> {
    if call.domain.is_empty() {
        return Err("domain: must not be empty".into());
    }
    if call.descriptors.is_empty() || call.descriptors.len() > defaults::RLS_MAX_DESCRIPTORS {
        let n = call.descriptors.len();
        return Err(format!("descriptors: from 1 to {} per call, got {n}", defaults::RLS_MAX_DESCRIPTORS));
    }
    if let Some(i) = call.descriptors.iter().position(|d| d.entries.is_empty()) {
        return Err(format!("descriptors[{i}].entries: must not be empty"));
    }
    let Some(limits) = limits else {
        // As envoyproxy/ratelimit answers a domain it does not know: no limit applies.
        let statuses = call.descriptors.iter().map(|_| status(Code::Ok)).collect();
        return Ok(RateLimitResponse { overall_code: Code::Ok.into(), statuses, ..Default::default() });
    };
    let met: Vec<Met> = call.descriptors.iter().map(|d| limits.meet(entries(d))).collect();
    // A limit another applying limit replaces is not applied.
    let replaced: HashSet<&str> = (met.iter())
        .filter_map(|m| match m {
            Met::Limit(limit, _) | Met::TooLong(limit) if !limit.replaces.is_empty() => Some(&limit.replaces),
            _ => None,
        })
        .flatten()
        .map(String::as_str)
        .collect();
    let mut charged: Vec<(Arc<Gate>, Cost)> = Vec::new();
    let mut outcomes = Vec::with_capacity(met.len());
    let mut retry_after: Option<Duration> = None;
    for (m, d) in met.into_iter().zip(&call.descriptors) {
        let outcome = match m {
            Met::Nothing => Outcome::Free,
            Met::Limit(limit, _) if limit.name.as_deref().is_some_and(|n| replaced.contains(n)) => Outcome::Free,
            Met::Limit(_, None) => Outcome::Unlimited,
            // In shadow mode a key that does not fit is counted nowhere and answered OK.
            Met::TooLong(limit) if limit.shadow => Outcome::Free,
            Met::TooLong(limit) => Outcome::Over(limit, None),
            Met::Limit(limit, Some(gate)) => {
                let cost = hits(call, d);
                let admitted = if cost > gate.largest_cost() {
                    // More than the bucket ever holds: it could only be admitted into a debt
                    // that would hold every later call back.
                    gate.metrics.record_refused(limit.shadow);
                    limit.shadow
                } else {
                    let mut permits = Permits::holding(None);
                    let passed =
                        pass(&limit.id, std::slice::from_ref(&gate), cost, None, limit.shadow, &mut permits, |g, _| {
                            g.metrics.record_allowed();
                            g.metrics.record_cost(cost);
                        })
                        .await;
                    match passed {
                        Ok(()) => {
                            // A shadow limit over its rate was not charged: it gets nothing back.
                            if !limit.shadow {
                                charged.push((gate.clone(), cost));
                            }
                            true
                        }
                        Err(limited) => {
                            retry_after = Some(retry_after.map_or(limited.retry_after, |r| r.max(limited.retry_after)));
                            false
                        }
                    }
                };
                if admitted { Outcome::Under(limit, gate) } else { Outcome::Over(limit, Some(gate)) }
            }
        };
        outcomes.push(outcome);
    }
    let over = outcomes.iter().any(|o| matches!(o, Outcome::Over(..)));
    if over {
        for (gate, cost) in charged {
            gate.refund(cost);
        }
    }
    let statuses: Vec<DescriptorStatus> = outcomes.iter().map(Outcome::status).collect();
    let mut response =
        RateLimitResponse { overall_code: if over { Code::OverLimit } else { Code::Ok }.into(), ..Default::default() };
    if over {
        response.response_headers_to_add = headers(&outcomes, &statuses, retry_after.unwrap_or(defaults::RETRY_AFTER));
    }
    response.statuses = statuses;
    Ok(response)
}

/// What one descriptor came to.
enum Outcome<'a> {
    /// No limit applied to it.
    Free,
    Unlimited,
    /// Admitted (or over, in shadow mode).
    Under(&'a Limit, Arc<Gate>),
    /// Over its limit (no gate: its key would not fit in an id).
    Over(&'a Limit, Option<Arc<Gate>>),
}

impl Outcome<'_> {
    fn status(&self) -> DescriptorStatus {
        match self {
            Outcome::Free => status(Code::Ok),
            Outcome::Unlimited => DescriptorStatus { limit_remaining: u32::MAX, ..status(Code::Ok) },
            Outcome::Under(limit, gate) => limited(Code::Ok, limit, Some(gate)),
            Outcome::Over(limit, gate) => limited(Code::OverLimit, limit, gate.as_ref()),
        }
    }
}

fn status(code: Code) -> DescriptorStatus {
    DescriptorStatus { code: code.into(), ..Default::default() }
}

/// A limited descriptor's status: its limit as the file says it, and this instance's bucket:
/// the tokens left and the time until it is full again.
fn limited(code: Code, limit: &Limit, gate: Option<&Arc<Gate>>) -> DescriptorStatus {
    let (remaining, until_full) = gate.map_or((0.0, 0.0), |g| g.level());
    let until_full = Duration::try_from_secs_f64(until_full).unwrap_or(defaults::MAX_RETRY_AFTER);
    DescriptorStatus {
        code: code.into(),
        current_limit: limit.quota.map(|q| current_limit(limit, q)),
        limit_remaining: remaining.clamp(0.0, f64::from(u32::MAX)) as u32,
        duration_until_reset: Some(prost_types::Duration {
            seconds: i64::try_from(until_full.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(until_full.subsec_nanos()).unwrap_or(0),
        }),
    }
}

fn current_limit(limit: &Limit, quota: Quota) -> RateLimit {
    RateLimit {
        name: limit.name.clone().unwrap_or_default(),
        requests_per_unit: quota.requests_per_unit,
        unit: quota.unit as i32,
    }
}

/// `Retry-After` and the IETF RateLimit headers of the first limit the call was over.
fn headers(outcomes: &[Outcome], statuses: &[DescriptorStatus], retry_after: Duration) -> Vec<HeaderValue> {
    let header = |key: &str, value: String| HeaderValue { key: key.into(), value, ..Default::default() };
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    let mut out = vec![header("retry-after", seconds.to_string())];
    let first = outcomes.iter().zip(statuses).find_map(|(o, s)| match o {
        Outcome::Over(limit, _) => Some((limit, s)),
        _ => None,
    });
    if let Some((limit, status)) = first
        && let Some(q) = limit.quota
    {
        let reset = status.duration_until_reset.map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9);
        out.push(header("ratelimit-policy", rate_policy(&limit.id, f64::from(q.requests_per_unit), q.window())));
        out.push(header("ratelimit", rate_state(&limit.id, f64::from(status.limit_remaining), reset)));
    }
    out
}

/// The descriptor's own hits, else the call's (0 is 1, as Envoy means it).
fn hits(call: &RateLimitRequest, descriptor: &RateLimitDescriptor) -> Cost {
    let hits = descriptor.hits_addend.unwrap_or(u64::from(call.hits_addend.max(1)));
    Cost::saturating(hits as f64)
}

fn entries(descriptor: &RateLimitDescriptor) -> impl Iterator<Item = (&str, &str)> {
    descriptor.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()))
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
