//! The Doorman client half on the network (SPEC §4.3): drives the core's [`LeaseClient`] with
//! real time, talks to the capacity servers (Discovery, GetCapacity, ReleaseCapacity, master
//! redirects), and applies each resource's lease or fallback to its gate.

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use arc_swap::ArcSwap;
use sluice_proto::{
    DiscoveryRequest, GetCapacityRequest, GetCapacityResponse, ReleaseCapacityRequest, capacity_client::CapacityClient,
};
use tokio::sync::{mpsc::UnboundedReceiver, watch};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::{
    config::{Config, ServerConfig},
    core::{Answer, LeaseClient, ResourceSpec},
    defaults,
    gate::Applied,
    listener::stopped,
    metrics,
    plan::Plan,
};

pub struct Leasing {
    client: Mutex<LeaseClient>,
    servers: Servers,
}

impl Leasing {
    pub fn new(client_id: String, server: &ServerConfig) -> Result<Leasing, String> {
        let seed = unix_now().to_bits() ^ u64::from(std::process::id());
        Ok(Leasing { client: Mutex::new(LeaseClient::new(client_id, seed)), servers: Servers::new(server)? })
    }

    fn lock(&self) -> MutexGuard<'_, LeaseClient> {
        self.client.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn client_id(&self) -> String {
        self.lock().client_id().to_owned()
    }

    /// Takes a configuration's resources; returns those to release (no longer configured).
    pub fn configure(&self, config: &Config) -> Vec<String> {
        self.lock().configure(config.resources.iter().map(|r| ResourceSpec {
            id: r.id.clone(),
            priority: r.priority,
            fallback: r.when_unreachable,
            safe_capacity: r.safe_capacity.unwrap_or(f64::INFINITY),
        }))
    }

    /// Puts every resource's current lease, or its fallback, into force.
    pub fn apply(&self, plan: &Plan) {
        let now = unix_now();
        let client = self.lock();
        for gate in &plan.gates {
            if let Some(effective) = client.effective(now, &gate.id) {
                gate.apply(Applied { capacity: effective.capacity, mode: effective.label(), expiry: effective.expiry });
            }
        }
    }

    /// Refreshes leases until `stop`, then releases them.
    pub async fn run(
        self: Arc<Self>,
        live: Arc<ArcSwap<Plan>>,
        mut first_use: UnboundedReceiver<Arc<str>>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let now = unix_now();
            let due = self.lock().next_due();
            let until_due = due.map_or(Duration::MAX, |d| Duration::from_secs_f64((d - now).max(0.0)));
            let refresh = until_due.is_zero();
            if !refresh {
                tokio::select! {
                    used = first_use.recv() => if let Some(id) = used {
                        self.lock().touch(&id);
                    },
                    _ = tokio::time::sleep(until_due.min(defaults::LEASE_CHECK_INTERVAL)) => {}
                    _ = stopped(&mut stop) => break,
                }
                self.apply(&live.load());
                continue;
            }
            let plan = live.load_full();
            let request = self.lock().request(now, |id| plan.gate(id).map_or(0.0, |g| g.wants()));
            if let Some(request) = request {
                let answer = tokio::select! {
                    answer = self.servers.get_capacity(request) => answer,
                    _ = stopped(&mut stop) => break,
                };
                let now = unix_now();
                match answer {
                    Ok(response) => match self.lock().on_response(now, response) {
                        Answer::Updated => {}
                        Answer::Redirect(master) => self.servers.redirect(master),
                    },
                    Err(error) => {
                        tracing::warn!(%error, "GetCapacity failed; current leases stay until they expire");
                        self.lock().on_error(now);
                        self.servers.next();
                    }
                }
            }
            self.apply(&plan);
        }
        let ids = self.lock().release_all();
        self.release(ids).await;
    }

    /// Gives leases back (resources dropped from the configuration, or shutdown).
    pub async fn release(&self, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        let request = ReleaseCapacityRequest { client_id: self.client_id(), resource_id: ids };
        match self.servers.release(request).await {
            Ok(()) => tracing::info!("leases released"),
            Err(error) => tracing::warn!(%error, "ReleaseCapacity failed; the leases will expire on their own"),
        }
    }
}

