//! Command-line flags; each of the server's own can also come from a `SLUICE_*` environment
//! variable. Without a subcommand the binary is the server; `check` validates a configuration.

use std::{fmt, net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};
use sluice_client::{id, tls::ClientTlsFiles};
use sluice_runtime::cli::{Check, LogFormat, host_port, poll_interval, positive_duration};

use crate::{
    defaults, election,
    etcd::{self, Credentials},
    tls::TlsFiles,
};

/// Sluice capacity server: shares each resource's capacity among its clients with Doorman's
/// protocol and algorithms.
#[derive(Debug, Parser)]
#[command(name = "sluice-server", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub server: Args,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validates a configuration file as the server's start would, without binding or dialling
    /// anything: exits 0 with a summary, or 64 with the first error found.
    Check(Check),
}

/// The server's own flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Configuration file (Doorman's YAML ResourceRepository); reloaded when it changes and on
    /// SIGHUP. `etcd:<key>` (Doorman's form): the same YAML in that etcd key, watched (needs
    /// --etcd-endpoints). Without it, the embedded default applies.
    #[arg(long, env = "SLUICE_CONFIG", value_parser = config_source)]
    pub config: Option<ConfigSource>,

    /// gRPC listen address.
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = defaults::GRPC_ADDR)]
    pub grpc_addr: SocketAddr,

    /// HTTP admin listen address (/metrics, /healthz, /readyz, and the /debug/ pages unless
    /// --debug-addr is given).
    #[arg(long, env = "SLUICE_ADMIN_ADDR", default_value = defaults::ADMIN_ADDR)]
    pub admin_addr: SocketAddr,

    /// HTTP listen address of the /debug/ pages (every client and its demand), apart from
    /// --admin-addr: e.g. 127.0.0.1:7779, reached with `kubectl port-forward`.
    #[arg(long, env = "SLUICE_DEBUG_ADDR")]
    pub debug_addr: Option<SocketAddr>,

    /// Address clients are told to use for this server (Discovery); defaults to the gRPC
    /// listen address. With --etcd-endpoints, the master publishes it as its election value.
    #[arg(long, env = "SLUICE_ADVERTISE_ADDRESS", value_parser = host_port)]
    pub advertise_address: Option<String>,

    /// Makes this an intermediate server: it gets its capacity from the parent node at these
    /// addresses (comma-separated host:port of its replicas, or one balanced name) instead of
    /// from its configuration (SPEC §3.6).
    #[arg(long, env = "SLUICE_PARENT", value_delimiter = ',', value_parser = host_port)]
    pub parent: Vec<String>,

    /// This server's id in its requests to the parent. Replicas of one node should share it,
    /// so that a new master takes over the lease of the old one. Defaults to the advertise
    /// address.
    #[arg(long, env = "SLUICE_SERVER_ID", requires = "parent", value_parser = id)]
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

    /// etcd v3 endpoints, comma-separated (e.g. "http://etcd-0:2379,http://etcd-1:2379", or all
    /// https:// for TLS): the replicas elect their master there. Without it, this server is
    /// always the master.
    #[arg(long, env = "SLUICE_ETCD_ENDPOINTS", value_delimiter = ',', value_parser = etcd_endpoint)]
    pub etcd_endpoints: Vec<String>,

    /// PEM CA bundle that signs etcd's certificate (https:// endpoints); the system roots when
    /// absent. Reloaded when it changes.
    #[arg(long, env = "SLUICE_ETCD_CACERT", requires = "etcd_endpoints")]
    pub etcd_cacert: Option<PathBuf>,

    /// PEM client certificate chain presented to etcd (mTLS, etcd's --client-cert-auth).
    /// Reloaded when it changes.
    #[arg(long, env = "SLUICE_ETCD_CERT", requires_all = ["etcd_endpoints", "etcd_key"])]
    pub etcd_cert: Option<PathBuf>,

    /// PEM private key for --etcd-cert.
    #[arg(long, env = "SLUICE_ETCD_KEY", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,

    /// etcd user, as name:password (etcd's user/password auth).
    #[arg(long, env = "SLUICE_ETCD_USER", value_parser = Credentials::parse, hide_env_values = true,
          requires = "etcd_endpoints")]
    pub etcd_user: Option<Credentials>,

    /// etcd key prefix the replicas of this capacity server campaign on; one per deployment.
    #[arg(long, env = "SLUICE_ELECTION_KEY", default_value = defaults::ELECTION_KEY,
          value_parser = election_key, requires = "etcd_endpoints")]
    pub election_key: String,

    /// TTL in seconds of the etcd lease behind the campaign: about how long a dead master keeps
    /// its replicas waiting, and the longest a master cut off from etcd keeps serving.
    #[arg(long, env = "SLUICE_ETCD_LEASE_TTL", default_value_t = defaults::ETCD_LEASE_TTL,
          value_parser = clap::value_parser!(i64).range(1..=86_400), allow_negative_numbers = true,
          requires = "etcd_endpoints")]
    pub etcd_lease_ttl: i64,

    /// How often to check the configuration file and the TLS files for changes, e.g. "2s" or
    /// "500ms".
    #[arg(long, env = "SLUICE_CONFIG_POLL_INTERVAL", value_parser = poll_interval, allow_hyphen_values = true,
          default_value = defaults::CONFIG_POLL_INTERVAL)]
    pub config_poll_interval: Duration,

    /// Most resources this server keeps at once; a request that would add more gets
    /// RESOURCE_EXHAUSTED. Bounds memory and the per-resource metric series.
    #[arg(long, env = "SLUICE_MAX_RESOURCES", default_value_t = defaults::MAX_RESOURCES,
          value_parser = at_least_one, allow_hyphen_values = true)]
    pub max_resources: usize,

    /// Most leases this server holds at once, a child server's counted once per priority band
    /// or profile group it claims; a request that would add more gets RESOURCE_EXHAUSTED, while
    /// leases already held renew. Bounds the memory clients can make the server hold.
    #[arg(long, env = "SLUICE_MAX_LEASES", default_value_t = defaults::MAX_LEASES,
          value_parser = at_least_one, allow_hyphen_values = true)]
    pub max_leases: usize,

    /// Most clients holding leases on one resource; a new client of a resource that has them
    /// gets RESOURCE_EXHAUSTED, while clients holding leases renew. Keeps one resource's
    /// clients from taking all of --max-leases.
    #[arg(long, env = "SLUICE_MAX_CLIENTS_PER_RESOURCE", default_value_t = defaults::MAX_CLIENTS_PER_RESOURCE,
          value_parser = at_least_one, allow_hyphen_values = true)]
    pub max_clients_per_resource: usize,

    /// Request bytes handled at once, over every gRPC connection and call: a call counts 24 KiB,
    /// its header and its body from its first byte until its answer is sent, and one that finds
    /// no room is refused RESOURCE_EXHAUSTED at once. Bounds the memory requests in flight take
    /// (at most about 16 times this); a request larger than it is never served.
    #[arg(long, env = "SLUICE_MAX_REQUEST_BYTES_IN_FLIGHT", default_value_t = defaults::MAX_REQUEST_BYTES_IN_FLIGHT,
          value_parser = request_bytes_in_flight, allow_hyphen_values = true)]
    pub max_request_bytes_in_flight: usize,

    /// gRPC connections served at once; beyond it the listener accepts no more until one
    /// closes, and new clients wait in the kernel's backlog.
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS", default_value_t = defaults::MAX_CONNECTIONS,
          value_parser = max_connections, allow_hyphen_values = true)]
    pub max_connections: usize,

    /// How often the status pages' charts take a sample (they show the last 120); tests
    /// shorten it.
    #[arg(long, env = "SLUICE_HISTORY_INTERVAL", value_parser = positive_duration, allow_hyphen_values = true,
          default_value = sluice_runtime::defaults::HISTORY_INTERVAL, hide = true)]
    pub history_interval: Duration,

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

    /// Log filter, in tracing's EnvFilter syntax (e.g. "info" or "info,sluice_server=debug").
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

    pub fn parent_tls(&self) -> Option<ClientTlsFiles> {
        Some(ClientTlsFiles {
            ca: Some(self.parent_tls_ca.clone()?),
            identity: self.parent_tls_cert.clone().zip(self.parent_tls_key.clone()),
            server_name: None,
        })
    }

    pub fn advertise_address(&self) -> String {
        self.advertise_address.clone().unwrap_or_else(|| self.grpc_addr.to_string())
    }

    /// How this server reaches etcd; `None` without etcd. TLS files go with `https://`
    /// endpoints only, and the endpoints share one scheme.
    pub fn etcd(&self) -> Result<Option<etcd::Settings>, String> {
        let Some(first) = self.etcd_endpoints.first() else { return Ok(None) };
        let https = first.starts_with("https://");
        if self.etcd_endpoints.iter().any(|e| e.starts_with("https://") != https) {
            return Err("--etcd-endpoints: all http:// or all https://, not both".into());
        }
        let identity = self.etcd_cert.clone().zip(self.etcd_key.clone());
        if !https && (self.etcd_cacert.is_some() || identity.is_some()) {
            return Err("--etcd-cacert, --etcd-cert and --etcd-key need https:// --etcd-endpoints".into());
        }
        let tls = https.then(|| ClientTlsFiles { ca: self.etcd_cacert.clone(), identity, server_name: None });
        Ok(Some(etcd::Settings { endpoints: self.etcd_endpoints.clone(), tls, user: self.etcd_user.clone() }))
    }

    /// The etcd election this server takes part in; `None` in the embedded mode.
    pub fn election(&self) -> Option<election::Settings> {
        (!self.etcd_endpoints.is_empty()).then(|| election::Settings {
            key: self.election_key.clone(),
            lease_ttl: self.etcd_lease_ttl,
            address: self.advertise_address(),
        })
    }
}

