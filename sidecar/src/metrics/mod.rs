//! The sidecar's Prometheus metrics (SPEC §4.5): names, help texts, and the handles the data path
//! holds so that recording costs an atomic operation, not a registry lookup; the series of keys
//! with series of their own are the keys' ([`keys`]).

mod keys;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use metrics::{
    Counter, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use sluice_http::sync;
use sluice_runtime::reload::ConfigStatus;

use keys::{DECISIONS, Gauges, KeySeries};
pub use keys::{KeyFamilies, render};

use crate::{
    core::{Applied, Cost},
    defaults::{DURATION_BUCKETS, METRICS_UPKEEP_INTERVAL, STALE_GAUGE_TIMEOUT},
};

const REQUESTS: &str = "sluice_sidecar_requests_total";
const WAIT: &str = "sluice_sidecar_wait_seconds";
const COST: &str = "sluice_sidecar_admitted_cost_total";
const CAPACITY: &str = "sluice_sidecar_lease_capacity";
const WANTS: &str = "sluice_sidecar_wants";
const EXPIRY: &str = "sluice_sidecar_lease_expiry_timestamp_seconds";
const MODE: &str = "sluice_sidecar_mode";
const RPCS: &str = "sluice_sidecar_capacity_rpcs_total";
const UPSTREAM: &str = "sluice_sidecar_upstream_request_duration_seconds";
const RELOADS: &str = "sluice_sidecar_config_reloads_total";
const RELOAD_OK: &str = "sluice_sidecar_config_last_reload_successful";
const REFRESH: &str = "sluice_sidecar_refresh_interval_seconds";
const FALLBACK: &str = "sluice_sidecar_fallback_duration_seconds";
const KEYS: &str = "sluice_sidecar_keys";
const KEYS_DROPPED: &str = "sluice_sidecar_keys_dropped_total";
const KEY_OVERFLOWS: &str = "sluice_sidecar_key_overflows_total";
const SHED: &str = "sluice_sidecar_requests_shed_total";
const RLS_CALLS: &str = "sluice_sidecar_rls_calls_total";

/// A family of series a resource has, and so a key with series of its own.
struct Family {
    name: &'static str,
    kind: &'static str,
    unit: Option<Unit>,
    help: &'static str,
}

/// The families of a resource's series, in the order of [`KeyFamilies`]' lines.
const RESOURCE_FAMILIES: [Family; 9] = [
    Family {
        name: REQUESTS,
        kind: "counter",
        unit: None,
        help: "Requests charged to a resource, by decision (allowed, delayed, rejected, shadow_rejected).",
    },
    Family {
        name: WAIT,
        kind: "histogram",
        unit: Some(Unit::Seconds),
        help: "Time delayed requests waited for capacity.",
    },
    Family {
        name: COST,
        kind: "counter",
        unit: None,
        help: "Cost admitted by the resource: requests' costs, and bytes for rules that charge bytes.",
    },
    Family {
        name: CAPACITY,
        kind: "gauge",
        unit: None,
        help: "Capacity the resource's limiter enforces now (+Inf: no limit).",
    },
    Family {
        name: WANTS,
        kind: "gauge",
        unit: None,
        help: "Capacity last asked for: the moving average of offered load with headroom.",
    },
    Family { name: EXPIRY, kind: "gauge", unit: None, help: "Unix time the resource's lease expires." },
    Family {
        name: MODE,
        kind: "gauge",
        unit: None,
        help: "1 for the resource's current mode (leased, pending, standalone, fallback_*).",
    },
    Family {
        name: REFRESH,
        kind: "gauge",
        unit: Some(Unit::Seconds),
        help: "Refresh interval of the resource's latest lease, kept while it lives on its fallback.",
    },
    Family {
        name: FALLBACK,
        kind: "gauge",
        unit: Some(Unit::Seconds),
        help: "How long the resource has lived on its fallback (asked, and no valid lease); 0 otherwise.",
    },
];

/// Every mode a resource can be in; exactly one has the value 1.
pub const MODES: &[&str] =
    &["standalone", "pending", "leased", "fallback_safe", "fallback_optimistic", "fallback_pessimistic", "denied"];

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
    for Family { name, kind, unit, help } in RESOURCE_FAMILIES {
        match (kind, unit) {
            ("counter", _) => describe_counter!(name, help),
            ("histogram", Some(unit)) => describe_histogram!(name, unit, help),
            (_, Some(unit)) => describe_gauge!(name, unit, help),
            _ => describe_gauge!(name, help),
        }
    }
    describe_counter!(RPCS, "RPCs to the capacity servers, by method and result.");
    describe_histogram!(UPSTREAM, Unit::Seconds, "Time until the upstream's response headers, by listener and status.");
    describe_counter!(RELOADS, "Configuration reloads, by result (success or failure).");
    describe_counter!(SHED, "Requests refused (503) because the listener had its max_requests in flight.");
    // Shown from the start, so that an alert on failures has a series before the first reload.
    for result in ["success", "failure"] {
        counter!(RELOADS, "result" => result).absolute(0);
    }
    describe_counter!(
        RLS_CALLS,
        "Rate limit service calls (ShouldRateLimit), by domain (`unknown` for one not configured) and answer \
         (ok, over_limit, invalid)."
    );
    describe_gauge!(RELOAD_OK, "0 while the last change of the configuration file was rejected, else 1.");
    describe_gauge!(KEYS, "Live keys of a keyed resource, its shared keys (no value, overflow) included.");
    describe_counter!(KEYS_DROPPED, "Keys of a keyed resource dropped after their idle timeout.");
    describe_counter!(
        KEY_OVERFLOWS,
        "Requests a keyed resource charged to its shared overflow key: their value found max_keys keys live."
    );
    Ok(handle)
}

