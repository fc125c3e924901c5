//! Structured logs through tracing, as text or JSON lines.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

pub fn init(format: LogFormat, filter: &str) -> Result<(), String> {
    let filter = EnvFilter::try_new(filter).map_err(|e| format!("--log {filter:?}: {e}"))?;
    // Colour only for a person at a terminal: escapes in a file, a pipe or a log collector are
    // noise. NO_COLOR (set and not empty, https://no-color.org) turns it off there too.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(|e| format!("cannot set up logging: {e}"))
}

/// `head`, then what lies behind `error`, as "head: cause: its cause…", for messages whose
/// error says too little on its own ("transport error"). A cause that repeats an earlier part
/// word for word (as layered errors often do) is left out.
pub fn with_causes(head: &str, error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![head.to_owned()];
    let mut source = error.source();
    while let Some(e) = source {
        let part = e.to_string();
        if !parts.contains(&part) {
            parts.push(part);
        }
        source = e.source();
    }
    parts.join(": ")
}
