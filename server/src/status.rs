//! Snapshots of the server for people and scrapers: the JSON and HTML of `/debug/status` and the
//! figures behind the per-resource gauges.

use std::{cmp::Ordering, collections::BinaryHeap, fmt::Write};

use serde::Serialize;
use sluice_runtime::{
    chart::{CAPACITY_COLOR, CHART_STYLE, Chart, Line},
    defaults::STATUS_REFRESH_SECONDS,
    history::History,
    html::escape,
    reload::ConfigStatus,
    when::{date, date_and_age, span},
};

use crate::{
    core::{Choice, Controller, Decision, Ledger, PriorityMode, Reason, Resource, SubtreeWants, UnixSeconds},
    state::{Role, State},
};

/// What is charted per resource, in this order: the capacity it shares (NaN without one), Σ
/// wants and Σ has.
pub type ResourceHistory = History<3>;

#[derive(Serialize)]
pub struct ServerStatus {
    pub is_master: bool,
    /// This server's advertise address when it is the master, the leader's when it follows one;
    /// `null` while unknown.
    pub master_address: Option<String>,
    pub serving_since: UnixSeconds,
    pub now: UnixSeconds,
    /// For an intermediate server: its parent and how asking it goes.
    pub parent: Option<ParentStatus>,
    pub election: ElectionStatus,
    pub config: ConfigStatus,
    pub templates: Vec<TemplateStatus>,
    /// Leases held, in demands (a child server's one per band or profile group), and the most
    /// the server holds (`--max-leases`).
    pub leases: usize,
    pub max_leases: usize,
    pub resources: Vec<ResourceStatus>,
}

#[derive(Serialize)]
pub struct ParentStatus {
    pub address: String,
    pub server_id: String,
    /// Failed requests in a row.
    pub failures: u32,
}

#[derive(Serialize)]
pub struct ElectionStatus {
    /// `embedded` (always the master) or `etcd` (elected among replicas).
    pub mode: &'static str,
    /// The etcd key the replicas campaign on.
    pub key: Option<String>,
    /// `master` or `follower`.
    pub role: &'static str,
    /// When this server took its role.
    pub since: UnixSeconds,
}

#[derive(Serialize)]
pub struct TemplateStatus {
    pub identifier_glob: String,
    pub capacity: f64,
    pub algorithm: &'static str,
    pub lease_length: i64,
    pub refresh_interval: i64,
    pub learning_mode_duration: i64,
    pub safe_capacity: Option<f64>,
    pub description: Option<String>,
}

#[derive(Serialize)]
pub struct ResourceStatus {
    pub id: String,
    pub template: String,
    pub algorithm: &'static str,
    pub priority_mode: &'static str,
    pub subtree_wants: &'static str,
    /// What the resource shares now; `None` at an intermediate server without a valid lease
    /// from its parent (it hands out safe capacity).
    pub capacity: Option<f64>,
    /// At an intermediate server: its own lease from the parent, while valid.
    pub parent_lease: Option<OwnLease>,
    /// Most important first.
    pub bands: Vec<BandStatus>,
    pub safe_capacity: f64,
    pub has: f64,
    pub wants: f64,
    pub clients: usize,
    pub subclients: f64,
    pub learning: bool,
    /// An adaptive resource at the server that learns its capacity.
    pub adaptive: Option<AdaptiveStatus>,
}

