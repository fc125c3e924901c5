//! What `/debug/status` shows: the sidecar's listeners, resources, leases and demand, as JSON or
//! as a small HTML page.

use std::fmt::Write;

use serde::Serialize;
use sluice_runtime::{
    chart::{CAPACITY_COLOR, CHART_STYLE, Chart, Line, number},
    defaults::STATUS_REFRESH_SECONDS,
    history::{History, Ring, Sample},
    html::escape,
    reload::ConfigStatus,
    when::{date, date_and_age, span},
};

use std::sync::Arc;

use super::leasing::Contact;
use crate::{
    config::KeyAttribute,
    core::Kind,
    defaults::STATUS_BUSIEST_KEYS,
    enforce::{Gate, Keyed},
    plan::{Plan, Target},
};

/// What is charted per resource, in this order: the capacity enforced (NaN: no limit), then the
/// requests admitted at once, delayed, refused and refused under shadow mode so far; the chart
/// draws the counts' rates.
pub type GateHistory = History<5>;

/// Refusals under shadow mode: they pass, so not the refused red.
const SHADOW_COLOR: &str = "#9467bd";

/// A resource's figures for [`GateHistory`].
pub fn figures(gate: &Gate) -> [f64; 5] {
    let capacity = gate.applied().capacity;
    let [admitted, delayed, refused, shadow] = gate.metrics.decisions().map(|n| n as f64);
    [if capacity.is_limited() { capacity.get() } else { f64::NAN }, admitted, delayed, refused, shadow]
}

/// A keyed resource's figures for [`GateHistory`]: its keys' requests together (dropped keys'
/// included); no capacity, each key having its own.
pub fn keyed_figures(keyed: &Keyed) -> [f64; 5] {
    let [admitted, delayed, refused, shadow] = keyed.figures().decisions.map(|n| n as f64);
    [f64::NAN, admitted, delayed, refused, shadow]
}

#[derive(Serialize)]
pub struct SidecarStatus {
    /// Unix time the status was taken.
    pub now: i64,
    pub client_id: String,
    /// The capacity servers; empty in standalone mode.
    pub servers: Vec<String>,
    /// How they answer; `null` in standalone mode.
    pub contact: Option<Contact>,
    pub config: ConfigStatus,
    pub listeners: Vec<ListenerStatus>,
    /// The fixed resources.
    pub resources: Vec<ResourceStatus>,
    pub keyed: Vec<KeyedStatus>,
}

/// A keyed resource: its keys in all, and the busiest of them.
#[derive(Serialize)]
pub struct KeyedStatus {
    pub id: String,
    pub kind: &'static str,
    /// The attribute whose value names the key, e.g. `header x-tenant`.
    pub per: String,
    pub max_keys: usize,
    /// Live keys, the shared ones (`!missing`, `!overflow`) included.
    pub keys: usize,
    /// Keys dropped after their idle timeout.
    pub dropped: u64,
    /// Requests over every key, dropped keys included.
    pub admitted: u64,
    pub delayed: u64,
    pub refused: u64,
    pub shadow: u64,
    /// The busiest keys by recent demand (wants), busiest first.
    pub busiest: Vec<ResourceStatus>,
}

#[derive(Serialize)]
pub struct ListenerStatus {
    pub name: String,
    pub address: String,
    /// The fixed upstream, or `host → upstream` routes.
    pub routes: Vec<String>,
    pub rules: usize,
}

#[derive(Serialize)]
pub struct ResourceStatus {
    pub id: String,
    pub kind: &'static str,
    pub mode: &'static str,
    /// `null`: no limit.
    pub capacity: Option<f64>,
    pub lease_expiry: Option<i64>,
    pub wants: f64,
    pub in_flight: f64,
    pub queued: usize,
    pub used: bool,
    /// Requests since the resource's gate was made (a reload keeps it unless the kind
    /// changes): admitted at once, delayed, refused, and let through under shadow mode that
    /// would have been refused.
    pub admitted: u64,
    pub delayed: u64,
    pub refused: u64,
    pub shadow: u64,
}

