//! Hot reload of the configuration file (SPEC §3.1): polled for changes and re-read on SIGHUP.
//! A valid file goes into force atomically; an invalid or unreadable one is logged and counted,
//! and the configuration in force stays.

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::signal::unix::Signal;

use crate::{config, metrics, state::State};

pub struct Reloader {
    path: PathBuf,
    state: Arc<State>,
    /// The file's content at the last attempt (`None`: it could not be read), so that an
    /// unchanged file is neither re-applied nor re-counted.
    last: Option<Vec<u8>>,
}

impl Reloader {
    /// `loaded` is the content the server started with.
    pub fn new(path: PathBuf, state: Arc<State>, loaded: Vec<u8>) -> Reloader {
        Reloader { path, state, last: Some(loaded) }
    }

    /// Checks the file every `interval` (> 0) and on every SIGHUP, until the process ends.
    pub async fn run(mut self, interval: Duration, mut hangup: Signal) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => self.check(false),
                _ = hangup.recv() => {
                    tracing::info!(path = %self.path.display(), "SIGHUP: reloading the configuration");
                    self.check(true);
                }
            }
        }
    }

    /// Answers SIGHUP when there is no file to reload.
    pub async fn without_file(mut hangup: Signal) {
        while hangup.recv().await.is_some() {
            tracing::info!("SIGHUP ignored: running on the embedded default configuration (no --config)");
        }
    }

    /// Applies the file if it changed, or in any case when `forced`.
    fn check(&mut self, forced: bool) {
        let read = std::fs::read(&self.path);
        let content = read.as_ref().ok().cloned();
        if !forced && content == self.last {
            return;
        }
        self.last = content;
        let outcome = read
            .map_err(|e| format!("cannot read {}: {e}", self.path.display()))
            .and_then(|bytes| String::from_utf8(bytes).map_err(|_| "the file is not UTF-8".to_owned()))
            .and_then(|text| config::parse(&text));
        match outcome {
            Ok(repository) => {
                tracing::info!(path = %self.path.display(), templates = repository.templates().len(), "configuration reloaded");
                self.state.publish(repository);
                metrics::record_reload(true);
            }
            Err(error) => {
                tracing::error!(path = %self.path.display(), %error, "configuration rejected; the previous one stays in force");
                metrics::record_reload(false);
            }
        }
    }
}
