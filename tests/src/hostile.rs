//! A hostile client of the capacity server, for the adversarial memory tests: callers that make
//! as many leases as the server takes, as fast as it answers, with the largest requests it
//! accepts (a new long client id each time, the most resources, the most bands and profile
//! groups), and a probe that times a small GetCapacity of an honest client meanwhile.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::StreamBody;
use hyper::{body::Frame, client::conn::http2::SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_proto::{
    ClientGroup, GetCapacityRequest, GetServerCapacityRequest, PriorityBandAggregate, ResourceRequest,
    ServerCapacityResourceRequest, WantsProfile, capacity_client::CapacityClient,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
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
    /// Distinct resource ids the requests cycle through (each caller names the same ones in all
    /// its requests).
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

/// What a server's refusal for want of room in its request bytes in flight names.
pub const IN_FLIGHT_FLAG: &str = "--max-request-bytes-in-flight";

/// How the flood's requests were answered.
#[derive(Debug, Default)]
pub struct Answers {
    pub ok: AtomicU64,
    /// RESOURCE_EXHAUSTED for the server's bounds on what it holds (leases, resources).
    pub exhausted: AtomicU64,
    /// RESOURCE_EXHAUSTED for want of room in the request bytes in flight.
    pub shed: AtomicU64,
    pub invalid: AtomicU64,
    pub other: AtomicU64,
    /// The first failure that is none of the above.
    pub failure: std::sync::OnceLock<String>,
}

impl Answers {
    fn count(&self, result: Result<(), tonic::Status>) {
        let counter = match &result {
            Ok(()) => &self.ok,
            Err(status) => match status.code() {
                Code::ResourceExhausted if status.message().contains(IN_FLIGHT_FLAG) => &self.shed,
                Code::ResourceExhausted => &self.exhausted,
                Code::InvalidArgument => &self.invalid,
                _ => {
                    let _ = self.failure.set(format!("{:?}: {}", status.code(), status.message()));
                    &self.other
                }
            },
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn summary(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "{} OK, {} RESOURCE_EXHAUSTED for what the server holds, {} for the bytes in flight, {} INVALID_ARGUMENT, \
             {} other (first: {})",
            n(&self.ok),
            n(&self.exhausted),
            n(&self.shed),
            n(&self.invalid),
            n(&self.other),
            self.failure.get().map_or("none", String::as_str)
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
                .map(|resource_id| ResourceRequest { resource_id, priority: 0, has: None, wants: 1e6, signals: None })
                .collect(),
        }
    }

    /// The `n`th GetServerCapacity: a new child server's, with [`Flood::bands`] on each resource.
    pub fn get_server_capacity(&self, n: u64) -> GetServerCapacityRequest {
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
                    signals: None,
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
                    // Built once: each call is a copy under a new client id, so that making
                    // requests takes the flood's machine little of what the server needs.
                    let (capacity, server) = (flood.get_capacity(k as u64), flood.get_server_capacity(k as u64));
                    while !stop.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let result = if flood.bands > 0 && n % 2 == 1 {
                            let request = GetServerCapacityRequest {
                                server_id: id(format!("hostile-server-{n}"), flood.id_bytes),
                                ..server.clone()
                            };
                            client.get_server_capacity(request).await.map(drop)
                        } else {
                            let request = GetCapacityRequest {
                                client_id: id(format!("hostile-{n}"), flood.id_bytes),
                                ..capacity.clone()
                            };
                            client.get_capacity(request).await.map(drop)
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

/// What one honest client saw of the server under the flood.
#[derive(Debug)]
pub struct Probe {
    /// Every call's latency in microseconds, refused and failed ones too.
    pub latency_us: Histogram<u64>,
    /// Calls refused RESOURCE_EXHAUSTED for want of room in the request bytes in flight.
    pub shed: u64,
    /// Calls that failed otherwise.
    pub failed: u64,
}

/// One honest client's small GetCapacity (one resource), one call after another on a
/// connection of its own, until `stop` is set.
pub async fn probe(addr: SocketAddr, stop: Arc<AtomicBool>) -> Probe {
    let mut client = client(channel(addr).await);
    let mut probe = Probe {
        latency_us: Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds"),
        shed: 0,
        failed: 0,
    };
    while !stop.load(Ordering::Relaxed) {
        let request = GetCapacityRequest {
            client_id: "honest".into(),
            resource: vec![ResourceRequest {
                resource_id: "honest".into(),
                priority: 0,
                has: None,
                wants: 1.0,
                signals: None,
            }],
        };
        let sent = Instant::now();
        match client.get_capacity(request).await {
            Ok(_) => {}
            Err(status) if status.code() == Code::ResourceExhausted && status.message().contains(IN_FLIGHT_FLAG) => {
                probe.shed += 1;
            }
            Err(status) => {
                eprintln!("the honest client's call failed: {status}");
                probe.failed += 1;
            }
        }
        probe.latency_us.saturating_record(sent.elapsed().as_micros() as u64);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    probe
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

/// A request body sent frame by frame, for as long as its sender is kept.
pub type Trickle = StreamBody<ReceiverStream<Result<Frame<Bytes>, Infallible>>>;

/// A plain HTTP/2 connection to a gRPC server, for calls that tonic would not send.
pub async fn connect(grpc: SocketAddr) -> SendRequest<Trickle> {
    let stream = tokio::net::TcpStream::connect(grpc).await.expect("connect");
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.expect("HTTP/2");
    tokio::spawn(connection);
    sender
}

/// Starts a GetCapacity on `connection` that sends the first `sent` bytes of a message it says
/// is `declared` bytes long, then nothing more until what it returns is dropped.
pub async fn stall(connection: &SendRequest<Trickle>, grpc: SocketAddr, declared: u32, sent: usize) -> Stalled {
    let (body, frames) = mpsc::channel(1);
    let request = hyper::Request::post(format!("http://{grpc}/doorman.Capacity/GetCapacity"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(StreamBody::new(ReceiverStream::new(frames)))
        .expect("a request");
    // Uncompressed, then the length, then part of the message.
    let mut start = vec![0];
    start.extend(declared.to_be_bytes());
    start.resize(5 + sent, 0);
    body.send(Ok(Frame::data(Bytes::from(start)))).await.expect("the body");
    let answer = tokio::spawn(connection.clone().send_request(request));
    Stalled { _body: body, answer }
}

/// A call whose body stopped half-way: held until dropped.
pub struct Stalled {
    _body: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
    answer: tokio::task::JoinHandle<hyper::Result<hyper::Response<hyper::body::Incoming>>>,
}

impl Stalled {
    /// Whether the server has answered it already (refused it), rather than holding it.
    pub fn answered(&self) -> bool {
        self.answer.is_finished()
    }
}