pub fn snapshot(
    plan: &Plan,
    client_id: &str,
    config_status: ConfigStatus,
    contact: Option<Contact>,
    now: i64,
) -> SidecarStatus {
    let config = &plan.config;
    let listeners = config
        .listeners
        .iter()
        .zip(&plan.listeners)
        .map(|(l, p)| ListenerStatus {
            name: l.name.clone(),
            address: l.address.to_string(),
            routes: match &p.target {
                Target::Fixed(u) => vec![u.config().url.to_string()],
                Target::ByHost(hosts) => {
                    let mut routes: Vec<String> =
                        hosts.iter().map(|(h, u)| format!("{h} → {}", u.config().url)).collect();
                    routes.sort();
                    routes
                }
            },
            rules: config.rules.iter().filter(|r| r.matcher.listener.as_ref().is_none_or(|n| n == &l.name)).count(),
        })
        .collect();
    let resources = plan.gates.iter().map(|g| resource(g)).collect();
    let keyed = plan.keyed.iter().map(|k| keyed(k)).collect();
    SidecarStatus {
        now,
        client_id: client_id.to_owned(),
        servers: config.server.as_ref().map_or_else(Vec::new, |s| s.addresses.clone()),
        contact,
        config: config_status,
        listeners,
        resources,
        keyed,
    }
}

fn kind(kind: Kind) -> &'static str {
    match kind {
        Kind::Rate => "rate",
        Kind::Concurrency => "concurrency",
    }
}

fn resource(g: &Gate) -> ResourceStatus {
    let applied = g.applied();
    let (in_flight, queued) = g.load();
    let [admitted, delayed, refused, shadow] = g.metrics.decisions();
    ResourceStatus {
        id: g.id.to_string(),
        kind: kind(g.kind),
        mode: applied.mode,
        capacity: applied.capacity.is_limited().then_some(applied.capacity.get()),
        lease_expiry: applied.expiry,
        wants: g.wants(),
        in_flight,
        queued,
        used: g.used(),
        admitted,
        delayed,
        refused,
        shadow,
    }
}

fn keyed(k: &Keyed) -> KeyedStatus {
    let mut by_demand: Vec<(f64, Arc<Gate>)> = k.gates().into_iter().map(|g| (g.wants(), g)).collect();
    let busiest = STATUS_BUSIEST_KEYS.min(by_demand.len());
    if busiest > 0 {
        by_demand.select_nth_unstable_by(busiest - 1, |a, b| b.0.total_cmp(&a.0));
    }
    by_demand.truncate(busiest);
    by_demand.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
    let figures = k.figures();
    let [admitted, delayed, refused, shadow] = figures.decisions;
    let spec = k.settings.key.as_ref().expect("a keyed resource");
    KeyedStatus {
        id: k.id.to_string(),
        kind: kind(k.settings.kind),
        per: match &spec.per {
            KeyAttribute::Header(name) => format!("header {name}"),
            KeyAttribute::PathSegment(n) => format!("path_segment {n}"),
            KeyAttribute::Query(name) => format!("query {name}"),
            KeyAttribute::GrpcService => "grpc service".into(),
            KeyAttribute::GrpcMethod => "grpc method".into(),
            KeyAttribute::Method => "method".into(),
            KeyAttribute::Host => "host".into(),
            KeyAttribute::Descriptor => "rate limit descriptor".into(),
        },
        max_keys: spec.max_keys,
        keys: figures.live,
        dropped: figures.dropped,
        admitted,
        delayed,
        refused,
        shadow,
        busiest: by_demand.iter().map(|(_, g)| resource(g)).collect(),
    }
}

