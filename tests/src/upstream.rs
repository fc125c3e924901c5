//! `sluice-upstream`: the upstream the sidecar's tests, benchmark and demo proxy to. One listener
//! serves HTTP/1.1 and HTTP/2 (h2c prior knowledge, or ALPN over TLS), plain endpoints that make
//! proxying observable, and the gRPC service `sluice.test.Echo` from `tests/proto/echo.proto`.

use std::{
    convert::Infallible,
    ffi::OsStr,
    fs,
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
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
use tokio::net::TcpListener;
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
        serve(listener, tls).await;
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
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| handle(request, grpc.clone()));
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

async fn handle(request: Request<Incoming>, mut grpc: EchoServer<Echo>) -> Result<Response<Body>, Infallible> {
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
