//! The Doorman client half on the network (SPEC §4.3): drives the core's [`LeaseClient`] with
//! real time, talks to the capacity servers (Discovery, GetCapacity, ReleaseCapacity, master
//! redirects), and applies each resource's lease or fallback to its gate.

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use arc_swap::ArcSwap;
use serde::Serialize;
use sluice_client::{discovery::Servers, tls::ClientTlsFiles};
use sluice_proto::ReleaseCapacityRequest;
use sluice_runtime::clock::precise_now;
use tokio::sync::{mpsc::UnboundedReceiver, watch};

use sluice_http::{
    sync::{self, stopped},
    time,
};

use crate::{
    config::ServerConfig,
    core::{Answer, Applied, Capacity, LeaseClient, Mode, ResourceSpec},
    defaults, metrics,
    plan::Plan,
};

pub struct Leasing {
    client: Mutex<LeaseClient>,
    servers: Arc<Servers>,
    contact: Mutex<Contact>,
}

/// How the capacity servers answer GetCapacity, for the status page: a sidecar that cannot
/// reach them lives on its fallbacks, which its page must say.
#[derive(Serialize, Clone, Default, Debug)]
pub struct Contact {
    /// Unix time of the last answer; `null`: none since the sidecar started.
    pub last_answer: Option<i64>,
    /// Calls failed in a row since (0: the last one was answered).
    pub failed_calls: u32,
    /// Unix time of the first of them.
    pub failing_since: Option<i64>,
    /// The last one's error, at most [`defaults::STATUS_ERROR_CHARS`] characters.
    pub error: Option<String>,
}

impl Contact {
    /// Returns the calls that had failed in a row before this answer.
    fn answered(&mut self, now: f64) -> u32 {
        let failed = self.failed_calls;
        *self = Contact { last_answer: Some(now.floor() as i64), ..Contact::default() };
        failed
    }

    fn failed(&mut self, now: f64, error: &str) {
        self.failed_calls = self.failed_calls.saturating_add(1);
        self.failing_since.get_or_insert(now.floor() as i64);
        // The servers' own message is part of it: bounded, as everything the page shows.
        let error = match error.char_indices().nth(defaults::STATUS_ERROR_CHARS) {
            Some((end, _)) => format!("{}…", &error[..end]),
            None => error.to_owned(),
        };
        self.error = Some(error);
    }
}

impl Leasing {
    /// Must be called on a runtime: the `server.tls` files are polled every `poll`.
    pub fn new(client_id: String, server: &ServerConfig, poll: Duration) -> Result<Leasing, String> {
        let seed = precise_now().to_bits() ^ u64::from(std::process::id());
        let files = server.tls.as_ref().map(|t| ClientTlsFiles {
            ca: t.ca.clone(),
            identity: t.cert.clone().zip(t.key.clone()),
            server_name: t.server_name.clone(),
        });
        let servers = Servers::with_tls_files(server.addresses.clone(), files, metrics::record_rpc, poll, "server.tls")
            .map_err(|e| format!("server.tls: {e}"))?;
        Ok(Leasing { client: Mutex::new(LeaseClient::new(client_id, seed)), servers, contact: Mutex::default() })
    }

