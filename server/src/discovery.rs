//! The replicas of one tree node as a client sees them (SPEC §2, §3.8): the configured
//! addresses tried in turn, the master that Discovery or a redirect names, and one channel to
//! it. Used by the sidecar toward its capacity servers and by an intermediate server toward
//! its parent.

use std::{
    future::Future,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use sluice_proto::{DiscoveryRequest, capacity_client::CapacityClient};
use tonic::{
    Response, Status,
    transport::{Channel, ClientTlsConfig, Endpoint},
};

use crate::{
    defaults::{CAPACITY_CONNECT_TIMEOUT, CAPACITY_RPC_TIMEOUT},
    reload::Watch,
    telemetry::with_causes,
    tls::{self, ClientTlsFiles},
};

/// Called once per RPC with its method and whether it succeeded, for the caller's metrics.
pub type Record = fn(&'static str, bool);

pub struct Servers {
    addresses: Vec<String>,
    record: Record,
    current: Mutex<Current>,
}

struct Current {
    tls: Option<ClientTlsConfig>,
    /// Bumped by every [`Servers::set_tls`]: a channel made before is not kept.
    tls_generation: u64,
    /// Index of the configured address last tried.
    index: usize,
    /// The master's address once Discovery or a redirect named it.
    master: Option<String>,
    channel: Option<Channel>,
}

impl Servers {
    /// `addresses`: at least one host:port of the node's replicas (or a name balancing over
    /// them).
    pub fn new(addresses: Vec<String>, tls: Option<ClientTlsConfig>, record: Record) -> Servers {
        assert!(!addresses.is_empty(), "a node has at least one address");
        Servers {
            addresses,
            record,
            current: Mutex::new(Current { tls, tls_generation: 0, index: 0, master: None, channel: None }),
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
        let Some(files) = files else { return Ok(Arc::new(Servers::new(addresses, None, record))) };
        let paths = files.paths();
        let content = Watch::read(&paths)?;
        let servers = Arc::new(Servers::new(addresses, Some(files.client_config(&content)?), record));
        if paths.is_empty() {
            return Ok(servers);
        }
        let target = servers.clone();
        let apply = move |content: &[Vec<u8>]| {
            target.set_tls(files.client_config(content)?);
            Ok(())
        };
        tokio::spawn(tls::rotate(what, paths, content, poll, apply));
        Ok(servers)
    }

    fn lock(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The master's address if known, else the configured address being tried.
    pub fn address(&self) -> String {
        let current = self.lock();
        current.master.clone().unwrap_or_else(|| self.addresses[current.index].clone())
    }

    /// New TLS settings (rotated files), for the connections made from now on: the next call
    /// connects anew.
    pub fn set_tls(&self, tls: ClientTlsConfig) {
        let mut current = self.lock();
        current.tls = Some(tls);
        current.tls_generation += 1;
        current.channel = None;
    }

    /// A channel to `address` with the TLS settings in force, and their generation.
    fn endpoint(&self, address: &str) -> Result<(Channel, u64), String> {
        let (tls, generation) = {
            let current = self.lock();
            (current.tls.clone(), current.tls_generation)
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| format!("{address}: {e}"))?
            .connect_timeout(CAPACITY_CONNECT_TIMEOUT)
            .timeout(CAPACITY_RPC_TIMEOUT)
            .tcp_nodelay(true);
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls).map_err(|e| format!("{address}: {e}"))?;
        }
        Ok((endpoint.connect_lazy(), generation))
    }

    /// Remembers the master and, unless the TLS settings changed since it was made (files
    /// rotated during a Discovery), its channel.
    fn keep(&self, master: String, channel: &Channel, generation: u64) {
        let mut current = self.lock();
        current.master = Some(master);
        if current.tls_generation == generation {
            current.channel = Some(channel.clone());
        }
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
        let (channel, generation) = self.endpoint(&address)?;
        let address = if known {
            address
        } else {
            let discovered = CapacityClient::new(channel.clone()).discovery(DiscoveryRequest {}).await;
            (self.record)("Discovery", discovered.is_ok());
            let response = discovered.map_err(|s| format!("Discovery at {address}: {}", described(&s)))?.into_inner();
            match response.mastership.master_address {
                Some(master) if !response.is_master && master != address => {
                    let (channel, generation) = self.endpoint(&master)?;
                    self.keep(master, &channel, generation);
                    return Ok(channel);
                }
                _ if !response.is_master => return Err(format!("{address} is not the master and knows none")),
                _ => address,
            }
        };
        self.keep(address, &channel, generation);
        Ok(channel)
    }

    /// One RPC to the master; errors come back as one line.
    pub async fn call<T, F, Fut>(&self, method: &'static str, rpc: F) -> Result<T, String>
    where
        F: FnOnce(CapacityClient<Channel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let channel = self.master().await?;
        let answer = rpc(CapacityClient::new(channel)).await;
        (self.record)(method, answer.is_ok());
        answer.map(Response::into_inner).map_err(|s| format!("{method}: {:?}: {}", s.code(), described(&s)))
    }

    /// Follows a master redirect; an unknown master means asking Discovery again.
    pub fn redirect(&self, master: Option<String>) {
        let mut current = self.lock();
        tracing::info!(master = master.as_deref().unwrap_or("unknown"), "redirected to the master");
        current.channel = None;
        current.master = master;
    }

    /// After an error: forget the master and try the next configured address.
    pub fn next(&self) {
        let mut current = self.lock();
        current.channel = None;
        current.master = None;
        current.index = (current.index + 1) % self.addresses.len();
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
    async fn a_channel_made_before_the_tls_files_rotated_is_not_kept() {
        let servers = Servers::new(vec!["127.0.0.1:1".into()], None, |_, _| {});
        // A Discovery under way when the files rotate: its channel serves that call only.
        let (channel, generation) = servers.endpoint("127.0.0.1:1").unwrap();
        servers.set_tls(ClientTlsConfig::new());
        servers.keep("127.0.0.1:1".into(), &channel, generation);
        assert!(servers.lock().channel.is_none());
        assert_eq!(servers.address(), "127.0.0.1:1", "the master is remembered all the same");
        // One made after is kept.
        let (channel, generation) = servers.endpoint("127.0.0.1:1").unwrap();
        servers.keep("127.0.0.1:1".into(), &channel, generation);
        assert!(servers.lock().channel.is_some());
    }
}
