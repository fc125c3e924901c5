//! Hot reload of a configuration file: polled for changes and re-read on SIGHUP. A valid file
//! goes into force atomically; an invalid or unreadable one is logged and counted, and the
//! configuration in force stays. Shared by the server and the sidecar, which differ only in how
//! a file's text is applied. The files a configuration names can be watched with it
//! ([`Reloader::also_watching`]). A configuration from elsewhere (the server's etcd key) goes
//! into force the same way ([`Applier`]).
//! [`Watch`], the polling itself, also keeps TLS settings up to date as their files rotate
//! ([`rotating`]).

use std::{
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio::signal::unix::Signal;

use crate::{clock::now, html::escape, when::date_and_age};

/// Where the configuration in force came from, and the last file rejected since: the status
/// pages show it, so that a rejected file is seen without reading the logs.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigStatus {
    /// The file watched (or `etcd:<key>`); `null`: the embedded default.
    pub path: Option<String>,
    /// Unix time the configuration in force was applied.
    pub applied_at: i64,
    /// The last file rejected since then.
    pub rejected: Option<Rejected>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Rejected {
    /// Unix time.
    pub at: i64,
    pub error: String,
}

/// Written by the reloader, read by the status pages.
pub type SharedConfigStatus = Arc<Mutex<ConfigStatus>>;

impl ConfigStatus {
    /// The configuration read from `path` (`None`: the embedded one), applied now.
    pub fn shared(path: Option<&std::path::Path>) -> SharedConfigStatus {
        ConfigStatus::from_source(path.map(|p| p.display().to_string()))
    }

    /// The configuration read from `source` as people name it (`None`: the embedded one),
    /// applied now.
    pub fn from_source(source: Option<String>) -> SharedConfigStatus {
        Arc::new(Mutex::new(ConfigStatus { path: source, applied_at: now(), rejected: None }))
    }

    /// A copy of what `shared` holds now.
    pub fn now(shared: &SharedConfigStatus) -> ConfigStatus {
        shared.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// One paragraph for a status page made at `now`.
    pub fn html(&self, now: i64) -> String {
        let source = self.path.as_deref().map_or_else(|| "embedded default".to_owned(), escape);
        let rejected = self.rejected.as_ref().map_or_else(String::new, |r| {
            format!(" · <b>last change rejected</b> at {}: {}", date_and_age(r.at, now), escape(&r.error))
        });
        format!("<p>configuration: {source}, applied at {}{rejected}</p>", date_and_age(self.applied_at, now))
    }
}

/// Parses and applies a configuration's text: `Ok` with a short summary for the log, or the
/// reason it was rejected (nothing applied).
pub type Apply = Box<dyn FnMut(&str) -> Result<String, String> + Send>;

/// Records the outcome of one attempt (`true`: applied), e.g. in a metric.
pub type Record = fn(bool);

/// The files a configuration's text names and its [`Apply`] reads (see
/// [`Reloader::also_watching`]).
pub type Named = Box<dyn Fn(&str) -> Vec<PathBuf> + Send>;

/// A configuration's text put into force, whatever its source: applied, or rejected with the
/// configuration in force kept; either way counted, shown on the status pages and logged once.
pub struct Applier {
    /// The source as the log names it: a file's path, `etcd:<key>`.
    source: String,
    apply: Apply,
    record: Record,
    status: SharedConfigStatus,
}

impl Applier {
    pub fn new(source: String, apply: Apply, record: Record, status: SharedConfigStatus) -> Applier {
        Applier { source, apply, record, status }
    }

    /// Applies `text`, or records why it could not be read; `true` when it went into force.
    pub fn take(&mut self, text: Result<String, String>) -> bool {
        let outcome = text.and_then(|text| (self.apply)(&text));
        (self.record)(outcome.is_ok());
        {
            let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
            match &outcome {
                Ok(_) => (status.applied_at, status.rejected) = (now(), None),
                Err(error) => status.rejected = Some(Rejected { at: now(), error: error.clone() }),
            }
        }
        match outcome {
            Ok(summary) => {
                tracing::info!(path = %self.source, %summary, "configuration reloaded");
                true
            }
            Err(error) => {
                tracing::error!(path = %self.source, %error, "configuration rejected; the previous one stays in force");
                false
            }
        }
    }
}

pub struct Reloader {
    path: PathBuf,
    applier: Applier,
    watch: Watch,
    /// The files the configuration names, watched apart from it: while one cannot be read, a
    /// change of the configuration is still seen.
    named: Option<(Named, Watch)>,
}

/// Files polled for a change, which is reported once it has settled: a poll reports a change
/// only once the poll before saw the same, so that a file caught half-written by a tool writing
/// it in place is not taken (a half that parses would drop the rest). It costs a change one poll
/// interval; a forced poll (SIGHUP) reports at once.
pub struct Watch {
    paths: Vec<PathBuf>,
    /// The files' content at the last change reported (`Err`: why one could not be read), so
    /// that unchanged files are neither taken again nor counted again.
    last: Content,
    /// A change seen by the last poll, not yet reported.
    pending: Option<Content>,
}

/// Each file's bytes, in the order of the paths, or why one could not be read.
pub type Content = Result<Vec<Vec<u8>>, String>;

impl Watch {
    /// `paths` whose content in force is `loaded`.
    pub fn new(paths: Vec<PathBuf>, loaded: Content) -> Watch {
        Watch { paths, last: loaded, pending: None }
    }

    /// Reads the files as they are now.
    pub fn read(paths: &[PathBuf]) -> Content {
        paths.iter().map(|p| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))).collect()
    }

    /// The files' content if it changed since the last change reported and has stayed so since
    /// the last poll, or in any case when `forced`.
    pub fn changed(&mut self, forced: bool) -> Option<Content> {
        let content = Watch::read(&self.paths);
        if !forced {
            if content == self.last {
                self.pending = None;
                return None;
            }
            if self.pending.as_ref() != Some(&content) {
                self.pending = Some(content);
                return None;
            }
        }
        self.pending = None;
        self.last = content.clone();
        Some(content)
    }
}

