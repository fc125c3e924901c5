//! A process's start and end: why it failed to start, the configuration file it reads, and
//! the signals that end it.

use std::fmt;

use tokio::signal::unix::{SignalKind, signal};

/// Why a process did not start or stopped.
#[derive(Debug)]
pub enum Failure {
    /// Bad flags or configuration: exit code 64 (EX_USAGE).
    Usage(String),
    /// Anything else, such as an address already in use: exit code 1.
    Runtime(String),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Usage(_) => 64,
            Failure::Runtime(_) => 1,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(why) | Failure::Runtime(why) => f.write_str(why),
        }
    }
}

/// The configuration file's name and text, or the embedded default's when there is no file.
pub fn read_config(path: Option<&std::path::Path>, embedded: &str) -> Result<(String, String), Failure> {
    match path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::Usage(format!("--config {}: {e}", path.display())))?;
            Ok((path.display().to_string(), text))
        }
        None => Ok(("embedded default configuration".to_owned(), embedded.to_owned())),
    }
}

/// Resolves on SIGTERM or SIGINT, naming it.
pub async fn termination() -> &'static str {
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
