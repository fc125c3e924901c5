//! The Doorman client half, shared by the sidecar's lease client and an intermediate server's
//! requests to its parent:
//!
//! - [`schedule`]: when to ask again (refresh, wake-ups, backoff) and how far a failover got;
//! - [`answer`]: what a server's answer grants, cleaned of what no caller can act on;
//! - [`discovery`]: the replicas of a node, its master, and one channel to it;
//! - [`tls`]: TLS toward the servers, and the checks of every PEM file;
//! - [`defaults`]: the protocol's bounds and the retry timings.
#![forbid(unsafe_code)]

pub mod answer;
pub mod defaults;
pub mod discovery;
pub mod schedule;
pub mod tls;

pub use answer::{Answer, Granted, safe_capacity};
pub use schedule::{Round, Schedule};

/// Why `value` is not an amount the protocol carries (a capacity, wants, a cost: from 0 to
/// [`MAX_AMOUNT`](defaults::MAX_AMOUNT)), worded alike by every binary and RPC; `or` names what
/// else a setting accepts (the sidecar's `.inf`).
pub fn out_of_range(value: f64, or: &str) -> String {
    // 1e300 in exponent form, not as its 301 digits.
    let got = if value.abs() < 1e16 { value.to_string() } else { format!("{value:e}") };
    format!("must be from 0 to {:e}{or}, got {got}", defaults::MAX_AMOUNT)
}

/// An id towards a capacity server (a client or server id given as a flag): what a server
/// accepts — non-empty, at most [`MAX_ID_BYTES`](defaults::MAX_ID_BYTES), no control characters.
pub fn id(text: &str) -> Result<String, String> {
    match text.len() {
        0 => Err("must not be empty".into()),
        n if n > defaults::MAX_ID_BYTES => Err(format!("at most {} bytes, got {n}", defaults::MAX_ID_BYTES)),
        _ if text.chars().any(char::is_control) => Err("must not contain control characters".into()),
        _ => Ok(text.to_owned()),
    }
}
