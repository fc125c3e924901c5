//! The wall clock. The sans-I/O cores never read it: the processes pass its readings in.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix time in the protocol's whole seconds.
pub fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Unix time with sub-second precision, for scheduling requests.
pub fn precise_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
