//! Every default and limit of the server, in one place.

use std::time::Duration;

use sluice_client::defaults::MAX_LEASE_SECONDS;
pub use sluice_client::defaults::{
    BACKOFF_BASE, BACKOFF_CAP, CAPACITY_CONNECT_TIMEOUT, CAPACITY_RPC_TIMEOUT, EXPIRY_MARGIN, MAX_AMOUNT, MAX_ID_BYTES,
    MAX_RESOURCES_PER_REQUEST,
};

/// gRPC listener for development; the container image sets 0.0.0.0.
pub const GRPC_ADDR: &str = "127.0.0.1:7777";

/// HTTP debug listener (/metrics, /healthz, /readyz, /debug/status).
pub const ADMIN_ADDR: &str = "127.0.0.1:7778";

/// How often the configuration file is checked for changes. Polling the content (not inotify)
/// also catches Kubernetes' ConfigMap symlink swaps.
pub const CONFIG_POLL_INTERVAL: &str = "2s";

/// The configuration used when no `--config` is given: one catch-all resource, enough to run the
/// demo and a single-pod setup.
pub const EMBEDDED_CONFIG: &str = include_str!("default_config.yaml");

/// The algorithm of the templates made from envoyproxy/ratelimit files when the configuration
/// gives none (`rate_limits.algorithm`): FAIR_SHARE with the embedded default's lease length and
/// refresh interval, in seconds; learning mode lasts a lease.
pub const RATE_LIMIT_LEASE_LENGTH: i64 = 10;
pub const RATE_LIMIT_REFRESH_INTERVAL: i64 = 2;

/// Most resources a server keeps at once (`--max-resources`): every resource costs memory and
/// five metric series, and clients choose resource ids freely.
pub const MAX_RESOURCES: usize = 100_000;

/// Most leases a server holds at once (`--max-leases`), counted in demands: an end client's
/// lease is one, a child server's one per priority band or profile group it claims. A request
/// that would add more gets RESOURCE_EXHAUSTED; leases already held renew as before. Sized from
/// the memory a lease costs (docs/server.md, Memory budget: the gRPC listener): 1,000,000 are
/// about 210 MB with short client ids, at most about 1.4 GB with ids of 1 KiB.
pub const MAX_LEASES: usize = 1_000_000;

/// Most clients one resource has leases for at once (`--max-clients-per-resource`): past it a
/// new client of the resource gets RESOURCE_EXHAUSTED while those holding leases renew, so that
/// no one resource's clients take all of `--max-leases`. Doorman's deployments count clients of
/// a resource in thousands.
pub const MAX_CLIENTS_PER_RESOURCE: usize = 100_000;

/// Most client ids one identity holds leases with at once, unless its policy says otherwise
/// (`max_client_ids`): a pod's sidecar uses one per listener, an intermediate server one. Bounds
/// what one pod takes of a fair share by opening many clients.
pub const MAX_CLIENT_IDS_PER_IDENTITY: usize = 100;

/// Most patterns in a policy's `client_ids` or `resources`.
pub const MAX_POLICY_PATTERNS: usize = 100;

/// Least time between two log lines about calls a policy refused: each is counted in
/// `sluice_server_policy_denials_total`, but a client retrying in a loop must not flood the log.
pub const DENIAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Bytes of resource ids a PERMISSION_DENIED names as outside the caller's policy (one id at
/// least): well within a client's header limits; a client learns any others on its next try.
pub const DENIED_NAMES_BYTES: usize = 4 << 10;

/// Longest identity taken from a client certificate; a longer one is no identity.
pub const MAX_IDENTITY_BYTES: usize = 1024;

/// Most priority bands one resource of a GetServerCapacity may claim: Doorman's servers send one
/// per priority among their clients, a handful. A Sluice server with more priorities among its
/// clients folds the least important into one band when it asks its parent.
pub const MAX_BANDS: usize = 16;

/// Demands a request files per hold of the ledger's lock: a request naming 10,000 resources (or
/// a child's bands and profile groups on them) is applied in parts, the lock let go between
/// them, so that it never holds up other clients' calls for long.
pub const DEMANDS_PER_LOCK: usize = 1_000;

/// Largest request the gRPC listener decodes: room for 10,000 resources with 1 KiB ids.
pub const MAX_REQUEST_BYTES: usize = 16 << 20;