pub fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The capacity servers: the configured addresses, tried in turn, and the master they name.
struct Servers {
    addresses: Vec<String>,
    tls: Option<ClientTlsConfig>,
    current: Mutex<Current>,
}

struct Current {
    /// Index of the configured address last tried.
    index: usize,
    /// The master's address once Discovery or a redirect named it.
    master: Option<String>,
    channel: Option<Channel>,
}

impl Servers {
    fn new(config: &ServerConfig) -> Result<Servers, String> {
        let tls = match &config.tls {
            None => None,
            Some(t) => {
                let read =
                    |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("server.tls: {}: {e}", p.display()));
                let mut tls = ClientTlsConfig::new();
                tls = match &t.ca {
                    Some(ca) => tls.ca_certificate(Certificate::from_pem(read(ca)?)),
                    None => tls.with_native_roots(),
                };
                if let (Some(cert), Some(key)) = (&t.cert, &t.key) {
                    tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
                }
                if let Some(name) = &t.server_name {
                    tls = tls.domain_name(name.clone());
                }
                Some(tls)
            }
        };
        Ok(Servers {
            addresses: config.addresses.clone(),
            tls,
            current: Mutex::new(Current { index: 0, master: None, channel: None }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn endpoint(&self, address: &str) -> Result<Channel, String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| format!("{address}: {e}"))?
            .connect_timeout(defaults::CAPACITY_CONNECT_TIMEOUT)
            .timeout(defaults::CAPACITY_RPC_TIMEOUT)
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone()).map_err(|e| format!("{address}: {e}"))?;
        }
        Ok(endpoint.connect_lazy())
    }

    /// A channel to the master, asking Discovery first when it is not known.
    async fn master(&self) -> Result<Channel, String> {
        let (address, known) = {
            let current = self.lock();
            if let Some(channel) = &current.channel {
                return Ok(channel.clone());
            }
            match &current.master {
                Some(master) => (master.clone(), true),
                None => (self.addresses[current.index].clone(), false),
            }
        };
        let channel = self.endpoint(&address)?;
        let address = if known {
            address
        } else {
            let discovered = CapacityClient::new(channel.clone()).discovery(DiscoveryRequest {}).await;
            metrics::record_rpc("Discovery", if discovered.is_ok() { "ok" } else { "error" });
            let response = discovered.map_err(|s| format!("Discovery at {address}: {}", s.message()))?.into_inner();
            match response.mastership.master_address {
                Some(master) if !response.is_master && master != address => {
                    let channel = self.endpoint(&master)?;
                    let mut current = self.lock();
                    current.master = Some(master);
                    current.channel = Some(channel.clone());
                    return Ok(channel);
                }
                _ if !response.is_master => return Err(format!("{address} is not the master and knows none")),
                _ => address,
            }
        };
        let mut current = self.lock();
        current.master = Some(address);
        current.channel = Some(channel.clone());
        Ok(channel)
    }

    async fn get_capacity(&self, request: GetCapacityRequest) -> Result<GetCapacityResponse, String> {
        let channel = self.master().await?;
        let answer = CapacityClient::new(channel).get_capacity(request).await;
        metrics::record_rpc("GetCapacity", if answer.is_ok() { "ok" } else { "error" });
        answer.map(|r| r.into_inner()).map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    }

    async fn release(&self, request: ReleaseCapacityRequest) -> Result<(), String> {
        let channel = self.master().await?;
        let answer = CapacityClient::new(channel).release_capacity(request).await;
        metrics::record_rpc("ReleaseCapacity", if answer.is_ok() { "ok" } else { "error" });
        answer.map(|_| ()).map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    }

    /// Follows a master redirect; an unknown master means asking Discovery again.
    fn redirect(&self, master: Option<String>) {
        let mut current = self.lock();
        tracing::info!(master = master.as_deref().unwrap_or("unknown"), "redirected to the master");
        current.channel = None;
        current.master = master;
    }

    /// After an error: forget the master and try the next configured address.
    fn next(&self) {
        let mut current = self.lock();
        current.channel = None;
        current.master = None;
        current.index = (current.index + 1) % self.addresses.len();
    }
}
