//! `sluice-upstream`: the upstream the sidecar's tests, benchmark and demo proxy to. One listener
//! serves HTTP/1.1 and HTTP/2 (h2c prior knowledge, or ALPN over TLS), plain endpoints that make
//! proxying observable, and the gRPC service `sluice.test.Echo` from `tests/proto/echo.proto`.
//! With `--workers`, `/job` is a service that can be overloaded (see [`Model`]).

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    convert::Infallible,
    ffi::OsStr,
    fs,
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use bytes::Bytes;
use clap::Parser;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Either, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use sluice_runtime::errln;
use tempfile::TempDir;
use tokio::{
    net::TcpListener,
    sync::{Semaphore, SemaphorePermit},
};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        ServerConfig,
        crypto::ring,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    },
};
use tokio_stream::StreamExt;
use tonic::{Code, Status, Streaming, codegen::Service, metadata::KeyAndValueRef};

use crate::harness::{binary, free_port};

/// The generated messages, client (`echo_client::EchoClient`) and server of `sluice.test.Echo`.
pub mod echo {
    tonic::include_proto!("sluice.test");
}

use echo::{EchoReply, EchoRequest, echo_server::EchoServer};

/// How long the binary may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Test and demo upstream: HTTP/1.1, h2c and gRPC on one port.
#[derive(Debug, Parser)]
#[command(name = "sluice-upstream")]
pub struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub worker_threads: u16,
    /// PEM certificate chain: serve TLS (ALPN h2 and http/1.1) instead of cleartext.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Protocols offered by ALPN with --tls-cert, in order of preference ("": none, ALPN ignored).
    #[arg(long, value_delimiter = ',', default_value = "h2,http/1.1", requires = "tls_cert")]
    pub tls_alpn: Vec<String>,
    /// Serve `/job` with this many workers (the capacity model; without it `/job` is 404).
    #[arg(long, value_parser = parse_workers)]
    pub workers: Option<u32>,
    /// How long a worker takes over each `/job` request.
    #[arg(long, value_parser = parse_service_time, default_value = "10ms", requires = "workers")]
    pub service_time: Duration,
    /// Most `/job` requests waiting for a worker; one more is answered 503 at once.
    #[arg(long, default_value_t = 1000, requires = "workers")]
    pub queue: usize,
}

/// Runs the upstream until the process is killed.
pub fn run(args: Args) -> Result<(), String> {
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls_config(cert, key, &args.tls_alpn)?),
        _ => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.worker_threads.into())
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async {
        let listener =
            TcpListener::bind(args.addr).await.map_err(|e| format!("cannot listen on {}: {e}", args.addr))?;
        let model = args.workers.map(|workers| Arc::new(Model::new(workers, args.service_time, args.queue)));
        serve_modelled(listener, tls, model).await;
        Ok(())
    })
}

/// A TLS configuration from PEM files, offering `alpn` by ALPN.
pub fn tls_config(cert: &Path, key: &Path, alpn: &[String]) -> Result<Arc<ServerConfig>, String> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read {}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("cannot read {}: {e}", key.display()))?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .and_then(|builder| builder.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| format!("invalid TLS certificate or key: {e}"))?;
    config.alpn_protocols = alpn.iter().filter(|p| !p.is_empty()).map(|p| p.as_bytes().to_vec()).collect();
    Ok(Arc::new(config))
}

/// Serves connections from `listener` forever, each on its own task.
pub async fn serve(listener: TcpListener, tls: Option<Arc<ServerConfig>>) {
    serve_modelled(listener, tls, None).await;
}

/// [`serve`], with `/job` and `/model` served by `model` if any.
pub async fn serve_modelled(listener: TcpListener, tls: Option<Arc<ServerConfig>>, model: Option<Arc<Model>>) {
    let tls = tls.map(TlsAcceptor::from);
    let grpc = EchoServer::new(Echo);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Usually out of file descriptors: back off instead of spinning.
                let _ = errln!("sluice-upstream: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Small responses on keep-alive connections: Nagle would add latency to every one.
        let _ = stream.set_nodelay(true);
        let tls = tls.clone();
        let grpc = grpc.clone();
        let model = model.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| handle(request, grpc.clone(), model.clone()));
            let builder = auto::Builder::new(TokioExecutor::new());
            // Failed handshakes and connections the client drops are the client's business; the
            // tests that care see them from the client side.
            match tls {
                Some(tls) => {
                    if let Ok(stream) = tls.accept(stream).await {
                        let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                    }
                }
                None => {
                    let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                }
            }
        });
    }
}

/// `Full` keeps `GET /` free of boxing; everything else is streamed or comes from tonic.
type Body = Either<Full<Bytes>, tonic::body::Body>;