/// `/debug/status`: the sidecar, charts of its resources' last minutes and tables. `history`
/// was recorded on the clock of `end`, the page's time.
pub fn html(status: &SidecarStatus, history: &GateHistory, end: f64) -> String {
    let mut page = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{STATUS_REFRESH_SECONDS}\"><title>sluice-sidecar</title>\
         <style>body{{font-family:sans-serif}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px}}\
         .unreachable{{background:#d62728;color:#fff;padding:4px 8px}}{CHART_STYLE}</style>\
         </head><body><h1>sluice-sidecar</h1>"
    );
    if let Some(contact) = status.contact.as_ref().filter(|c| c.failed_calls > 0) {
        page.push_str(&unreachable(contact, status.now));
    }
    let servers = if status.servers.is_empty() { "standalone".to_owned() } else { status.servers.join(", ") };
    let last_answer = match status.contact.as_ref().map(|c| c.last_answer) {
        Some(Some(at)) => format!(" (last answer {})", date_and_age(at, status.now)),
        Some(None) => " (no answer yet)".to_owned(),
        None => String::new(),
    };
    let _ = write!(
        page,
        "<p>client id <b>{}</b>; capacity servers: {}{last_answer} · page made {}</p>",
        escape(&status.client_id),
        escape(&servers),
        date(status.now)
    );
    page.push_str(&status.config.html(status.now));
    let _ = write!(page, "<h2>The last {}</h2><div class=\"charts\">", span(history.window() as u64));
    for r in &status.resources {
        if let Some(ring) = history.get(&r.id) {
            let _ = write!(
                page,
                "<figure><figcaption><b>{}</b> · {} · {}{}</figcaption>{}</figure>",
                escape(&r.id),
                r.kind,
                r.mode,
                match (r.kind, r.capacity) {
                    ("concurrency", Some(c)) => format!(" · limit {} at once (not drawn)", number(c)),
                    _ => String::new(),
                },
                chart(&r.id, r.kind == "rate", ring, history.window(), end)
            );
        }
    }
    for k in &status.keyed {
        if let Some(ring) = history.get(&k.id) {
            let _ = write!(
                page,
                "<figure><figcaption><b>{}</b> · {} · per {} · {} keys together</figcaption>{}</figure>",
                escape(&k.id),
                k.kind,
                escape(&k.per),
                k.keys,
                chart(&k.id, false, ring, history.window(), end)
            );
        }
    }
    page.push_str("</div><h2>Listeners</h2><table><tr><th>name</th><th>address</th><th>routes</th><th>rules</th></tr>");
    for l in &status.listeners {
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&l.name),
            escape(&l.address),
            escape(&l.routes.join(", ")),
            l.rules
        );
    }
    page.push_str("</table>");
    resource_table(&mut page, "Resources", &status.resources, status.now);
    for k in &status.keyed {
        let _ = write!(
            page,
            "<h2>Keyed resource {}</h2><p>{} · per {} · {} keys live (max_keys {}), {} dropped · \
             admitted {}, delayed {}, refused {}, refused under shadow mode (let through) {}</p>",
            escape(&k.id),
            k.kind,
            escape(&k.per),
            k.keys,
            k.max_keys,
            k.dropped,
            k.admitted,
            k.delayed,
            k.refused,
            k.shadow
        );
        resource_table(&mut page, "The busiest keys", &k.busiest, status.now);
    }
    page.push_str("<p><a href=\"/debug/status.json\">JSON</a> · <a href=\"/metrics\">metrics</a></p></body></html>");
    page
}

/// The line atop the page while the capacity servers do not answer: the resources live on
/// their leases until they expire, then on their fallbacks.
fn unreachable(contact: &Contact, now: i64) -> String {
    let since = contact.failing_since.map_or_else(String::new, |at| format!(" since {}", date_and_age(at, now)));
    let last = contact.last_answer.map_or_else(|| "none yet".to_owned(), |at| date_and_age(at, now));
    format!(
        "<p class=\"unreachable\"><b>The capacity servers do not answer</b>: {} calls failed in a row{since}; \
         last answer {last}; last error: {}</p>",
        contact.failed_calls,
        escape(contact.error.as_deref().unwrap_or(""))
    )
}