/// An adaptive resource's bounds and its controller's decisions.
#[derive(Serialize)]
pub struct AdaptiveStatus {
    pub min: f64,
    pub max: f64,
    /// Decisions so far, by reason.
    pub decisions: Vec<(&'static str, u64)>,
    /// The latest decisions, oldest first: all of them on a resource's own page, the last one
    /// in the list of resources.
    pub history: Vec<DecisionStatus>,
}

/// One decision of a controller and what it was made on (per second, the whole fleet).
#[derive(Serialize)]
pub struct DecisionStatus {
    pub at: UnixSeconds,
    pub capacity: f64,
    pub reason: &'static str,
    pub goodput: Option<f64>,
    pub errors: Option<f64>,
    /// Mean latency of the answers that were not errors, in seconds.
    pub latency: Option<f64>,
    /// The unloaded latency it judged by.
    pub baseline: Option<f64>,
    /// The goodput last measured in an overload.
    pub ceiling: Option<f64>,
}

#[derive(Serialize)]
pub struct OwnLease {
    pub capacity: f64,
    pub expiry_time: UnixSeconds,
    pub refresh_interval: i64,
}

#[derive(Serialize)]
pub struct BandStatus {
    pub priority: i64,
    pub shares: usize,
    pub subclients: f64,
    pub wants: f64,
    pub has: f64,
}

#[derive(Serialize)]
pub struct ResourceDetail {
    #[serde(flatten)]
    pub resource: ResourceStatus,
    /// How many leases there are; `leases` lists at most a page of them.
    pub lease_count: usize,
    pub leases: Vec<LeaseStatus>,
}

#[derive(Serialize)]
pub struct LeaseStatus {
    pub client: String,
    /// Its most important band.
    pub priority: i64,
    pub has: f64,
    pub wants: f64,
    pub subclients: f64,
    pub expiry_time: UnixSeconds,
    /// A child server's lease that ran out without a release: what it holds is kept as
    /// its cut-off subtree's safe capacity until `expiry_time`.
    pub lapsed: bool,
}

pub fn server(ledger: &Ledger, now: UnixSeconds, state: &State) -> ServerStatus {
    let templates = ledger
        .repository()
        .templates()
        .iter()
        .map(|t| TemplateStatus {
            identifier_glob: t.identifier_glob.clone(),
            capacity: t.capacity,
            algorithm: t.algorithm.kind.name(),
            lease_length: t.algorithm.lease_length,
            refresh_interval: t.algorithm.refresh_interval,
            learning_mode_duration: t.algorithm.learning_seconds(),
            safe_capacity: t.safe_capacity,
            description: t.description.clone(),
        })
        .collect();
    let mut resources: Vec<_> = ledger.resources().map(|(id, r)| resource(ledger, id, r, now)).collect();
    resources.sort_by(|a, b| a.id.cmp(&b.id));
    let standing = state.standing();
    let (role, master_address) = match &standing.role {
        Role::Master => ("master", Some(state.advertise_address().to_owned())),
        Role::Follower { leader } => ("follower", leader.clone()),
    };
    ServerStatus {
        is_master: standing.role == Role::Master,
        master_address,
        serving_since: ledger.serving_since(),
        leases: ledger.leases(),
        max_leases: ledger.max_leases(),
        now,
        parent: ledger.parent().zip(state.parent()).map(|(p, link)| ParentStatus {
            address: link.servers.address(),
            server_id: p.server_id().to_owned(),
            failures: p.schedule().failures(),
        }),
        election: ElectionStatus {
            mode: if state.election_key().is_some() { "etcd" } else { "embedded" },
            key: state.election_key().map(str::to_owned),
            role,
            since: standing.since,
        },
        config: ConfigStatus::now(state.config_status()),
        templates,
        resources,
    }
}

pub fn resource_detail(ledger: &Ledger, id: &str, now: UnixSeconds, limit: usize) -> Option<ResourceDetail> {
    let r = ledger.resource(id)?;
    let mut leases: Vec<_> = r
        .leases()
        .iter()
        .take(limit)
        .map(|l| LeaseStatus {
            client: l.client.to_owned(),
            priority: l.priority,
            has: l.demand.has,
            wants: l.demand.wants,
            subclients: l.demand.subclients,
            expiry_time: l.expiry,
            lapsed: l.lapsed,
        })
        .collect();
    leases.sort_by(|a, b| a.client.cmp(&b.client));
    let mut resource = resource(ledger, id, r, now);
    if let (Some(a), Some(c)) = (resource.adaptive.as_mut(), r.controller()) {
        a.history = c.history().iter().map(decision).collect();
    }
    Some(ResourceDetail { resource, lease_count: r.leases().len(), leases })
}

fn adaptive(c: &Controller) -> AdaptiveStatus {
    let s = c.settings();
    AdaptiveStatus {
        min: s.min,
        max: s.max,
        decisions: Reason::ALL.iter().map(|&r| (r.name(), c.decisions(r))).collect(),
        history: c.history().back().map(decision).into_iter().collect(),
    }
}

fn decision(d: &Decision) -> DecisionStatus {
    DecisionStatus {
        at: d.at,
        capacity: d.capacity,
        reason: d.reason.name(),
        goodput: d.rates.map(|r| r.goodput),
        errors: d.rates.map(|r| r.errors),
        latency: d.rates.and_then(|r| r.latency),
        baseline: d.baseline,
        ceiling: d.ceiling,
    }
}

fn resource(ledger: &Ledger, id: &str, r: &Resource, now: UnixSeconds) -> ResourceStatus {
    let sums = r.bands().sums();
    let algorithm = r.algorithm();
    ResourceStatus {
        id: id.to_owned(),
        template: r.template().identifier_glob.clone(),
        algorithm: algorithm.kind.name(),
        priority_mode: PriorityMode::of(algorithm).name(),
        subtree_wants: SubtreeWants::of(algorithm).name(),
        capacity: r.capacity(now),
        parent_lease: r.parent_lease(now).map(|l| OwnLease {
            capacity: l.capacity,
            expiry_time: l.expiry,
            refresh_interval: l.refresh_interval,
        }),
        bands: r
            .bands()
            .iter()
            .map(|(priority, band)| {
                let sums = band.sums();
                BandStatus {
                    priority,
                    shares: band.len(),
                    subclients: sums.subclients,
                    wants: sums.wants,
                    has: sums.has,
                }
            })
            .collect(),
        safe_capacity: r.safe_capacity(now),
        has: sums.has,
        wants: sums.wants,
        clients: r.leases().len(),
        subclients: sums.subclients,
        learning: ledger.is_learning(r, now),
        adaptive: r.controller().map(adaptive),
    }
}

/// One round of samples for [`ResourceHistory`]: the `keep` resources with the largest Σ wants
/// (ties by id, so that a calm server charts the same ones each time), busiest first.
pub fn sample(ledger: &Ledger, now: UnixSeconds, keep: usize) -> Vec<(String, [f64; 3])> {
    // A bounded heap whose top is the least busy kept: one pass, whatever the resource count,
    // and a single comparison for most resources once it is full.
    let mut kept = BinaryHeap::with_capacity(keep);
    for (id, r) in ledger.resources() {
        let candidate = Busiest(r.bands().sums().wants, id, r);
        if kept.len() < keep {
            kept.push(candidate);
        } else if let Some(mut least) = kept.peek_mut()
            && candidate < *least
        {
            *least = candidate;
        }
    }
    kept.into_sorted_vec()
        .into_iter()
        .map(|Busiest(wants, id, r)| {
            (id.to_owned(), [r.capacity(now).unwrap_or(f64::NAN), wants, r.bands().sums().has])
        })
        .collect()
}

/// Ordered busiest first: larger Σ wants, then the smaller id.
struct Busiest<'a>(f64, &'a str, &'a Resource);

impl Ord for Busiest<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then_with(|| self.1.cmp(other.1))
    }
}