async fn handle(
    request: Request<Incoming>,
    mut grpc: EchoServer<Echo>,
    model: Option<Arc<Model>>,
) -> Result<Response<Body>, Infallible> {
    let is_grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|content_type| content_type.as_bytes().starts_with(b"application/grpc"));
    if is_grpc {
        // The generated server is always ready, so `poll_ready` can be skipped.
        let response = grpc.call(request).await?;
        return Ok(response.map(Either::Right));
    }
    let path = request.uri().path();
    if let Some(model) = model {
        if path == "/job" || path.starts_with("/job/") {
            return Ok(model.work().await);
        }
        if path == "/model" {
            return Ok(model.handle(&request));
        }
    }
    Ok(if path == "/" && request.method() == Method::GET {
        Response::new(Either::Left(Full::new(Bytes::from_static(b"ok"))))
    } else if path.starts_with("/echo") {
        echo_http(request).await
    } else if let Some(code) = path.strip_prefix("/status/") {
        match code.parse().ok().and_then(|code| StatusCode::from_u16(code).ok()) {
            Some(status) => {
                let mut response = text(status, format!("status {}", status.as_u16()));
                response.headers_mut().insert("x-upstream-status", HeaderValue::from(status.as_u16()));
                response
            }
            None => text(StatusCode::BAD_REQUEST, "bad status code"),
        }
    } else if path == "/stream" {
        let chunks = query(&request, "chunks").unwrap_or(1);
        let delay = Duration::from_millis(query(&request, "delay_ms").unwrap_or(0));
        let body = tokio_stream::iter(0..chunks).then(move |i| async move {
            if i > 0 {
                tokio::time::sleep(delay).await;
            }
            Ok::<_, Infallible>(Frame::data(Bytes::from(format!("chunk {i}\n"))))
        });
        Response::new(Either::Right(tonic::body::Body::new(StreamBody::new(body))))
    } else if path == "/trailers" {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-trailer", HeaderValue::from_static("done"));
        let frames = [Frame::data(Bytes::from_static(b"with trailers")), Frame::trailers(trailers)];
        let body = StreamBody::new(tokio_stream::iter(frames.map(Ok::<_, Infallible>)));
        Response::new(Either::Right(tonic::body::Body::new(body)))
    } else if path == "/big-head" {
        // A response head of about `bytes`, in 1 KB headers.
        let mut response = text(StatusCode::OK, "big head");
        for i in 0..query(&request, "bytes").unwrap_or(0) / 1024 {
            let name = http::HeaderName::try_from(format!("x-big-{i}")).expect("a header name");
            response.headers_mut().insert(name, HeaderValue::from_str(&"b".repeat(1000)).expect("a header value"));
        }
        response
    } else if path == "/slow" {
        tokio::time::sleep(Duration::from_millis(query(&request, "ms").unwrap_or(0))).await;
        text(StatusCode::OK, "slow")
    } else {
        text(StatusCode::NOT_FOUND, "not found")
    })
}

/// The request as JSON, body included, so tests can see exactly what the proxy forwarded.
async fn echo_http(request: Request<Incoming>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("cannot read the body: {e}")),
    };
    let headers: Vec<[String; 2]> = parts
        .headers
        .iter()
        .map(|(name, value)| [name.to_string(), String::from_utf8_lossy(value.as_bytes()).into_owned()])
        .collect();
    let json = serde_json::json!({
        "method": parts.method.as_str(),
        "uri": parts.uri.path_and_query().map_or("", |p| p.as_str()),
        "version": format!("{:?}", parts.version),
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    });
    let mut response = Response::new(Either::Left(Full::new(Bytes::from(json.to_string()))));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let mut response = Response::new(Either::Left(Full::new(Bytes::from(body.into()))));
    *response.status_mut() = status;
    response
}

/// A numeric query parameter.
fn query(request: &Request<Incoming>, name: &str) -> Option<u64> {
    form_urlencoded::parse(request.uri().query()?.as_bytes()).find(|(key, _)| key == name)?.1.parse().ok()
}

/// Header on the 503 of a `/job` request the full queue turned away, which tells it apart from a
/// proxy's or limiter's 503.
pub const SHED_HEADER: &str = "x-upstream-shed";

/// Bounds of `workers` (`--workers`, `PUT /model`).
const WORKERS: std::ops::RangeInclusive<u32> = 1..=10_000;
/// Bounds of the service time (`--service-time`, `PUT /model`).
const SERVICE_TIME: std::ops::RangeInclusive<Duration> = Duration::from_millis(1)..=Duration::from_secs(10);

