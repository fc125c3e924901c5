//! What `/debug/status` shows: the sidecar's listeners, resources, leases and demand, as JSON or
//! as a small HTML page.

use std::fmt::Write;

use serde::Serialize;
use sluice_runtime::{html::escape, reload::ConfigStatus};

use crate::{
    core::Kind,
    plan::{Plan, Target},
};

#[derive(Serialize)]
pub struct SidecarStatus {
    pub client_id: String,
    /// The capacity servers; empty in standalone mode.
    pub servers: Vec<String>,
    pub config: ConfigStatus,
    pub listeners: Vec<ListenerStatus>,
    pub resources: Vec<ResourceStatus>,
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
}

pub fn snapshot(plan: &Plan, client_id: &str, config_status: ConfigStatus) -> SidecarStatus {
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
    let resources = plan
        .gates
        .iter()
        .map(|g| {
            let applied = g.applied();
            let (in_flight, queued) = g.load();
            ResourceStatus {
                id: g.id.to_string(),
                kind: match g.kind {
                    Kind::Rate => "rate",
                    Kind::Concurrency => "concurrency",
                },
                mode: applied.mode,
                capacity: applied.capacity.is_limited().then_some(applied.capacity.get()),
                lease_expiry: applied.expiry,
                wants: g.wants(),
                in_flight,
                queued,
                used: g.used(),
            }
        })
        .collect();
    SidecarStatus {
        client_id: client_id.to_owned(),
        servers: config.server.as_ref().map_or_else(Vec::new, |s| s.addresses.clone()),
        config: config_status,
        listeners,
        resources,
    }
}

pub fn html(status: &SidecarStatus) -> String {
    let mut page = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>sluice-sidecar</title>\
         <style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px}</style>\
         </head><body><h1>sluice-sidecar</h1>",
    );
    let servers = if status.servers.is_empty() { "standalone".to_owned() } else { status.servers.join(", ") };
    let _ =
        write!(page, "<p>client id <b>{}</b>; capacity servers: {}</p>", escape(&status.client_id), escape(&servers));
    page.push_str(&status.config.html());
    page.push_str("<h2>Listeners</h2><table><tr><th>name</th><th>address</th><th>routes</th><th>rules</th></tr>");
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
    page.push_str(
        "</table><h2>Resources</h2><table><tr><th>id</th><th>kind</th><th>mode</th><th>capacity</th>\
         <th>lease expiry</th><th>wants</th><th>in flight</th><th>queued</th></tr>",
    );
    for r in &status.resources {
        let capacity = r.capacity.map_or_else(|| "no limit".to_owned(), |c| format!("{c:.2}"));
        let expiry = r.lease_expiry.map_or_else(String::new, |e| e.to_string());
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{capacity}</td><td>{expiry}</td><td>{:.2}</td><td>{}</td><td>{}</td></tr>",
            escape(&r.id),
            r.kind,
            r.mode,
            r.wants,
            r.in_flight,
            r.queued
        );
    }
    page.push_str(
        "</table><p><a href=\"/debug/status.json\">JSON</a> · <a href=\"/metrics\">metrics</a></p></body></html>",
    );
    page
}
