//! Times for people: Unix seconds as UTC dates, and as ages relative to when a page was made
//! ("in 8 s", "3 min ago"). Every input is accepted: out-of-range values saturate.

use std::time::{Duration, UNIX_EPOCH};

/// The last second ISO-8601 dates can show with four-digit years (9999-12-31T23:59:59Z).
const LAST_DATE: i64 = 253_402_300_799;

/// `unix` as an ISO-8601 UTC date to the second, e.g. "2026-11-25T10:00:00Z"; times before 1970
/// or after 9999 show as the nearest of the two.
pub fn date(unix: i64) -> String {
    let seconds = unix.clamp(0, LAST_DATE) as u64;
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(seconds)).to_string()
}

/// How far `at` is from `now`: "in 8 s", "3 min ago", or "now".
pub fn relative(at: i64, now: i64) -> String {
    let ahead = at.saturating_sub(now);
    match ahead {
        0 => "now".to_owned(),
        1.. => format!("in {}", span(ahead.unsigned_abs())),
        _ => format!("{} ago", span(ahead.unsigned_abs())),
    }
}

/// A date and its age, e.g. "2026-11-25T10:00:00Z (in 8 s)".
pub fn date_and_age(at: i64, now: i64) -> String {
    format!("{} ({})", date(at), relative(at, now))
}

/// A length of time, rounded down to the largest unit of which it holds at least two: "119 s",
/// "2 min", "47 h", "400 d".
pub fn span(seconds: u64) -> String {
    match seconds {
        0..120 => format!("{seconds} s"),
        120..7_200 => format!("{} min", seconds / 60),
        7_200..172_800 => format!("{} h", seconds / 3_600),
        _ => format!("{} d", seconds / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_iso_8601_and_saturate() {
        assert_eq!(date(0), "1970-01-01T00:00:00Z");
        assert_eq!(date(1_764_064_800), "2025-11-25T10:00:00Z");
        assert_eq!(date(-5), "1970-01-01T00:00:00Z");
        assert_eq!(date(i64::MIN), "1970-01-01T00:00:00Z");
        assert_eq!(date(i64::MAX), "9999-12-31T23:59:59Z");
        assert_eq!(date(LAST_DATE + 1), "9999-12-31T23:59:59Z");
    }

    #[test]
    fn ages_read_both_ways_and_saturate() {
        assert_eq!(relative(108, 100), "in 8 s");
        assert_eq!(relative(100, 280), "3 min ago");
        assert_eq!(relative(100, 100), "now");
        assert_eq!(relative(0, 0), "now");
        assert_eq!(relative(0, 1_764_064_800), "20417 d ago");
        assert_eq!(relative(i64::MAX, i64::MIN), format!("in {} d", i64::MAX as u64 / 86_400));
        assert_eq!(relative(i64::MIN, i64::MAX), format!("{} d ago", i64::MAX as u64 / 86_400));
        assert_eq!(date_and_age(1_764_064_808, 1_764_064_800), "2025-11-25T10:00:08Z (in 8 s)");
    }

    #[test]
    fn spans_use_the_largest_unit_they_hold_twice() {
        let cases = [
            (0, "0 s"),
            (119, "119 s"),
            (120, "2 min"),
            (7_199, "119 min"),
            (7_200, "2 h"),
            (172_799, "47 h"),
            (172_800, "2 d"),
            (u64::MAX, "213503982334601 d"),
        ];
        for (seconds, text) in cases {
            assert_eq!(span(seconds), text, "{seconds} s");
        }
    }
}
