//! Wires the server together: configuration, listeners, the gRPC service, the debug listener,
//! reload and expiry sweeping, the master election, and shutdown.

use std::{
    future::Future,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use sluice_client::discovery::Servers;
use sluice_proto::{FILE_DESCRIPTOR_SET, capacity_server::CapacityServer};
use sluice_runtime::{
    defaults::HISTORY_LENGTH,
    history::History,
    process::{Failure, bind_admin, read_config, termination},
    reload::{Applier, Apply, ConfigStatus, Reloader, rotating},
    telemetry,
};
use tokio::{
    net::TcpListener,
    signal::unix::{SignalKind, signal},
    sync::oneshot,
};
use tonic::{server::NamedService, transport::Server};
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{
    accept, admin,
    cli::{Args, ConfigSource},
    config,
    defaults::{
        EMBEDDED_CONFIG, HEALTH_CHECK_INTERVAL, HISTORY_RESOURCES, HTTP2_WINDOW, MAX_CONCURRENT_STREAMS,
        MAX_HEADER_LIST_BYTES, MAX_REQUEST_BYTES, SHUTDOWN_GRACE, SWEEP_BATCH, SWEEP_INTERVAL,
    },
    election::Election,
    etcd::Etcd,
    etcd_config,
    inflight::InFlight,
    metrics, parent,
    service::CapacityService,
    state::{self, Bounds, ParentLink, State},
    status::{self, ResourceHistory},
    tls,
};

pub async fn run(args: Args) -> Result<(), Failure> {
    telemetry::init(args.log_format, &args.log).map_err(Failure::Usage)?;
    let etcd = args.etcd().map_err(Failure::Usage)?;
    let etcd =
        etcd.map(|settings| Etcd::new(settings, args.config_poll_interval)).transpose().map_err(Failure::Usage)?;
    let (source, text, dir) = match &args.config {
        // The files it names are found in the working directory.
        Some(ConfigSource::Etcd(key)) => {
            let source = format!("etcd:{key}");
            let etcd =
                etcd.as_ref().ok_or_else(|| Failure::Usage(format!("--config {source} needs --etcd-endpoints")))?;
            let text = etcd_config::read_at_start(etcd, key).await.map_err(|e| etcd_failure(&source, e))?;
            (source, text, PathBuf::new())
        }
        Some(ConfigSource::File(path)) => {
            let (source, text) = read_config(Some(path), EMBEDDED_CONFIG)?;
            // The files it names are found beside it.
            (source, text, path.parent().unwrap_or(Path::new("")).to_owned())
        }
        // The embedded default's, in the working directory.
        None => {
            let (source, text) = read_config(None, EMBEDDED_CONFIG)?;
            (source, text, PathBuf::new())
        }
    };
    let repository = config::parse(&text, &dir).map_err(|e| Failure::config(&source, &e))?;
    let election = args.election();
    if let (Some(etcd), Some(election), Some(ConfigSource::File(_)) | None) = (&etcd, &election, &args.config) {
        // What only etcd can say is wrong (a certificate, a password, a permission) stops the
        // start; etcd down does not, since the election waits for it.
        match etcd.check(&election.key).await {
            Ok(()) => {}
            Err(e) if e.unreachable => tracing::warn!(error = %e, "etcd unreachable at start; the election retries"),
            Err(e) => return Err(etcd_failure("--etcd-endpoints", e)),
        }
    }
    let tls = args
        .tls()
        .map(|files| {
            rotating("gRPC listener", files.paths(), args.config_poll_interval, move |content| {
                files.server_config(content)
            })
        })
        .transpose()
        .map_err(Failure::Usage)?;

    let grpc = TcpListener::bind(args.grpc_addr)
        .await
        .map_err(|e| Failure::Runtime(format!("cannot listen on {} (gRPC): {e}", args.grpc_addr)))?;
    let admin = bind_admin(args.admin_addr, "admin")?;
    let debug = args.debug_addr.map(|a| bind_admin(a, "debug")).transpose()?;
    let local = |l: Result<std::net::SocketAddr, std::io::Error>| l.map_or_else(|e| e.to_string(), |a| a.to_string());
    let (grpc_addr, admin_addr) = (local(grpc.local_addr()), local(admin.local_addr()));

    let handle = metrics::install().map_err(Failure::Runtime)?;
    let parent = if args.parent.is_empty() {
        None
    } else {
        let servers = Servers::with_tls_files(
            args.parent.clone(),
            args.parent_tls(),
            metrics::record_parent_rpc,
            args.config_poll_interval,
            "parent link",
        )
        .map_err(Failure::Usage)?;
        Some(ParentLink { servers, server_id: args.server_id.clone().unwrap_or_else(|| args.advertise_address()) })
    };
    let election_key = election.as_ref().map(|e| e.key.clone());
    let config_status = ConfigStatus::from_source(args.config.as_ref().map(ConfigSource::to_string));
    let state = Arc::new(State::new(
        repository,
        args.advertise_address(),
        election_key,
        parent,
        config_status.clone(),
        Bounds { max_leases: args.max_leases, max_clients: args.max_clients_per_resource },
        state::now(),
    ));
    tokio::spawn(parent::run(state.clone()));
    let history =
        Arc::new(Mutex::new(History::new(HISTORY_LENGTH, args.history_interval.as_secs_f64(), HISTORY_RESOURCES)));
    tokio::spawn(record_history(state.clone(), history.clone(), args.history_interval));
    admin::spawn(admin, debug, state.clone(), history, handle.clone())
        .map_err(|e| Failure::Runtime(format!("admin listener: {e}")))?;
    let election = election.zip(etcd.clone()).map(|(settings, etcd)| Election::spawn(settings, etcd, state.clone()));
    tokio::spawn(sweep(state.clone(), handle));
    // Installed before serving: SIGHUP's default action would end the process.
    let hangup = signal(SignalKind::hangup()).map_err(|e| Failure::Runtime(format!("SIGHUP handler: {e}")))?;
    let apply: Apply = Box::new({
        let (state, at) = (state.clone(), dir.clone());
        move |text: &str| {
            let repository = config::parse(text, &at)?;
            let summary = format!("{} templates", repository.templates().len());
            state.publish(repository);
            Ok(summary)
        }
    });
    match (args.config.clone(), etcd) {
        (Some(ConfigSource::File(path)), _) => {
            // A change of only a rate limit file re-applies the configuration, which reads it.
            let reloader = Reloader::new(path, text.into_bytes(), apply, metrics::record_reload, config_status)
                .also_watching(Box::new(move |text| config::named_files(text, &dir)));
            tokio::spawn(reloader.run(args.config_poll_interval, hangup));
        }
        (Some(ConfigSource::Etcd(key)), Some(etcd)) => {
            let applier = Applier::new(source.clone(), apply, metrics::record_reload, config_status);
            tokio::spawn(etcd_config::follow(etcd, key, text, applier, hangup));
        }
        _ => {
            tokio::spawn(Reloader::without_file(hangup));
        }
    }

    let (health, health_service) = tonic_health::server::health_reporter();
    // Both reflection versions: many tools (grpcurl among them) still ask v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_error = |e: tonic_reflection::server::Error| Failure::Runtime(format!("reflection service: {e}"));
    let reflection_v1 = reflection().build_v1().map_err(reflection_error)?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(reflection_error)?;
    let router = Server::builder()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .initial_stream_window_size(HTTP2_WINDOW)
        .initial_connection_window_size(HTTP2_WINDOW)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .layer(InFlight::new(args.max_request_bytes_in_flight))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            CapacityServer::new(CapacityService::new(state.clone(), args.max_resources))
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        );

    let max_connections = args.max_connections;
    let (stop, stopped) = oneshot::channel::<()>();
    let stopped = async {
        let _ = stopped.await;
    };
    let mut serve: Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>>>> = match tls {
        Some(config) => {
            let handshake = move |stream, peer| tls::handshake(config.load_full(), stream, peer);
            Box::pin(router.serve_with_incoming_shutdown(accept::incoming(grpc, max_connections, handshake), stopped))
        }
        None => {
            let plain = |stream, _| accept::speaking(stream);
            Box::pin(router.serve_with_incoming_shutdown(accept::incoming(grpc, max_connections, plain), stopped))
        }
    };
    // Told before `/readyz` turns 200, so that a probe that saw one agrees with the other.
    tell_health(&health, true).await;
    state.set_ready();
    tokio::spawn(follow_readiness(state.clone(), health));
    tracing::info!(grpc = %grpc_addr, admin = %admin_addr, config = %source, "sluice-server serving");
    let served = tokio::select! {
        served = &mut serve => served,
        signal = termination() => {
            tracing::info!(signal, "shutting down");
            state.set_draining();
            // First, so that a replica takes over while this one drains.
            if let Some(election) = election {
                election.resign().await;
            }
            let _ = stop.send(());
            tokio::time::timeout(SHUTDOWN_GRACE, &mut serve).await.unwrap_or(Ok(()))
        }
    };
    served.map_err(|e| Failure::Runtime(format!("gRPC server: {e}")))
}