impl Reloader {
    /// `loaded` is the content the process started with; `status` what the status pages show.
    pub fn new(path: PathBuf, loaded: Vec<u8>, apply: Apply, record: Record, status: SharedConfigStatus) -> Reloader {
        let watch = Watch::new(vec![path.clone()], Ok(vec![loaded]));
        let applier = Applier::new(path.display().to_string(), apply, record, status);
        Reloader { path, applier, watch, named: None }
    }

    /// Also watches the files that `named` says the configuration's text names: a settled change
    /// of one re-applies the configuration's text (whose [`Apply`] reads them again). The files
    /// are those of the text read last, so that a file a rejected text names is watched too,
    /// and taken to hold what they hold when this is called.
    pub fn also_watching(mut self, named: Named) -> Reloader {
        let text = match &self.watch.last {
            Ok(files) => String::from_utf8_lossy(&files[0]).into_owned(),
            Err(_) => String::new(),
        };
        let watch = named_watch(&named, &text);
        self.named = Some((named, watch));
        self
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

    /// Applies the file if it changed and has stayed so since the last poll, or in any case when
    /// `forced`.
    fn check(&mut self, forced: bool) {
        let changed = self.watch.changed(forced);
        // Both polled, so that each settles on its own.
        let named_changed = self.named.as_mut().is_some_and(|(_, watch)| watch.changed(forced).is_some());
        let content = match changed {
            Some(content) => content,
            None if named_changed => self.watch.last.clone(),
            None => return,
        };
        let text = content
            .and_then(|mut files| String::from_utf8(files.remove(0)).map_err(|_| "the file is not UTF-8".to_owned()));
        if let (Ok(text), Some((named, watch))) = (&text, &mut self.named) {
            // Read before `apply` reads them, so that a change in between is seen at the next poll.
            *watch = named_watch(named, text);
        }
        self.applier.take(text);
    }
}

/// A watch of the files `text` names, as they are now.
fn named_watch(named: &Named, text: &str) -> Watch {
    let paths = named(text);
    let loaded = Watch::read(&paths);
    Watch::new(paths, loaded)
}

/// Settings that `build` makes from the content of `paths`, kept up to date as the files rotate:
/// they are polled every `interval`, and when their content changes and settles, `build` makes
/// new settings from it, or says why it cannot and the old settings stay. `what` names the
/// settings in the log. Must be called on a runtime.
pub fn rotating<T: Send + Sync + 'static>(
    what: &'static str,
    paths: Vec<PathBuf>,
    interval: Duration,
    build: impl Fn(&[Vec<u8>]) -> Result<T, String> + Send + 'static,
) -> Result<Arc<ArcSwap<T>>, String> {
    let loaded = Watch::read(&paths)?;
    let settings = Arc::new(ArcSwap::from_pointee(build(&loaded)?));
    if paths.is_empty() {
        return Ok(settings);
    }
    let installed = settings.clone();
    let mut watch = Watch::new(paths, Ok(loaded));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(content) = watch.changed(false) else { continue };
            match content.and_then(|files| build(&files)) {
                Ok(new) => {
                    installed.store(Arc::new(new));
                    tracing::info!(what, "TLS files changed: new connections use them");
                }
                Err(error) => tracing::error!(what, %error, "TLS files rejected; the previous ones stay in force"),
            }
        }
    });
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn a_change_is_applied_once_two_polls_see_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, "a").unwrap();
        let applied = Arc::new(Mutex::new(Vec::new()));
        let apply: Apply = Box::new({
            let applied = applied.clone();
            move |text: &str| {
                applied.lock().unwrap().push(text.to_owned());
                Ok(String::new())
            }
        });
        let mut reloader = Reloader::new(path.clone(), b"a".to_vec(), apply, |_| {}, ConfigStatus::shared(None));
        let applied = || applied.lock().unwrap().clone();
        reloader.check(false);
        assert!(applied().is_empty(), "unchanged");
        // Caught half-written, then complete: only the complete file is applied.
        std::fs::write(&path, "b: [").unwrap();
        reloader.check(false);
        std::fs::write(&path, "b: [1]").unwrap();
        reloader.check(false);
        assert!(applied().is_empty(), "still changing");
        reloader.check(false);
        assert_eq!(applied(), ["b: [1]"]);
        reloader.check(false);
        assert_eq!(applied().len(), 1, "applied once");
        // SIGHUP does not wait.
        std::fs::write(&path, "c").unwrap();
        reloader.check(true);
        assert_eq!(applied(), ["b: [1]", "c"]);
    }

    #[test]
    fn a_change_of_a_file_the_configuration_names_reapplies_it() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        let path = dir.path().join("config");
        write("config", "a");
        write("a", "1");
        // The configuration is the name of the file it reads; applying it reads that file.
        let applied = Arc::new(Mutex::new(Vec::new()));
        let apply: Apply = Box::new({
            let (applied, dir) = (applied.clone(), dir.path().to_owned());
            move |text: &str| {
                let named = std::fs::read_to_string(dir.join(text)).map_err(|e| e.to_string())?;
                applied.lock().unwrap().push(format!("{text}:{named}"));
                Ok(String::new())
            }
        });
        let named: Named = Box::new({
            let dir = dir.path().to_owned();
            move |text: &str| vec![dir.join(text)]
        });
        let status = ConfigStatus::shared(None);
        let mut reloader = Reloader::new(path, b"a".to_vec(), apply, |_| {}, status.clone()).also_watching(named);
        let applied = || applied.lock().unwrap().clone();
        let rejected = || ConfigStatus::now(&status).rejected.is_some();
        let settle = |reloader: &mut Reloader| (0..2).for_each(|_| reloader.check(false));
        reloader.check(false);
        assert!(applied().is_empty(), "unchanged");
        // Only the named file changes: applied once it has settled, once.
        write("a", "2");
        reloader.check(false);
        assert!(applied().is_empty(), "still changing");
        reloader.check(false);
        assert_eq!(applied(), ["a:2"]);
        reloader.check(false);
        assert_eq!(applied().len(), 1, "applied once");
        // The configuration names a file that is not there yet: rejected, and the file watched.
        write("config", "b");
        settle(&mut reloader);
        assert!(rejected());
        write("b", "x");
        settle(&mut reloader);
        assert_eq!(applied(), ["a:2", "b:x"]);
        assert!(!rejected());
        // While a named file cannot be read, a change of the configuration is still seen.
        std::fs::remove_file(dir.path().join("b")).unwrap();
        settle(&mut reloader);
        assert!(rejected());
        write("config", "a");
        settle(&mut reloader);
        assert_eq!(applied(), ["a:2", "b:x", "a:2"]);
        // SIGHUP does not wait.
        write("a", "3");
        reloader.check(true);
        assert_eq!(applied(), ["a:2", "b:x", "a:2", "a:3"]);
    }
}
