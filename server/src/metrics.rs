//! The server's Prometheus metrics (SPEC §3.9): names, help texts, and where they are recorded.
//! Per-resource gauges are set from the ledger when /metrics is scraped, so the request path
//! pays only for the request counter and histogram.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use tonic::Code;

use crate::{
    core::Denial,
    defaults::{DURATION_BUCKETS, GAUGE_IDLE_TIMEOUT},
    status::{AdaptiveStatus, ServerStatus},
};

const REQUESTS: &str = "sluice_server_requests_total";
const DURATION: &str = "sluice_server_request_duration_seconds";
const CAPACITY: &str = "sluice_server_capacity";
const HAS: &str = "sluice_server_has";
const WANTS: &str = "sluice_server_wants";
const CLIENTS: &str = "sluice_server_clients";
const LEARNING: &str = "sluice_server_learning_mode";
const IS_MASTER: &str = "sluice_server_is_master";
const RELOADS: &str = "sluice_server_config_reloads_total";
const PARENT_LEASE: &str = "sluice_server_parent_lease_capacity";
const BAND_WANTS: &str = "sluice_server_band_wants";
const BAND_HAS: &str = "sluice_server_band_has";
const PARENT_RPCS: &str = "sluice_server_parent_rpcs_total";
const ELECTIONS: &str = "sluice_server_elections_total";
const INFO: &str = "sluice_server_info";
const RELOAD_OK: &str = "sluice_server_config_last_reload_successful";
const PARENT_EXPIRY: &str = "sluice_server_parent_lease_expiry_timestamp_seconds";
const LEASES: &str = "sluice_server_leases";
const LEASE_LIMIT: &str = "sluice_server_lease_limit";
const SHED: &str = "sluice_server_requests_shed_total";
const CONNECTIONS: &str = "sluice_server_grpc_connections";
const DENIALS: &str = "sluice_server_policy_denials_total";
const BOUNDS: &str = "sluice_server_bound_refusals_total";
const ADAPTIVE_MIN: &str = "sluice_server_adaptive_min_capacity";
const ADAPTIVE_MAX: &str = "sluice_server_adaptive_max_capacity";
const ADAPTIVE_DECISIONS: &str = "sluice_server_adaptive_decisions_total";
const ADAPTIVE_GOODPUT: &str = "sluice_server_adaptive_goodput";
const ADAPTIVE_ERRORS: &str = "sluice_server_adaptive_errors";
const ADAPTIVE_LATENCY: &str = "sluice_server_adaptive_latency_seconds";
const ADAPTIVE_BASELINE: &str = "sluice_server_adaptive_unloaded_latency_seconds";

/// The `doorman.Capacity` methods a policy may refuse, as the `method` label names them.
pub const GET_CAPACITY: &str = "GetCapacity";
pub const GET_SERVER_CAPACITY: &str = "GetServerCapacity";
pub const RELEASE_CAPACITY: &str = "ReleaseCapacity";

/// Open gRPC connections, kept here and published when scraped: a gauge left unchanged would
/// go stale and disappear.
static OPEN_CONNECTIONS: AtomicUsize = AtomicUsize::new(0);

