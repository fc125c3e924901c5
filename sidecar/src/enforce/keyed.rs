//! A keyed resource on the data path: the core's [`KeyTable`] of gates behind a lock, one gate
//! per key, each leased (or, standalone, limited) as a resource of its own under the id
//! `<resource id>/<key>`. Keys unused for the resource's idle timeout are swept away and their
//! leases released.

use std::{
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use sluice_client::defaults::MAX_ID_BYTES;
use sluice_http::sync;
use tokio::sync::mpsc::UnboundedSender;

use super::gate::Gate;
use crate::{
    config::{KeyAttribute, Resource},
    core::{Applied, Capacity, Key, KeyTable, Placed, ResourceSpec, SafeKey, Seconds, TooLong},
    metrics::{GateMetrics, KeyFamilies, KeyedMetrics},
};

pub struct Keyed {
    pub id: Arc<str>,
    /// Fixed for the resource's life, as its kind: a reload that changes either makes a new one.
    pub settings: Resource,
    /// The attribute whose values are the keys, read on every request: taken out of
    /// `settings` once.
    per: KeyAttribute,
    state: Mutex<State>,
    /// Longest key that fits in an id.
    room: usize,
    cue: Option<UnboundedSender<Arc<str>>>,
    origin: Instant,
    /// Seconds since `origin` (f64 bits) as of the last sweep: the time of a key's use, so
    /// that the data path reads no clock for it.
    clock: AtomicU64,
    metrics: KeyedMetrics,
    /// Decisions of the keys dropped so far (admitted at once, delayed, refused, refused under
    /// shadow mode), for totals.
    retired: [AtomicU64; 4],
    dropped: AtomicU64,
}

struct State {
    table: KeyTable<Arc<Gate>>,
    /// The settings new keys take (a reload changes them in place).
    settings: Resource,
}

/// A keyed resource's figures for the status page.
pub struct KeyedFigures {
    pub live: usize,
    pub dropped: u64,
    /// Admitted at once, delayed, refused, refused under shadow mode: over every key, dropped
    /// ones included.
    pub decisions: [u64; 4],
}

impl Keyed {
    pub fn new(settings: Resource, cue: Option<UnboundedSender<Arc<str>>>) -> Keyed {
        let key = settings.key.as_ref().expect("a keyed resource");
        let per = key.per.clone();
        let id: Arc<str> = settings.id.as_str().into();
        let metrics = KeyedMetrics::new(&id);
        metrics.live(0);
        Keyed {
            room: MAX_ID_BYTES - settings.id.len() - 1,
            state: Mutex::new(State { table: KeyTable::new(key.max_keys), settings: settings.clone() }),
            per,
            settings,
            cue,
            origin: Instant::now(),
            clock: AtomicU64::new(0f64.to_bits()),
            metrics,
            retired: Default::default(),
            dropped: AtomicU64::new(0),
            id,
        }
    }

    /// Whether `settings` can be taken in place: the same kind and attribute.
    pub fn keeps(&self, settings: &Resource) -> bool {
        let per = |r: &Resource| r.key.as_ref().map(|k| (k.per.clone(), k.per_key_metrics));
        self.settings.kind == settings.kind && per(&self.settings) == per(settings)
    }

    /// Takes a reload's settings: every live key keeps its state and takes them as a fixed
    /// resource would; a lower `max_keys` applies to new values.
    pub fn reconfigure(&self, settings: &Resource) {
        let mut state = self.lock();
        if state.settings == *settings {
            return;
        }
        state.settings = settings.clone();
        state.table.set_max_keys(settings.key.as_ref().map_or(0, |k| k.max_keys));
        for (name, gate) in state.table.iter() {
            gate.reconfigure(&key_settings(settings, name));
        }
    }

    pub fn attribute(&self) -> &KeyAttribute {
        &self.per
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        sync::lock(&self.state)
    }

    /// The gate a request with this attribute value (`None`: none, or empty) is charged to.
    pub fn gate(&self, value: Option<&[u8]>) -> Result<Arc<Gate>, TooLong> {
        let key = match value {
            Some(v) if !v.is_empty() => Key::Value(SafeKey::encode(v, self.room)?),
            _ => Key::Missing,
        };
        let now = f64::from_bits(self.clock.load(Ordering::Relaxed));
        let mut state = self.lock();
        let State { table, settings } = &mut *state;
        let (gate, placed) = table.get(now, &key, |name| self.make(settings, name));
        let live = (placed != Placed::Live).then(|| table.len());
        drop(state);
        if placed == Placed::Overflow {
            self.metrics.overflowed();
        }
        if let Some(live) = live {
            self.metrics.live(live);
        }
        Ok(gate)
    }

    fn make(&self, settings: &Resource, name: &str) -> Arc<Gate> {
        let settings = key_settings(settings, name);
        let per_key = settings_per_key(&self.settings);
        let metrics =
            if per_key { GateMetrics::own(&settings.id.as_str().into()) } else { GateMetrics::shared(&self.id) };
        let fallback = self.cue.as_ref().map(|_| {
            // Until the lease client hears of the key, it holds to what the client would
            // enforce for a resource not yet answered for.
            let safe = settings.safe_capacity.unwrap_or(Capacity::UNLIMITED).get();
            Applied {
                capacity: Capacity::saturating(settings.when_unreachable.capacity(safe)),
                mode: "pending",
                expiry: None,
            }
        });
        let gate = Gate::key(settings, self.cue.clone(), metrics);
        if let Some(pending) = fallback {
            gate.apply(pending);
        }
        Arc::new(gate)
    }

    /// The live key of id `<resource id>/<key>`, if any.
    pub fn find(&self, id: &str) -> Option<Arc<Gate>> {
        let key = id.strip_prefix(&*self.id)?.strip_prefix('/')?;
        self.lock().table.find(key).cloned()
    }

    /// The live keys' gates.
    pub fn gates(&self) -> Vec<Arc<Gate>> {
        self.lock().table.iter().map(|(_, gate)| gate.clone()).collect()
    }

    /// What the lease client needs to lease one of the keys.
    pub fn spec(&self, id: &str) -> ResourceSpec {
        let settings = &self.lock().settings;
        ResourceSpec {
            id: id.to_owned(),
            priority: settings.priority,
            fallback: settings.when_unreachable,
            safe_capacity: settings.safe_capacity.unwrap_or(Capacity::UNLIMITED).get(),
        }
    }

    /// Drops the keys idle for the resource's idle timeout, with nothing in flight or queued;
    /// returns their ids.
    pub fn sweep(&self) -> Vec<String> {
        let now: Seconds = self.origin.elapsed().as_secs_f64();
        self.clock.store(now.to_bits(), Ordering::Relaxed);
        let (dropped, live) = {
            let mut state = self.lock();
            let idle = state.settings.key.as_ref().map_or(Duration::MAX, |k| k.idle_timeout).as_secs_f64();
            let dropped = state.table.drop_idle(now, idle, |gate| gate.load() != (0.0, 0));
            (dropped, state.table.len())
        };
        self.metrics.live(live);
        if dropped.is_empty() {
            return Vec::new();
        }
        self.metrics.dropped(dropped.len());
        self.dropped.fetch_add(dropped.len() as u64, Ordering::Relaxed);
        dropped
            .into_iter()
            .map(|(_, gate)| {
                for (total, count) in self.retired.iter().zip(gate.metrics.decisions()) {
                    total.fetch_add(count, Ordering::Relaxed);
                }
                gate.id.to_string()
            })
            .collect()
    }

    /// Sets the series of the resource (and of each key, with series per key) afresh, before
    /// a scrape; the live keys' own counters go into `families`.
    pub fn show_metrics(&self, families: &mut KeyFamilies) {
        let gates = self.gates();
        self.metrics.live(gates.len());
        if settings_per_key(&self.settings) {
            for gate in &gates {
                gate.show_metrics();
                gate.metrics.write_own(families);
            }
        }
    }

    pub fn figures(&self) -> KeyedFigures {
        let gates = self.gates();
        let mut decisions = self.retired.each_ref().map(|d| d.load(Ordering::Relaxed));
        for gate in &gates {
            for (total, count) in decisions.iter_mut().zip(gate.metrics.decisions()) {
                *total += count;
            }
        }
        KeyedFigures { live: gates.len(), dropped: self.dropped.load(Ordering::Relaxed), decisions }
    }
}

fn settings_per_key(settings: &Resource) -> bool {
    settings.key.as_ref().is_some_and(|k| k.per_key_metrics)
}

/// A key's settings: its keyed resource's, under its own id.
fn key_settings(keyed: &Resource, key: &str) -> Resource {
    Resource { id: format!("{}/{key}", keyed.id), key: None, ..keyed.clone() }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;
    use crate::{config, core::Cost};

    fn keyed(extra: &str) -> Keyed {
        let resource = format!(
            "resources:\n  - {{id: t, capacity: 1, burst: 1, per: {{header: x-tenant}}, max_keys: 2{extra}}}\n"
        );
        Keyed::new(config::for_test(&resource).resources.remove(0), None)
    }

    #[tokio::test]
    async fn each_key_has_its_own_bucket_and_values_beyond_max_keys_share_one() {
        let keyed = keyed("");
        let admit = |value: Option<&str>| {
            let gate = keyed.gate(value.map(str::as_bytes)).unwrap();
            let admitted = gate.admit(Cost::ONE, Duration::ZERO).now_or_never().expect("no wait").is_ok();
            (gate.id.to_string(), admitted)
        };
        assert_eq!(admit(Some("a")), ("t/a".into(), true));
        assert_eq!(admit(Some("a")), ("t/a".into(), false), "a's bucket is empty");
        assert_eq!(admit(Some("b c")), ("t/b%20c".into(), true), "b's is its own");
        assert_eq!(admit(None), ("t/!missing".into(), true));
        assert_eq!(admit(Some("")), ("t/!missing".into(), false), "empty is missing");
        assert_eq!(admit(Some("c")), ("t/!overflow".into(), true));
        assert_eq!(admit(Some("d")), ("t/!overflow".into(), false), "the overflow key is shared");
        assert_eq!(keyed.figures().live, 4);
        assert!(keyed.gate(Some("x".repeat(MAX_ID_BYTES).as_bytes())).is_err(), "no room in the id");
        assert!(keyed.find("t/a").is_some() && keyed.find("t/c").is_none() && keyed.find("ta").is_none());
    }
}
