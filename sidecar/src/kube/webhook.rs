//! `sluice-sidecar webhook`: the injection as a mutating admission webhook. The API server
//! POSTs an `AdmissionReview` to `/mutate` over TLS (HTTP/1.1 or HTTP/2, by ALPN) and gets the
//! pod's JSON Patch back ([`super::inject::review`]); `/healthz` answers the kubelet's probes.
//! The certificate and key are polled and replaced as they rotate, like every TLS file in
//! Sluice. With `--native auto` it asks the API server's version ([`super::cluster`]) to choose
//! native or classic sidecars. `/metrics` counts reviews by outcome and failed TLS handshakes
//! (a wrong `caBundle` shows there and in the log, while pods start without the sidecar).
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
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
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

use super::{
    cluster::{ApiAccess, KubeVersion, Mode, Native},
    inject::{
        Settings, config_map_name,
        review::{Answer, Outcome, answer},
    },
};
use crate::defaults::{
    self, MAX_REVIEW_BYTES, TLS_HANDSHAKE_TIMEOUT, VERSION_REFRESH, WEBHOOK_ACCEPT_PAUSE, WEBHOOK_BODY_TIMEOUT,
    WEBHOOK_HTTP2_WINDOW, WEBHOOK_IDLE_TIMEOUT, WEBHOOK_MAX_CONNECTIONS, WEBHOOK_MAX_HEADER_BYTES, WEBHOOK_MAX_REVIEWS,
    WEBHOOK_MAX_STREAMS,
};

/// Reviews answered, by `outcome` (injected_native, injected_classic, skipped, unhandled,
/// refused) and `dry_run`.
const REVIEWS: &str = "sluice_webhook_reviews_total";

/// TLS handshakes that failed or timed out: with a wrong `caBundle`, every call of the API server.
const TLS_FAILURES: &str = "sluice_webhook_tls_failures_total";

/// What every connection shares.
struct Shared {
    args: Args,
    /// The API server's version, as last asked (`--native auto`); `None`: unknown.
    version: watch::Receiver<Option<KubeVersion>>,
    metrics: PrometheusHandle,
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

    #[command(flatten)]
    pub api: ApiAccess,

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
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Failure::Runtime(format!("cannot record metrics: {e}")))?;
    let version = cluster_version(&args).await;
    tracing::info!(address = %args.listen_addr, config_map = ?args.config_map, image = %args.settings.image, native = ?args.settings.native, "sluice-sidecar webhook serving");
    let mut http1 = auto::Builder::new(TokioExecutor::new()).http1_only();
    http1.http1().max_buf_size(WEBHOOK_MAX_HEADER_BYTES);
    let mut http2 = auto::Builder::new(TokioExecutor::new()).http2_only();
    http2
        .http2()
        .max_concurrent_streams(WEBHOOK_MAX_STREAMS)
        .max_header_list_size(u32::try_from(WEBHOOK_MAX_HEADER_BYTES).unwrap_or(u32::MAX))
        .initial_stream_window_size(WEBHOOK_HTTP2_WINDOW)
        .initial_connection_window_size(WEBHOOK_HTTP2_WINDOW.saturating_mul(WEBHOOK_MAX_STREAMS));
    let shared =
        Arc::new(Shared { args, version, metrics, reviews: Semaphore::new(WEBHOOK_MAX_REVIEWS), http1, http2 });
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

/// The API server's version, kept current every [`VERSION_REFRESH`] by a task of its own when
/// `--native auto` needs it; asked once before the first review, so that the first pods get the
/// mode the cluster runs.
async fn cluster_version(args: &Args) -> watch::Receiver<Option<KubeVersion>> {
    let (sender, receiver) = watch::channel(None);
    if args.settings.native != Native::Auto {
        return receiver;
    }
    let api = args.api.clone();
    ask_version(&api, &sender).await;
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(VERSION_REFRESH);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            ask_version(&api, &sender).await;
        }
    });
    receiver
}

/// Asks the API server's version into `version`, saying when the mode changes (or stays unknown).
async fn ask_version(api: &ApiAccess, version: &watch::Sender<Option<KubeVersion>>) {
    let asked = match api.version().await {
        Ok(asked) => Some(asked),
        Err(error) => {
            tracing::warn!(%error, "the API server's version is unknown: sidecars are injected classic");
            None
        }
    };
    if version.send_replace(asked) != asked || asked.is_none() {
        let mode = Native::Auto.mode(asked);
        let kubernetes = asked.map_or_else(|| "unknown".to_owned(), |v| v.to_string());
        tracing::info!(kubernetes, ?mode, "sidecars are injected {}", describe(mode));
    }
}

fn describe(mode: Mode) -> &'static str {
    match mode {
        Mode::Native => "as native sidecars",
        Mode::Classic => "as classic containers, started first",
    }
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
        // At info: an API server given the wrong CA bundle fails here on every pod, which then
        // starts without the sidecar (failurePolicy: Ignore).
        Ok(Err(error)) => {
            metrics::counter!(TLS_FAILURES).increment(1);
            return tracing::info!(%peer, %error, "webhook TLS handshake failed (is the webhook's caBundle its CA?)");
        }
        Err(_) => {
            metrics::counter!(TLS_FAILURES).increment(1);
            return tracing::info!(%peer, "webhook TLS handshake timed out");
        }
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
        (&Method::GET, "/metrics") => reply(StatusCode::OK, "text/plain; version=0.0.4", shared.metrics.render()),
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
            let version = *shared.version.borrow();
            match answer(&body, &args.settings, args.config_map.as_deref(), version) {
                Ok(Answer { review, outcome, uid, pod, dry_run }) => {
                    let label = match &outcome {
                        Outcome::Injected(Mode::Native) => "injected_native",
                        Outcome::Injected(Mode::Classic) => "injected_classic",
                        Outcome::Skipped(_) => "skipped",
                        Outcome::Unhandled(_) => "unhandled",
                    };
                    metrics::counter!(REVIEWS, "outcome" => label, "dry_run" => dry_run.to_string()).increment(1);
                    match outcome {
                        Outcome::Injected(mode) => {
                            tracing::info!(uid, pod, dry_run, ?mode, "sidecar injected {}", describe(mode))
                        }
                        Outcome::Skipped(why) => tracing::info!(uid, pod, dry_run, why, "pod left as it is"),
                        Outcome::Unhandled(why) => {
                            tracing::warn!(uid, pod, dry_run, why, "request not handled: allowed unchanged")
                        }
                    }
                    reply(StatusCode::OK, "application/json", review)
                }
                Err(why) => refused(StatusCode::BAD_REQUEST, &why),
            }
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "POST /mutate, GET /healthz or GET /metrics\n".into()),
    }
}

/// A review not answered: the API server's failure policy applies.
fn refused(code: StatusCode, why: &str) -> Response<Full<Bytes>> {
    metrics::counter!(REVIEWS, "outcome" => "refused", "dry_run" => "unknown").increment(1);
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
