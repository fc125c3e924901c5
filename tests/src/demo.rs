//! `make demo`: a capacity server on its embedded default configuration and a handful of Doorman
//! clients whose demand changes over time, printing once a second what each is granted. The
//! grants never add up to more than the capacity, and settle on the fair shares.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use clap::Parser;
use sluice_proto::{
    GetCapacityRequest, Lease, ReleaseCapacityRequest, ResourceRequest, capacity_client::CapacityClient,
};
use tonic::transport::Channel;

use crate::harness::{self, Server};

/// Runs a capacity server and demo clients, printing their leases live.
#[derive(Debug, Parser)]
#[command(name = "sluice-demo")]
pub struct Args {
    /// The sluice-server binary (default: the one built next to this program).
    #[arg(long)]
    pub server: Option<PathBuf>,
    /// How long to run.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "40s")]
    pub duration: Duration,
}

const RESOURCE: &str = "demo/api";

/// What each client wants from second `t` on; `None` means it has left.
fn wants(client: &str, t: u64) -> Option<f64> {
    match (client, t) {
        ("alpha", _) => Some(20.0),
        ("bravo", 0..30) => Some(50.0),
        ("bravo", _) => None,
        ("charlie", 0..14) => Some(80.0),
        ("charlie", _) => Some(10.0),
        ("delta", 0..20) => None,
        ("delta", _) => Some(100.0),
        _ => None,
    }
}

const CLIENTS: [&str; 4] = ["alpha", "bravo", "charlie", "delta"];

const SCRIPT: &str = "alpha wants 20, bravo 50, charlie 80 · t=14 s charlie drops to 10 · t=20 s delta joins wanting 100 · t=30 s bravo leaves";

struct Holder {
    wants: f64,
    lease: Option<Lease>,
    next_refresh: Instant,
}

pub async fn run(args: Args) -> Result<(), String> {
    let binary = args.server.unwrap_or_else(|| harness::binary("sluice-server"));
    let server = Server::builder_for(binary).arg("--log").arg("warn").start();
    let mut client: CapacityClient<Channel> = server.client().await;
    println!(
        "sluice-server on {} (debug pages on http://{}/debug/status), embedded default: FAIR_SHARE of 100 per resource, learning mode for the first 4 s",
        server.grpc, server.admin
    );
    println!("{SCRIPT}");
    println!("granted capacity on {RESOURCE:?} (wants in brackets):");
    let start = Instant::now();
    let mut holders: BTreeMap<&str, Holder> = BTreeMap::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    let mut printed = None;
    while start.elapsed() < args.duration {
        ticks.tick().await;
        let t = start.elapsed().as_secs();
        for name in CLIENTS {
            match wants(name, t) {
                Some(w) => {
                    let holder =
                        holders.entry(name).or_insert(Holder { wants: w, lease: None, next_refresh: Instant::now() });
                    // Refresh on schedule, and at once when demand changes.
                    if Instant::now() >= holder.next_refresh || holder.wants != w {
                        let lease = ask(&mut client, name, w, holder.lease.as_ref()).await?;
                        holder.wants = w;
                        holder.next_refresh =
                            Instant::now() + Duration::from_secs(lease.refresh_interval.max(1) as u64);
                        holder.lease = Some(lease);
                    }
                }
                None => {
                    if holders.remove(name).is_some() {
                        client
                            .release_capacity(ReleaseCapacityRequest {
                                client_id: name.into(),
                                resource_id: vec![RESOURCE.into()],
                            })
                            .await
                            .map_err(|e| format!("ReleaseCapacity: {e}"))?;
                    }
                }
            }
        }
        if printed != Some(t) {
            printed = Some(t);
            print_line(&server, t, &holders);
        }
    }
    Ok(())
}

async fn ask(
    client: &mut CapacityClient<Channel>,
    name: &str,
    wants: f64,
    has: Option<&Lease>,
) -> Result<Lease, String> {
    let request = GetCapacityRequest {
        client_id: name.into(),
        resource: vec![ResourceRequest { resource_id: RESOURCE.into(), priority: 0, has: has.cloned(), wants }],
    };
    let response = client.get_capacity(request).await.map_err(|e| format!("GetCapacity: {e}"))?;
    response.into_inner().response.into_iter().next().map(|r| r.gets).ok_or_else(|| "empty response".to_owned())
}

fn print_line(server: &Server, t: u64, holders: &BTreeMap<&str, Holder>) {
    let (_, status) = server.get("/debug/status.json");
    let learning = status.contains("\"learning\": true");
    let mut line = format!("t={t:>3}s {:<9}", if learning { "learning" } else { "" });
    let mut total = 0.0;
    for name in CLIENTS {
        match holders.get(name) {
            Some(h) => {
                let got = h.lease.as_ref().map_or(0.0, |l| l.capacity);
                total += got;
                line.push_str(&format!(" {name} {got:>5.1} ({:>3})", h.wants));
            }
            None => line.push_str(&format!(" {name} {:>11}", "-")),
        }
    }
    line.push_str(&format!("  Σ {total:>5.1} / 100"));
    println!("{line}");
}
