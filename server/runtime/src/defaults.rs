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
