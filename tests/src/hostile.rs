//! A hostile client of the capacity server, for the adversarial memory tests: callers that make
//! as many leases as the server takes, as fast as it answers, with the largest requests it
//! accepts (a new long client id each time, the most resources, the most bands and profile
//! groups), and a probe that times a small GetCapacity of an honest client meanwhile.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use sluice_proto::{
    ClientGroup, GetCapacityRequest, GetServerCapacityRequest, PriorityBandAggregate, ResourceRequest,
    ServerCapacityResourceRequest, WantsProfile, capacity_client::CapacityClient,
};
use tonic::{
    Code,
    transport::{Channel, Endpoint},
};

/// Largest message either side of the flood takes: the servers' request limit.
const MAX_MESSAGE: usize = 16 << 20;

/// What the callers send.
#[derive(Clone, Debug)]
pub struct Flood {
    /// Requests in flight at once.
    pub callers: usize,
    /// Connections they share.
    pub connections: usize,
    /// Resources named per request.
    pub resources: usize,
    /// Distinct resource ids the requests cycle through.
    pub resource_pool: usize,
    /// Bands per resource of the GetServerCapacity requests (every other request); 0: only
    /// GetCapacity.
    pub bands: usize,
    /// Profile groups per band (1: no profile).
    pub groups: usize,
    /// Length of every client and server id.
    pub id_bytes: usize,
    /// Length of every resource id.
    pub resource_id_bytes: usize,
}

/// How the flood's requests were answered.
#[derive(Debug, Default)]
pub struct Answers {
    pub ok: AtomicU64,
    pub exhausted: AtomicU64,
    pub invalid: AtomicU64,
    pub other: AtomicU64,
    /// The first refusal's message.
    pub refusal: std::sync::OnceLock<String>,
}

impl Answers {
    fn count(&self, result: Result<(), tonic::Status>) {
        if let Err(status) = &result {
            let _ = self.refusal.set(format!("{:?}: {}", status.code(), status.message()));
        }
        let counter = match result.as_ref().map_err(tonic::Status::code) {
            Ok(()) => &self.ok,
            Err(Code::ResourceExhausted) => &self.exhausted,
            Err(Code::InvalidArgument) => &self.invalid,
            Err(_) => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn summary(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "{} OK, {} RESOURCE_EXHAUSTED, {} INVALID_ARGUMENT, {} other (first refusal: {})",
            n(&self.ok),
            n(&self.exhausted),
            n(&self.invalid),
            n(&self.other),
            self.refusal.get().map_or("none", String::as_str)
        )
    }
}

/// `text` padded with dots to `bytes` (at least its own length).
fn id(text: String, bytes: usize) -> String {
    let pad = bytes.saturating_sub(text.len());
    text + &".".repeat(pad)
}

async fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect to the server")
}

fn client(channel: Channel) -> CapacityClient<Channel> {
    CapacityClient::new(channel).max_decoding_message_size(MAX_MESSAGE).max_encoding_message_size(MAX_MESSAGE)
}

impl Flood {
    /// The `n`th request's resource ids.
    fn resource_ids(&self, n: u64) -> impl Iterator<Item = String> + '_ {
        let first = (n as usize).wrapping_mul(self.resources);
        (0..self.resources)
            .map(move |k| id(format!("r{}", (first + k) % self.resource_pool.max(1)), self.resource_id_bytes))
    }

    /// The `n`th GetCapacity: a new client's, on [`Flood::resources`] of the pool.
    pub fn get_capacity(&self, n: u64) -> GetCapacityRequest {
        GetCapacityRequest {
            client_id: id(format!("hostile-{n}"), self.id_bytes),
            resource: self
                .resource_ids(n)
                .map(|resource_id| ResourceRequest { resource_id, priority: 0, has: None, wants: 1e6 })
                .collect(),
        }
    }

    fn get_server_capacity(&self, n: u64) -> GetServerCapacityRequest {
        let groups = self.groups.max(1) as i64;
        let band = |priority: usize| PriorityBandAggregate {
            priority: priority as i64,
            num_clients: groups,
            wants: groups as f64,
            profile: (groups > 1).then(|| WantsProfile {
                group: (0..groups).map(|_| ClientGroup { num_clients: 1, wants: 1.0 }).collect(),
            }),
        };
        GetServerCapacityRequest {
            server_id: id(format!("hostile-server-{n}"), self.id_bytes),
            resource: self
                .resource_ids(n)
                .map(|resource_id| ServerCapacityResourceRequest {
                    resource_id,
                    has: None,
                    wants: (0..self.bands).map(band).collect(),
                })
                .collect(),
        }
    }

    /// Sends requests from [`Flood::callers`] callers until `stop` is set.
    pub async fn run(self, addr: SocketAddr, stop: Arc<AtomicBool>) -> Arc<Answers> {
        let answers = Arc::new(Answers::default());
        let mut channels = Vec::new();
        for _ in 0..self.connections.max(1) {
            channels.push(channel(addr).await);
        }
        let flood = Arc::new(self);
        let next = Arc::new(AtomicU64::new(0));
        let callers: Vec<_> = (0..flood.callers)
            .map(|k| {
                let (flood, next, stop, answers) = (flood.clone(), next.clone(), stop.clone(), answers.clone());
                let mut client = client(channels[k % channels.len()].clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let result = if flood.bands > 0 && n % 2 == 1 {
                            client.get_server_capacity(flood.get_server_capacity(n)).await.map(drop)
                        } else {
                            client.get_capacity(flood.get_capacity(n)).await.map(drop)
                        };
                        answers.count(result);
                    }
                })
            })
            .collect();
        for caller in callers {
            caller.await.expect("flood caller");
        }
        answers
    }
}

/// Latencies of one honest client's small GetCapacity (one resource), one call after another on
/// a connection of its own, until `stop` is set; failed calls count too.
pub async fn probe(addr: SocketAddr, stop: Arc<AtomicBool>) -> (Histogram<u64>, u64) {
    let mut client = client(channel(addr).await);
    let mut latency_us = Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds");
    let mut failed = 0;
    while !stop.load(Ordering::Relaxed) {
        let request = GetCapacityRequest {
            client_id: "honest".into(),
            resource: vec![ResourceRequest { resource_id: "honest".into(), priority: 0, has: None, wants: 1.0 }],
        };
        let sent = Instant::now();
        failed += u64::from(client.get_capacity(request).await.is_err());
        latency_us.saturating_record(sent.elapsed().as_micros() as u64);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (latency_us, failed)
}

/// p50, p99 and max of a latency histogram in microseconds, as milliseconds.
pub fn latency_summary(h: &Histogram<u64>) -> String {
    let ms = |us: u64| us as f64 / 1000.0;
    format!(
        "{} calls: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        h.len(),
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max())
    )
}
