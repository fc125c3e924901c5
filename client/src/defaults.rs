//! Every default and limit of the Doorman client half, in one place: the protocol's bounds on
//! what a request may state, and how callers retry.

use std::time::Duration;

/// Largest wants or has one request may state: far above any rate or concurrency, yet low
/// enough that sums over any number of leases stay finite.
pub const MAX_AMOUNT: f64 = 1e15;

/// Longest client, server or resource id, in bytes: ids are stored per lease.
pub const MAX_ID_BYTES: usize = 1_024;

/// Most resources one request may name (SPEC §3.9): bounds the work a single call can cause.
/// A sidecar's configuration is held to it, keyed resources' keys included.
pub const MAX_RESOURCES_PER_REQUEST: usize = 10_000;

/// Largest answer a caller decodes: an answer names every resource of its request, so room for
/// 10,000 with 1 KiB ids, as the servers take requests of (gRPC's default, 4 MiB, would refuse
/// the answer to a sidecar asking for 10,000 keys of 400 bytes).
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// After a failed request to a capacity server (a sidecar's, or an intermediate server's to its
/// parent) — once every address of the node has failed in a row — retries back off from this
/// many seconds...
pub const BACKOFF_BASE: f64 = 1.0;

/// ...doubling up to this; a random half of the interval is waited (equal jitter), so
/// replicas restarted together do not retry together. Short, because a caller cut off lives
/// on a fallback that knows nothing of demand, and because a subtree that comes back late
/// finds its parent has given its share away (a new master's learning mode over, the
/// reservation of its lapsed lease run out): in the simulated mishaps of scenario 7, a 30 s cap
/// let grants overshoot capacity by up to 30%. The price: 10,000 callers of an unreachable server
/// retry about 1,300 times a second between them (a wait of 7.5 s on average) instead of 450.
pub const BACKOFF_CAP: f64 = 10.0;

/// A retry is brought forward to this long before the earliest valid lease expires, so that one
/// success in time keeps the capacity instead of falling back.
pub const EXPIRY_MARGIN: f64 = 2.0;

/// Timeout of one RPC to a capacity server (a sidecar's, or an intermediate server's parent).
pub const CAPACITY_RPC_TIMEOUT: Duration = Duration::from_secs(5);

/// Connect timeout toward a capacity server.
pub const CAPACITY_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest lease length or refresh interval taken from a server's answer: a year, which is also
/// the most a Sluice template may set. Keeps the arithmetic on unix times far from overflow.
pub const MAX_LEASE_SECONDS: i64 = 366 * 24 * 3600;
