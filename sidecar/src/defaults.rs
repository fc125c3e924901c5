//! Every default and limit of the sidecar, in one place.

use std::time::Duration;

/// Admin listener (/metrics, /live, /ready, /debug/status): loopback only unless configured.
pub const ADMIN_ADDR: &str = "127.0.0.1:9901";

/// The injection webhook's HTTPS listener (`sluice-sidecar webhook`); the chart sets 0.0.0.0.
pub const WEBHOOK_ADDR: &str = "127.0.0.1:8443";

/// How often the configuration file is checked for changes (content, not mtime, so Kubernetes'
/// ConfigMap symlink swaps are seen).
pub const CONFIG_POLL_INTERVAL: &str = "2s";

/// A sidecar is sized for a fraction of a core; one worker thread serves tens of thousands of
/// requests per second. Raise with `--worker-threads` for heavier pods.
pub const WORKER_THREADS: u16 = 1;

/// How long SIGTERM waits for in-flight requests before closing connections and releasing leases.
pub const SHUTDOWN_GRACE: &str = "10s";

/// The configuration used without `--config`: standalone, one listener in front of a local app.
pub const EMBEDDED_CONFIG: &str = include_str!("default_config.yaml");

/// Resources charted, in the configuration's order; those beyond are not. About 5 KB each.
pub const HISTORY_RESOURCES: usize = 100;

/// How often recorded histogram samples are folded into their buckets. Until then each request's
/// samples are kept one by one, so memory grew with traffic between scrapes.
pub const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(1);

/// A resource's gauges not set for this long are dropped from `/metrics`: a scrape sets those of
/// every configured resource first, so only the series of resources a reload removed go.
pub const STALE_GAUGE_TIMEOUT: Duration = Duration::from_secs(10);

/// A keyed resource's `max_keys` unless it sets one: most keys of values held at once.
pub const MAX_KEYS: usize = 1_000;

/// The most `max_keys` of a keyed resource with `metrics: per_key`: each live key is
/// [`SERIES_PER_KEY`] series, about 2.5 KB of `/metrics` and 0.7 KB of memory (docs/sidecar.md,
/// Memory budget), so that a scrape stays a few megabytes.
pub const MAX_KEYS_WITH_SERIES: usize = 1_000;

/// The series of a key with series of its own: 4 decisions, admitted cost, the wait
/// histogram's buckets, sum and count, and 11 gauges (capacity, wants, expiry, refresh
/// interval, fallback duration, 6 modes).
pub const SERIES_PER_KEY: usize = 4 + 1 + DURATION_BUCKETS.len() + 3 + 11;

/// A keyed resource's `idle_timeout` unless it sets one: a key unused this long (and with
/// nothing in flight or queued) is dropped and its lease released, so memory and the servers'
/// resources follow the live keys. Several lease lengths, so that a client pausing between
/// bursts keeps its key, its lease and its debt; a few minutes, so that keys churned through
/// once go soon.
pub const KEY_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// How often idle keys are looked for; a key's last use is known to this precision.
pub const KEY_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Room a keyed resource's id must leave for a key in its ids (of at most
/// `sluice_client::defaults::MAX_ID_BYTES`): a value whose key is longer than what is left is
/// refused (400).
pub const MIN_KEY_BYTES: usize = 64;

/// Keys listed per keyed resource on `/debug/status`: the busiest by recent demand.
pub const STATUS_BUSIEST_KEYS: usize = 10;

/// Characters of the capacity servers' last error kept for `/debug/status`.
pub const STATUS_ERROR_CHARS: usize = 300;

/// Time allowed for a client to send a request's headers (slowloris protection).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A downstream connection with no request in flight for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A response (HTTP/1.1), or an HTTP/2 stream's, that the application takes no byte of for this
/// long is cut off, and the concurrency permits it holds go (nginx's `send_timeout`): an
/// application that stops reading must not hold a resource for everybody.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest request head accepted (HTTP/1.1 buffer and HTTP/2 header list): room for large
/// cookies and tokens (Node.js allows 16 KiB, nginx 4 lines of 8 KiB), and a bound on what each
/// connection and request in flight holds (docs/sidecar.md, Memory budget).
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Downstream connections served at once per listener; beyond it the listener stops accepting
/// until one closes, so the kernel's backlog pushes back on the application. A pod's
/// application needs tens to hundreds; each costs up to about 100 KiB (Memory budget).
pub const MAX_CONNECTIONS: usize = 1_000;

/// Requests in flight at once per listener, over every connection and HTTP/2 stream; the next
/// is refused at once (503, gRPC UNAVAILABLE) as Linkerd sheds load past its in-flight bound.
/// Each costs up to about 150 KiB (Memory budget): 500 is 5,000 requests a second of 100 ms.
pub const MAX_REQUESTS: usize = 500;

/// The most a listener's `max_requests` may be.
pub const MAX_REQUESTS_LIMIT: usize = 1_000_000;

