//! The sidecar's Prometheus metrics (SPEC §4.5): names, help texts, and the handles the data path
//! holds so that recording costs an atomic operation, not a registry lookup.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll, ready},
    time::Instant,
};

use http::Response;
use metrics::{
    Counter, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use pin_project_lite::pin_project;
use tower::Service;

use crate::{
    body::Body,
    defaults::{DURATION_BUCKETS, METRICS_UPKEEP_INTERVAL, STALE_GAUGE_TIMEOUT},
    gate::Applied,
    plan::ListenerPlan,
    stack::Exchange,
    sync,
};

const REQUESTS: &str = "sluice_sidecar_requests_total";
const WAIT: &str = "sluice_sidecar_wait_seconds";
const CAPACITY: &str = "sluice_sidecar_lease_capacity";
const WANTS: &str = "sluice_sidecar_wants";
const EXPIRY: &str = "sluice_sidecar_lease_expiry_timestamp_seconds";
const MODE: &str = "sluice_sidecar_mode";
const RPCS: &str = "sluice_sidecar_capacity_rpcs_total";
const UPSTREAM: &str = "sluice_sidecar_upstream_request_duration_seconds";
const RELOADS: &str = "sluice_sidecar_config_reloads_total";

/// Every mode a resource can be in; exactly one has the value 1.
pub const MODES: &[&str] =
    &["standalone", "pending", "leased", "fallback_safe", "fallback_optimistic", "fallback_pessimistic"];

/// Installs the process-wide recorder, with a thread of its own folding histogram samples into
/// their buckets (off the data path, scraped or not).
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets(DURATION_BUCKETS)
        .and_then(|b| b.idle_timeout(MetricKindMask::GAUGE, Some(STALE_GAUGE_TIMEOUT)).install_recorder())
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("sluice-metrics".into())
        .spawn(move || {
            loop {
                std::thread::sleep(METRICS_UPKEEP_INTERVAL);
                upkeep.run_upkeep();
            }
        })
        .map_err(|e| format!("cannot start the metrics upkeep thread: {e}"))?;
    describe_counter!(
        REQUESTS,
        "Requests charged to a resource, by decision (allowed, delayed, rejected, shadow_rejected)."
    );
    describe_histogram!(WAIT, Unit::Seconds, "Time delayed requests waited for capacity.");
    describe_gauge!(CAPACITY, "Capacity the resource's limiter enforces now (+Inf: no limit).");
    describe_gauge!(WANTS, "Capacity last asked for: the moving average of offered load with headroom.");
    describe_gauge!(EXPIRY, "Unix time the resource's lease expires.");
    describe_gauge!(MODE, "1 for the resource's current mode (leased, pending, standalone, fallback_*).");
    describe_counter!(RPCS, "RPCs to the capacity servers, by method and result.");
    describe_histogram!(UPSTREAM, Unit::Seconds, "Time until the upstream's response headers, by listener and status.");
    describe_counter!(RELOADS, "Configuration reloads, by result (success or failure).");
    // Shown from the start, so that an alert on failures has a series before the first reload.
    for result in ["success", "failure"] {
        counter!(RELOADS, "result" => result).absolute(0);
    }
    Ok(handle)
}

pub fn record_reload(ok: bool) {
    counter!(RELOADS, "result" => if ok { "success" } else { "failure" }).increment(1);
}

pub fn record_rpc(method: &'static str, ok: bool) {
    counter!(RPCS, "method" => method, "result" => if ok { "ok" } else { "error" }).increment(1);
}

/// One resource's series. The counters and the histogram are resolved once, for the data path;
/// the gauges are looked up each time they are set (seldom: on a change, a lease check or a
/// scrape), so that a series dropped as stale comes back when it is set again.
pub struct GateMetrics {
    pub allowed: Counter,
    pub delayed: Counter,
    pub rejected: Counter,
    pub shadow_rejected: Counter,
    pub wait: Histogram,
    resource: Arc<str>,
}

impl GateMetrics {
    pub fn new(id: &Arc<str>) -> GateMetrics {
        let resource = || id.to_string();
        let decision = |d: &'static str| counter!(REQUESTS, "resource" => resource(), "decision" => d);
        GateMetrics {
            allowed: decision("allowed"),
            delayed: decision("delayed"),
            rejected: decision("rejected"),
            shadow_rejected: decision("shadow_rejected"),
            wait: histogram!(WAIT, "resource" => resource()),
            resource: id.clone(),
        }
    }

    pub fn wants(&self, wants: f64) {
        gauge!(WANTS, "resource" => self.resource.clone()).set(wants);
    }

    pub fn applied(&self, applied: &Applied) {
        let resource = || self.resource.clone();
        gauge!(CAPACITY, "resource" => resource()).set(applied.capacity.get());
        gauge!(EXPIRY, "resource" => resource()).set(applied.expiry.map_or(0.0, |e| e as f64));
        for mode in MODES {
            gauge!(MODE, "resource" => resource(), "mode" => *mode).set(f64::from(u8::from(*mode == applied.mode)));
        }
    }
}

/// A listener's upstream latency histograms, one per status code, made on first use.
pub struct UpstreamTiming {
    listener: Arc<str>,
    by_status: Mutex<Vec<(u16, Histogram)>>,
}

impl UpstreamTiming {
    pub fn new(listener: Arc<str>) -> UpstreamTiming {
        UpstreamTiming { listener, by_status: Mutex::new(Vec::new()) }
    }

    fn record(&self, status: u16, seconds: f64) {
        let mut known = sync::lock(&self.by_status);
        let histogram = match known.iter().find(|(s, _)| *s == status) {
            Some((_, h)) => h,
            None => {
                let h = histogram!(UPSTREAM, "listener" => self.listener.to_string(), "status" => status.to_string());
                known.push((status, h));
                &known.last().expect("just pushed").1
            }
        };
        histogram.record(seconds);
    }
}

/// Tower layer above the proxy: times each forwarded request until its response headers.
#[derive(Clone)]
pub struct Measure<S> {
    inner: S,
}

impl<S> Measure<S> {
    pub fn layer() -> tower::layer::LayerFn<fn(S) -> Measure<S>> {
        tower::layer::layer_fn(|inner| Measure { inner })
    }
}

impl<S> Service<Exchange> for Measure<S>
where
    S: Service<Exchange, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Timed<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, exchange: Exchange) -> Timed<S::Future> {
        let listener = exchange.listener.clone();
        let start = Instant::now();
        Timed { answer: self.inner.call(exchange), listener, start }
    }
}

pin_project! {
    /// A forwarded request until its response headers, then recorded.
    pub struct Timed<F> {
        #[pin]
        answer: F,
        listener: Arc<ListenerPlan>,
        start: Instant,
    }
}

impl<F: Future<Output = Result<Response<Body>, Infallible>>> Future for Timed<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let Ok(response) = ready!(this.answer.poll(cx));
        this.listener.timing.record(response.status().as_u16(), this.start.elapsed().as_secs_f64());
        Poll::Ready(Ok(response))
    }
}
