//! A scriptable server of Envoy's rate limit quota service (RLQS v3,
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`), for the
//! tests that put a real Envoy's `envoy.filters.http.rate_limit_quota` filter in front of the
//! test upstream: it records every usage report, pushes the assignment it is given to every
//! bucket it has seen (and to each new bucket as it first shows up), and can break its streams
//! or stop outright. Also the Envoy binary and the filter's configuration those tests run.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{SocketAddr, TcpListener},
    pin::Pin,
    process::{Command, Stdio},
    sync::{Arc, Mutex, MutexGuard},
    thread,
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, oneshot};
use tokio_stream::{Stream, wrappers::UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming, transport::server::TcpIncoming};

use crate::harness::free_port;

use sluice_proto::envoy::{
    service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
        rate_limit_quota_response::{
            BucketAction,
            bucket_action::{self, QuotaAssignmentAction},
        },
        rate_limit_quota_service_server::{RateLimitQuotaService, RateLimitQuotaServiceServer},
    },
    r#type::v3::{RateLimitStrategy, RateLimitUnit, TokenBucket, rate_limit_strategy},
};

/// A bucket id: Envoy's `BucketId.bucket`, ordered so that equal ids compare equal.
pub type Bucket = BTreeMap<String, String>;

/// One bucket's line of a usage report.
#[derive(Clone, Debug, PartialEq)]
pub struct Usage {
    pub bucket: Bucket,
    pub allowed: u64,
    pub denied: u64,
    /// `time_elapsed`: since the bucket's previous report (or its first request).
    pub elapsed: Option<Duration>,
}

/// One `RateLimitQuotaUsageReports` message as received.
#[derive(Clone, Debug)]
pub struct Report {
    /// When it arrived.
    pub at: Instant,
    /// Which stream it came on: 0 for the first stream the server accepted, and so on.
    pub stream: usize,
    pub domain: String,
    pub usages: Vec<Usage>,
}

/// What the server pushes: a strategy and the assignment's time to live (`None`: no expiry).
#[derive(Clone, Debug)]
pub struct Assignment {
    pub strategy: RateLimitStrategy,
    pub ttl: Option<Duration>,
}

impl Assignment {
    pub fn new(strategy: RateLimitStrategy, ttl: Option<Duration>) -> Self {
        Assignment { strategy, ttl }
    }
}

/// `blanket_rule: ALLOW_ALL`.
pub fn allow_all() -> RateLimitStrategy {
    blanket(rate_limit_strategy::BlanketRule::AllowAll)
}

/// `blanket_rule: DENY_ALL`.
pub fn deny_all() -> RateLimitStrategy {
    blanket(rate_limit_strategy::BlanketRule::DenyAll)
}

fn blanket(rule: rate_limit_strategy::BlanketRule) -> RateLimitStrategy {
    RateLimitStrategy { strategy: Some(rate_limit_strategy::Strategy::BlanketRule(rule as i32)) }
}

/// `token_bucket {max_tokens, tokens_per_fill, fill_interval}`.
pub fn token_bucket(max_tokens: u32, tokens_per_fill: u32, fill_interval: Duration) -> RateLimitStrategy {
    RateLimitStrategy {
        strategy: Some(rate_limit_strategy::Strategy::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(tokens_per_fill),
            fill_interval: Some(duration(fill_interval)),
        })),
    }
}

/// `requests_per_time_unit {requests_per_time_unit: n, time_unit: SECOND}`.
pub fn per_second(n: u64) -> RateLimitStrategy {
    RateLimitStrategy {
        strategy: Some(rate_limit_strategy::Strategy::RequestsPerTimeUnit(rate_limit_strategy::RequestsPerTimeUnit {
            requests_per_time_unit: n,
            time_unit: RateLimitUnit::Second as i32,
        })),
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

fn std_duration(d: &prost_types::Duration) -> Option<Duration> {
    Some(Duration::new(u64::try_from(d.seconds).ok()?, u32::try_from(d.nanos).ok()?))
}

type Reply = Result<RateLimitQuotaResponse, Status>;

/// One stream the server accepted: where its pushes go (`None` once it ended) and the buckets
/// reported on it.
struct OpenStream {
    push: Option<mpsc::UnboundedSender<Reply>>,
    buckets: Vec<Bucket>,
}

#[derive(Default)]
struct State {
    reports: Vec<Report>,
    streams: Vec<OpenStream>,
    assignment: Option<Assignment>,
    pushes: Vec<(Instant, Bucket, Assignment)>,
}

impl State {
    fn push(&mut self, stream: usize, buckets: &[Bucket]) {
        let Some(assignment) = self.assignment.clone() else { return };
        let Some(tx) = self.streams[stream].push.clone() else { return };
        if buckets.is_empty() {
            return;
        }
        let response = RateLimitQuotaResponse {
            bucket_action: buckets
                .iter()
                .map(|bucket| BucketAction {
                    bucket_id: Some(BucketId { bucket: bucket.clone().into_iter().collect() }),
                    bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(QuotaAssignmentAction {
                        assignment_time_to_live: assignment.ttl.map(duration),
                        rate_limit_strategy: Some(assignment.strategy),
                    })),
                })
                .collect(),
        };
        if tx.send(Ok(response)).is_ok() {
            let now = Instant::now();
            self.pushes.extend(buckets.iter().map(|b| (now, b.clone(), assignment.clone())));
        }
    }
}

#[derive(Clone, Default)]
struct Service {
    state: Arc<Mutex<State>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[tonic::async_trait]
impl RateLimitQuotaService for Service {
    type StreamRateLimitQuotasStream = Pin<Box<dyn Stream<Item = Reply> + Send>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = {
            let mut state = lock(&self.state);
            state.streams.push(OpenStream { push: Some(tx), buckets: Vec::new() });
            state.streams.len() - 1
        };
        let shared = self.state.clone();
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                let usages: Vec<Usage> = message
                    .bucket_quota_usages
                    .iter()
                    .map(|u| Usage {
                        bucket: u
                            .bucket_id
                            .as_ref()
                            .map(|b| b.bucket.clone().into_iter().collect())
                            .unwrap_or_default(),
                        allowed: u.num_requests_allowed,
                        denied: u.num_requests_denied,
                        elapsed: u.time_elapsed.as_ref().and_then(std_duration),
                    })
                    .collect();
                let mut state = lock(&shared);
                let mut new = Vec::new();
                for usage in &usages {
                    if !state.streams[stream].buckets.contains(&usage.bucket) {
                        state.streams[stream].buckets.push(usage.bucket.clone());
                        new.push(usage.bucket.clone());
                    }
                }
                state.reports.push(Report { at: Instant::now(), stream, domain: message.domain, usages });
                state.push(stream, &new);
            }
            lock(&shared).streams[stream].push = None;
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }
}

/// The RLQS server, on its own thread and runtime; stopped (every connection dropped) when
/// dropped.
pub struct RlqsServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl RlqsServer {
    /// On a free loopback port.
    pub fn start() -> Self {
        Self::start_at(SocketAddr::from(([127, 0, 0, 1], free_port())))
    }

    /// On `addr`, listening before this returns.
    pub fn start_at(addr: SocketAddr) -> Self {
        let listener = TcpListener::bind(addr).expect("bind the RLQS server");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let service = Service::default();
        let state = service.state.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                let server = tonic::transport::Server::builder()
                    .add_service(RateLimitQuotaServiceServer::new(service))
                    .serve_with_incoming(TcpIncoming::from(listener));
                tokio::select! {
                    result = server => result.expect("RLQS server"),
                    _ = stopped => {}
                }
            });
            // Dropping the runtime drops every connection and stream task with it.
        });
        RlqsServer { addr, state, stop: Some(stop), thread: Some(thread) }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every usage report received so far, in order.
    pub fn reports(&self) -> Vec<Report> {
        lock(&self.state).reports.clone()
    }

    /// How many streams Envoy has opened.
    pub fn streams_opened(&self) -> usize {
        lock(&self.state).streams.len()
    }

    /// Every assignment pushed so far: when, to which bucket, what.
    pub fn pushes(&self) -> Vec<(Instant, Bucket, Assignment)> {
        lock(&self.state).pushes.clone()
    }

    /// From now on push `assignment`: at once to every bucket seen on every open stream, and to
    /// each bucket when it is first reported on a stream.
    pub fn assign(&self, assignment: Assignment) {
        let mut state = lock(&self.state);
        state.assignment = Some(assignment);
        for stream in 0..state.streams.len() {
            let buckets = state.streams[stream].buckets.clone();
            state.push(stream, &buckets);
        }
    }

    /// Ends every open stream with UNAVAILABLE (the server keeps listening).
    pub fn break_streams(&self) {
        let mut state = lock(&self.state);
        for stream in &mut state.streams {
            if let Some(tx) = stream.push.take() {
                let _ = tx.send(Err(Status::unavailable("stream broken by the test")));
            }
        }
    }

    /// Stops the server as a crash would: the listener and every connection closed at once.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for RlqsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `envoy.filters.http.rate_limit_quota` filter's settings for its one bucket matcher.
#[derive(Clone, Debug)]
pub struct QuotaFilter {
    /// `RateLimitQuotaFilterConfig.domain`.
    pub domain: String,
    /// The RLQS server (an h2c cluster).
    pub rlqs: SocketAddr,
    /// `bucket_id_builder`: the fixed entries of every bucket id.
    pub fixed: Vec<(String, String)>,
    /// `bucket_id_builder`: entries whose value is this request header (a `custom_value` of
    /// `HttpRequestHeaderMatchInput`).
    pub from_headers: Vec<(String, String)>,
    pub reporting_interval: Duration,
    /// `no_assignment_behavior.fallback_rate_limit`, as YAML (e.g. `{blanket_rule: ALLOW_ALL}`).
    pub no_assignment: String,
    /// `expired_assignment_behavior`: the timeout and `fallback_rate_limit` as YAML, if any.
    pub expired: Option<(Duration, String)>,
}

impl QuotaFilter {
    pub fn new(domain: &str, rlqs: SocketAddr) -> Self {
        QuotaFilter {
            domain: domain.into(),
            rlqs,
            fixed: vec![("name".into(), "sluice".into())],
            from_headers: Vec::new(),
            reporting_interval: Duration::from_millis(500),
            no_assignment: "{blanket_rule: ALLOW_ALL}".into(),
            expired: None,
        }
    }
}

/// An Envoy bootstrap: a listener on `listen` (admin on `admin`) sending every request to
/// `upstream` through the rate limit quota filter, whose RLQS cluster is h2c.
pub fn envoy_yaml(listen: SocketAddr, admin: SocketAddr, upstream: SocketAddr, filter: &QuotaFilter) -> String {
    let at = |a: SocketAddr| format!("{{address: {}, port_value: {}}}", a.ip(), a.port());
    let indent = " ".repeat(40);
    let mut builder = String::new();
    for (key, value) in &filter.fixed {
        let _ = write!(builder, "\n{indent}{key}: {{string_value: {value:?}}}");
    }
    for (key, header) in &filter.from_headers {
        let _ = write!(
            builder,
            "\n{indent}{key}:\n{indent}  custom_value:\n{indent}    name: {key}\n{indent}    typed_config:\n{indent}      \
             \"@type\": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput\n{indent}      header_name: {header}"
        );
    }
    let expired = match &filter.expired {
        Some((timeout, fallback)) => {
            let indent = " ".repeat(36);
            format!(
                "\n{indent}expired_assignment_behavior:\n{indent}  expired_assignment_behavior_timeout: {}s\n{indent}  \
                 fallback_rate_limit: {fallback}",
                timeout.as_secs_f64()
            )
        }
        None => String::new(),
    };
    format!(
        r#"admin:
  address:
    socket_address: {admin}
static_resources:
  listeners:
    - name: ingress
      address:
        socket_address: {listen}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                route_config:
                  name: local
                  virtual_hosts:
                    - name: upstream
                      domains: ["*"]
                      routes:
                        - match: {{prefix: "/"}}
                          route: {{cluster: upstream}}
                http_filters:
                  - name: envoy.filters.http.rate_limit_quota
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
                      rlqs_server:
                        envoy_grpc: {{cluster_name: rlqs}}
                      domain: {domain:?}
                      bucket_matchers:
                        matcher_list:
                          matchers:
                            - predicate:
                                single_predicate:
                                  input:
                                    name: path
                                    typed_config:
                                      "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                      header_name: ":path"
                                  value_match: {{prefix: "/"}}
                              on_match:
                                action:
                                  name: rate_limit_quota
                                  typed_config:
                                    "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                                    bucket_id_builder:
                                      bucket_id_builder:{builder}
                                    reporting_interval: {interval}s
                                    no_assignment_behavior:
                                      fallback_rate_limit: {no_assignment}{expired}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: upstream
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: upstream
        endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {upstream}}}}}}}]}}]
    - name: rlqs
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{http2_protocol_options: {{}}}}
      load_assignment:
        cluster_name: rlqs
        endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {rlqs}}}}}}}]}}]
"#,
        admin = at(admin),
        listen = at(listen),
        upstream = at(upstream),
        rlqs = at(filter.rlqs),
        domain = filter.domain,
        interval = filter.reporting_interval.as_secs_f64(),
        no_assignment = filter.no_assignment,
    )
}

/// How long Envoy may take to answer `/ready`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running Envoy (`--concurrency 1`, a `--base-id` of its own, debug logs of the filter to a
/// file), killed when dropped.
pub struct Envoy {
    child: std::process::Child,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts `binary` in front of `upstream` with `filter` and waits until its admin listener
    /// says it is ready.
    pub fn start(binary: &std::path::Path, upstream: SocketAddr, filter: &QuotaFilter) -> Envoy {
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let dir = tempfile::tempdir().expect("temporary directory");
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, envoy_yaml(listen, admin, upstream, filter)).expect("write envoy.yaml");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("envoy.log");
        let child = Command::new(binary)
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", "1", "--base-id", &listen.port().to_string(), "--disable-hot-restart"])
            .args(["--log-level", "warning", "--component-log-level", "rate_limit_quota:debug"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start envoy");
        let mut envoy = Envoy { child, listen, admin, dir };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if matches!(get(admin, "/ready", &[]), Ok((200, _))) {
                return envoy;
            }
            if let Ok(Some(status)) = envoy.child.try_wait() {
                panic!("envoy exited ({status}); log:\n{}\nconfig:\n{}", envoy.logs(), envoy.config());
            }
            assert!(Instant::now() < deadline, "envoy not ready after {START_TIMEOUT:?}; log:\n{}", envoy.logs());
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The configuration it runs.
    pub fn config(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.yaml")).unwrap_or_default()
    }

    /// Envoy's log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// The status of `GET path` through Envoy's listener, with `headers` (`name: value`); 0 if
    /// the request failed.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> u16 {
        get(self.listen, path, headers).map_or(0, |(status, _)| status)
    }

    /// An admin stat's value (`/stats?filter=` exact name), if Envoy has it.
    pub fn stat(&self, name: &str) -> Option<u64> {
        let (_, body) = get(self.admin, &format!("/stats?filter=^{name}$"), &[]).ok()?;
        body.lines().find_map(|line| line.strip_prefix(&format!("{name}: "))?.trim().parse().ok())
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` over HTTP/1.1 (Envoy refuses HTTP/1.0 with 426 unless told otherwise): the
/// status and body.
pub fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        let _ = write!(request, "{name}: {value}\r\n");
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    // Read the head and Content-Length's worth of body rather than to the end: Envoy closes
    // after a local reply (the 429s) only once its delayed_close_timeout (1 s) has run.
    let mut response = Vec::new();
    let mut chunk = [0; 4096];
    loop {
        let text = String::from_utf8_lossy(&response).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse::<usize>().ok())?
            });
            if length.is_some_and(|length| body.len() >= length) {
                break;
            }
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        response.extend_from_slice(&chunk[..n]);
    }
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((status, body.to_owned()))
}

/// Sends `GET path` through `envoy` at about `per_second` for `for_`, one request at a time;
/// returns (passed, denied with 429, other).
pub fn drive(envoy: &Envoy, path: &str, headers: &[(&str, &str)], per_second: u32, for_: Duration) -> (u32, u32, u32) {
    let gap = Duration::from_secs(1) / per_second;
    let start = Instant::now();
    let (mut passed, mut denied, mut other) = (0, 0, 0);
    let mut next = start;
    while start.elapsed() < for_ {
        match envoy.get(path, headers) {
            200 => passed += 1,
            429 => denied += 1,
            _ => other += 1,
        }
        next += gap;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
    }
    (passed, denied, other)
}
