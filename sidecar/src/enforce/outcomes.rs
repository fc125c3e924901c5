//! What the calls forwarded for one resource met at the service behind it: counted on the data
//! path with a few atomic operations, taken as the proto's `Signals` with each request for the
//! resource's lease, so that an adaptive resource's server learns its capacity from them
//! (docs/sidecar.md, Signals).

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use http::{HeaderMap, StatusCode};
use sluice_proto::Signals;

/// The counts since the last [`Outcomes::take`]; latencies in whole microseconds.
pub struct Outcomes {
    completed: AtomicU64,
    errors: AtomicU64,
    latency_micros: AtomicU64,
    /// `u64::MAX`: none yet.
    min_micros: AtomicU64,
    /// Microseconds after the gate's origin of the last take.
    since_micros: AtomicU64,
}

impl Default for Outcomes {
    fn default() -> Outcomes {
        Outcomes {
            completed: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency_micros: AtomicU64::new(0),
            min_micros: AtomicU64::new(u64::MAX),
            since_micros: AtomicU64::new(0),
        }
    }
}

/// Whether an answer says the service is overloaded: an HTTP 5xx (the sidecar's own 502 and 504
/// for a failed or timed-out upstream included), or a gRPC UNAVAILABLE or RESOURCE_EXHAUSTED in
/// the headers of a trailers-only answer. A 429 is not: services send it for their own per-user
/// limits as often as for overload.
pub fn is_overload(status: StatusCode, headers: Option<&HeaderMap>) -> bool {
    const UNAVAILABLE: &[u8] = b"14";
    const RESOURCE_EXHAUSTED: &[u8] = b"8";
    status.is_server_error()
        || headers
            .and_then(|h| h.get("grpc-status"))
            .is_some_and(|v| v.as_bytes() == UNAVAILABLE || v.as_bytes() == RESOURCE_EXHAUSTED)
}

impl Outcomes {
    pub fn record(&self, latency: Duration, overload: bool) {
        self.completed.fetch_add(1, Ordering::Relaxed);
        if overload {
            self.errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency_micros.fetch_add(micros, Ordering::Relaxed);
        self.min_micros.fetch_min(micros, Ordering::Relaxed);
    }

    /// The signals since the last take (`origin` is the gate's), counting anew from `now`. A
    /// call recorded while this runs may land in either take, never in both.
    pub fn take(&self, origin: Instant, now: Instant) -> Signals {
        let now_micros = u64::try_from(now.saturating_duration_since(origin).as_micros()).unwrap_or(u64::MAX);
        let since = self.since_micros.swap(now_micros, Ordering::Relaxed);
        let seconds = now_micros.saturating_sub(since) as f64 / 1e6;
        let completed = self.completed.swap(0, Ordering::Relaxed);
        let errors = self.errors.swap(0, Ordering::Relaxed).min(completed);
        let latency = self.latency_micros.swap(0, Ordering::Relaxed) as f64 / 1e6;
        let min = self.min_micros.swap(u64::MAX, Ordering::Relaxed);
        Signals {
            completed: Some(i64::try_from(completed).unwrap_or(i64::MAX)),
            errors: Some(i64::try_from(errors).unwrap_or(i64::MAX)),
            latency_sum: Some(latency),
            min_latency: (min != u64::MAX).then(|| min as f64 / 1e6),
            seconds: Some(seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_take_sums_the_calls_since_the_last_and_starts_anew() {
        let outcomes = Outcomes::default();
        let origin = Instant::now();
        outcomes.record(Duration::from_millis(10), false);
        outcomes.record(Duration::from_millis(30), false);
        outcomes.record(Duration::from_secs(5), true);
        let s = outcomes.take(origin, origin + Duration::from_secs(2));
        assert_eq!((s.completed, s.errors, s.seconds), (Some(3), Some(1), Some(2.0)));
        assert_eq!(s.latency_sum, Some(0.04), "errors' latencies are not the service's");
        assert_eq!(s.min_latency, Some(0.01));
        let s = outcomes.take(origin, origin + Duration::from_secs(3));
        assert_eq!((s.completed, s.min_latency, s.seconds), (Some(0), None, Some(1.0)));
    }

    #[test]
    fn overload_is_a_5xx_or_a_grpc_overload_status() {
        let mut grpc = HeaderMap::new();
        grpc.insert("grpc-status", "14".parse().unwrap());
        assert!(is_overload(StatusCode::OK, Some(&grpc)));
        grpc.insert("grpc-status", "8".parse().unwrap());
        assert!(is_overload(StatusCode::OK, Some(&grpc)));
        grpc.insert("grpc-status", "5".parse().unwrap());
        assert!(!is_overload(StatusCode::OK, Some(&grpc)));
        assert!(is_overload(StatusCode::GATEWAY_TIMEOUT, None));
        assert!(!is_overload(StatusCode::TOO_MANY_REQUESTS, None));
    }
}
