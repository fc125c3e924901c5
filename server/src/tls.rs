//! TLS and mTLS for the gRPC listener and toward capacity servers (a parent, or the sidecar's
//! servers), with certificates rotated in place.
//!
//! Every file is checked when it is loaded — PEM holding what it must hold, and a private key
//! that belongs to its certificate — so that a wrong file stops the process at start-up with
//! that file named, instead of failing every handshake later behind a bare "transport error".
//! The files are then polled like the configuration ([`rotating`]): once a change has settled, new
//! connections use the new files; one that fails the checks is logged and the old ones stay.
//! The sidecar loads its `server.tls` and upstream CA files through the same functions.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use arc_swap::ArcSwap;
use rustls::{
    RootCertStore, ServerConfig,
    crypto::ring,
    pki_types::{
        CertificateDer, PrivateKeyDer,
        pem::{self, PemObject},
    },
    server::WebPkiClientVerifier,
    sign::CertifiedKey,
};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::{defaults::TLS_HANDSHAKE_TIMEOUT, reload::Watch};

/// Where the gRPC listener's certificate, key and (for mTLS) client CA are.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// The files, in the order [`TlsFiles::server_config`] takes their content.
    pub fn paths(&self) -> Vec<PathBuf> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()].into_iter().flatten().cloned().collect()
    }

    /// The listener's rustls settings from the files' content, HTTP/2 only.
    pub fn server_config(&self, content: &[Vec<u8>]) -> Result<ServerConfig, String> {
        let [cert, key, rest @ ..] = content else { return Err(files_expected(&self.paths(), content)) };
        let (chain, private) = parse_identity((&self.cert, cert), (&self.key, key))?;
        let provider = Arc::new(ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let builder = match (&self.client_ca, rest) {
            (Some(path), [ca]) => {
                let mut roots = RootCertStore::empty();
                for cert in certificates(path, ca)? {
                    roots.add(cert).map_err(|e| format!("{}: {e}", path.display()))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
            (None, []) => builder.with_no_client_auth(),
            _ => return Err(files_expected(&self.paths(), content)),
        };
        let mut config = builder.with_single_cert(chain, private).map_err(|e| format!("TLS: {e}"))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

/// How a client verifies the capacity servers it talks to and, for mTLS, proves who it is.
#[derive(Clone, Debug)]
pub struct ClientTlsFiles {
    /// CA bundle that signs the servers' certificates; the system roots when absent.
    pub ca: Option<PathBuf>,
    /// Certificate chain and private key for mTLS.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// Name to verify in the servers' certificates; the address's host when absent.
    pub server_name: Option<String>,
}

impl ClientTlsFiles {
    /// The files, in the order [`ClientTlsFiles::client_config`] takes their content.
    pub fn paths(&self) -> Vec<PathBuf> {
        let identity = self.identity.iter().flat_map(|(cert, key)| [cert, key]);
        self.ca.iter().chain(identity).cloned().collect()
    }

    pub fn client_config(&self, content: &[Vec<u8>]) -> Result<ClientTlsConfig, String> {
        let paths = self.paths();
        if content.len() != paths.len() {
            return Err(files_expected(&paths, content));
        }
        let mut content = content.iter();
        let mut next = || content.next().map_or(&[][..], Vec::as_slice);
        let mut config = ClientTlsConfig::new();
        config = match &self.ca {
            Some(path) => config.ca_certificate(ca_certificate(path, next())?),
            None => config.with_native_roots(),
        };
        if let Some((cert_path, key_path)) = &self.identity {
            let (cert, key) = (next(), next());
            parse_identity((cert_path, cert), (key_path, key))?;
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }
}

/// Settings that `build` makes from the content of `paths`, kept up to date as the files rotate:
/// they are polled every `interval`, and when their content changes and settles, `build` makes
/// new settings from it, or says why it cannot and the old settings stay. `what` names the
/// settings in the log. Must be called on a runtime.
pub fn rotating<T: Send + Sync + 'static>(
    what: &'static str,
    paths: Vec<PathBuf>,
    interval: Duration,
    build: impl Fn(&[Vec<u8>]) -> Result<T, String> + Send + 'static,
) -> Result<Arc<ArcSwap<T>>, String> {
    let loaded = Watch::read(&paths)?;
    let settings = Arc::new(ArcSwap::from_pointee(build(&loaded)?));
    if paths.is_empty() {
        return Ok(settings);
    }
    let installed = settings.clone();
    let mut watch = Watch::new(paths, Ok(loaded));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(content) = watch.changed(false) else { continue };
            match content.and_then(|files| build(&files)) {
                Ok(new) => {
                    installed.store(Arc::new(new));
                    tracing::info!(what, "TLS files changed: new connections use them");
                }
                Err(error) => tracing::error!(what, %error, "TLS files rejected; the previous ones stay in force"),
            }
        }
    });
    Ok(settings)
}

/// Sets up a TLS connection of the gRPC listener with `config` (the settings in force when it
/// came), within [`TLS_HANDSHAKE_TIMEOUT`]; `None` if it fails.
pub async fn handshake(config: Arc<ServerConfig>, stream: TcpStream, peer: SocketAddr) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, TlsAcceptor::from(config).accept(stream)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

/// A CA bundle for tonic, checked to hold certificates.
fn ca_certificate(path: &Path, pem: &[u8]) -> Result<Certificate, String> {
    certificates(path, pem)?;
    Ok(Certificate::from_pem(pem))
}

/// A certificate chain and its private key, checked to belong together.
fn parse_identity(
    (cert_path, cert): (&Path, &[u8]),
    (key_path, key): (&Path, &[u8]),
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain = certificates(cert_path, cert)?;
    check_pem(key_path, key)?;
    let private = PrivateKeyDer::from_pem_slice(key).map_err(|e| match e {
        pem::Error::NoItemsFound => format!("{}: no private key in it", key_path.display()),
        e => format!("{}: {e}", key_path.display()),
    })?;
    CertifiedKey::from_der(chain.clone(), private.clone_key(), &ring::default_provider())
        .map_err(|e| format!("{} and {} do not go together: {e}", cert_path.display(), key_path.display()))?;
    Ok((chain, private))
}

/// The certificates of a PEM file (`path`, read as `pem`), at least one.
pub fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    check_pem(path, pem)?;
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

fn check_pem(path: &Path, pem: &[u8]) -> Result<(), String> {
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!("{} is not PEM", path.display()));
    }
    Ok(())
}

/// The error for content that does not match its files, which the callers never pass.
fn files_expected(paths: &[PathBuf], content: &[Vec<u8>]) -> String {
    format!("{} TLS files expected, {} read", paths.len(), content.len())
}
