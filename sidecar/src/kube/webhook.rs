//! `sluice-sidecar webhook`: the injection as a mutating admission webhook. The API server
//! POSTs an `AdmissionReview` to `/mutate` over TLS (HTTP/1.1 or HTTP/2, by ALPN) and gets the
//! pod's JSON Patch back ([`super::inject::review`]); `/healthz` answers the kubelet's probes.
//! The certificate and key are polled and replaced as they rotate, like every TLS file in
//! Sluice.
//!
//! Its memory has a bound whatever clients send (docs/kubernetes.md, "Memory budget: the
//! webhook"): at most [`WEBHOOK_MAX_CONNECTIONS`] connections, each with a bounded head, HTTP/2
//! window and stream count, closed when idle; at most [`WEBHOOK_MAX_REVIEWS`] bodies held, each
//! of at most [`MAX_REVIEW_BYTES`] and arriving within [`WEBHOOK_BODY_TIMEOUT`]; and one review
//! answered at a time (the runtime has one thread), costing little beyond its body.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use http_body_util::{BodyExt, Full};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Body, Bytes, Incoming},
    service::service_fn,
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use rustls::{ServerConfig, crypto::ring};
use sluice_client::tls::{files_expected, identity};
use sluice_runtime::{
    admin::reply,
    cli::{LogFormat, poll_interval},
    process::{Failure, termination},
    reload::rotating,
    telemetry,
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
    time::timeout,
};
use tokio_rustls::TlsAcceptor;

use super::inject::{
    Settings, config_map_name,
    review::{Answer, Outcome, answer},
};
use crate::defaults::{
    self, MAX_REVIEW_BYTES, TLS_HANDSHAKE_TIMEOUT, WEBHOOK_ACCEPT_PAUSE, WEBHOOK_BODY_TIMEOUT, WEBHOOK_HTTP2_WINDOW,
    WEBHOOK_IDLE_TIMEOUT, WEBHOOK_MAX_CONNECTIONS, WEBHOOK_MAX_HEADER_BYTES, WEBHOOK_MAX_REVIEWS, WEBHOOK_MAX_STREAMS,
};

/// What every connection shares.
struct Shared {
    args: Args,
    /// A slot per review whose body is held.
    reviews: Semaphore,
    /// The HTTP/1.1 and HTTP/2 servers, with their limits.
    http1: auto::Builder<TokioExecutor>,
    http2: auto::Builder<TokioExecutor>,
}

/// `sluice-sidecar webhook`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// HTTPS listen address of the webhook.
    #[arg(long, env = "SLUICE_WEBHOOK_ADDR", default_value = defaults::WEBHOOK_ADDR)]
    pub listen_addr: SocketAddr,

    /// PEM certificate chain of the webhook's TLS listener; re-read when it changes.
    #[arg(long, env = "SLUICE_WEBHOOK_TLS_CERT")]
    pub tls_cert: PathBuf,

    /// PEM private key for --tls-cert.
    #[arg(long, env = "SLUICE_WEBHOOK_TLS_KEY")]
    pub tls_key: PathBuf,

    /// ConfigMap of pods without a `sluice.io/config` annotation; without it, such pods are
    /// admitted unchanged.
    #[arg(long, env = "SLUICE_WEBHOOK_CONFIG_MAP", value_parser = config_map_name)]
    pub config_map: Option<String>,

    #[command(flatten)]
    pub settings: Settings,

    /// How often to check the TLS files for changes.
    #[arg(long, env = "SLUICE_WEBHOOK_POLL_INTERVAL", value_parser = poll_interval, allow_hyphen_values = true,
          default_value = defaults::CONFIG_POLL_INTERVAL)]
    pub poll_interval: Duration,

    /// Log format.
    #[arg(long, env = "SLUICE_WEBHOOK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter, in tracing's EnvFilter syntax.
    #[arg(long, env = "SLUICE_WEBHOOK_LOG", default_value = "info")]
    pub log: String,
}

