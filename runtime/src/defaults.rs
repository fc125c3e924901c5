//! Defaults and limits of what the processes share.

use std::time::Duration;

/// The shortest poll interval accepted for configuration and TLS files: each poll reads the
/// whole files.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Time an admin client has to send a request head, on both binaries' admin listeners. hyper
/// starts it when it waits for the next request too, so it is also how long a connection may
/// sit idle, open or between keep-alive requests.
pub const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Most connections an admin listener serves at once; one more is closed as soon as it is
/// accepted. Probes, a scraper or two and a person at the status page need a handful; each
/// costs about [`ADMIN_BUFFER_BYTES`] twice and a task (docs/server.md, Memory budget: the
/// admin listener).
pub const ADMIN_MAX_CONNECTIONS: usize = 64;

/// Answers an admin listener renders and sends at once: a request waits for its turn before
/// its answer is rendered, and an answer larger than [`ADMIN_CHUNK_BYTES`] keeps its turn until
/// it has been handed over whole. Bounds what large pages (`/metrics` of 100,000 resources)
/// cost however many ask at once; two, so that a pair of Prometheus replicas do not wait.
pub const ADMIN_ANSWERS_AT_ONCE: usize = 2;

/// An answer is handed to the connection in copies of this size, so that once the last is
/// handed over the rendered whole is freed and what the connection still holds is small.
pub const ADMIN_CHUNK_BYTES: usize = 16 << 10;

/// Most a connection buffers each way (hyper's `max_buf_size`, at least 8 KiB): requests to the
/// admin listener are a line and a few headers.
pub const ADMIN_BUFFER_BYTES: usize = 16 << 10;

/// A client that takes nothing of its answer for this long is let go, so that it does not
/// keep an answer, and its turn, for ever.
pub const ADMIN_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest an answer keeps its turn, from when it is rendered: a client that reads just fast
/// enough not to stall is let go then.
pub const ADMIN_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// After a failed accept on the admin listener (out of file descriptors, say), the pause before
/// the next, so that the loop does not spin.
pub const ADMIN_ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// The status pages reload themselves this often, in seconds.
pub const STATUS_REFRESH_SECONDS: u32 = 5;

/// The status pages chart each resource's last `HISTORY_LENGTH` samples, one taken every
/// `HISTORY_INTERVAL` (the hidden flag `--history-interval`, which tests shorten): 10 minutes
/// by default.
pub const HISTORY_INTERVAL: &str = "5s";
pub const HISTORY_LENGTH: usize = 120;