/// A table of resources (or keys) under heading `title`.
fn resource_table(page: &mut String, title: &str, resources: &[ResourceStatus], now: i64) {
    let _ = write!(
        page,
        "<h2>{}</h2><table><tr><th>id</th><th>kind</th><th>mode</th><th>capacity</th>\
         <th>lease expires</th><th>wants</th><th>in flight</th><th>queued</th><th>admitted</th><th>delayed</th>\
         <th>refused</th><th>shadow</th></tr>",
        escape(title)
    );
    for r in resources {
        let capacity = r.capacity.map_or_else(|| "no limit".to_owned(), |c| format!("{c:.2}"));
        let expiry = r.lease_expiry.map_or_else(String::new, |e| date_and_age(e, now));
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{capacity}</td><td>{expiry}</td><td>{:.2}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&r.id),
            r.kind,
            r.mode,
            r.wants,
            r.in_flight,
            r.queued,
            r.admitted,
            r.delayed,
            r.refused,
            r.shadow
        );
    }
    page.push_str("</table>");
}

/// A resource's chart: requests per second admitted at once, delayed and refused, against the
/// capacity when `capacity` (a rate's: a concurrency limit is not a rate, a keyed resource's keys
/// each have their own); those refused under shadow mode, which pass, apart and only if there were
/// any.
fn chart(id: &str, capacity: bool, ring: &Ring<Sample<5>>, window: f64, end: f64) -> String {
    let mut lines = Vec::new();
    if capacity {
        let points = ring.iter().map(|s| (s.at, s.values[0])).collect();
        lines.push(Line { label: "capacity".into(), color: CAPACITY_COLOR, dashed: true, points });
    }
    for (k, label, color) in [(1, "admitted", "#1f77b4"), (2, "delayed", "#ff7f0e"), (3, "refused", "#d62728")] {
        lines.push(Line { label: label.into(), color, dashed: false, points: rates(ring, k) });
    }
    if ring.iter().any(|s| s.values[4] > 0.0) {
        lines.push(Line { label: "shadow".into(), color: SHADOW_COLOR, dashed: false, points: rates(ring, 4) });
    }
    let title =
        format!("{id}: requests per second admitted, delayed and refused over the last {}", span(window as u64));
    Chart { title: &title, unit: "/s", end, window, lines }.svg()
}