/// A service that can be overloaded: `workers` requests served at once, each taking a worker for
/// the service time, and up to `queue` more waiting for one in arrival order (tokio's semaphore is
/// FIFO), so that latency grows with the queue; a request that finds the queue full is answered
/// 503 at once. `PUT /model` changes the workers and the service time while it runs.
pub struct Model {
    permits: Semaphore,
    settings: Mutex<Settings>,
    queue: usize,
    waiting: AtomicUsize,
    in_flight: AtomicUsize,
}

struct Settings {
    workers: u32,
    service_time: Duration,
    /// When each idle worker is free, one for each permit not held, earliest first. A request
    /// starts when it arrived or its worker was free, whichever is later, not when the timers
    /// woke it: wake-ups come up to a millisecond late, which cost a 10 ms service 10% of its
    /// capacity.
    idle: BinaryHeap<Reverse<Instant>>,
    /// Permits to forget as they come back: a shrink by more than the idle permits takes effect
    /// as the busy workers finish, not when the queue next drains.
    owed: u32,
}

impl Model {
    pub fn new(workers: u32, service_time: Duration, queue: usize) -> Self {
        Model {
            permits: Semaphore::new(workers as usize),
            settings: Mutex::new(Settings {
                workers,
                service_time,
                idle: (0..workers).map(|_| Reverse(Instant::now())).collect(),
                owed: 0,
            }),
            queue,
            waiting: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn settings(&self) -> std::sync::MutexGuard<'_, Settings> {
        self.settings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One `/job` request: a place in the queue, then a worker for the service time.
    async fn work(&self) -> Response<Body> {
        let arrived = Instant::now();
        let Some(waiting) = Counted::enter(&self.waiting, self.queue) else {
            let mut response = text(StatusCode::SERVICE_UNAVAILABLE, "queue full");
            response.headers_mut().insert(SHED_HEADER, HeaderValue::from_static("queue"));
            return response;
        };
        let permit = self.permits.acquire().await.expect("the semaphore is never closed");
        drop(waiting);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let done = {
            let mut settings = self.settings();
            let Reverse(free) = settings.idle.pop().expect("an idle worker for every permit");
            free.max(arrived) + settings.service_time
        };
        let worker = Worker { model: self, permit: Some(permit), done };
        tokio::time::sleep_until(done.into()).await;
        drop(worker);
        text(StatusCode::OK, "done")
    }

    /// `GET /model`, or `PUT /model?workers=N&service_time=D` (either, both checked before either applies).
    fn handle(&self, request: &Request<Incoming>) -> Response<Body> {
        match *request.method() {
            Method::GET => {}
            Method::PUT => {
                if let Err(e) = self.change(request.uri().query().unwrap_or("")) {
                    return text(StatusCode::BAD_REQUEST, e);
                }
            }
            _ => return text(StatusCode::METHOD_NOT_ALLOWED, "GET or PUT /model"),
        }
        let json = {
            let settings = self.settings();
            serde_json::json!({
                "workers": settings.workers,
                "service_time": humantime::format_duration(settings.service_time).to_string(),
                "queue": self.queue,
                "waiting": self.waiting.load(Ordering::Relaxed),
                "in_flight": self.in_flight.load(Ordering::Relaxed),
            })
        };
        let mut response = Response::new(Either::Left(Full::new(Bytes::from(json.to_string()))));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }

    fn change(&self, query: &str) -> Result<(), String> {
        let (mut workers, mut service_time) = (None, None);
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            match &*key {
                "workers" => workers = Some(parse_workers(&value)?),
                "service_time" => service_time = Some(parse_service_time(&value)?),
                other => return Err(format!("unknown parameter {other:?}: workers or service_time")),
            }
        }
        if workers.is_none() && service_time.is_none() {
            return Err("nothing to change: give workers or service_time".into());
        }
        let mut settings = self.settings();
        if let Some(service_time) = service_time {
            settings.service_time = service_time;
        }
        if let Some(workers) = workers {
            if workers > settings.workers {
                let more = workers - settings.workers;
                let repaid = more.min(settings.owed);
                settings.owed -= repaid;
                let now = Instant::now();
                settings.idle.extend((repaid..more).map(|_| Reverse(now)));
                self.permits.add_permits((more - repaid) as usize);
            } else {
                let fewer = settings.workers - workers;
                let forgotten = self.permits.forget_permits(fewer as usize) as u32;
                for _ in 0..forgotten {
                    settings.idle.pop();
                }
                settings.owed += fewer - forgotten;
            }
            settings.workers = workers;
        }
        Ok(())
    }
}

/// A request holding a worker; gives the worker back when done or dropped, or retires it if the
/// workers were cut meanwhile. A worker whose client left stays busy until `done`, as a real
/// server's goes on with a request nobody waits for.
struct Worker<'a> {
    model: &'a Model,
    permit: Option<SemaphorePermit<'a>>,
    done: Instant,
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        self.model.in_flight.fetch_sub(1, Ordering::Relaxed);
        let mut settings = self.model.settings();
        let Some(permit) = self.permit.take() else { return };
        if settings.owed > 0 {
            settings.owed -= 1;
            permit.forget();
        } else {
            // Free before its permit is, so that whoever takes the permit finds it.
            settings.idle.push(Reverse(self.done));
            drop(permit);
        }
    }
}

