//! The replicas of one tree node as a client sees them (SPEC §2, §3.8): the configured
//! addresses tried in turn, the master that Discovery or a redirect names, and one channel to
//! it. Used by the sidecar toward its capacity servers and by an intermediate server toward
//! its parent.

use std::{
    fmt,
    future::Future,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use arc_swap::ArcSwap;
use sluice_proto::{DiscoveryRequest, capacity_client::CapacityClient};
use tonic::{
    Response, Status,
    transport::{Channel, ClientTlsConfig, Endpoint},
};

use sluice_runtime::{reload::rotating, telemetry::with_causes};

use crate::{
    answer,
    defaults::{CAPACITY_CONNECT_TIMEOUT, CAPACITY_RPC_TIMEOUT, MAX_ANSWER_BYTES},
    schedule::Round,
    tls::ClientTlsFiles,
};

/// Called once per RPC with its method and whether it succeeded, for the caller's metrics.
pub type Record = fn(&'static str, bool);

pub struct Servers {
    addresses: Vec<String>,
    /// The TLS settings in force (rotated files replace them); `None`: plaintext.
    tls: Option<Arc<ArcSwap<ClientTlsConfig>>>,
    record: Record,
    current: Mutex<Current>,
}

struct Current {
    /// Index of the configured address last tried.
    index: usize,
    /// The master's address once Discovery or a redirect named it.
    master: Option<String>,
    /// The channel to it, and the TLS settings it was made with: once they are no longer in
    /// force, the next call connects anew.
    channel: Option<(Channel, Option<Arc<ClientTlsConfig>>)>,
    /// The TLS settings in force when the last call failed, until a call succeeds.
    failed_with: Option<Arc<ClientTlsConfig>>,
    /// How far through the addresses the failures since the last answer have gone.
    round: Round,
}

impl Servers {
    /// `addresses`: at least one host:port of the node's replicas (or a name balancing over
    /// them).
    pub fn new(addresses: Vec<String>, tls: Option<Arc<ArcSwap<ClientTlsConfig>>>, record: Record) -> Servers {
        assert!(!addresses.is_empty(), "a node has at least one address");
        Servers {
            addresses,
            tls,
            record,
            current: Mutex::new(Current {
                index: 0,
                master: None,
                channel: None,
                failed_with: None,
                round: Round::default(),
            }),
        }
    }

    /// Like [`Servers::new`], over TLS from `files` when given; the files are then polled every
    /// `poll`, and the connections made after they change use them (`what` names them in the
    /// log). Must be called on a runtime.
    pub fn with_tls_files(
        addresses: Vec<String>,
        files: Option<ClientTlsFiles>,
        record: Record,
        poll: Duration,
        what: &'static str,
    ) -> Result<Arc<Servers>, String> {
        let tls = files
            .map(|files| rotating(what, files.paths(), poll, move |content| files.client_config(content)))
            .transpose()?;
        Ok(Arc::new(Servers::new(addresses, tls, record)))
    }

    fn lock(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The master's address if known, else the configured address being tried.
    pub fn address(&self) -> String {
        let current = self.lock();
        current.master.clone().unwrap_or_else(|| self.addresses[current.index].clone())
    }

    /// A channel to `address` with the TLS settings in force, and those settings.
    fn endpoint(&self, address: &str) -> Result<(Channel, Option<Arc<ClientTlsConfig>>), String> {
        let tls = self.tls.as_ref().map(|t| t.load_full());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| format!("{address}: {e}"))?
            .connect_timeout(CAPACITY_CONNECT_TIMEOUT)
            .timeout(CAPACITY_RPC_TIMEOUT)
            .tcp_nodelay(true);
        if let Some(tls) = &tls {
            endpoint = endpoint.tls_config(ClientTlsConfig::clone(tls)).map_err(|e| format!("{address}: {e}"))?;
        }
        Ok((endpoint.connect_lazy(), tls))
    }

    /// Whether `settings` (`None`: plaintext) are the TLS settings in force.
    fn in_force(&self, settings: Option<&Arc<ClientTlsConfig>>) -> bool {
        match (settings, self.tls.as_ref().map(|t| t.load())) {
            (Some(settings), Some(in_force)) => Arc::ptr_eq(settings, &in_force),
            (settings, in_force) => settings.is_none() && in_force.is_none(),
        }
    }

    /// The channel to the master, unless the TLS settings it was made with were replaced.
    fn cached(&self, current: &Current) -> Option<Channel> {
        let (channel, made_with) = current.channel.as_ref()?;
        self.in_force(made_with.as_ref()).then(|| channel.clone())
    }

    /// A channel to the master, asking Discovery first when it is not known.
    async fn master(&self) -> Result<Channel, String> {
        let (address, known) = {
            let current = self.lock();
            if let Some(channel) = self.cached(&current) {
                return Ok(channel);
            }
            match &current.master {
                Some(master) => (master.clone(), true),
                None => (self.addresses[current.index].clone(), false),
            }
        };
        let (mut channel, mut made_with) = self.endpoint(&address)?;
        let address = if known {
            address
        } else {
            let discovered = CapacityClient::new(channel.clone()).discovery(DiscoveryRequest {}).await;
            (self.record)("Discovery", discovered.is_ok());
            let response = discovered.map_err(|s| format!("Discovery at {address}: {}", described(&s)))?.into_inner();
            match response.mastership.master_address {
                Some(master) if !response.is_master && master != address => {
                    (channel, made_with) = self.endpoint(&master)?;
                    master
                }
                _ if !response.is_master => return Err(format!("{address} is not the master and knows none")),
                _ => address,
            }
        };
        let mut current = self.lock();
        current.master = Some(address);
        current.channel = Some((channel.clone(), made_with));
        Ok(channel)
    }

    /// One RPC to the master; errors come back as one line, with the resources a policy
    /// refused.
    pub async fn call<T, F, Fut>(&self, method: &'static str, rpc: F) -> Result<T, CallError>
    where
        F: FnOnce(CapacityClient<Channel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let settings = self.tls.as_ref().map(|t| t.load_full());
        let answer = match self.master().await {
            Ok(channel) => {
                let answer = rpc(CapacityClient::new(channel).max_decoding_message_size(MAX_ANSWER_BYTES)).await;
                (self.record)(method, answer.is_ok());
                answer.map(Response::into_inner).map_err(|s| CallError {
                    message: format!("{method}: {:?}: {}", s.code(), described(&s)),
                    denied: answer::denied(&s),
                })
            }
            Err(message) => Err(CallError { message, denied: Vec::new() }),
        };
        let mut current = self.lock();
        current.failed_with = answer.is_err().then_some(settings).flatten();
        if answer.is_ok() {
            current.round.answered();
        }
        answer
    }

    /// Whether the TLS settings were replaced since the last call failed with the old ones
    /// (true once per replacement). The failure may have been theirs, an expired or untrusted
    /// certificate, so the caller asks again at once instead of waiting out its backoff.
    pub fn renewed_since_failure(&self) -> bool {
        let mut current = self.lock();
        let renewed = current.failed_with.as_ref().is_some_and(|failed_with| !self.in_force(Some(failed_with)));
        if renewed {
            current.failed_with = None;
        }
        renewed
    }

    /// Follows a master redirect; an unknown master means asking Discovery again.
    pub fn redirect(&self, master: Option<String>) {
        let mut current = self.lock();
        tracing::info!(master = master.as_deref().unwrap_or("unknown"), "redirected to the master");
        current.channel = None;
        current.master = master;
    }

    /// After an error: forget the master and try the next configured address. Returns whether
    /// it is untried in this round ([`Round`]): the caller asks it at once, and backs off only
    /// once every address has failed in a row.
    pub fn move_on(&self) -> bool {
        let mut current = self.lock();
        current.channel = None;
        current.master = None;
        current.index = (current.index + 1) % self.addresses.len();
        current.round.failed(self.addresses.len())
    }
}

/// Why a call failed.
#[derive(Debug)]
pub struct CallError {
    /// One line.
    pub message: String,
    /// The resources the server's policy refused (PERMISSION_DENIED), if it named them.
    pub denied: Vec<String>,
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<CallError> for String {
    fn from(error: CallError) -> String {
        error.message
    }
}

/// A status's message and the errors behind it: tonic says only "transport error" for a refused
/// connection or a failed TLS handshake, and the cause is in its sources.
fn described(status: &Status) -> String {
    with_causes(status.message(), status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_channel_made_before_the_tls_files_rotated_is_not_used_again() {
        let tls = Arc::new(ArcSwap::from_pointee(ClientTlsConfig::new()));
        let servers = Servers::new(vec!["127.0.0.1:1".into()], Some(tls.clone()), |_, _| {});
        let (channel, made_with) = servers.endpoint("127.0.0.1:1").unwrap();
        servers.lock().channel = Some((channel, made_with));
        assert!(servers.cached(&servers.lock()).is_some(), "made with the settings in force");
        // The files rotate (during a Discovery, say): the next call connects anew.
        tls.store(Arc::new(ClientTlsConfig::new()));
        assert!(servers.cached(&servers.lock()).is_none());
    }

    #[test]
    fn after_an_error_the_other_addresses_are_tried_before_a_backoff() {
        let servers = Servers::new(vec!["a:1".into(), "b:1".into(), "c:1".into()], None, |_, _| {});
        let rounds: Vec<(bool, String)> = (0..6).map(|_| (servers.move_on(), servers.address())).collect();
        let expected = [(true, "b:1"), (true, "c:1"), (false, "a:1"), (true, "b:1"), (true, "c:1"), (false, "a:1")];
        assert_eq!(rounds, expected.map(|(untried, address)| (untried, address.to_string())));
    }

    #[tokio::test]
    async fn new_tls_settings_after_a_failure_are_reported_once() {
        let tls = Arc::new(ArcSwap::from_pointee(ClientTlsConfig::new()));
        // Nothing listens on port 1 of the loopback: every call fails at once.
        let servers = Servers::new(vec!["127.0.0.1:1".into()], Some(tls.clone()), |_, _| {});
        let discovery = || servers.call("Discovery", |mut c| async move { c.discovery(DiscoveryRequest {}).await });
        assert!(discovery().await.is_err());
        assert!(!servers.renewed_since_failure(), "the settings that failed are still in force");
        tls.store(Arc::new(ClientTlsConfig::new()));
        assert!(servers.renewed_since_failure());
        assert!(!servers.renewed_since_failure(), "once per replacement");
        // Replaced with no failure since: nothing to retry.
        tls.store(Arc::new(ClientTlsConfig::new()));
        assert!(!servers.renewed_since_failure());
    }
}