impl PartialOrd for Busiest<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Busiest<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Busiest<'_> {}

/// A resource's chart, if it has a history.
fn resource_chart(history: &ResourceHistory, id: &str, end: f64) -> Option<String> {
    let ring = history.get(id)?;
    let line = |label: &str, color, k: usize| Line {
        label: label.to_owned(),
        color,
        dashed: k == 0,
        points: ring.iter().map(|s| (s.at, s.values[k])).collect(),
    };
    let chart = Chart {
        title: &format!("{id}: capacity, Σ wants and Σ has over the last {}", span(history.window() as u64)),
        unit: "",
        end,
        window: history.window(),
        lines: vec![line("capacity", CAPACITY_COLOR, 0), line("Σ wants", "#ff7f0e", 1), line("Σ has", "#1f77b4", 2)],
    };
    Some(chart.svg())
}

/// `/debug/status`: the server, charts of its busiest resources and a table of them all.
/// `history` was recorded on the clock of `end`, the page's time.
pub fn server_html(s: &ServerStatus, history: &ResourceHistory, end: f64) -> String {
    let mut html = page_head("Sluice capacity server");
    let e = &s.election;
    let _ = write!(
        html,
        "<p>role: <b>{}</b> since {} · master: {} · election: {}{} · serving since {} · leases: {} of at most {} \
         · page made {}</p>",
        e.role,
        date_and_age(e.since, s.now),
        escape(s.master_address.as_deref().unwrap_or("unknown")),
        e.mode,
        e.key.as_deref().map_or_else(String::new, |key| format!(" on key {}", escape(key))),
        date_and_age(s.serving_since, s.now),
        s.leases,
        s.max_leases,
        date(s.now)
    );
    html.push_str(&s.config.html(s.now));
    if let Some(p) = &s.parent {
        let _ = write!(
            html,
            "<p>parent: <b>{}</b> · asking as {} · failed requests in a row: {}</p>",
            escape(&p.address),
            escape(&p.server_id),
            p.failures
        );
    }
    let mut busiest: Vec<&ResourceStatus> = s.resources.iter().filter(|r| history.get(&r.id).is_some()).collect();
    busiest.sort_by(|a, b| b.wants.total_cmp(&a.wants).then_with(|| a.id.cmp(&b.id)));
    let _ = write!(
        html,
        "<h2>The last {}</h2><p>{} of {} resources charted: the {} with the largest Σ wants at each sample \
         are kept; the others have no history.</p><div class=\"charts\">",
        span(history.window() as u64),
        busiest.len(),
        s.resources.len(),
        history.max_keys()
    );
    for r in busiest {
        if let Some(svg) = resource_chart(history, &r.id, end) {
            let _ = write!(
                html,
                "<figure><figcaption><a href=\"/debug/status?resource={}\">{}</a></figcaption>{svg}</figure>",
                query_escape(&r.id),
                escape(&r.id)
            );
        }
    }
    html.push_str("</div><h2>Resources</h2><table><tr><th>resource</th><th>template</th><th>algorithm</th><th>capacity</th><th>own lease expires</th><th>bands</th><th>Σ has</th><th>Σ wants</th><th>clients</th><th>subclients</th><th>safe capacity</th><th>learning</th></tr>");
    for r in &s.resources {
        let _ = write!(
            html,
            "<tr><td><a href=\"/debug/status?resource={}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{}</td></tr>",
            query_escape(&r.id),
            escape(&r.id),
            escape(&r.template),
            r.algorithm,
            capacity(r),
            r.parent_lease.as_ref().map_or_else(|| "-".to_owned(), |l| date_and_age(l.expiry_time, s.now)),
            bands(r),
            r.has,
            r.wants,
            r.clients,
            r.subclients,
            r.safe_capacity,
            if r.learning { "yes" } else { "no" }
        );
    }
    html.push_str("</table><h2>Templates</h2><table><tr><th>glob</th><th>capacity</th><th>algorithm</th><th>lease</th><th>refresh</th><th>learning</th><th>safe capacity</th><th>description</th></tr>");
    for t in &s.templates {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} s</td><td>{} s</td><td>{} s</td><td>{}</td><td>{}</td></tr>",
            escape(&t.identifier_glob),
            t.capacity,
            t.algorithm,
            t.lease_length,
            t.refresh_interval,
            t.learning_mode_duration,
            t.safe_capacity.map_or_else(|| "capacity / subclients".to_owned(), |v| v.to_string()),
            escape(t.description.as_deref().unwrap_or(""))
        );
    }
    html.push_str(
        "</table><p><a href=\"/debug/status.json\">JSON</a> · <a href=\"/metrics\">metrics</a></p></body></html>",
    );
    html
}

