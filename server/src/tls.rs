//! TLS and mTLS on the gRPC listener, with certificates rotated in place
//! (`sluice_runtime::reload::rotating`) and checked as `sluice_client::tls` checks every TLS
//! file.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use rustls::{RootCertStore, ServerConfig, crypto::ring, server::WebPkiClientVerifier};
use sluice_client::tls::{certificates, files_expected, identity};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, server::TlsStream};

use crate::{defaults::TLS_HANDSHAKE_TIMEOUT, identity::Caller};

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
        let (chain, private) = identity((&self.cert, cert), (&self.key, key))?;
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

/// Sets up a TLS connection of the gRPC listener with `config` (the settings in force when it
/// came), within [`TLS_HANDSHAKE_TIMEOUT`], and says who its client certificate names; `None`
/// if it fails.
pub async fn handshake(
    config: Arc<ServerConfig>,
    stream: TcpStream,
    peer: SocketAddr,
) -> Option<(TlsStream<TcpStream>, Caller)> {
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, TlsAcceptor::from(config).accept(stream)).await {
        Ok(Ok(tls)) => {
            let caller = Caller::of(tls.get_ref().1.peer_certificates());
            Some((tls, caller))
        }
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
