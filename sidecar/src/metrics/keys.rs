//! The series of keys with series of their own (`metrics: per_key`): kept out of the
//! registry, which never forgets a series, and written into `/metrics` while the key lives.

use std::{
    fmt::Write,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use metrics::HistogramFn;
use metrics_exporter_prometheus::{PrometheusHandle, formatting::sanitize_label_value};
use sluice_http::sync;

use super::{CAPACITY, COST, EXPIRY, FALLBACK, Family, MODE, MODES, REFRESH, REQUESTS, RESOURCE_FAMILIES, WAIT, WANTS};
use crate::defaults::DURATION_BUCKETS;

/// The series of a key with series of its own: kept out of the registry, which never forgets
/// a counter, and written into `/metrics` by [`render`] while the key lives.
#[derive(Default)]
pub(super) struct KeySeries {
    /// Allowed, delayed, rejected, shadow-rejected.
    pub(super) decisions: [Arc<AtomicU64>; 4],
    pub(super) cost: Arc<AtomicU64>,
    pub(super) wait: Arc<Buckets>,
    pub(super) gauges: Mutex<Gauges>,
}

/// A resource's gauges as last set.
#[derive(Clone, Copy, Default)]
pub(super) struct Gauges {
    pub(super) capacity: f64,
    pub(super) wants: Option<f64>,
    pub(super) expiry: f64,
    pub(super) mode: &'static str,
    pub(super) refresh: Option<f64>,
    pub(super) fallback: f64,
}

/// A histogram over [`DURATION_BUCKETS`] in atomics: a sample in the first bucket it fits,
/// beyond the last in the `+Inf` one.
pub(super) struct Buckets {
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
pub(super) const DECISIONS: [&str; 4] = ["allowed", "delayed", "rejected", "shadow_rejected"];

/// The sample lines of the live keys' own series, one string per family of
/// [`RESOURCE_FAMILIES`], for [`render`].
#[derive(Default)]
pub struct KeyFamilies {
    lines: [String; RESOURCE_FAMILIES.len()],
}

impl KeySeries {
    pub(super) fn write(&self, resource: &str, families: &mut KeyFamilies) {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use metrics::{describe_counter, describe_gauge, gauge};
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;
    use crate::{
        core::{Applied, Capacity, Cost},
        metrics::{GateMetrics, KEYS},
    };

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