/// Installs the process-wide recorder.
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(DURATION.into()), DURATION_BUCKETS)
        .and_then(|b| b.idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE_TIMEOUT)).install_recorder())
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    describe_counter!(REQUESTS, "gRPC requests handled, by method and status code.");
    describe_histogram!(DURATION, Unit::Seconds, "Time to handle a gRPC request, by method.");
    describe_gauge!(
        CAPACITY,
        "Capacity a resource shares: the configured one at a root, the parent's lease at an intermediate server."
    );
    describe_gauge!(HAS, "Sum of the capacity granted on a resource's unexpired leases.");
    describe_gauge!(WANTS, "Sum of the capacity wanted by a resource's lease holders.");
    describe_gauge!(CLIENTS, "Clients holding a lease on a resource.");
    describe_gauge!(LEARNING, "1 while a resource is in learning mode.");
    describe_gauge!(IS_MASTER, "1 when this server is the master.");
    describe_counter!(RELOADS, "Configuration reloads, by result (success or failure).");
    // Shown from the start, so that an alert on failures has a series before the first reload.
    for result in ["success", "failure"] {
        counter!(RELOADS, "result" => result).absolute(0);
    }
    describe_gauge!(
        PARENT_LEASE,
        "Capacity an intermediate server holds on a resource from its parent (valid leases only)."
    );
    describe_gauge!(BAND_WANTS, "Capacity wanted on a resource, by priority band.");
    describe_gauge!(BAND_HAS, "Capacity granted on a resource, by priority band.");
    describe_counter!(PARENT_RPCS, "RPCs to the parent node, by method and result (ok or error).");
    describe_counter!(ELECTIONS, "etcd elections this server won, and masterships it lost (not counting resigning).");
    // From zero, so that `increase` counts the first election too.
    for result in ["won", "lost"] {
        counter!(ELECTIONS, "result" => result).absolute(0);
    }
    describe_gauge!(
        INFO,
        "Always 1: how the master is chosen (election: embedded or etcd) and the etcd election key, which names the tier of replicas."
    );
    describe_gauge!(RELOAD_OK, "0 while the last change of the configuration file was rejected, else 1.");
    describe_gauge!(
        PARENT_EXPIRY,
        "Unix time an intermediate server's lease on a resource from its parent expires (0: no valid lease)."
    );
    describe_gauge!(
        LEASES,
        "Leases the server holds, a child server's counted once per priority band or profile group it claims."
    );
    describe_gauge!(
        LEASE_LIMIT,
        "Most leases the server holds (--max-leases); new ones beyond get RESOURCE_EXHAUSTED."
    );
    describe_counter!(
        SHED,
        "gRPC calls refused RESOURCE_EXHAUSTED at once because the request bytes in flight were at --max-request-bytes-in-flight."
    );
    counter!(SHED).absolute(0);
    describe_gauge!(ADAPTIVE_MIN, "An adaptive resource's least capacity (its template's adaptive.min).");
    describe_gauge!(ADAPTIVE_MAX, "An adaptive resource's most capacity (its template's adaptive.max).");
    describe_counter!(ADAPTIVE_DECISIONS, "An adaptive resource's controller decisions, by reason.");
    describe_gauge!(ADAPTIVE_GOODPUT, "Answers per second that were not errors, as the last decision measured them.");
    describe_gauge!(ADAPTIVE_ERRORS, "Overload errors per second, as the last decision measured them.");
    describe_gauge!(
        ADAPTIVE_LATENCY,
        Unit::Seconds,
        "Mean latency of the answers that were not errors, as the last decision measured it."
    );
    describe_gauge!(ADAPTIVE_BASELINE, Unit::Seconds, "The unloaded latency the last decision judged by.");
    describe_gauge!(CONNECTIONS, "Open gRPC connections; at --max-connections the listener accepts no more.");
    describe_counter!(
        DENIALS,
        "gRPC calls refused PERMISSION_DENIED by the configuration's policies, by method and reason."
    );
    describe_counter!(
        BOUNDS,
        "gRPC calls refused RESOURCE_EXHAUSTED because they would pass a bound (resources, leases, clients_per_resource, client_ids_per_identity)."
    );
    // From zero, so that alerts on `increase` see the first refusal or denial.
    for bound in ["resources", "leases", "clients_per_resource", "client_ids_per_identity"] {
        counter!(BOUNDS, "bound" => bound).absolute(0);
    }
    for method in [GET_CAPACITY, GET_SERVER_CAPACITY, RELEASE_CAPACITY] {
        for reason in Denial::REASONS {
            counter!(DENIALS, "method" => method, "reason" => *reason).absolute(0);
        }
    }
    Ok(handle)
}

pub fn record_request(method: &'static str, code: Code, elapsed: Duration) {
    counter!(REQUESTS, "method" => method, "code" => code_name(code)).increment(1);
    histogram!(DURATION, "method" => method).record(elapsed.as_secs_f64());
}

/// Counts a call refused for want of room in the request bytes in flight.
pub fn record_refused_in_flight() {
    counter!(SHED).increment(1);
}

/// Counts a call a policy refused.
pub fn record_denial(method: &'static str, reason: &'static str) {
    counter!(DENIALS, "method" => method, "reason" => reason).increment(1);
}