/// One place in a counted set, left when dropped.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    /// A place, unless `limit` are taken.
    fn enter(count: &'a AtomicUsize, limit: usize) -> Option<Self> {
        if count.fetch_add(1, Ordering::Relaxed) >= limit {
            count.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Counted(count))
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn parse_workers(text: &str) -> Result<u32, String> {
    match text.parse() {
        Ok(n) if WORKERS.contains(&n) => Ok(n),
        _ => Err(format!("workers: a whole number from {} to {}, got {text:?}", WORKERS.start(), WORKERS.end())),
    }
}

fn parse_service_time(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if SERVICE_TIME.contains(&d) => Ok(d),
        _ => Err(format!("service_time: a duration from 1ms to 10s, got {text:?}")),
    }
}

struct Echo;

#[tonic::async_trait]
impl echo::echo_server::Echo for Echo {
    async fn unary(&self, request: tonic::Request<EchoRequest>) -> Result<tonic::Response<EchoReply>, Status> {
        let message = request.get_ref();
        if message.fail_code != 0 {
            return Err(Status::new(Code::from(message.fail_code), message.fail_message.clone()));
        }
        let mut response = tonic::Response::new(EchoReply { message: message.message.clone(), index: 0 });
        let metadata = response.metadata_mut();
        for entry in request.metadata().iter() {
            match entry {
                KeyAndValueRef::Ascii(key, value) if key.as_str().starts_with("x-") => {
                    metadata.append(key.clone(), value.clone());
                }
                KeyAndValueRef::Binary(key, value) if key.as_str().starts_with("x-") => {
                    metadata.append_bin(key.clone(), value.clone());
                }
                _ => {}
            }
        }
        Ok(response)
    }

    type ServerStreamStream = tokio_stream::Iter<std::vec::IntoIter<Result<EchoReply, Status>>>;

    async fn server_stream(
        &self,
        request: tonic::Request<EchoRequest>,
    ) -> Result<tonic::Response<Self::ServerStreamStream>, Status> {
        let EchoRequest { message, count, .. } = request.into_inner();
        let replies = (0..count).map(|index| Ok(EchoReply { message: message.clone(), index })).collect::<Vec<_>>();
        Ok(tonic::Response::new(tokio_stream::iter(replies)))
    }

    async fn client_stream(
        &self,
        request: tonic::Request<Streaming<EchoRequest>>,
    ) -> Result<tonic::Response<EchoReply>, Status> {
        let mut stream = request.into_inner();
        let mut reply = EchoReply::default();
        while let Some(request) = stream.message().await? {
            reply.message.push_str(&request.message);
            reply.index += 1;
        }
        Ok(tonic::Response::new(reply))
    }
}

/// The built `sluice-upstream` binary on a free loopback port, killed when dropped.
pub struct UpstreamProcess {
    child: Child,
    addr: SocketAddr,
    log_path: PathBuf,
    _dir: TempDir,
}

impl UpstreamProcess {
    /// The workspace's binary, serving TLS when given a PEM certificate and key.
    pub fn start(tls: Option<(&Path, &Path)>) -> Self {
        let mut args: Vec<&OsStr> = Vec::new();
        if let Some((cert, key)) = tls {
            args.extend(["--tls-cert".as_ref(), cert.as_os_str(), "--tls-key".as_ref(), key.as_os_str()]);
        }
        Self::launch(&binary("sluice-upstream"), &args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `binary` with extra `args` and waits until it accepts connections.
    pub fn launch<S: AsRef<OsStr>>(binary: &Path, args: &[S]) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log_path = dir.path().join("upstream.log");
        let log = fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let child = Command::new(binary)
            .arg("--addr")
            .arg(addr.to_string())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let mut upstream = UpstreamProcess { child, addr, log_path, _dir: dir };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = upstream.child.try_wait() {
                return Err(format!("sluice-upstream exited during start-up with {status}: {}", upstream.logs()));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
                return Ok(upstream);
            }
            if Instant::now() > deadline {
                return Err(format!("sluice-upstream not listening after {START_TIMEOUT:?}: {}", upstream.logs()));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for UpstreamProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