/// Request bytes the gRPC listener handles at once, over every connection and call
/// (`--max-request-bytes-in-flight`): a call holds its share from its first byte until its
/// answer is sent, and one that finds no room is refused RESOURCE_EXHAUSTED at once, never
/// queued. Room for two of the largest requests. A request takes at most about 16 times the
/// bytes it counts while decoded, checked and answered, 2 to 4 times when it is large
/// (docs/server.md, Memory budget: the gRPC listener), so requests in flight cost at most about
/// 512 MB, about 130 MB when they are large.
pub const MAX_REQUEST_BYTES_IN_FLIGHT: usize = 2 * MAX_REQUEST_BYTES;

/// Bounds of `--max-request-bytes-in-flight`: room for a call's own cost and a small request at
/// least; at most what a semaphore counts, far beyond any machine's memory.
pub const MIN_REQUEST_BYTES_IN_FLIGHT: usize = 64 << 10;
pub const MAX_REQUEST_BYTES_IN_FLIGHT_LIMIT: usize = 1 << 40;

/// What every call counts against the bytes in flight besides its header and body: the state
/// a stream and its handler hold while the body arrives (tonic's 8 KiB decode buffer among
/// it; about 19 KB measured on the debug build), so that calls whose bodies never come are
/// bounded by the same budget.
pub const CALL_BYTES: usize = 24 << 10;

/// gRPC connections served at once (`--max-connections`); beyond it the listener stops
/// accepting until one closes, so the kernel's backlog pushes back on new clients. A server's
/// clients hold one connection each (a sidecar, a Doorman client, a child server's replica);
/// an idle connection costs about 17 KB and a busy one at most about 100 KB beside its calls.
pub const MAX_CONNECTIONS: usize = 10_000;

/// Most `--max-connections` may be.
pub const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;

/// HTTP/2 streams (calls) one gRPC connection may have open at once: RFC 9113's recommended
/// least. tonic sets no limit of its own; clients queue calls beyond it.
pub const MAX_CONCURRENT_STREAMS: u32 = 100;

/// HTTP/2 flow-control windows of a gRPC connection and each of its streams: request data a
/// client may send ahead of what the server has read. RFC 9113's initial window (hyper's 1 MiB
/// would let each connection park a megabyte unread); on loopback a 16 MiB request still
/// arrives in tens of milliseconds.
pub const HTTP2_WINDOW: u32 = 65_535;

/// Largest header list of a gRPC call (hyper's default, made explicit): gRPC metadata is small.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;

/// Longest lease length, refresh interval or learning period a template may set: the longest
/// a client takes from an answer.
pub const MAX_TEMPLATE_SECONDS: i64 = MAX_LEASE_SECONDS;

/// Expired leases a claim forgets before it is granted. The sweeper forgets the rest; until then
/// they only make grants smaller. Bounds the lock hold of a claim after a mass expiry.
pub const EXPIRY_PER_CLAIM: usize = 1_000;

/// Most clients a server may say one priority band aggregates: subclient counts are summed as
/// floating-point numbers, exact well beyond this.
pub const MAX_SUBCLIENTS: i64 = 1_000_000_000;

/// Most client groups in one band's wants profile (`PriorityBandAggregate.profile`), sent or
/// accepted: a band of up to this many clients is described exactly, a larger one in this many
/// groups of clients that want about as much each. Each group is one demand at the parent, so
/// this bounds what one child adds to a grant's cost (a few hundred bytes, 32 tree insertions).
pub const MAX_PROFILE_GROUPS: usize = 32;

/// How often expired leases are swept (they never count once expired; sweeping frees memory
/// and keeps the gauges current).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Leases forgotten per hold of the ledger lock while sweeping, so that requests never wait
/// behind a mass expiry.
pub const SWEEP_BATCH: usize = 20_000;

