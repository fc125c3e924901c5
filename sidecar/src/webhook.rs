//! `sluice-sidecar webhook`: the injection as a mutating admission webhook. The API server
//! POSTs an `AdmissionReview` to `/mutate` over TLS (HTTP/1.1 or HTTP/2) and gets the pod's
//! JSON Patch back ([`crate::inject::review`]); `/healthz` answers the kubelet's probes. The
//! certificate and key are polled and replaced as they rotate, like every TLS file in Sluice.

use std::{convert::Infallible, net::SocketAddr, path::Path, sync::Arc};

use http_body_util::{BodyExt, Full, Limited};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    service::service_fn,
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use rustls::{ServerConfig, crypto::ring};
use sluice_client::tls::{files_expected, identity};
use sluice_runtime::{
    admin::{json, reply},
    process::{Failure, termination},
    reload::rotating,
    telemetry,
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::{
    cli::Webhook,
    defaults::{MAX_REVIEW_BYTES, TLS_HANDSHAKE_TIMEOUT, WEBHOOK_ACCEPT_PAUSE},
    inject::review::{Answer, Outcome, answer},
};

pub async fn run(args: Webhook) -> Result<(), Failure> {
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
    let args = Arc::new(args);
    let accepting = async {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting a webhook connection failed");
                    tokio::time::sleep(WEBHOOK_ACCEPT_PAUSE).await;
                    continue;
                }
            };
            let (config, args) = (tls.load_full(), args.clone());
            tokio::spawn(async move { connection(stream, peer, config, args).await });
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

async fn connection(stream: tokio::net::TcpStream, peer: SocketAddr, config: Arc<ServerConfig>, args: Arc<Webhook>) {
    let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, TlsAcceptor::from(config).accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => return tracing::debug!(%peer, %error, "webhook TLS handshake failed"),
        Err(_) => return tracing::debug!(%peer, "webhook TLS handshake timed out"),
    };
    let service = service_fn(move |request| {
        let args = args.clone();
        async move { Ok::<_, Infallible>(handle(request, &args).await) }
    });
    if let Err(error) = auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(tls), service).await {
        tracing::debug!(%peer, %error, "webhook connection ended");
    }
}

async fn handle(request: Request<Incoming>, args: &Webhook) -> Response<Full<Bytes>> {
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        (&Method::POST, "/mutate") => {
            let body = match Limited::new(request.into_body(), MAX_REVIEW_BYTES).collect().await {
                Ok(body) => body.to_bytes(),
                Err(error) => {
                    tracing::warn!(%error, "AdmissionReview not read; the API server's failure policy applies");
                    return reply(StatusCode::BAD_REQUEST, "text/plain", format!("{error}\n"));
                }
            };
            match answer(&body, &args.settings, args.config_map.as_deref()) {
                Ok(Answer { review, outcome, uid, pod }) => {
                    match outcome {
                        Outcome::Injected => tracing::info!(uid, pod, "sidecar injected"),
                        Outcome::Skipped(why) => tracing::info!(uid, pod, why, "pod left as it is"),
                        Outcome::Unhandled(why) => {
                            tracing::warn!(uid, pod, why, "request not handled: allowed unchanged")
                        }
                    }
                    json(&review)
                }
                Err(why) => {
                    tracing::warn!(why, "not an AdmissionReview; the API server's failure policy applies");
                    reply(StatusCode::BAD_REQUEST, "text/plain", format!("{why}\n"))
                }
            }
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "POST /mutate or GET /healthz\n".into()),
    }
}
