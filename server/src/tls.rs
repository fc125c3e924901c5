//! TLS and mTLS for the gRPC listener, and toward a parent server (rustls, through tonic).

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

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
        let identity = Identity::from_pem(read(&self.cert)?, read(&self.key)?);
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.client_ca {
            config = config.client_ca_root(Certificate::from_pem(read(ca)?));
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
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&self.ca)?));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        Ok(config)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!("{} is not PEM", path.display()));
    }
    Ok(pem)
}
