//! envoyproxy/ratelimit's files: any text is accepted or refused with a one-line reason, never a
//! panic; an accepted one's ids keep their bounds and are distinct, and finding a limit for any
//! descriptor made of the text's words ends.
#![no_main]
#![forbid(unsafe_code)]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use sluice_ratelimit::{Domain, MAX_ID_BYTES};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Domain::parse(text) {
        Err(reason) => assert!(!reason.contains('\n'), "one line: {reason:?}"),
        Ok(domain) => {
            let mut ids = HashSet::new();
            for limit in &domain.limits {
                assert!(limit.id.len() <= MAX_ID_BYTES, "{}", limit.id);
                assert!(ids.insert(limit.id.as_str()), "{} twice", limit.id);
                assert!(limit.quota.is_none_or(|q| q.rate().is_finite() && q.rate() >= 0.0));
            }
            let words: Vec<&str> = text.split(|c: char| c.is_whitespace() || ":,{}[]\"'".contains(c)).collect();
            for pair in words.windows(4) {
                let entries = [(pair[0], pair[1]), (pair[2], pair[3])];
                for n in 1..=2 {
                    if let Some(found) = domain.find(entries[..n].iter().copied()) {
                        assert!(found.limit < domain.limits.len());
                        assert_eq!(found.key.is_some(), domain.limits[found.limit].keyed);
                    }
                }
            }
        }
    }
});
