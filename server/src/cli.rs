//! Command-line flags; each can also come from a `SLUICE_*` environment variable.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Parser, ValueEnum};

use crate::{
    defaults,
    tls::{ParentTlsFiles, TlsFiles},
};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Sluice capacity server: shares each resource's capacity among its clients with Doorman's
/// protocol and algorithms.
#[derive(Debug, Parser)]
#[command(name = "sluice-server", version)]
pub struct Args {
    /// Configuration file (Doorman's YAML ResourceRepository); reloaded when it changes and on
    /// SIGHUP. Without it, the embedded default applies.
    #[arg(long, env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,

    /// gRPC listen address.
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = defaults::GRPC_ADDR)]
    pub grpc_addr: SocketAddr,

    /// HTTP debug listen address (/metrics, /healthz, /readyz, /debug/status).
    #[arg(long, env = "SLUICE_ADMIN_ADDR", default_value = defaults::ADMIN_ADDR)]
    pub admin_addr: SocketAddr,

    /// Address clients are told to use for this server (Discovery); defaults to the gRPC
    /// listen address.
    #[arg(long, env = "SLUICE_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,

    /// Makes this an intermediate server: it gets its capacity from the parent node at these
    /// addresses (comma-separated host:port of its replicas, or one balanced name) instead of
    /// from its configuration (SPEC §3.6).
    #[arg(long, env = "SLUICE_PARENT", value_delimiter = ',')]
    pub parent: Vec<String>,

    /// This server's id in its requests to the parent. Replicas of one node should share it,
    /// so that a new master takes over the lease of the old one. Defaults to the advertise
    /// address.
    #[arg(long, env = "SLUICE_SERVER_ID", requires = "parent")]
    pub server_id: Option<String>,

    /// PEM CA bundle that signs the parent's certificate: talk to the parent over TLS.
    #[arg(long, env = "SLUICE_PARENT_TLS_CA", requires = "parent")]
    pub parent_tls_ca: Option<PathBuf>,

    /// PEM certificate chain presented to the parent (mTLS).
    #[arg(long, env = "SLUICE_PARENT_TLS_CERT", requires_all = ["parent_tls_ca", "parent_tls_key"])]
    pub parent_tls_cert: Option<PathBuf>,

    /// PEM private key for --parent-tls-cert.
    #[arg(long, env = "SLUICE_PARENT_TLS_KEY", requires = "parent_tls_cert")]
    pub parent_tls_key: Option<PathBuf>,

    /// How often to check the configuration file for changes, e.g. "2s" or "500ms".
    #[arg(long, env = "SLUICE_CONFIG_POLL_INTERVAL", value_parser = positive_duration,
          default_value = defaults::CONFIG_POLL_INTERVAL)]
    pub config_poll_interval: Duration,

    /// Most resources this server keeps at once; a request that would add more gets
    /// RESOURCE_EXHAUSTED. Bounds memory and the per-resource metric series.
    #[arg(long, env = "SLUICE_MAX_RESOURCES", default_value_t = defaults::MAX_RESOURCES)]
    pub max_resources: usize,

    /// PEM certificate chain for TLS on the gRPC listener.
    #[arg(long, env = "SLUICE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for --tls-cert.
    #[arg(long, env = "SLUICE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA bundle: require client certificates signed by it (mTLS).
    #[arg(long, env = "SLUICE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Log format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter, in tracing's EnvFilter syntax (e.g. "info" or "sluice_server=debug").
    #[arg(long, env = "SLUICE_LOG", default_value = "info")]
    pub log: String,
}

impl Args {
    pub fn tls(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone(),
        })
    }

    pub fn parent_tls(&self) -> Option<ParentTlsFiles> {
        Some(ParentTlsFiles {
            ca: self.parent_tls_ca.clone()?,
            identity: self.parent_tls_cert.clone().zip(self.parent_tls_key.clone()),
        })
    }

    pub fn advertise_address(&self) -> String {
        self.advertise_address.clone().unwrap_or_else(|| self.grpc_addr.to_string())
    }
}

/// A duration flag that must be above zero, e.g. "2s" or "500ms".
pub fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("must be greater than 0".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

/// Parses the command line; on a usage error, the one line to print (exit code 64).
pub fn parse() -> Result<Args, clap::Error> {
    Args::try_parse()
}

/// The first line of a clap error, without its "error: " prefix.
pub fn usage_line(error: &clap::Error) -> String {
    let text = error.to_string();
    let line = text.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}
