//! The sidecar's Prometheus metrics (SPEC §4.5): names, help texts, and the handles the data path
//! holds so that recording costs an atomic operation, not a registry lookup.

use std::{
    fmt::Write,
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use http::Response;
use metrics::{
    Counter, Histogram, HistogramFn, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge,
    histogram,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, formatting::sanitize_label_value};
use metrics_util::MetricKindMask;
use pin_project_lite::pin_project;
use sluice_runtime::reload::ConfigStatus;
use tower::Service;

use crate::{
    core::Cost,
    defaults::{DURATION_BUCKETS, METRICS_UPKEEP_INTERVAL, STALE_GAUGE_TIMEOUT},
    gate::Applied,
    plan::ListenerPlan,
    respond::Refusal,
    stack::Exchange,
    sync,
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
    /// write-only): admitted at once, delayed, refused (shadow refusals included).
    decisions: [AtomicU64; 3],
    resource: Arc<str>,
    lease: Mutex<LeaseTimes>,
    /// Whether the resource's gauges are set: not for the keys of a keyed resource, whose
    /// counters go to the keyed resource's series, unless it has series per key.
    gauges: bool,
    /// A key's series of its own, when it has them.
    own: Option<Arc<KeySeries>>,
}

/// The series of a key with series of its own: kept out of the registry, which never forgets
/// a counter, and written into `/metrics` by [`render`] while the key lives.
#[derive(Default)]
pub struct KeySeries {
    /// Allowed, delayed, rejected, shadow-rejected.
    decisions: [Arc<AtomicU64>; 4],
    cost: Arc<AtomicU64>,
    wait: Arc<Buckets>,
    gauges: Mutex<Gauges>,
}

/// A resource's gauges as last set.
#[derive(Clone, Copy, Default)]
struct Gauges {
    capacity: f64,
    wants: Option<f64>,
    expiry: f64,
    mode: &'static str,
    refresh: Option<f64>,
    fallback: f64,
}

/// A histogram over [`DURATION_BUCKETS`] in atomics: a sample in the first bucket it fits,
/// beyond the last in the `+Inf` one.
struct Buckets {
    counts: [AtomicU64; DURATION_BUCKETS.len() + 1],
    /// The sum of the samples (an `f64`'s bits).
    sum: AtomicU64,
}

impl Default for Buckets {
    fn default() -> Buckets {
        Buckets { counts: std::array::from_fn(|_| AtomicU64::new(0)), sum: AtomicU64::new(0f64.to_bits()) }
    }
}

impl HistogramFn for Buckets {
    fn record(&self, value: f64) {
        let bucket = DURATION_BUCKETS.partition_point(|bound| *bound < value);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let add = |bits: u64| Some((f64::from_bits(bits) + value).to_bits());
        let _ = self.sum.fetch_update(Ordering::Relaxed, Ordering::Relaxed, add);
    }
}

/// The decisions' label values, in the order of [`KeySeries::decisions`].
const DECISIONS: [&str; 4] = ["allowed", "delayed", "rejected", "shadow_rejected"];

/// The sample lines of the live keys' own series, one string per family of
/// [`RESOURCE_FAMILIES`], for [`render`].
#[derive(Default)]
pub struct KeyFamilies {
    lines: [String; RESOURCE_FAMILIES.len()],
}

impl KeySeries {
    fn write(&self, resource: &str, families: &mut KeyFamilies) {
        let r = sanitize_label_value(resource);
        let [requests, wait, cost, capacity, wants, expiry, mode, refresh, fallback] = &mut families.lines;
        for (decision, count) in DECISIONS.iter().zip(&self.decisions) {
            let count = count.load(Ordering::Relaxed);
            let _ = writeln!(requests, "{REQUESTS}{{resource=\"{r}\",decision=\"{decision}\"}} {count}");
        }
        let _ = writeln!(cost, "{COST}{{resource=\"{r}\"}} {}", self.cost.load(Ordering::Relaxed));
        let mut below = 0;
        for (bound, count) in DURATION_BUCKETS.iter().zip(&self.wait.counts) {
            below += count.load(Ordering::Relaxed);
            let _ = writeln!(wait, "{WAIT}_bucket{{resource=\"{r}\",le=\"{bound}\"}} {below}");
        }
        let all = below + self.wait.counts[DURATION_BUCKETS.len()].load(Ordering::Relaxed);
        let sum = f64::from_bits(self.wait.sum.load(Ordering::Relaxed));
        let _ = writeln!(wait, "{WAIT}_bucket{{resource=\"{r}\",le=\"+Inf\"}} {all}");
        let _ = writeln!(wait, "{WAIT}_sum{{resource=\"{r}\"}} {sum}");
        let _ = writeln!(wait, "{WAIT}_count{{resource=\"{r}\"}} {all}");
        let g = *sync::lock(&self.gauges);
        let _ = writeln!(capacity, "{CAPACITY}{{resource=\"{r}\"}} {}", number(g.capacity));
        if let Some(w) = g.wants {
            let _ = writeln!(wants, "{WANTS}{{resource=\"{r}\"}} {}", number(w));
        }
        let _ = writeln!(expiry, "{EXPIRY}{{resource=\"{r}\"}} {}", g.expiry);
        for m in MODES {
            let _ = writeln!(mode, "{MODE}{{resource=\"{r}\",mode=\"{m}\"}} {}", u8::from(*m == g.mode));
        }
        if let Some(seconds) = g.refresh {
            let _ = writeln!(refresh, "{REFRESH}{{resource=\"{r}\"}} {seconds}");
        }
        let _ = writeln!(fallback, "{FALLBACK}{{resource=\"{r}\"}} {}", g.fallback);
    }
}

/// A sample's value as the exposition format writes it (`+Inf` for no limit).
fn number(x: f64) -> String {
    if x == f64::INFINITY { "+Inf".to_owned() } else { x.to_string() }
}

/// `/metrics`: the registry's series with the live keys' own series in their families (a
/// family's samples must follow its `# TYPE` line together).
pub fn render(handle: &PrometheusHandle, keys: KeyFamilies) -> String {
    let mut pending: Vec<(&Family, String)> =
        RESOURCE_FAMILIES.iter().zip(keys.lines).filter(|(_, lines)| !lines.is_empty()).collect();
    let recorded = handle.render();
    if pending.is_empty() {
        return recorded;
    }
    let mut out = String::with_capacity(recorded.len() + pending.iter().map(|(_, l)| l.len() + 200).sum::<usize>());
    // The lines of `family`, if any are pending, close it (before the blank line that ends it).
    let flush = |out: &mut String, family: Option<&str>, pending: &mut Vec<(&Family, String)>| {
        if let Some(at) = family.and_then(|name| pending.iter().position(|(f, _)| f.name == name)) {
            let blank = out.ends_with("\n\n");
            if blank {
                out.pop();
            }
            out.push_str(&pending.swap_remove(at).1);
            if blank {
                out.push('\n');
            }
        }
    };
    let mut current: Option<&str> = None;
    for line in recorded.lines() {
        let family =
            line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")).and_then(|l| l.split(' ').next());
        if family.is_some() && family != current {
            flush(&mut out, current, &mut pending);
            current = family;
        }
        out.push_str(line);
        out.push('\n');
    }
    flush(&mut out, current, &mut pending);
    for (Family { name, kind, help, .. }, lines) in pending {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{lines}");
    }
    out
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
        self.decisions[2].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests admitted at once, delayed and refused since the gate was made.
    pub fn decisions(&self) -> [u64; 3] {
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

impl<S, B> Service<Exchange> for Measure<S>
where
    S: Service<Exchange, Response = Response<B>, Error = Refusal>,
{
    type Response = Response<B>;
    type Error = Refusal;
    type Future = Timed<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, exchange: Exchange) -> Timed<S::Future> {
        let listener = exchange.listener.clone();
        let start = Instant::now();
        Timed { answer: self.inner.call(exchange), listener, start }
    }
}

pin_project! {
    /// A forwarded request until its response headers, then recorded; one that failed, with
    /// the status the sidecar answers it with.
    pub struct Timed<F> {
        #[pin]
        answer: F,
        listener: Arc<ListenerPlan>,
        start: Instant,
    }
}

impl<F: Future<Output = Result<Response<B>, Refusal>>, B> Future for Timed<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let answer = ready!(this.answer.poll(cx));
        let status = match &answer {
            Ok(response) => response.status(),
            Err(refusal) => refusal.status(),
        };
        this.listener.timing.record(status.as_u16(), this.start.elapsed().as_secs_f64());
        Poll::Ready(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Capacity;

    #[test]
    fn a_keys_own_series_join_their_families_and_leave_with_the_key() {
        let recorder = PrometheusBuilder::new().set_buckets(DURATION_BUCKETS).unwrap().build_recorder();
        let handle = recorder.handle();
        let (key, other): (Arc<str>, Arc<str>) = ("t/acme".into(), "orders".into());
        let own = GateMetrics::own(&key);
        metrics::with_local_recorder(&recorder, || {
            describe_counter!(REQUESTS, "requests");
            describe_gauge!(KEYS, "keys");
            GateMetrics::new(&other).record_allowed();
            gauge!(KEYS, "resource" => "t").set(1.0);
        });
        own.record_allowed();
        own.record_delayed(Duration::from_millis(3));
        own.record_delayed(Duration::from_secs(60));
        own.record_cost(Cost::new(2.5).unwrap());
        own.applied(&Applied { capacity: Capacity::UNLIMITED, mode: "leased", expiry: Some(7) });

        let mut families = KeyFamilies::default();
        own.write_own(&mut families);
        let text = render(&handle, families);
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let mut names: Vec<&str> = types.iter().map(|l| l.split(' ').nth(2).unwrap()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), types.len(), "one TYPE line per family:\n{text}");
        // Each family's samples follow its TYPE line, with no other family's in between.
        let family_of = |line: &str| {
            let name = line.split(['{', ' ']).next().unwrap();
            let names = RESOURCE_FAMILIES.iter().map(|f| f.name).chain([KEYS]);
            names.filter(|f| name.starts_with(f)).max_by_key(|f| f.len()).unwrap_or_else(|| panic!("{line}:\n{text}"))
        };
        let mut current = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                current = rest.split(' ').next().unwrap();
            } else if !line.starts_with('#') && !line.is_empty() {
                assert_eq!(family_of(line), current, "{line} outside its family:\n{text}");
            }
        }
        for line in [
            "sluice_sidecar_requests_total{resource=\"t/acme\",decision=\"allowed\"} 1",
            "sluice_sidecar_requests_total{resource=\"t/acme\",decision=\"delayed\"} 2",
            "sluice_sidecar_admitted_cost_total{resource=\"t/acme\"} 2",
            "sluice_sidecar_wait_seconds_bucket{resource=\"t/acme\",le=\"0.0025\"} 0",
            "sluice_sidecar_wait_seconds_bucket{resource=\"t/acme\",le=\"0.005\"} 1",
            "sluice_sidecar_wait_seconds_bucket{resource=\"t/acme\",le=\"30\"} 1",
            "sluice_sidecar_wait_seconds_bucket{resource=\"t/acme\",le=\"+Inf\"} 2",
            "sluice_sidecar_wait_seconds_count{resource=\"t/acme\"} 2",
            "sluice_sidecar_lease_capacity{resource=\"t/acme\"} +Inf",
            "sluice_sidecar_lease_expiry_timestamp_seconds{resource=\"t/acme\"} 7",
            "sluice_sidecar_mode{resource=\"t/acme\",mode=\"leased\"} 1",
            "sluice_sidecar_mode{resource=\"t/acme\",mode=\"pending\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        assert!(text.contains("# TYPE sluice_sidecar_wait_seconds histogram"), "a family of its own:\n{text}");

        drop(own);
        let text = render(&handle, KeyFamilies::default());
        assert!(!text.contains("t/acme"), "a dropped key's series are gone:\n{text}");
        assert!(text.contains("resource=\"orders\""));
    }
}