    fn lock(&self) -> MutexGuard<'_, LeaseClient> {
        sync::lock(&self.client)
    }

    pub fn client_id(&self) -> String {
        self.lock().client_id().to_owned()
    }

    pub fn contact(&self) -> Contact {
        sync::lock(&self.contact).clone()
    }

    /// Takes a plan's resources, the live keys of its keyed resources included; returns those
    /// to release (no longer configured).
    pub fn configure(&self, plan: &Plan) -> Vec<String> {
        let fixed = plan.config.resources.iter().filter(|r| r.key.is_none()).map(|r| ResourceSpec {
            id: r.id.clone(),
            priority: r.priority,
            fallback: r.when_unreachable,
            safe_capacity: r.safe_capacity.unwrap_or(Capacity::UNLIMITED).get(),
        });
        let keys = plan.keyed.iter().flat_map(|k| k.gates().into_iter().map(|gate| k.spec(&gate.id)));
        self.lock().configure(fixed.chain(keys.collect::<Vec<_>>()))
    }

    /// A resource's first use: a fixed resource, or a key new to the lease client.
    fn touch(&self, plan: &Plan, id: &str) {
        let mut client = self.lock();
        if let Some(keyed) =
            plan.config.resource(id).is_none().then(|| plan.keyed.iter().find(|k| k.find(id).is_some())).flatten()
        {
            client.add(keyed.spec(id));
        }
        client.touch(precise_now(), id);
    }

    /// Forgets keys the sweep dropped (unless a request made them anew since) and releases
    /// their leases.
    pub async fn forget(&self, plan: &Plan, mut ids: Vec<String>) {
        ids.retain(|id| plan.lease_gate(id).is_none());
        let released = self.lock().remove(ids);
        self.release(released).await;
    }

    /// Puts every resource's current lease, or its fallback, into force.
    pub fn apply(&self, plan: &Plan) {
        let now = precise_now();
        let gates = plan.all_gates();
        let client = self.lock();
        for gate in &gates {
            if let Some(effective) = client.effective(now, &gate.id) {
                if effective.mode == Mode::Fallback {
                    gate.unleased();
                }
                if let Some(seconds) = effective.refresh_interval {
                    gate.metrics.refresh_interval(seconds);
                }
                // Leases come cleaned (`sluice_client::Granted`) and fallbacks from validated
                // settings: the saturation only keeps the gate's type honest.
                let capacity = Capacity::saturating(effective.capacity);
                gate.apply(Applied { capacity, mode: effective.label(), expiry: effective.expiry });
            }
        }
    }

    /// Refreshes leases until `stop`, then releases them.
    pub async fn run(
        self: Arc<Self>,
        live: Arc<ArcSwap<Plan>>,
        mut cues: UnboundedReceiver<Arc<str>>,
        mut stop: watch::Receiver<bool>,
    ) {
        'refresh: loop {
            if self.servers.renewed_since_failure() {
                self.lock().retry_now();
            }
            let now = precise_now();
            let due = self.lock().next_due();
            let until_due = due.map_or(Duration::MAX, |d| time::seconds(d - now));
            let refresh = until_due.is_zero();
            if !refresh {
                tokio::select! {
                    // A resource's first use, or a surge in its demand: looked
                    // at now, not at the next check.
                    cued = cues.recv() => if let Some(id) = cued {
                        let plan = live.load();
                        self.touch(&plan, &id);
                        // A burst of new keys is taken in one look, not one look each.
                        while let Ok(id) = cues.try_recv() {
                            self.touch(&plan, &id);
                        }
                    },
                    _ = tokio::time::sleep(until_due.min(defaults::LEASE_CHECK_INTERVAL)) => {}
                    _ = stopped(&mut stop) => break,
                }
                let plan = live.load();
                self.lock().demand_moved(precise_now(), |id| plan.lease_gate(id).map_or(0.0, |g| g.wants()));
                self.apply(&plan);
                continue;
            }
            let plan = live.load_full();
            let mut answered = false;
            let request = self.lock().request(now, |id| plan.lease_gate(id).map_or(0.0, |g| g.ask()));
            if let Some(mut request) = request {
                // Lost if the call fails: the next request's span starts after this one.
                for r in &mut request.resource {
                    r.signals = plan.lease_gate(&r.resource_id).and_then(|g| g.take_signals()).map(Box::new);
                }
                for r in &request.resource {
                    tracing::debug!(resource = %r.resource_id, wants = r.wants, "asking");
                }
                let call = self.servers.call("GetCapacity", |mut c| async move { c.get_capacity(request).await });
                tokio::pin!(call);
                // A call can hang up to its timeout (a partition): leases that run out meanwhile
                // give way to their fallback on time, as between calls.
                let answer = loop {
                    tokio::select! {
                        answer = &mut call => break answer,
                        _ = tokio::time::sleep(defaults::LEASE_CHECK_INTERVAL) => self.apply(&plan),
                        _ = stopped(&mut stop) => break 'refresh,
                    }
                };
                let now = precise_now();
                match answer {
                    Ok(response) => {
                        let failing = sync::lock(&self.contact).answered(now);
                        if failing > 0 {
                            tracing::info!(failed_attempts = failing, "the capacity servers answer again");
                        }
                        for r in &response.response {
                            let (capacity, refresh) = (r.gets.capacity, r.gets.refresh_interval);
                            tracing::debug!(resource = %r.resource_id, capacity, refresh, "leased");
                        }
                        // Leases came, or none at all: a redirect is not an answer to wait on.
                        let taken = self.lock().on_response(now, response);
                        match taken {
                            Answer::Updated => answered = true,
                            Answer::Redirect(master) => self.servers.redirect(master),
                        }
                    }
                    Err(error) if !error.denied.is_empty() => {
                        // The servers answered: the others are asked for again at once.
                        sync::lock(&self.contact).answered(now);
                        if self.lock().on_denied(now, &error.denied) {
                            tracing::warn!(
                                resources = %error.denied.join(","),
                                retry_seconds = defaults::DENIED_RETRY,
                                "the capacity servers' policy refuses these resources to this client: nothing passes \
                                 for them until they are asked for again; {error}"
                            );
                        }
                    }
                    Err(error) => {
                        // The first failure in a row is a warning, the rest are not news.
                        let failing = sync::lock(&self.contact).failed_calls;
                        if failing == 0 {
                            tracing::warn!(%error, "no lease from the capacity servers; current leases stay until they expire");
                        } else {
                            tracing::debug!(%error, failed_attempts = failing + 1, "still no lease from the capacity servers");
                        }
                        sync::lock(&self.contact).failed(now, &error.message);
                        let untried = self.servers.move_on();
                        self.lock().on_error(now, untried);
                    }
                }
            }
            self.apply(&plan);
            if answered {
                plan.all_gates().iter().for_each(|gate| gate.answered());
            }
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
        match self.servers.call("ReleaseCapacity", |mut c| async move { c.release_capacity(request).await }).await {
            Ok(_) => tracing::info!("leases released"),
            Err(error) => tracing::warn!(%error, "ReleaseCapacity failed; the leases will expire on their own"),
        }
    }
}
