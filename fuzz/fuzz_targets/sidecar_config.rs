//! The sidecar's configuration file: any text is accepted or refused with a line per error found,
//! never a panic; parsing is deterministic; an accepted configuration builds a plan (nothing it
//! allows fails later), and a reload of it onto itself needs no restart.
#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;
use sluice_sidecar::{config, plan::Plan};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match config::parse(text) {
        Err(reason) => {
            assert!(one_per_line(&reason), "a line per error: {reason:?}");
            assert_eq!(config::parse(text).err(), Some(reason), "deterministic");
        }
        Ok(parsed) => {
            let again = config::parse(text).expect("deterministic");
            assert_eq!(parsed.restart_needed(&again), None);
            // Plans with `https://` upstreams read CA files (which may be missing here) and the
            // system's roots: only the others are built, which takes no I/O.
            if parsed.upstreams.iter().all(|u| u.url.scheme_str() == Some("http")) {
                let plan = Plan::build(parsed, None, None).expect("an accepted configuration builds a plan");
                assert_eq!(plan.gates.len(), plan.config.resources.len());
            }
        }
    }
});

/// Errors one to a line: none empty, no carriage return hiding a second line.
fn one_per_line(reason: &str) -> bool {
    !reason.contains('\r') && reason.split('\n').all(|line| !line.trim().is_empty())
}