/// `/debug/status?resource=ID`: one resource, its chart and its leases.
pub fn resource_html(d: &ResourceDetail, history: &ResourceHistory, now: UnixSeconds, end: f64) -> String {
    let r = &d.resource;
    let mut html = page_head(&format!("Resource {}", r.id));
    let _ = write!(
        html,
        "<p>template <b>{}</b> · {} · capacity {} · bands {} · Σ has {:.3} · Σ wants {:.3} · {} clients ({} subclients) · safe capacity {:.3} · learning {}</p>",
        escape(&r.template),
        r.algorithm,
        capacity(r),
        bands(r),
        r.has,
        r.wants,
        r.clients,
        r.subclients,
        r.safe_capacity,
        if r.learning { "yes" } else { "no" }
    );
    let _ = write!(html, "<h2>The last {}</h2>", span(history.window() as u64));
    match resource_chart(history, &r.id, end) {
        Some(svg) => html.push_str(&svg),
        None => {
            let _ = write!(
                html,
                "<p>Not charted (yet): only the {} resources with the largest Σ wants at each sample have a \
                 history.</p>",
                history.max_keys()
            );
        }
    }
    if let Some(a) = &r.adaptive {
        html.push_str(&decisions_html(a, now));
    }
    if d.lease_count > d.leases.len() {
        let _ = write!(html, "<p>showing {} of {} leases</p>", d.leases.len(), d.lease_count);
    }
    html.push_str(
        "<table><tr><th>client</th><th>priority</th><th>has</th><th>wants</th><th>subclients</th><th>expires</th></tr>",
    );
    for l in &d.leases {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{}{}</td></tr>",
            escape(&l.client),
            l.priority,
            l.has,
            l.wants,
            l.subclients,
            date_and_age(l.expiry_time, now),
            if l.lapsed { " (lapsed: kept as its subtree's safe capacity)" } else { "" }
        );
    }
    let _ = write!(
        html,
        "</table><p><a href=\"/debug/status\">all resources</a> · <a href=\"/debug/status.json?resource={}\">JSON</a></p></body></html>",
        query_escape(&r.id)
    );
    html
}

