//! A process's start and end: why it failed to start, the configuration file it reads, and
//! the signals that end it.

use std::{fmt, path::Path, process::ExitCode};

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
    /// A configuration's errors (one per line), each line naming where it came from.
    pub fn config(source: &str, why: &str) -> Failure {
        Failure::Usage(why.lines().map(|line| format!("{source}: {line}")).collect::<Vec<_>>().join("\n"))
    }

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

/// Says on standard error why `binary` stops, a line per error found, and gives the code to exit
/// with.
pub fn exit(binary: &str, why: &str, code: u8) -> ExitCode {
    for line in why.lines() {
        let _ = crate::errln!("{binary}: {line}");
    }
    ExitCode::from(code)
}

/// A listener of the admin thread's (`what`: admin or debug), bound before anything starts.
pub fn bind_admin(address: std::net::SocketAddr, what: &str) -> Result<std::net::TcpListener, Failure> {
    std::net::TcpListener::bind(address)
        .map_err(|e| Failure::Runtime(format!("cannot listen on {address} ({what}): {e}")))
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

/// `check --config FILE`: `summarize` validates the file's text as a start would, relative paths
/// leading to the file's folder, and says what it holds. Exits 0 saying `FILE: ok: <summary>` on
/// standard output, else 64 (as a start would) saying `FILE: <why>` on standard error for every
/// error found, a line each; nothing bound or dialled.
pub fn check(path: &Path, summarize: impl FnOnce(&str, &Path) -> Result<String, String>) -> ExitCode {
    let dir = path.parent().unwrap_or(Path::new(""));
    let name = path.display();
    match std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}")).and_then(|t| summarize(&t, dir)) {
        Ok(summary) => {
            let _ = crate::outln!("{name}: ok: {summary}");
            ExitCode::SUCCESS
        }
        Err(why) => exit(&name.to_string(), &why, Failure::Usage(why.clone()).exit_code()),
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