/// A count that must be at least 1.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("must be a whole number ≥ 1".into()),
    }
}

/// A whole number within `range`.
fn within(text: &str, range: std::ops::RangeInclusive<usize>) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(format!("must be a whole number from {} to {}", range.start(), range.end())),
    }
}

fn request_bytes_in_flight(text: &str) -> Result<usize, String> {
    within(text, defaults::MIN_REQUEST_BYTES_IN_FLIGHT..=defaults::MAX_REQUEST_BYTES_IN_FLIGHT_LIMIT)
}

fn max_connections(text: &str) -> Result<usize, String> {
    within(text, 1..=defaults::MAX_CONNECTIONS_LIMIT)
}

/// Where the configuration comes from.
#[derive(Clone, Debug)]
pub enum ConfigSource {
    File(PathBuf),
    /// An etcd key holding the file's YAML.
    Etcd(String),
}

/// As people name it: the file's path, or `etcd:<key>`.
impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigSource::File(path) => write!(f, "{}", path.display()),
            ConfigSource::Etcd(key) => write!(f, "etcd:{key}"),
        }
    }
}

/// `etcd:<key>`, else a file's path (a file whose name starts with `etcd:` as `./etcd:...`).
fn config_source(text: &str) -> Result<ConfigSource, String> {
    match text.strip_prefix("etcd:") {
        Some("") => Err("etcd: needs a key, e.g. etcd:/sluice/config".into()),
        Some(key) => Ok(ConfigSource::Etcd(key.to_owned())),
        None => Ok(ConfigSource::File(PathBuf::from(text))),
    }
}

/// An etcd endpoint URL, http:// or https://.
fn etcd_endpoint(text: &str) -> Result<String, String> {
    let uri: hyper::Uri = text.parse().map_err(|e| format!("{e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(_)) => Ok(text.to_owned()),
        _ => Err("expected a URL such as http://127.0.0.1:2379 or https://etcd:2379".into()),
    }
}

fn election_key(text: &str) -> Result<String, String> {
    if text.is_empty() { Err("must not be empty".into()) } else { Ok(text.to_owned()) }
}