/// An adaptive resource's bounds and its controller's latest decisions, newest first.
fn decisions_html(a: &AdaptiveStatus, now: UnixSeconds) -> String {
    let counts: Vec<String> = a.decisions.iter().map(|(reason, n)| format!("{reason} {n}")).collect();
    let mut html = format!(
        "<h2>Adaptive capacity</h2><p>learned between {} and {} · decisions: {}</p><table><tr><th>at</th>\
         <th>reason</th><th>capacity</th><th>goodput/s</th><th>errors/s</th><th>latency ms</th>\
         <th>unloaded ms</th><th>ceiling</th></tr>",
        a.min,
        a.max,
        counts.join(", ")
    );
    let figure = |v: Option<f64>, scale: f64| v.map_or_else(|| "–".to_owned(), |v| format!("{:.1}", v * scale));
    for d in a.history.iter().rev() {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            date_and_age(d.at, now),
            d.reason,
            d.capacity,
            figure(d.goodput, 1.0),
            figure(d.errors, 1.0),
            figure(d.latency, 1e3),
            figure(d.baseline, 1e3),
            figure(d.ceiling, 1.0)
        );
    }
    html.push_str("</table>");
    html
}

fn capacity(r: &ResourceStatus) -> String {
    r.capacity.map_or_else(|| "no lease: safe".to_owned(), |c| c.to_string())
}

/// The bands as "priority: has/wants" from the most important down, with the priority mode and
/// how children's wants are counted.
fn bands(r: &ResourceStatus) -> String {
    let list: Vec<String> = r
        .bands
        .iter()
        .map(|b| format!("{}: {:.3}/{:.3} ({} clients)", b.priority, b.has, b.wants, b.subclients))
        .collect();
    format!("{}, subtree {} [{}]", r.priority_mode, r.subtree_wants, escape(&list.join(", ")))
}

fn page_head(title: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"{STATUS_REFRESH_SECONDS}\"><title>{0}</title><style>body{{font-family:sans-serif}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}td:first-child{{text-align:left}}{CHART_STYLE}</style></head><body><h1>{0}</h1>",
        escape(title)
    )
}

fn query_escape(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{config, core::Claim};

    #[test]
    fn sampling_keeps_the_busiest_resources_with_ties_by_id() {
        let repository =
            config::parse(crate::defaults::EMBEDDED_CONFIG, std::path::Path::new("")).expect("embedded config");
        let mut ledger = Ledger::new(Arc::new(repository), 0);
        for (id, wants) in [("d", 1.0), ("c", 5.0), ("b", 1.0), ("a", 0.0), ("e", 9.0)] {
            ledger.claim(100, "client", id, &Claim::single(0, wants, None));
        }
        let round = sample(&ledger, 100, 3);
        let ids: Vec<&str> = round.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["e", "c", "b"], "busiest first; of the two at 1, the smaller id");
        let [capacity, wants, has] = round[0].1;
        assert!(capacity > 0.0 && wants == 9.0 && has > 0.0, "{:?}", round[0].1);
        assert!(sample(&ledger, 100, 0).is_empty());
        assert_eq!(sample(&ledger, 100, 10).len(), 5);
    }
}
