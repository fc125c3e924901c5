//! The server's configuration file (Doorman's ResourceRepository in YAML): any text is accepted
//! or refused with a line per error found, never a panic; an accepted one has a catch-all template
//! last, finite non-negative capacities, and finds a template for any resource id.
#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;
use sluice_server::config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match config::parse(text, std::path::Path::new("")) {
        Err(reason) => assert!(one_per_line(&reason), "a line per error: {reason:?}"),
        Ok(repository) => {
            let templates = repository.templates();
            assert_eq!(templates.last().map(|t| t.identifier_glob.as_str()), Some("*"), "a catch-all comes last");
            for t in templates {
                assert!(t.capacity.is_finite() && t.capacity >= 0.0, "capacity {}", t.capacity);
                assert!(t.safe_capacity.is_none_or(f64::is_finite), "safe capacity {:?}", t.safe_capacity);
                assert!(t.algorithm.lease_length > 0 && t.algorithm.refresh_interval > 0);
            }
            // Every glob and id the text names, and the text itself, find a template.
            for id in text.split(|c: char| c.is_whitespace() || c == '"' || c == '\'').chain([text]) {
                let found = repository.find(id);
                assert!(templates.iter().any(|t| std::sync::Arc::ptr_eq(t, found)));
            }
        }
    }
});

/// Errors one to a line: none empty, no carriage return hiding a second line.
fn one_per_line(reason: &str) -> bool {
    !reason.contains('\r') && reason.split('\n').all(|line| !line.trim().is_empty())
}