/// An upstream's response body that sends nothing for this long is cut off (Envoy's
/// `stream_idle_timeout`): long enough for a quiet stream, short enough that a stalled
/// upstream does not hold a connection and its permits for ever.
pub const UPSTREAM_BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// `on_limit: reject` unless a rule says otherwise: a limiter that silently delays surprises
/// callers with their own timeouts.
pub const MAX_WAIT: Duration = Duration::ZERO;

/// Token bucket depth when a resource sets no `burst`: this many seconds of the leased rate, and
/// at least 2 cost units (with less, tokens that accrue between arrivals overflow and are lost).
pub const BURST_SECONDS: f64 = 0.1;

/// Retry-After for a rejection whose wait cannot be predicted (a concurrency limit, or no
/// capacity at all).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest Retry-After given: at a sliver of a rate the next token may be years away, but a
/// larger lease may come long before.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The longest duration a setting may name (timeouts, `max_wait`): a limit past a day protects
/// nothing, and a bounded one keeps every deadline far from the clock's range.
pub const MAX_SETTING_DURATION: Duration = Duration::from_secs(24 * 3600);

/// The most a listener's `max_connections` may be: far above what one process's file
/// descriptors allow.
pub const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;

/// The most a listener's `max_header_bytes` may be: a head is held whole while it is read, on
/// each of up to `max_connections` connections.
pub const MAX_HEADER_BYTES_LIMIT: usize = 1 << 20;

/// How often leases are re-applied to the limiters between refreshes, so an expiry switches a
/// resource to its fallback promptly.
pub const LEASE_CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// Seconds from a resource's first use (or its first after it was idle) to its first request
/// to the capacity servers, while its fallback admits requests: long enough to see the rate they
/// come at (20 requests at 80 a second), short enough that a fallback below it refuses little.
/// Without it the first lease asked for one arrival's worth, and refused the rest for a second.
pub const FIRST_ASK_AFTER: f64 = 0.25;

/// Seconds a resource the server's policy refused lets nothing pass and is left out of
/// requests, before it is asked for again (the policy may have changed by then: a reload).
pub const DENIED_RETRY: f64 = 30.0;

/// A resource whose wants moved by more than this fraction since they were last reported is
/// asked for again before the refresh interval is up...
pub const DEMAND_CHANGE: f64 = 0.1;

/// ...but no sooner than this fraction of the refresh interval after the last answer (and at
/// least a second): a surge gets capacity within a fraction of the interval, and demand that
/// swings at every check does not multiply the load on the servers by more than this.
pub const EARLY_REFRESH: f64 = 0.25;

/// Demand that has grown past what was last asked for by more than this fraction, and by more
/// than [`SURGE_FLOOR`] times it in cost units, is a surge, as after a lull that let the lease
/// dwindle: a larger lease is on its way (see [`DEMAND_CHANGE`]), so a request in delay mode
/// waits for it rather than being refused by the lease in force.
pub const SURGE: f64 = 1.0;

/// A low rate's estimate jumps by a unit or two with a couple of close arrivals: below this
/// many cost units a surge is measured against this. (With 1, steady Poisson arrivals at
/// 0.3–2/s passed for surges in 12–34% of the requests not admitted at once; with 3, in at most
/// a few percent.)
pub const SURGE_FLOOR: f64 = 3.0;

