//! How one setting is read, for every section that has it: durations, amounts, bounded counts
//! and fallbacks, each refused with one line naming the field.

use std::time::Duration;

use super::document::FallbackDoc;
use crate::{
    core::{Cost, Fallback, MAX_AMOUNT},
    defaults,
};

/// A duration setting: at most [`defaults::MAX_SETTING_DURATION`].
pub(super) fn within_limit(text: &str, at: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d > defaults::MAX_SETTING_DURATION => {
            Err(format!("{at}: must be at most {}", humantime::format_duration(defaults::MAX_SETTING_DURATION)))
        }
        Ok(d) => Ok(d),
        Err(e) => Err(format!("{at}: {text:?}: {e}")),
    }
}

/// A timeout: above 0 and at most [`defaults::MAX_SETTING_DURATION`].
pub(super) fn duration(text: &str, at: &str) -> Result<Duration, String> {
    match within_limit(text, at)? {
        d if d.is_zero() => Err(format!("{at}: must be greater than 0")),
        d => Ok(d),
    }
}

/// An amount that must be above 0 (a burst, a bound on costs).
pub(super) fn amount(value: f64, at: &str) -> Result<Cost, String> {
    Cost::new(value)
        .filter(|c| c.get() > 0.0)
        .ok_or_else(|| format!("{at}: must be above 0 and at most {MAX_AMOUNT:e}, got {value}"))
}

/// A count from 1 to `limit`, `default` when not given.
pub(super) fn count(value: Option<usize>, at: &str, default: usize, limit: usize) -> Result<usize, String> {
    match value {
        Some(n) if n == 0 || n > limit => Err(format!("{at}: must be from 1 to {limit}, got {n}")),
        v => Ok(v.unwrap_or(default)),
    }
}

pub(super) fn fallback(doc: FallbackDoc) -> Fallback {
    match doc {
        FallbackDoc::Safe => Fallback::Safe,
        FallbackDoc::Optimistic => Fallback::Optimistic,
        FallbackDoc::Pessimistic => Fallback::Pessimistic,
    }
}
