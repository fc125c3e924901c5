//! TLS and mTLS toward capacity servers (a parent, or the sidecar's servers), and the checks of
//! PEM files that every TLS setting in Sluice goes through.
//!
//! Every file is checked when it is loaded — PEM holding what it must hold, and a private key
//! that belongs to its certificate — so that a wrong file stops the process at start-up with
//! that file named, instead of failing every handshake later behind a bare "transport error".
//! The files are then polled like the configuration (`sluice_runtime::reload::rotating`): once a
//! change has settled, new connections use the new files; one that fails the checks is logged
//! and the old ones stay. The server's listener and the sidecar's upstream CA files use the same
//! checks.

use std::path::{Path, PathBuf};

use rustls::{
    crypto::ring,
    pki_types::{
        CertificateDer, PrivateKeyDer,
        pem::{self, PemObject},
    },
    sign::CertifiedKey,
};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

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
            identity((cert_path, cert), (key_path, key))?;
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }
}

/// A CA bundle for tonic, checked to hold certificates.
fn ca_certificate(path: &Path, pem: &[u8]) -> Result<Certificate, String> {
    certificates(path, pem)?;
    Ok(Certificate::from_pem(pem))
}

/// A certificate chain and its private key, checked to belong together.
pub fn identity(
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
pub fn files_expected(paths: &[PathBuf], content: &[Vec<u8>]) -> String {
    format!("{} TLS files expected, {} read", paths.len(), content.len())
}