/// Bucket bounds of the sidecar's latency histograms (waits and upstream requests), from
/// 100 µs to 30 s.
pub const DURATION_BUCKETS: &[f64] =
    &[0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Largest AdmissionReview the webhook reads: the API server sends objects of up to about
/// 1.5 MiB (etcd's limit), wrapped with the request's details. A larger body is refused (413)
/// unread when its length is declared, else once it passes this.
pub const MAX_REVIEW_BYTES: usize = 4 << 20;

/// Time a connection to the webhook has to finish its TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A failed accept on the webhook's listener (out of file descriptors, typically) pauses it
/// this long instead of spinning.
pub const WEBHOOK_ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Connections the webhook holds at once, handshakes included; beyond it it stops accepting
/// until one closes. The API servers keep one or a few each, the kubelet's probes one at a time.
/// Each holds at most about 330 KiB (docs/kubernetes.md, "Memory budget: the webhook").
pub const WEBHOOK_MAX_CONNECTIONS: usize = 64;

/// AdmissionReviews read or answered at once, each holding its body (up to
/// [`MAX_REVIEW_BYTES`]); the others wait for a slot before a byte of their body is read.
/// Answering takes milliseconds, so a few slots serve hundreds of pods a second.
pub const WEBHOOK_MAX_REVIEWS: usize = 4;

/// Requests one HTTP/2 connection may have open at once; the API server's client opens another
/// connection past it.
pub const WEBHOOK_MAX_STREAMS: u32 = 4;

/// Largest request head (HTTP/1.1 read buffer, HTTP/2 header list; hyper allows no less for
/// HTTP/1.1): the API server's heads take a few hundred bytes.
pub const WEBHOOK_MAX_HEADER_BYTES: usize = 8 << 10;

/// HTTP/2 flow-control window of each stream (the protocol's default): what a client may send
/// ahead of what the webhook has read. A connection's is this times [`WEBHOOK_MAX_STREAMS`], so
/// that streams waiting for a review slot, unread, do not stall the one being read.
pub const WEBHOOK_HTTP2_WINDOW: u32 = 65_535;

/// A connection with no request being answered for this long is closed: one silent after its
/// handshake, one sending a head too slowly (a head counts once complete), one idle between
/// requests, one not reading its answer. The API server opens a new one when it needs it.
pub const WEBHOOK_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Time an AdmissionReview has, from its head, to get a slot and arrive whole (408 after);
/// the API server itself gives up after the webhook's `timeoutSeconds` (at most 30).
pub const WEBHOOK_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// `sluice-sidecar wait` (a classic sidecar's `postStart` hook): how long it waits at most for the
/// sidecar to be ready before the application starts all the same, and how often it asks.
pub const HOLD_TIMEOUT: &str = "60s";
pub const HOLD_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// How long the webhook waits for the API server's `/version` (`--native auto`); past it, the
/// version is unknown and pods get the classic sidecar.
pub const KUBE_API_TIMEOUT: Duration = Duration::from_secs(5);

/// The most of a `/version` answer the webhook reads (a real one is about 300 bytes).
pub const MAX_VERSION_BYTES: usize = 16 << 10;

/// How often the webhook asks the API server's version again: a cluster is upgraded in place.
pub const VERSION_REFRESH: Duration = Duration::from_secs(300);

/// Longest `request.uid` answered: Kubernetes sends a UUID (36 bytes), and the answer echoes it,
/// so it bounds what an answer costs until it is read.
pub const MAX_REVIEW_UID_BYTES: usize = 128;

/// Characters of a review's strings (the pod's name, its kind) that the webhook's log shows: a
/// Kubernetes name's most.
pub const REVIEW_SHOWN_CHARS: usize = 253;

/// Deepest nesting of YAML flow collections (`[...]`, `{...}`) that `inject` hands to the YAML
/// parser, whose time per token grows with that depth (a 500 KB `{a: {a: ...}}` took minutes);
/// the parser refuses documents nested deeper than this anyway.
pub const MAX_FLOW_DEPTH: usize = 128;

/// Trust domain of the injected sidecars' SPIFFE ids (`--identity-trust-domain`): Kubernetes'
/// default cluster domain, as Istio's.
pub const IDENTITY_TRUST_DOMAIN: &str = "cluster.local";

/// Kind of the issuer of the injected sidecars' certificates (`--identity-issuer-kind`): a
/// ClusterIssuer, since cert-manager's CSI driver asks for a pod's certificate in the pod's own
/// namespace, where an Issuer of the release's namespace is not seen.
pub const IDENTITY_ISSUER_KIND: &str = "ClusterIssuer";

/// Descriptors one rate limit service call may carry: Envoy sends one per `rate_limits` action
/// list that applies to a request, a handful in practice.
pub const RLS_MAX_DESCRIPTORS: usize = 64;

/// A rate limit service call's bytes at most: 64 descriptors of a few hundred bytes each fit.
pub const RLS_MAX_REQUEST_BYTES: usize = 64 * 1024;

/// How long a rate limit service call may take before it is cut off: no call waits (each is
/// answered from the leases at hand), so only a stalled peer reaches it. Envoy's own timeout
/// for the call is 20 ms by default.
pub const RLS_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Streams one rate limit service connection may have open at once.
pub const RLS_MAX_STREAMS: u32 = 1024;

/// RLQS: how long an assignment pushed to Envoy lasts (`assignment_time_to_live`; Envoy 1.40
/// takes it in whole seconds and expires an unset or sub-second one at once). Three re-pushes
/// fit in it, so a stream that stalls twice keeps its assignments; a sidecar gone for longer
/// leaves Envoy to its `expired_assignment_behavior`.
pub const RLQS_ASSIGNMENT_TTL: Duration = Duration::from_secs(15);

/// RLQS: an assignment that did not change is pushed again this long after its last push, so
/// that it never runs out while the stream lasts (the same token bucket again keeps Envoy's
/// tokens).
pub const RLQS_REPUSH_AFTER: Duration = Duration::from_secs(5);

/// RLQS: how often a stream spreads the load its reports told of onto the gates.
pub const RLQS_TICK: Duration = Duration::from_millis(100);

/// RLQS: how often a stream looks whether an assignment moved: a lease that changed reaches
/// Envoy within this.
pub const RLQS_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// RLQS: buckets one stream may report (the `max_keys` of a keyed resource, per Envoy).
pub const RLQS_MAX_BUCKETS: usize = 1_000;

/// RLQS: a bucket not reported for this long is forgotten: charged nothing more, no longer
/// pushed (Envoy 1.40 reports every bucket it holds every 5 s).
pub const RLQS_STALE_AFTER: Duration = Duration::from_secs(15);

/// RLQS: a usage report's bytes at most: 1,000 buckets of a few hundred bytes each fit.
pub const RLQS_MAX_REPORT_BYTES: usize = 1024 * 1024;

/// RLQS: the longest `fill_interval` of a token bucket pushed (a rate under one request an
/// hour gets one token an hour).
pub const RLQS_MAX_FILL_SECONDS: u64 = 3_600;