pub async fn run(args: Args) -> Result<(), Failure> {
    telemetry::init(args.log_format, &args.log).map_err(Failure::Usage)?;
    let (cert, key) = (args.tls_cert.clone(), args.tls_key.clone());
    let tls = rotating("webhook TLS", vec![cert.clone(), key.clone()], args.poll_interval, move |content| {
        server_config(&cert, &key, content)
    })
    .map_err(Failure::Usage)?;
    let listener = TcpListener::bind(args.listen_addr)
        .await
        .map_err(|e| Failure::Runtime(format!("cannot listen on {} (webhook): {e}", args.listen_addr)))?;
    tracing::info!(address = %args.listen_addr, config_map = ?args.config_map, image = %args.settings.image, "sluice-sidecar webhook serving");
    let mut http1 = auto::Builder::new(TokioExecutor::new()).http1_only();
    http1.http1().max_buf_size(WEBHOOK_MAX_HEADER_BYTES);
    let mut http2 = auto::Builder::new(TokioExecutor::new()).http2_only();
    http2
        .http2()
        .max_concurrent_streams(WEBHOOK_MAX_STREAMS)
        .max_header_list_size(u32::try_from(WEBHOOK_MAX_HEADER_BYTES).unwrap_or(u32::MAX))
        .initial_stream_window_size(WEBHOOK_HTTP2_WINDOW)
        .initial_connection_window_size(WEBHOOK_HTTP2_WINDOW.saturating_mul(WEBHOOK_MAX_STREAMS));
    let shared = Arc::new(Shared { args, reviews: Semaphore::new(WEBHOOK_MAX_REVIEWS), http1, http2 });
    let connections = Arc::new(Semaphore::new(WEBHOOK_MAX_CONNECTIONS));
    let accepting = async {
        loop {
            // At the cap, stop accepting: the kernel's backlog holds the rest.
            let Ok(slot) = connections.clone().acquire_owned().await else { return };
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting a webhook connection failed");
                    tokio::time::sleep(WEBHOOK_ACCEPT_PAUSE).await;
                    continue;
                }
            };
            let (config, shared) = (tls.load_full(), shared.clone());
            tokio::spawn(async move {
                connection(stream, peer, config, shared).await;
                drop(slot);
            });
        }
    };
    tokio::select! {
        () = accepting => {}
        signal = termination() => tracing::info!(signal, "stopped"),
    }
    Ok(())
}