/// Sets the configuration gauge, just before /metrics is rendered.
pub fn publish_config(config: &ConfigStatus) {
    gauge!(RELOAD_OK).set(f64::from(u8::from(config.rejected.is_none())));
}

pub fn record_reload(ok: bool) {
    counter!(RELOADS, "result" => if ok { "success" } else { "failure" }).increment(1);
}

pub fn record_shed(listener: &str) {
    counter!(SHED, "listener" => listener.to_owned()).increment(1);
}

/// One ShouldRateLimit call answered: `domain` is a configured domain's name, or `None`.
pub fn record_rls(domain: Option<&str>, code: &'static str) {
    counter!(RLS_CALLS, "domain" => domain.unwrap_or("unknown").to_owned(), "code" => code).increment(1);
}

pub fn record_rpc(method: &'static str, ok: bool) {
    counter!(RPCS, "method" => method, "result" => if ok { "ok" } else { "error" }).increment(1);
}

/// One resource's series. The counters and the histogram are resolved once, for the data path;
/// the gauges are looked up each time they are set (seldom: on a change, a lease check or a
/// scrape), so that a series dropped as stale comes back when it is set again.
pub struct GateMetrics {
    allowed: Counter,
    delayed: Counter,
    rejected: Counter,
    shadow_rejected: Counter,
    wait: Histogram,
    cost: Counter,
    /// The admitted cost as an exact sum (an `f64`'s bits): costs may be fractions, and the
    /// counter shows the whole units of the sum rather than each cost rounded.
    cost_sum: AtomicU64,
    /// The same decisions counted where the status page can read them back (a `Counter` is
    /// write-only): admitted at once, delayed, refused, and let through under shadow mode that
    /// would have been refused.
    decisions: [AtomicU64; 4],
    resource: Arc<str>,
    lease: Mutex<LeaseTimes>,
    /// Whether the resource's gauges are set: not for the keys of a keyed resource, whose
    /// counters go to the keyed resource's series, unless it has series per key.
    gauges: bool,
    /// A key's series of its own, when it has them.
    own: Option<Arc<KeySeries>>,
}

/// What the fallback alert needs to know of a resource's leases.
#[derive(Default)]
struct LeaseTimes {
    /// The latest lease's, in seconds.
    refresh_interval: Option<i64>,
    /// Since when the resource lives on its fallback.
    fallback_since: Option<Instant>,
}

impl GateMetrics {
    pub fn new(id: &Arc<str>) -> GateMetrics {
        let resource = || id.to_string();
        let decision = |d: &'static str| counter!(REQUESTS, "resource" => resource(), "decision" => d);
        let counters = DECISIONS.map(decision);
        let (wait, cost) = (histogram!(WAIT, "resource" => resource()), counter!(COST, "resource" => resource()));
        GateMetrics::recording(id, counters, wait, cost, None)
    }

    /// A key's: its decisions counted in `keyed`'s series, and no gauges.
    pub fn shared(keyed: &Arc<str>) -> GateMetrics {
        GateMetrics { gauges: false, ..GateMetrics::new(keyed) }
    }

    /// A key's with series of its own (`metrics: per_key`), which go when it goes (see
    /// [`KeySeries`]).
    pub fn own(id: &Arc<str>) -> GateMetrics {
        let series = Arc::new(KeySeries::default());
        let counters = series.decisions.each_ref().map(|d| Counter::from_arc(d.clone()));
        let (wait, cost) = (Histogram::from_arc(series.wait.clone()), Counter::from_arc(series.cost.clone()));
        GateMetrics::recording(id, counters, wait, cost, Some(series))
    }

    fn recording(
        id: &Arc<str>,
        [allowed, delayed, rejected, shadow_rejected]: [Counter; 4],
        wait: Histogram,
        cost: Counter,
        own: Option<Arc<KeySeries>>,
    ) -> GateMetrics {
        GateMetrics {
            allowed,
            delayed,
            rejected,
            shadow_rejected,
            wait,
            cost,
            cost_sum: AtomicU64::new(0f64.to_bits()),
            decisions: Default::default(),
            resource: id.clone(),
            lease: Mutex::new(LeaseTimes::default()),
            gauges: true,
            own,
        }
    }