/// Per-resource gauges of a resource that has gone away disappear from /metrics after this.
pub const GAUGE_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Bucket bounds of `sluice_server_request_duration_seconds`, from 25 µs to 2.5 s.
pub const DURATION_BUCKETS: &[f64] = &[
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Leases listed on a resource's debug page; the page says how many more there are.
pub const STATUS_LEASES_SHOWN: usize = 1_000;

/// Resources with a history: the busiest (largest Σ wants) at each sample. A server may hold
/// `--max-resources` (100,000 by default); the others are not charted, and a resource that
/// drops out of the busiest loses its history. About 4 KB each, so 200 KB in all.
pub const HISTORY_RESOURCES: usize = 50;

/// Time a client has to finish its TLS handshake on the gRPC listener (Linkerd's default): a
/// connection that stops half-way does not hold a socket for ever.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a cleartext client has to send its first byte: a connection that never speaks does not
/// hold one of the listener's `--max-connections` places for ever (the TLS handshake's bound).
pub const FIRST_BYTE_TIMEOUT: Duration = TLS_HANDSHAKE_TIMEOUT;

/// After a failed accept on the gRPC listener (out of file descriptors, say), the pause before
/// the next, so that the loop does not spin; a warning is logged at most once per
/// [`ACCEPT_WARNING_INTERVAL`].
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
pub const ACCEPT_WARNING_INTERVAL: Duration = Duration::from_secs(1);

/// How often the gRPC health service's answer is brought in line with readiness.
pub const HEALTH_CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// Time allowed for in-flight RPCs after SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Each level further from the root hands out this fraction of the refresh interval it got
/// from its parent (Doorman's decay factor: Doorman counts levels from the root, so its
/// "halves with every level up the tree" means towards the clients), so a server's wants are
/// fresh when it asks its parent.
pub const REFRESH_DECAY: f64 = 0.5;

/// Shortest refresh interval a server hands out, in seconds: the protocol's unit.
pub const MIN_REFRESH_INTERVAL: i64 = 1;

/// A grant more than this fraction away from its share (waiting for others to give capacity
/// back, or above what the claimant's clients still hold) is in transit: the claimant is asked
/// back at [`MIN_REFRESH_INTERVAL`]. Small, because a region's few percent of a large lease is
/// many clients' worth: over seeds 1–25 of the simulator's scenario 7, 0.5% instead of 2% took
/// the lowest utilization from 97.9% to 98.0% (scenario 5: 99.0% to 99.1%) for 4% more RPCs.
pub const TRANSIT_SHARE: f64 = 0.005;

/// A child server's lease that ran out without a release stays reserved as its subtree's
/// safe capacity for this many lease lengths more (see `LeaseStore::expire`): long enough to
/// cover an outage and the backoff after it; a server gone for good gives its share back then.
pub const LAPSED_LEASE_LENGTHS: i64 = 3;

/// A child server back from a lapse keeps at least what its lapsed lease reserved for this many
/// seconds after its first request: its clients cut off with it come back one by one, each
/// within its retry backoff ([`BACKOFF_CAP`] at most), and until they all have, what it reports
/// holding counts only those that asked it again while the others still live on their safe
/// capacity. Over seeds 1–50 of the simulator's scenario 7, 20 s left no run above 102% of the
/// capacity in either sharing mode (10 s: two, up to 107%; 30 s: none, with 0.1 point less
/// utilization passing up profiles).
pub const RETURN_GRACE: i64 = 2 * BACKOFF_CAP as i64;

/// An intermediate server asks its parent before its refresh interval is up once its clients'
/// Σ wants, or what it holds, has moved by this fraction of its lease since it last asked —
/// but no sooner than its own clients refresh. Shifts travel up the tree at the speed of the
/// lowest level instead of waiting for each level's longer interval.
pub const REPORT_CHANGE: f64 = 0.01;

/// Longest an intermediate server waits between looks at its schedule, so that a request
/// brought forward (a new resource) never waits long for a missed wake-up.
pub const PARENT_CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// Election key (an etcd key prefix) replicas campaign on with `--etcd-endpoints`. Replicas of
/// one capacity server share it; separate deployments on one etcd need keys of their own.
pub const ELECTION_KEY: &str = "/sluice/election/default";

/// TTL of the etcd lease behind a campaign, in seconds. When a master dies, a replica takes over
/// within about this long; a master that cannot renew its lease steps down within it. Shorter
/// means faster failover but more keep-alive traffic and more step-downs on etcd hiccups.
pub const ETCD_LEASE_TTL: i64 = 10;

/// Bound on each etcd request that should answer at once (lease grant and revoke, resign): an
/// unreachable etcd must not stall the election task or shutdown.
pub const ETCD_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How often an idle etcd connection is pinged (HTTP/2 PING, answered within
/// `ETCD_REQUEST_TIMEOUT`): a configuration watch, which otherwise only waits, notices a
/// connection that died silently and connects anew.
pub const ETCD_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// First wait before trying etcd again after a configuration watch broke; it doubles on each
/// failure up to `CONFIG_WATCH_RETRY_MAX`.
pub const CONFIG_WATCH_RETRY_MIN: Duration = Duration::from_millis(200);

/// Longest wait between attempts to watch the configuration's etcd key again: a change made
/// while etcd was unreachable is applied at most about this long after etcd is back.
pub const CONFIG_WATCH_RETRY_MAX: Duration = Duration::from_secs(2);

/// First wait before trying etcd again after losing the election session; it doubles on each
/// failure up to `ELECTION_RETRY_MAX`.
pub const ELECTION_RETRY_MIN: Duration = Duration::from_millis(200);

/// Longest wait between attempts to reach etcd: short enough that a master is back soon after
/// etcd is, long enough that replicas do not hammer a struggling etcd.
pub const ELECTION_RETRY_MAX: Duration = Duration::from_secs(3);

/// Adaptive capacity (docs/server.md, Adaptive capacity): the controller's settings when a
/// template leaves them out. How far the mean latency may rise above the unloaded latency before
/// the service counts as overloaded: 50% lets a busy service run near its capacity while a
/// growing queue shows within a decision or two.
pub const ADAPTIVE_TOLERANCE: f64 = 0.5;
/// The share of overload errors (HTTP 5xx, gRPC UNAVAILABLE or RESOURCE_EXHAUSTED, timeouts) past
/// which the service counts as overloaded, whatever the latency.
pub const ADAPTIVE_ERROR_SHARE: f64 = 0.05;
/// The share of the measured ceiling left unused, so that the queue in front of the service stays
/// short: the goodput given up for latency.
pub const ADAPTIVE_HEADROOM: f64 = 0.05;
/// The first step of growth past the known ceiling, doubled each decision that finds no overload
/// (capped at doubling the capacity): a service that got its capacity back is found again in
/// three or four decisions, one that did not costs one decision of overload.
pub const ADAPTIVE_GROWTH: f64 = 0.25;
/// The seconds in which a queue found in front of the service should drain: each decision that
/// finds one cuts that queue's share of it below the goodput.
pub const ADAPTIVE_DRAIN: f64 = 2.0;
/// Seconds between two decisions: the least refresh interval, so that every client's signals
/// reach about every decision.
pub const ADAPTIVE_INTERVAL: i64 = MIN_REFRESH_INTERVAL;
/// Seconds a client's latest signals count for the fleet's rates: past it, a client that stopped
/// reporting (gone, or no longer calling) counts for nothing. Clients of an adaptive resource
/// report every second or two.
pub const ADAPTIVE_REPORT_HORIZON: i64 = 3;
/// Decisions just below the measured ceiling without an overload before the capacity is
/// probed past it.
pub const ADAPTIVE_HOLD_DECISIONS: u32 = 3;
/// Most doublings of that hold after probes that found no more room: 3 × 2³ = 24 decisions
/// between probes of a service that stays at its capacity.
pub const ADAPTIVE_PROBE_BACKOFFS: u32 = 3;
/// Fewest answers a decision is made on: fewer are added to the next interval's.
pub const ADAPTIVE_MIN_SAMPLES: f64 = 20.0;
/// Decisions whose intervals' mean latencies the unloaded latency is the lowest of: a minute at
/// the default interval, so that a service that got faster is believed within a minute.
pub const ADAPTIVE_BASELINE_DECISIONS: usize = 60;
/// Decisions in a row in which no call was answered as fast as the unloaded latency allows before
/// that latency is measured again: a standing queue, or a service that got slower for good.
pub const ADAPTIVE_STALE_DECISIONS: u32 = 10;
/// The share of the capacity the whole fleet keeps for one decision while the unloaded latency is
/// measured again: enough for the queue to empty once, so that the fastest answer shows it.
pub const ADAPTIVE_PROBE_SHARE: f64 = 0.5;
/// Decisions of each adaptive resource the status page keeps.
pub const ADAPTIVE_HISTORY: usize = 120;
/// Longest latency and span a client's signals may report, in seconds: anything longer is a
/// broken clock or a hostile client.
pub const MAX_SIGNAL_SECONDS: f64 = 3600.0;
