//! Command-line flags; each can also come from a `SLUICE_SIDECAR_*` environment variable.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Parser;
use sluice_client::id;
use sluice_runtime::cli::{LogFormat, poll_interval, positive_duration};

use crate::defaults;

/// Sluice sidecar: a reverse proxy that leases each resource's capacity from the Sluice (or
/// Doorman) capacity servers and delays or rejects the requests above it.
#[derive(Debug, Parser)]
#[command(name = "sluice-sidecar", version)]
pub struct Args {
    /// Configuration file (YAML: listeners, upstreams, resources, rules, server); reloaded when
    /// it changes and on SIGHUP. Without it, the embedded default applies.
    #[arg(long, env = "SLUICE_SIDECAR_CONFIG")]
    pub config: Option<PathBuf>,

    /// Admin listen address (/metrics, /live, /ready, /debug/status).
    #[arg(long, env = "SLUICE_SIDECAR_ADMIN_ADDR", default_value = defaults::ADMIN_ADDR)]
    pub admin_addr: SocketAddr,

    /// Client id toward the capacity servers; default: $POD_NAME or the host name, plus the
    /// first listener's port.
    #[arg(long, env = "SLUICE_SIDECAR_CLIENT_ID", value_parser = id)]
    pub client_id: Option<String>,

    /// Threads serving the data path.
    #[arg(long, env = "SLUICE_SIDECAR_WORKER_THREADS", default_value_t = defaults::WORKER_THREADS,
          value_parser = clap::value_parser!(u16).range(1..), allow_negative_numbers = true)]
    pub worker_threads: u16,

    /// How often to check the configuration file and the TLS files for changes, e.g. "2s" or
    /// "500ms".
    #[arg(long, env = "SLUICE_SIDECAR_CONFIG_POLL_INTERVAL", value_parser = poll_interval, allow_hyphen_values = true,
          default_value = defaults::CONFIG_POLL_INTERVAL)]
    pub config_poll_interval: Duration,

    /// On SIGTERM, how long in-flight requests may finish before connections close.
    #[arg(long, env = "SLUICE_SIDECAR_SHUTDOWN_GRACE", value_parser = positive_duration, allow_hyphen_values = true,
          default_value = defaults::SHUTDOWN_GRACE)]
    pub shutdown_grace: Duration,

    /// How often the status page's charts take a sample (they show the last 120); tests
    /// shorten it.
    #[arg(long, env = "SLUICE_SIDECAR_HISTORY_INTERVAL", value_parser = positive_duration, allow_hyphen_values = true,
          default_value = sluice_runtime::defaults::HISTORY_INTERVAL, hide = true)]
    pub history_interval: Duration,

    /// Log format.
    #[arg(long, env = "SLUICE_SIDECAR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter, in tracing's EnvFilter syntax (e.g. "info" or "info,sluice_sidecar=debug").
    /// Configuration reloads log under `sluice_runtime::reload`, code the sidecar shares with the
    /// server: a filter naming only `sluice_sidecar` hides a rejected file.
    #[arg(long, env = "SLUICE_SIDECAR_LOG", default_value = "info")]
    pub log: String,
}