/// The listener's rustls settings from the certificate's and key's content.
fn server_config(cert: &Path, key: &Path, content: &[Vec<u8>]) -> Result<ServerConfig, String> {
    let [cert_pem, key_pem] = content else {
        return Err(files_expected(&[cert.to_owned(), key.to_owned()], content));
    };
    let (chain, private) = identity((cert, cert_pem), (key, key_pem))?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| format!("TLS: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

async fn connection(stream: TcpStream, peer: SocketAddr, config: Arc<ServerConfig>, shared: Arc<Shared>) {
    let tls = match timeout(TLS_HANDSHAKE_TIMEOUT, TlsAcceptor::from(config).accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => return tracing::debug!(%peer, %error, "webhook TLS handshake failed"),
        Err(_) => return tracing::debug!(%peer, "webhook TLS handshake timed out"),
    };
    let builder = if tls.get_ref().1.alpn_protocol() == Some(b"h2") { &shared.http2 } else { &shared.http1 };
    // Requests in the service: hyper counts none while a head arrives or an answer leaves.
    let (busy, mut busy_seen) = watch::channel(0usize);
    let service = service_fn(|request| {
        busy.send_modify(|n| *n = n.saturating_add(1));
        let done = Busy(busy.clone());
        let shared = shared.clone();
        async move {
            let response = handle(request, &shared).await;
            drop(done);
            Ok::<_, Infallible>(response)
        }
    });
    let served = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(served);
    let ended = tokio::select! {
        ended = served.as_mut() => ended,
        () = idle(&mut busy_seen) => {
            tracing::debug!(%peer, "closing an idle webhook connection");
            served.as_mut().graceful_shutdown();
            // One that does not read even its GOAWAY or last answer is dropped.
            timeout(WEBHOOK_IDLE_TIMEOUT, served).await.unwrap_or(Ok(()))
        }
    };
    if let Err(error) = ended {
        tracing::debug!(%peer, %error, "webhook connection ended");
    }
}

/// Takes one request off the connection's count when dropped, however the request ends.
struct Busy(watch::Sender<usize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Resolves once the connection has had no request in its service for [`WEBHOOK_IDLE_TIMEOUT`].
async fn idle(busy: &mut watch::Receiver<usize>) {
    loop {
        let changed = if *busy.borrow_and_update() == 0 {
            match timeout(WEBHOOK_IDLE_TIMEOUT, busy.changed()).await {
                Ok(changed) => changed,
                Err(_) => return,
            }
        } else {
            // A request's own time is bounded: the body's timeout, then its answer.
            busy.changed().await
        };
        if changed.is_err() {
            return;
        }
    }
}

async fn handle(request: Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        (&Method::POST, "/mutate") => {
            let read = timeout(WEBHOOK_BODY_TIMEOUT, async {
                let slot =
                    shared.reviews.acquire().await.map_err(|_| (StatusCode::SERVICE_UNAVAILABLE, "stopping".into()))?;
                Ok((slot, read_body(request.into_body()).await?))
            });
            let (_slot, body) = match read.await {
                Ok(Ok(read)) => read,
                Ok(Err((code, why))) => return refused(code, &why),
                Err(_) => {
                    return refused(StatusCode::REQUEST_TIMEOUT, &format!("not read within {WEBHOOK_BODY_TIMEOUT:?}"));
                }
            };
            let args = &shared.args;
            match answer(&body, &args.settings, args.config_map.as_deref()) {
                Ok(Answer { review, outcome, uid, pod }) => {
                    match outcome {
                        Outcome::Injected => tracing::info!(uid, pod, "sidecar injected"),
                        Outcome::Skipped(why) => tracing::info!(uid, pod, why, "pod left as it is"),
                        Outcome::Unhandled(why) => {
                            tracing::warn!(uid, pod, why, "request not handled: allowed unchanged")
                        }
                    }
                    reply(StatusCode::OK, "application/json", review)
                }
                Err(why) => refused(StatusCode::BAD_REQUEST, &why),
            }
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "POST /mutate or GET /healthz\n".into()),
    }
}

/// A review not answered: the API server's failure policy applies.
fn refused(code: StatusCode, why: &str) -> Response<Full<Bytes>> {
    tracing::warn!(%code, why, "AdmissionReview not answered; the API server's failure policy applies");
    reply(code, "text/plain", format!("{why}\n"))
}

/// A request's body, refused (413) past [`MAX_REVIEW_BYTES`]: unread when its declared length
/// says so, else as soon as it passes it. Read into one buffer of its declared length, so that
/// nothing is copied or grown.
async fn read_body(mut body: Incoming) -> Result<Vec<u8>, (StatusCode, String)> {
    let too_large =
        || (StatusCode::PAYLOAD_TOO_LARGE, format!("an AdmissionReview takes at most {MAX_REVIEW_BYTES} bytes"));
    let declared = body.size_hint().exact().map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    if declared.is_some_and(|n| n > MAX_REVIEW_BYTES) {
        return Err(too_large());
    }
    // Without a declared length, room for the largest: pages not written cost nothing.
    let mut bytes = Vec::with_capacity(declared.unwrap_or(MAX_REVIEW_BYTES));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| (StatusCode::BAD_REQUEST, format!("reading the AdmissionReview: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if bytes.len().saturating_add(data.len()) > MAX_REVIEW_BYTES {
                return Err(too_large());
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}