    /// Writes a key's own series (see [`GateMetrics::own`]) into `families`.
    pub fn write_own(&self, families: &mut KeyFamilies) {
        if let Some(series) = &self.own {
            series.write(&self.resource, families);
        }
    }

    /// A lease came with this refresh interval (shown at the next scrape).
    pub fn refresh_interval(&self, seconds: i64) {
        sync::lock(&self.lease).refresh_interval = Some(seconds);
    }

    /// A request admitted at once.
    pub fn record_allowed(&self) {
        self.allowed.increment(1);
        self.decisions[0].fetch_add(1, Ordering::Relaxed);
    }

    /// A request admitted after waiting `waited`.
    pub fn record_delayed(&self, waited: Duration) {
        self.delayed.increment(1);
        self.wait.record(waited.as_secs_f64());
        self.decisions[1].fetch_add(1, Ordering::Relaxed);
    }

    /// Cost the resource admitted: a request's, or a body's bytes as they pass.
    pub fn record_cost(&self, cost: Cost) {
        let add = |bits: u64| Some((f64::from_bits(bits) + cost.get()).to_bits());
        if let Ok(before) = self.cost_sum.fetch_update(Ordering::Relaxed, Ordering::Relaxed, add) {
            let before = f64::from_bits(before);
            // The whole units this cost completes.
            self.cost.increment(((before + cost.get()).floor() - before.floor()) as u64);
        }
    }

    /// A request refused, or one let through under `shadow` that would have been.
    pub fn record_refused(&self, shadow: bool) {
        match shadow {
            true => self.shadow_rejected.increment(1),
            false => self.rejected.increment(1),
        }
        self.decisions[if shadow { 3 } else { 2 }].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests admitted at once, delayed, refused and shadow-refused since the gate was made.
    pub fn decisions(&self) -> [u64; 4] {
        self.decisions.each_ref().map(|d| d.load(Ordering::Relaxed))
    }

    pub fn wants(&self, wants: f64) {
        match (&self.own, self.gauges) {
            (Some(series), _) => sync::lock(&series.gauges).wants = Some(wants),
            (None, true) => gauge!(WANTS, "resource" => self.resource.clone()).set(wants),
            (None, false) => {}
        }
    }

    pub fn applied(&self, applied: &Applied) {
        if !self.gauges {
            return;
        }
        // Called at every change of mode (and at every scrape), so the move to the fallback
        // is seen as it happens.
        let mut lease = sync::lock(&self.lease);
        let since = lease.fallback_since;
        lease.fallback_since = applied.mode.starts_with("fallback").then(|| since.unwrap_or_else(Instant::now));
        let shown = Gauges {
            capacity: applied.capacity.get(),
            wants: None,
            expiry: applied.expiry.map_or(0.0, |e| e as f64),
            mode: applied.mode,
            refresh: lease.refresh_interval.map(|seconds| seconds as f64),
            fallback: lease.fallback_since.map_or(0.0, |since| since.elapsed().as_secs_f64()),
        };
        drop(lease);
        if let Some(series) = &self.own {
            let mut gauges = sync::lock(&series.gauges);
            *gauges = Gauges { wants: gauges.wants, ..shown };
            return;
        }
        let resource = || self.resource.clone();
        gauge!(CAPACITY, "resource" => resource()).set(shown.capacity);
        gauge!(EXPIRY, "resource" => resource()).set(shown.expiry);
        for mode in MODES {
            gauge!(MODE, "resource" => resource(), "mode" => *mode).set(f64::from(u8::from(*mode == shown.mode)));
        }
        gauge!(FALLBACK, "resource" => resource()).set(shown.fallback);
        if let Some(seconds) = shown.refresh {
            gauge!(REFRESH, "resource" => resource()).set(seconds);
        }
    }
}

/// A keyed resource's own series.
pub struct KeyedMetrics {
    resource: Arc<str>,
    dropped: Counter,
    overflows: Counter,
}

impl KeyedMetrics {
    pub fn new(id: &Arc<str>) -> KeyedMetrics {
        let (dropped, overflows) = (
            counter!(KEYS_DROPPED, "resource" => id.to_string()),
            counter!(KEY_OVERFLOWS, "resource" => id.to_string()),
        );
        // Shown from the start: an alert on overflows needs a series before the first one.
        dropped.increment(0);
        overflows.increment(0);
        KeyedMetrics { resource: id.clone(), dropped, overflows }
    }

    pub fn live(&self, keys: usize) {
        gauge!(KEYS, "resource" => self.resource.clone()).set(keys as f64);
    }

    pub fn dropped(&self, keys: usize) {
        self.dropped.increment(keys as u64);
    }

    pub fn overflowed(&self) {
        self.overflows.increment(1);
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

    pub fn record(&self, status: u16, seconds: f64) {
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
