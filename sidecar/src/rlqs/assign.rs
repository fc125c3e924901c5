//! What an RLQS bucket is and gets, without a runtime: a `BucketId` turned into descriptor
//! entries, and the rate a limit's gate holds now turned into the strategy Envoy enforces —
//! shaped for what Envoy 1.40 really does (see `docs/rlqs.md`): a token bucket with a whole
//! number of seconds between fills, never `requests_per_time_unit`.

use std::{collections::BTreeMap, sync::Arc};

use sluice_proto::envoy::{
    service::rate_limit_quota::v3::BucketId,
    r#type::v3::{
        RateLimitStrategy, TokenBucket,
        rate_limit_strategy::{BlanketRule, Strategy},
    },
};

use crate::{
    defaults,
    enforce::{Gate, Met},
};

/// A bucket's entries, sorted by key (a `BucketId` is a map: unordered).
pub type Entries = BTreeMap<String, String>;

/// The entries of `id`: at least one, and no empty key.
pub fn entries(id: Option<&BucketId>) -> Result<Entries, String> {
    let Some(id) = id.filter(|id| !id.bucket.is_empty()) else {
        return Err("bucket_id: must have at least one entry".into());
    };
    if id.bucket.keys().any(String::is_empty) {
        return Err("bucket_id: a key must not be empty".into());
    }
    Ok(id.bucket.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// `entries` as the `BucketId` to answer with.
pub fn bucket_id(entries: &Entries) -> BucketId {
    BucketId { bucket: entries.iter().map(|(k, v)| (k.clone(), v.clone())).collect() }
}

pub fn allow_all() -> RateLimitStrategy {
    RateLimitStrategy { strategy: Some(Strategy::BlanketRule(BlanketRule::AllowAll.into())) }
}

pub fn deny_all() -> RateLimitStrategy {
    RateLimitStrategy { strategy: Some(Strategy::BlanketRule(BlanketRule::DenyAll.into())) }
}

/// What a bucket that met `met` gets, and the gate its reported load is charged to (if any).
/// No limit, an `unlimited` one or a shadow one: `ALLOW_ALL` (a shadow limit's gate still
/// hears of the load). A key too long for a resource id: `DENY_ALL`, as the RLS refuses it
/// (`ALLOW_ALL` for a shadow limit).
/// Otherwise the token bucket of the rate in force (the lease, or the fallback).
pub fn assignment(met: Met) -> (Option<Arc<Gate>>, RateLimitStrategy) {
    match met {
        Met::Nothing | Met::Limit(_, None) => (None, allow_all()),
        Met::TooLong(limit) if limit.shadow => (None, allow_all()),
        Met::TooLong(_) => (None, deny_all()),
        Met::Limit(limit, Some(gate)) if limit.shadow => (Some(gate), allow_all()),
        Met::Limit(limit, Some(gate)) => {
            let window = limit.quota.map_or(1.0, |q| q.window());
            let strategy = strategy(gate.applied().capacity.get(), window);
            (Some(gate), strategy)
        }
    }
}

/// The strategy of `rate` requests a second with a bucket `window` seconds of it deep:
/// - no rate (0, or not a number): `DENY_ALL`; no limit (∞): `ALLOW_ALL`;
/// - otherwise `token_bucket`: `fill_interval` a whole number of seconds (Envoy 1.40 truncates
///   it, and lets everything through under a second), the shortest from the first at which a
///   fill holds a whole request whose rounding is within 2% of the rate (else the closest of
///   20), at most [`defaults::RLQS_MAX_FILL_SECONDS`]; `tokens_per_fill` the rate over it,
///   rounded (at least 1); `max_tokens` the bucket's depth as the gate's (`window × rate`, at
///   least 1 and at least a fill, which Envoy would otherwise cut).
pub fn strategy(rate: f64, window: f64) -> RateLimitStrategy {
    if rate.is_nan() || rate <= 0.0 {
        return deny_all();
    }
    if rate == f64::INFINITY {
        return allow_all();
    }
    let max = defaults::RLQS_MAX_FILL_SECONDS;
    let first = ((1.0 / rate).ceil() as u64).clamp(1, max);
    let error = |s: u64| {
        let exact = rate * s as f64;
        (exact.round().max(1.0) - exact).abs() / exact
    };
    let seconds = (first..=(first + 19).min(max)).find(|&s| error(s) <= 0.02).unwrap_or_else(|| {
        (first..=(first + 19).min(max)).min_by(|a, b| error(*a).total_cmp(&error(*b))).unwrap_or(first)
    });
    let per_fill = whole(rate * seconds as f64);
    let depth = whole(rate * window.max(0.0)).max(per_fill);
    RateLimitStrategy {
        strategy: Some(Strategy::TokenBucket(TokenBucket {
            max_tokens: depth,
            tokens_per_fill: Some(per_fill),
            fill_interval: Some(prost_types::Duration { seconds: seconds as i64, nanos: 0 }),
        })),
    }
}

/// `x` rounded into a u32, at least 1.
fn whole(x: f64) -> u32 {
    x.round().clamp(1.0, f64::from(u32::MAX)) as u32
}

/// `assignment_time_to_live`: whole seconds, never unset or 0 (Envoy 1.40 expires those at
/// once).
pub fn time_to_live() -> prost_types::Duration {
    let seconds = defaults::RLQS_ASSIGNMENT_TTL.as_secs().max(1);
    prost_types::Duration { seconds: i64::try_from(seconds).unwrap_or(i64::MAX), nanos: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(strategy: &RateLimitStrategy) -> (u32, u32, i64) {
        match &strategy.strategy {
            Some(Strategy::TokenBucket(b)) => {
                let fill = b.fill_interval.expect("fill_interval");
                assert_eq!(fill.nanos, 0, "whole seconds");
                (b.max_tokens, b.tokens_per_fill.expect("tokens_per_fill"), fill.seconds)
            }
            other => panic!("a token bucket, got {other:?}"),
        }
    }

    #[test]
    fn a_rate_is_a_token_bucket_filled_every_whole_second() {
        assert_eq!(bucket(&strategy(20.0, 1.0)), (20, 20, 1));
        // 600 a minute: a bucket a minute deep, 10 a second.
        assert_eq!(bucket(&strategy(10.0, 60.0)), (600, 10, 1));
        // 1.5 a second is 3 every 2 s, not 2 a second.
        assert_eq!(bucket(&strategy(1.5, 1.0)), (3, 3, 2));
        // 6 a minute: one every 10 s, a minute's worth deep.
        assert_eq!(bucket(&strategy(0.1, 60.0)), (6, 1, 10));
        // A sliver: one an hour at most rarely.
        assert_eq!(bucket(&strategy(1e-9, 1.0)), (1, 1, defaults::RLQS_MAX_FILL_SECONDS as i64));
        // Far above u32: clamped, not wrapped.
        assert_eq!(bucket(&strategy(1e12, 1.0)).0, u32::MAX);
    }

    #[test]
    fn the_fill_rounds_within_two_percent_when_it_can() {
        for rate in [0.3, 0.7, 1.1, 2.5, 3.3, 7.77, 19.4, 123.4] {
            let (_, per_fill, seconds) = bucket(&strategy(rate, 1.0));
            let given = f64::from(per_fill) / seconds as f64;
            assert!((given - rate).abs() / rate <= 0.02, "{rate}: {per_fill} per {seconds} s");
        }
    }

    #[test]
    fn no_rate_denies_all_and_no_limit_allows_all() {
        assert_eq!(strategy(0.0, 1.0), deny_all());
        assert_eq!(strategy(f64::NAN, 1.0), deny_all());
        assert_eq!(strategy(f64::INFINITY, 1.0), allow_all());
    }

    #[test]
    fn a_time_to_live_is_whole_seconds_and_never_zero() {
        let ttl = time_to_live();
        assert!(ttl.seconds >= 1 && ttl.nanos == 0);
    }

    #[test]
    fn bucket_ids_become_sorted_entries() {
        let id = BucketId { bucket: [("tenant", "a"), ("name", "sluice")].map(|(k, v)| (k.into(), v.into())).into() };
        let entries = entries(Some(&id)).expect("entries");
        let sorted: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(sorted, [("name", "sluice"), ("tenant", "a")]);
        assert_eq!(bucket_id(&entries), id);
        assert!(super::entries(None).is_err());
        assert!(super::entries(Some(&BucketId::default())).is_err());
        let empty_key = BucketId { bucket: [(String::new(), "x".to_owned())].into() };
        assert!(super::entries(Some(&empty_key)).is_err());
    }
}
