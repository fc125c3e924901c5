//! Wires the sidecar together: configuration, leases, listeners, the admin listener, reload and
//! a graceful shutdown that releases the leases.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use arc_swap::ArcSwap;
use sluice_runtime::{
    defaults::HISTORY_LENGTH,
    history::History,
    process::{Failure, bind_admin, read_config, termination},
    reload::{self, ConfigStatus, Reloader},
    telemetry,
};
use tokio::{
    net::TcpListener,
    signal::unix::{SignalKind, signal},
    sync::{mpsc, watch},
};

use sluice_http::sync;

use super::{
    admin::{self, Admin},
    ca_rotation,
    leasing::Leasing,
    sweep,
};
use crate::{
    cli::Args,
    config::{self, Config, ServerFlags},
    defaults::{EMBEDDED_CONFIG, HISTORY_RESOURCES},
    listener, metrics,
    plan::Plan,
    rls,
};

pub async fn run(args: Args) -> Result<(), Failure> {
    telemetry::init(args.log_format, &args.log).map_err(Failure::Usage)?;
    let (source, text) = read_config(args.config.as_deref(), EMBEDDED_CONFIG)?;
    let base = folder(args.config.as_deref());
    let server_flags = args.server_flags();
    let config = config::parse_with(&text, &server_flags, &base).map_err(|e| Failure::config(&source, &e))?;
    let handle = metrics::install().map_err(Failure::Runtime)?;
    let client_id = args.client_id.clone().unwrap_or_else(|| default_client_id(&config));

    let (cue, cues) = mpsc::unbounded_channel();
    let leasing = match &config.server {
        Some(server) => {
            let leasing = Leasing::new(client_id.clone(), server, args.config_poll_interval).map_err(Failure::Usage)?;
            Some(Arc::new(leasing))
        }
        None => None,
    };
    let cue = leasing.as_ref().map(|_| cue);
    let mut listeners = Vec::new();
    for l in &config.listeners {
        let bound = TcpListener::bind(l.address)
            .await
            .map_err(|e| Failure::Runtime(format!("cannot listen on {} (listener {}): {e}", l.address, l.name)))?;
        listeners.push(bound);
    }
    let rls_listener = match &config.rate_limit_service {
        Some(service) => Some(TcpListener::bind(service.address).await.map_err(|e| {
            Failure::Runtime(format!("cannot listen on {} (rate_limit_service): {e}", service.address))
        })?),
        None => None,
    };
    let admin_listener = bind_admin(args.admin_addr, "admin")?;
    let debug_listener = args.debug_addr.map(|a| bind_admin(a, "debug")).transpose()?;

    let plan = Plan::build(config, None, cue.as_ref()).map_err(|e| Failure::config(&source, &e))?;
    if let Some(leasing) = &leasing {
        leasing.configure(&plan);
        leasing.apply(&plan);
    }
    let live = Arc::new(ArcSwap::from_pointee(plan));
    let config_status = ConfigStatus::shared(args.config.as_deref());
    let admin = Arc::new(Admin {
        live: live.clone(),
        client_id: client_id.clone(),
        handle,
        config: config_status.clone(),
        started: false.into(),
        draining: false.into(),
        history: Mutex::new(History::new(HISTORY_LENGTH, args.history_interval.as_secs_f64(), HISTORY_RESOURCES)),
        leasing: leasing.clone(),
    });
    admin::spawn(admin_listener, debug_listener, admin.clone())
        .map_err(|e| Failure::Runtime(format!("admin listener: {e}")))?;
    tokio::spawn(admin.clone().record_history(args.history_interval));

    // Installed before serving: SIGHUP's default action would end the process.
    let hangup = signal(SignalKind::hangup()).map_err(|e| Failure::Runtime(format!("SIGHUP handler: {e}")))?;
    // Held while a new plan is built and put in force, by a reload or a CA bundle's rotation.
    let applying = Arc::new(Mutex::new(()));
    tokio::spawn(ca_rotation::run(live.clone(), applying.clone(), cue.clone(), args.config_poll_interval));
    match args.config.clone() {
        Some(path) => {
            let apply = reload(live.clone(), applying, leasing.clone(), cue.clone(), server_flags, base.clone());
            let reloader = Reloader::new(path, text.into_bytes(), apply, metrics::record_reload, config_status)
                .also_watching(Box::new(move |text| config::named_files(text, &base)));
            tokio::spawn(reloader.run(args.config_poll_interval, hangup));
        }
        None => {
            tokio::spawn(Reloader::without_file(hangup));
        }
    }

    let (stop, stopped) = watch::channel(false);
    // The leases are kept up while the listeners drain, and given back after.
    let (release, released) = watch::channel(false);
    let leasing_task = leasing.clone().map(|l| tokio::spawn(l.run(live.clone(), cues, released.clone())));
    tokio::spawn(sweep::sweep(live.clone(), leasing.clone(), released));
    let serving: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| tokio::spawn(listener::serve(l, i, live.clone(), stopped.clone(), args.shutdown_grace)))
        .collect();
    let rls_task = rls_listener.map(|l| {
        let max_requests = live.load().config.rate_limit_service.as_ref().map_or(1, |s| s.max_requests);
        let mut stopped = stopped.clone();
        let stopping = async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        tokio::spawn(rls::serve(l, live.clone(), max_requests, stopping))
    });
    admin.started.store(true, Ordering::Relaxed);
    let addresses: Vec<String> =
        live.load().config.listeners.iter().map(|l| format!("{}={}", l.name, l.address)).collect();
    let mode = if leasing.is_some() { "leasing from capacity servers" } else { "standalone" };
    tracing::info!(listeners = %addresses.join(","), admin = %args.admin_addr, config = %source, %client_id, mode, "sluice-sidecar serving");

    let signal = termination().await;
    tracing::info!(signal, grace = ?args.shutdown_grace, "draining connections");
    admin.draining.store(true, Ordering::Relaxed);
    let _ = stop.send(true);
    let drained = async {
        for task in serving {
            let _ = task.await;
        }
        if let Some(task) = rls_task
            && let Ok(Err(e)) = task.await
        {
            tracing::error!(error = %e, "rate limit service");
        }
    };
    tokio::select! {
        _ = drained => {}
        signal = termination() => tracing::warn!(signal, "asked again: the connections still open are closed now"),
    }
    let _ = release.send(true);
    if let Some(task) = leasing_task {
        let _ = task.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// What `sluice-sidecar check` says of a valid configuration, checked as [`run`] checks it at
/// start (the TLS and CA files it names read too), without binding or dialling anything.
pub fn check(text: &str, base: &Path) -> Result<String, String> {
    let config = config::parse_with(text, &ServerFlags::default(), base)?;
    // Watching `server.tls`'s files takes a runtime, where the watch is spawned and never runs.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let _entered = runtime.enter();
    if let Some(server) = &config.server {
        Leasing::new(default_client_id(&config), server, Duration::MAX)?;
    }
    let config = Plan::build(config, None, None)?.config;
    let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let mut summary = [
        count(config.listeners.len(), "listener"),
        count(config.upstreams.len(), "upstream"),
        count(config.resources.len(), "resource"),
        count(config.rules.len(), "rule"),
    ]
    .join(", ");
    if let Some(service) = &config.rate_limit_service {
        summary += &format!(", rate limit service with {}", count(service.domains.len(), "domain"));
    }
    summary += &match &config.server {
        Some(server) => format!(", leasing from {}", count(server.addresses.len(), "server")),
        None => ", standalone".to_owned(),
    };
    Ok(summary)
}

/// How a reload applies a new file: validate it, build its plan from the one in force, release
/// the leases of resources it drops, then put it in force in one swap.
fn reload(
    live: Arc<ArcSwap<Plan>>,
    applying: Arc<Mutex<()>>,
    leasing: Option<Arc<Leasing>>,
    cue: Option<mpsc::UnboundedSender<Arc<str>>>,
    flags: ServerFlags,
    base: PathBuf,
) -> reload::Apply {
    Box::new(move |text: &str| {
        let next: Config = config::parse_with(text, &flags, &base)?;
        let _applying = sync::lock(&applying);
        let current = live.load_full();
        if let Some(why) = current.config.restart_needed(&next) {
            return Err(why);
        }
        let plan = Plan::build(next, Some(&current), cue.as_ref())?;
        if let Some(leasing) = &leasing {
            let dropped = leasing.configure(&plan);
            leasing.apply(&plan);
            let leasing = leasing.clone();
            tokio::spawn(async move { leasing.release(dropped).await });
        }
        let summary = format!("{} rules, {} resources", plan.config.rules.len(), plan.config.resources.len());
        live.store(Arc::new(plan));
        Ok(summary)
    })
}

/// The folder relative paths in the configuration file are read from: the file's own.
fn folder(config: Option<&Path>) -> PathBuf {
    config.and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default()
}

/// `$POD_NAME` or the host name, plus the first listener's port (or the rate limit service's):
/// unique per pod and per sidecar within it.
fn default_client_id(config: &Config) -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()))
        .unwrap_or_else(|| "sluice-sidecar".to_owned());
    let port = config.listeners.first().map(|l| l.address).or(config.rate_limit_service.as_ref().map(|s| s.address));
    format!("{host}:{}", port.map_or(0, |a| a.port()))
}