/// The rate of counter `k` between consecutive samples, at the later one's time; a gap where
/// the counter went back (the gate was made anew) or the clock did not move.
fn rates(ring: &Ring<Sample<5>>, k: usize) -> Vec<(f64, f64)> {
    let samples: Vec<&Sample<5>> = ring.iter().collect();
    samples
        .windows(2)
        .map(|pair| {
            let (elapsed, counted) = (pair[1].at - pair[0].at, pair[1].values[k] - pair[0].values[k]);
            let rate = if elapsed > 0.0 && counted >= 0.0 { counted / elapsed } else { f64::NAN };
            (pair[1].at, rate)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_counter_differences_with_gaps_at_resets() {
        let mut ring = Ring::new(5);
        for (at, count) in [(0.0, 0.0), (5.0, 50.0), (10.0, 60.0), (15.0, 2.0), (15.0, 3.0)] {
            ring.push(Sample { at, values: [1.0, count, 0.0, 0.0, 0.0] });
        }
        let rates = rates(&ring, 1);
        assert_eq!(rates[..2], [(5.0, 10.0), (10.0, 2.0)]);
        assert!(rates[2].1.is_nan() && rates[3].1.is_nan(), "a reset, then no time: {rates:?}");
    }

    fn sample(contact: Option<Contact>) -> SidecarStatus {
        let resource = ResourceStatus {
            id: "orders".into(),
            kind: "rate",
            mode: "leased",
            capacity: Some(5.0),
            lease_expiry: None,
            wants: 1.0,
            in_flight: 0.0,
            queued: 0,
            used: true,
            admitted: 7,
            delayed: 0,
            refused: 2,
            shadow: 3,
        };
        SidecarStatus {
            now: 1_000,
            client_id: "pod-1".into(),
            servers: vec!["10.0.0.1:5101".into()],
            contact,
            config: ConfigStatus { path: None, applied_at: 900, rejected: None },
            listeners: Vec::new(),
            resources: vec![resource],
            keyed: Vec::new(),
        }
    }

    #[test]
    fn servers_that_do_not_answer_head_the_page_and_the_json() {
        let failing = Contact {
            last_answer: Some(890),
            failed_calls: 4,
            failing_since: Some(940),
            error: Some("GetCapacity: Unavailable: <refused>".into()),
        };
        let status = sample(Some(failing));
        let page = html(&status, &GateHistory::new(2, 1.0, 1), 1_000.0);
        let line = "<h1>sluice-sidecar</h1><p class=\"unreachable\"><b>The capacity servers do not answer</b>: \
                    4 calls failed in a row since 1970-01-01T00:15:40Z (60 s ago); last answer \
                    1970-01-01T00:14:50Z (110 s ago); last error: GetCapacity: Unavailable: &lt;refused&gt;</p>";
        assert!(page.contains(line), "{page}");
        assert!(page.contains("capacity servers: 10.0.0.1:5101 (last answer 1970-01-01T00:14:50Z (110 s ago))"));
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["contact"]["failed_calls"], 4);
        assert_eq!(json["contact"]["failing_since"], 940);
        assert_eq!(json["contact"]["error"], "GetCapacity: Unavailable: <refused>");

        let answered = Contact { last_answer: Some(999), ..Contact::default() };
        let page = html(&sample(Some(answered)), &GateHistory::new(2, 1.0, 1), 1_000.0);
        assert!(!page.contains("class=\"unreachable\""), "answering: {page}");
        let page = html(&sample(None), &GateHistory::new(2, 1.0, 1), 1_000.0);
        assert!(!page.contains("class=\"unreachable\"") && !page.contains("last answer"), "standalone: {page}");
        assert_eq!(serde_json::to_value(sample(None)).unwrap()["contact"], serde_json::Value::Null);
    }

    #[test]
    fn shadow_refusals_are_shown_apart_from_refusals() {
        let status = sample(None);
        let page = html(&status, &GateHistory::new(2, 1.0, 1), 1_000.0);
        assert!(page.contains("<th>refused</th><th>shadow</th>"), "{page}");
        assert!(page.contains("<td>7</td><td>0</td><td>2</td><td>3</td></tr>"), "{page}");
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!((&json["resources"][0]["refused"], &json["resources"][0]["shadow"]), (&2.into(), &3.into()));

        // Charted in a colour of their own, only where there are some.
        let mut ring = Ring::new(3);
        for (at, shadow) in [(0.0, 0.0), (1.0, 0.0), (2.0, 4.0)] {
            ring.push(Sample { at, values: [5.0, at, 0.0, 1.0, shadow] });
        }
        let svg = chart("orders", true, &ring, 3.0, 2.0);
        assert!(svg.contains("shadow <tspan") && svg.contains(SHADOW_COLOR), "{svg}");
        let mut quiet = Ring::new(2);
        quiet.push(Sample { at: 0.0, values: [5.0, 0.0, 0.0, 1.0, 0.0] });
        assert!(!chart("orders", true, &quiet, 3.0, 2.0).contains("shadow"));
    }

    #[test]
    fn a_keyed_resource_is_charted_as_its_keys_together_without_a_capacity() {
        let mut status = sample(None);
        status.keyed.push(KeyedStatus {
            id: "tenants".into(),
            kind: "rate",
            per: "header x-tenant".into(),
            max_keys: 100,
            keys: 3,
            dropped: 0,
            admitted: 9,
            delayed: 0,
            refused: 4,
            shadow: 0,
            busiest: Vec::new(),
        });
        let mut history = GateHistory::new(3, 1.0, 4);
        for at in [0.0, 1.0, 2.0] {
            history.record(
                at,
                [("orders", [5.0, at, 0.0, 0.0, 0.0]), ("tenants", [f64::NAN, 3.0 * at, 0.0, 2.0 * at, 0.0])],
            );
        }
        let page = html(&status, &history, 2.0);
        let caption = "<figcaption><b>tenants</b> · rate · per header x-tenant · 3 keys together</figcaption><svg";
        assert!(page.contains(caption), "{page}");
        let keyed_chart = &page[page.find(caption).unwrap()..];
        let keyed_chart = &keyed_chart[..keyed_chart.find("</figure>").unwrap()];
        assert!(keyed_chart.contains("refused") && !keyed_chart.contains("capacity"), "{keyed_chart}");
    }
}
