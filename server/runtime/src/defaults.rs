//! Defaults and limits of what the processes share.

use std::time::Duration;

/// The shortest poll interval accepted for configuration and TLS files: each poll reads the
/// whole files.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Time an admin client has to send a request head, on both binaries' admin listeners.
pub const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

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