/// Counts a call refused at one of the server's bounds.
pub fn record_bound(bound: &'static str) {
    counter!(BOUNDS, "bound" => bound).increment(1);
}

/// A gRPC connection opened (`true`) or closed.
pub fn record_connection(opened: bool) {
    if opened {
        OPEN_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
    } else {
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::Relaxed);
    }
}

pub fn record_parent_rpc(method: &'static str, ok: bool) {
    counter!(PARENT_RPCS, "method" => method, "result" => if ok { "ok" } else { "error" }).increment(1);
}

pub fn record_reload(ok: bool) {
    counter!(RELOADS, "result" => if ok { "success" } else { "failure" }).increment(1);
}

/// Counts a won election, or a mastership lost with the etcd session.
pub fn record_election(won: bool) {
    counter!(ELECTIONS, "result" => if won { "won" } else { "lost" }).increment(1);
}

/// Sets the gauges from a status snapshot, just before they are rendered.
pub fn publish(status: &ServerStatus) {
    gauge!(IS_MASTER).set(f64::from(u8::from(status.is_master)));
    let key = status.election.key.clone().unwrap_or_default();
    gauge!(INFO, "election" => status.election.mode, "election_key" => key).set(1.0);
    gauge!(RELOAD_OK).set(f64::from(u8::from(status.config.rejected.is_none())));
    gauge!(LEASES).set(status.leases as f64);
    gauge!(LEASE_LIMIT).set(status.max_leases as f64);
    gauge!(CONNECTIONS).set(OPEN_CONNECTIONS.load(Ordering::Relaxed) as f64);
    let intermediate = status.parent.is_some();
    for r in &status.resources {
        let id = r.id.clone();
        // Without a lease from its parent, an intermediate server shares nothing but safe
        // capacity.
        gauge!(CAPACITY, "resource" => id.clone()).set(r.capacity.unwrap_or(0.0));
        if let Some(lease) = &r.parent_lease {
            gauge!(PARENT_LEASE, "resource" => id.clone()).set(lease.capacity);
        }
        // Set with or without a lease: the lease gauge of a lapsed lease lingers until it
        // goes stale, this one says at once that there is none.
        if intermediate {
            let expiry = r.parent_lease.as_ref().map_or(0.0, |lease| lease.expiry_time as f64);
            gauge!(PARENT_EXPIRY, "resource" => id.clone()).set(expiry);
        }
        for band in &r.bands {
            let priority = band.priority.to_string();
            gauge!(BAND_WANTS, "resource" => id.clone(), "priority" => priority.clone()).set(band.wants);
            gauge!(BAND_HAS, "resource" => id.clone(), "priority" => priority).set(band.has);
        }
        gauge!(HAS, "resource" => id.clone()).set(r.has);
        gauge!(WANTS, "resource" => id.clone()).set(r.wants);
        gauge!(CLIENTS, "resource" => id.clone()).set(r.clients as f64);
        gauge!(LEARNING, "resource" => id.clone()).set(f64::from(u8::from(r.learning)));
        if let Some(a) = &r.adaptive {
            publish_adaptive(id, a);
        }
    }
}

fn publish_adaptive(id: String, a: &AdaptiveStatus) {
    gauge!(ADAPTIVE_MIN, "resource" => id.clone()).set(a.min);
    gauge!(ADAPTIVE_MAX, "resource" => id.clone()).set(a.max);
    for &(reason, n) in &a.decisions {
        counter!(ADAPTIVE_DECISIONS, "resource" => id.clone(), "reason" => reason).absolute(n);
    }
    if let Some(d) = a.history.last() {
        let inputs = [
            (ADAPTIVE_GOODPUT, d.goodput),
            (ADAPTIVE_ERRORS, d.errors),
            (ADAPTIVE_LATENCY, d.latency),
            (ADAPTIVE_BASELINE, d.baseline),
        ];
        for (name, value) in inputs {
            if let Some(value) = value {
                gauge!(name, "resource" => id.clone()).set(value);
            }
        }
    }
}

/// The canonical gRPC name of a status code, as in the gRPC spec.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}
