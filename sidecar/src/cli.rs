//! Command-line flags; each of the sidecar's own can also come from a `SLUICE_SIDECAR_*`
//! environment variable. Without a subcommand the binary is the sidecar; `inject` and
//! `webhook` put it into Kubernetes pods (`crate::kube`), `wait` holds a pod's other containers
//! until it is ready; `check` validates a configuration.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};
use sluice_client::id;
use sluice_runtime::cli::{Check, LogFormat, host_port, poll_interval, positive_duration};

use crate::{
    config::ServerFlags,
    defaults,
    kube::{
        hold,
        inject::{Settings, config_map_name},
        webhook,
    },
};

/// Sluice sidecar: a reverse proxy that leases each resource's capacity from the Sluice (or
/// Doorman) capacity servers and delays or rejects the requests above it.
#[derive(Debug, Parser)]
#[command(name = "sluice-sidecar", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub sidecar: Args,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Adds the sidecar to every pod template of Kubernetes YAML (Pod, Deployment, StatefulSet,
    /// DaemonSet, ReplicaSet, Job, CronJob, also inside a List; other kinds pass through) and
    /// writes it to standard output. Injecting again replaces the sidecar injected before.
    Inject(Inject),
    /// Takes out what `inject` added (the sidecar container, its volume, annotation and label)
    /// and writes the rest to standard output.
    Uninject(Uninject),
    /// The same injection as a Kubernetes mutating admission webhook (AdmissionReview v1 over
    /// TLS), for pods labelled, or in a namespace labelled, `sluice.io/inject: enabled`.
    Webhook(webhook::Args),
    /// Validates a configuration file as the sidecar's start would (the files it names
    /// included), without binding or dialling anything: exits 0 with a summary, or 64 with
    /// every error found, a line each.
    Check(Check),
    /// Waits until the sidecar is ready (its `/ready` answers 200): the `postStart` hook of a
    /// classic sidecar, which holds the pod's other containers until then. Exits 0 once ready,
    /// 1 after --timeout.
    Wait(hold::Args),
}

#[derive(Debug, clap::Args)]
pub struct Inject {
    /// YAML file to read, or a directory (its `.yaml`, `.yml` and `.json` files in name order);
    /// `-` for standard input.
    #[arg(default_value = "-")]
    pub file: PathBuf,

    /// ConfigMap (in the pod's namespace) whose `sidecar.yaml` key is the sidecar's
    /// configuration, mounted read-only.
    #[arg(long, value_parser = config_map_name)]
    pub config_map: String,

    #[command(flatten)]
    pub settings: Settings,
}

#[derive(Debug, clap::Args)]
pub struct Uninject {
    /// YAML file to read, or a directory, as for `inject`; `-` for standard input.
    #[arg(default_value = "-")]
    pub file: PathBuf,
}

/// The sidecar's own flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Configuration file (YAML: listeners, upstreams, resources, rules, server); reloaded when
    /// it changes and on SIGHUP. Without it, the embedded default applies.
    #[arg(long, env = "SLUICE_SIDECAR_CONFIG")]
    pub config: Option<PathBuf>,

    /// Capacity servers (comma-separated host:port), in place of the configuration's
    /// `server.addresses`; a configuration without a `server` section then leases from them
    /// too, without TLS.
    #[arg(long, env = "SLUICE_SIDECAR_SERVER_ADDRESSES", value_delimiter = ',', value_parser = host_port)]
    pub server_addresses: Vec<String>,

    /// CA bundle that signs the capacity servers' certificates, in place of the configuration's
    /// `server.tls.ca` (an injected sidecar's, from its identity volume).
    #[arg(long, env = "SLUICE_SIDECAR_SERVER_TLS_CA")]
    pub server_tls_ca: Option<PathBuf>,

    /// Client certificate toward the capacity servers (mTLS), in place of `server.tls.cert`.
    #[arg(long, env = "SLUICE_SIDECAR_SERVER_TLS_CERT", requires = "server_tls_key")]
    pub server_tls_cert: Option<PathBuf>,

    /// Private key of --server-tls-cert, in place of `server.tls.key`.
    #[arg(long, env = "SLUICE_SIDECAR_SERVER_TLS_KEY", requires = "server_tls_cert")]
    pub server_tls_key: Option<PathBuf>,

    /// Admin listen address (/metrics, /live, /ready, and the /debug/ pages unless --debug-addr
    /// is given).
    #[arg(long, env = "SLUICE_SIDECAR_ADMIN_ADDR", default_value = defaults::ADMIN_ADDR)]
    pub admin_addr: SocketAddr,

    /// Listen address of the /debug/ pages apart from --admin-addr: e.g. 127.0.0.1:9902, reached
    /// with `kubectl port-forward`.
    #[arg(long, env = "SLUICE_SIDECAR_DEBUG_ADDR")]
    pub debug_addr: Option<SocketAddr>,

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

impl Args {
    /// What the flags say of the capacity servers, in place of the configuration's.
    pub fn server_flags(&self) -> ServerFlags {
        ServerFlags {
            addresses: self.server_addresses.clone(),
            ca: self.server_tls_ca.clone(),
            cert: self.server_tls_cert.clone(),
            key: self.server_tls_key.clone(),
        }
    }
}