/// A start stopped by etcd (`what`: the setting it was for): 64 as for a bad setting when etcd
/// refused this server, 1 when it could not be reached.
fn etcd_failure(what: &str, error: crate::etcd::Error) -> Failure {
    let why = format!("{what}: {error}");
    if error.unreachable { Failure::Runtime(why) } else { Failure::Usage(why) }
}

/// Keeps the gRPC health service's answer, overall and for `doorman.Capacity`, in step with
/// `/readyz`, so that gRPC and HTTP probes agree.
async fn follow_readiness(state: Arc<State>, health: HealthReporter) {
    let mut ticks = tokio::time::interval(HEALTH_CHECK_INTERVAL);
    let mut was = true;
    loop {
        ticks.tick().await;
        let ready = state.is_ready();
        if ready != was {
            was = ready;
            tell_health(&health, ready).await;
        }
    }
}

async fn tell_health(health: &HealthReporter, ready: bool) {
    let status = if ready { ServingStatus::Serving } else { ServingStatus::NotServing };
    for service in ["", <CapacityServer<CapacityService> as NamedService>::NAME] {
        health.set_service_status(service, status).await;
    }
}

/// Forgets expired leases in batches, releasing the lock between them.
async fn sweep(state: Arc<State>, handle: metrics_exporter_prometheus::PrometheusHandle) {
    let mut ticks = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        ticks.tick().await;
        let now = state::now();
        while state.ledger().expire(now, SWEEP_BATCH) == SWEEP_BATCH {
            tokio::task::yield_now().await;
        }
        handle.run_upkeep();
    }
}

/// Samples the busiest resources for the status pages' charts every `interval`.
async fn record_history(state: Arc<State>, history: Arc<Mutex<ResourceHistory>>, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let round = status::sample(&state.ledger(), state::now(), HISTORY_RESOURCES);
        let mut history = history.lock().unwrap_or_else(PoisonError::into_inner);
        history.record(state::precise_now(), round.iter().map(|(id, values)| (id.as_str(), *values)));
    }
}
