//! TLS and mTLS for the gRPC listener, and toward a parent server (rustls, through tonic).
//!
//! Every file is checked when it is loaded — PEM holding what it must hold, and a private key
//! that belongs to its certificate — so that a wrong file stops the process at start-up with
//! that file named, instead of failing every handshake later behind a bare "transport error".
//! The sidecar loads its `server.tls` and upstream CA files through the same functions.

use std::path::{Path, PathBuf};

use rustls::{
    crypto::ring,
    pki_types::{
        CertificateDer, PrivateKeyDer,
        pem::{self, PemObject},
    },
    sign::CertifiedKey,
};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::defaults::TLS_HANDSHAKE_TIMEOUT;

/// Where the server's certificate, key and (for mTLS) client CA are.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    pub fn load(&self) -> Result<ServerTlsConfig, String> {
        let mut config =
            ServerTlsConfig::new().identity(identity(&self.cert, &self.key)?).timeout(TLS_HANDSHAKE_TIMEOUT);
        if let Some(ca) = &self.client_ca {
            config = config.client_ca_root(ca_certificate(ca)?);
        }
        Ok(config)
    }
}

/// How an intermediate server verifies its parent and, for mTLS, proves who it is.
#[derive(Clone, Debug)]
pub struct ParentTlsFiles {
    pub ca: PathBuf,
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl ParentTlsFiles {
    pub fn load(&self) -> Result<ClientTlsConfig, String> {
        let mut config = ClientTlsConfig::new().ca_certificate(ca_certificate(&self.ca)?);
        if let Some((cert, key)) = &self.identity {
            config = config.identity(identity(cert, key)?);
        }
        Ok(config)
    }
}

/// The certificates of a PEM file, at least one.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    parse_certificates(path, &read_pem(path)?)
}

/// A CA bundle for tonic, checked to hold certificates.
pub fn ca_certificate(path: &Path) -> Result<Certificate, String> {
    let pem = read_pem(path)?;
    parse_certificates(path, &pem)?;
    Ok(Certificate::from_pem(pem))
}

/// A certificate chain and its private key for tonic, checked to belong together.
pub fn identity(cert: &Path, key: &Path) -> Result<Identity, String> {
    let (cert_pem, key_pem) = (read_pem(cert)?, read_pem(key)?);
    let chain = parse_certificates(cert, &cert_pem)?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
        pem::Error::NoItemsFound => format!("{}: no private key in it", key.display()),
        e => format!("{}: {e}", key.display()),
    })?;
    CertifiedKey::from_der(chain, private, &ring::default_provider())
        .map_err(|e| format!("{} and {} do not go together: {e}", cert.display(), key.display()))?;
    Ok(Identity::from_pem(cert_pem, key_pem))
}

fn parse_certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!("{} is not PEM", path.display()));
    }
    Ok(pem)
}
