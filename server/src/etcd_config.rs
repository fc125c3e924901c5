//! The configuration from an etcd key (`--config etcd:<key>`, Doorman's form): read once at
//! start, then watched, so that every server applies a change as soon as etcd reports it.
//!
//! The key holds the same YAML a configuration file does, and a new value goes into force as a
//! file's would (`sluice_runtime::reload::Applier`): a valid one atomically, an invalid one
//! logged and counted with the configuration in force kept. A deleted key, or etcd lost, also
//! keeps it. A broken watch connects again after a backoff and reads the key before watching
//! from the revision read, so that a change made meanwhile is applied then. SIGHUP reads the key
//! again and applies it even if unchanged (re-reading the rate limit files it names).

use std::sync::Arc;

use sluice_etcd::{
    etcdserverpb::{WatchCreateRequest, WatchRequest, watch_client::WatchClient, watch_request::RequestUnion},
    mvccpb::event::EventType,
};
use sluice_runtime::{reload::Applier, telemetry::with_causes};
use tokio::{
    signal::unix::Signal,
    sync::mpsc,
    time::{Instant, sleep, timeout},
};
use tokio_stream::wrappers::ReceiverStream;

use crate::{
    defaults::{CONFIG_WATCH_RETRY_MAX, CONFIG_WATCH_RETRY_MIN, ETCD_REQUEST_TIMEOUT},
    etcd::{self, Connection, Etcd},
};

/// The key's value as a start reads it.
pub async fn read_at_start(etcd: &Etcd, key: &str) -> Result<String, etcd::Error> {
    let connection = etcd.connect().await?;
    let (value, _) = read(&connection, key).await?;
    let missing = || etcd::Error { message: "no such key in etcd".into(), unreachable: false, code: None };
    text(value.ok_or_else(missing)?).map_err(|message| etcd::Error { message, unreachable: false, code: None })
}

/// The key's value (`None`: no such key) and the revision of etcd's store it was read at.
async fn read(etcd: &Connection, key: &str) -> Result<(Option<Vec<u8>>, i64), etcd::Error> {
    let answer = etcd.range(key, false).await?;
    let revision = answer.header.map_or(0, |h| h.revision);
    Ok((answer.kvs.into_iter().next().map(|kv| kv.value), revision))
}

fn text(value: Vec<u8>) -> Result<String, String> {
    String::from_utf8(value).map_err(|_| "the value is not UTF-8".to_owned())
}

/// The value last taken (applied or rejected), so that one seen again is not taken again: a
/// watch that connects anew reads the key it may already have.
#[derive(Debug)]
struct Seen(Vec<u8>);

impl Seen {
    /// Whether `value` is new; it is the last seen from now.
    fn changed(&mut self, value: &[u8]) -> bool {
        if self.0 == value {
            return false;
        }
        value.clone_into(&mut self.0);
        true
    }
}

/// Watches `key` until the process ends; `loaded` is the value the server started with.
pub async fn follow(etcd: Arc<Etcd>, key: String, loaded: String, applier: Applier, hangup: Signal) {
    let mut follower = Follower { key, seen: Seen(loaded.into_bytes()), applier, hangup };
    let mut backoff = CONFIG_WATCH_RETRY_MIN;
    loop {
        let started = Instant::now();
        let why = match follower.watch(&etcd).await {
            Ok(never) => match never {},
            Err(why) => why,
        };
        // A watch that lasted was healthy: start the backoff over.
        if started.elapsed() >= CONFIG_WATCH_RETRY_MAX {
            backoff = CONFIG_WATCH_RETRY_MIN;
        }
        tracing::warn!(key = %follower.key, reason = %why, retry_in = ?backoff,
            "configuration watch on etcd broke; the configuration in force stays");
        tokio::select! {
            () = sleep(backoff) => {}
            // Asked to reload: try at once.
            _ = follower.hangup.recv() => {}
        }
        backoff = (backoff * 2).min(CONFIG_WATCH_RETRY_MAX);
    }
}

struct Follower {
    key: String,
    seen: Seen,
    applier: Applier,
    hangup: Signal,
}

impl Follower {
    /// One connection: the key read, then watched from the revision read, until it breaks.
    async fn watch(&mut self, etcd: &Etcd) -> Result<std::convert::Infallible, String> {
        let etcd = etcd.connect().await?;
        let revision = self.reread(&etcd, false).await?;
        // Kept open: etcd ends a watch stream whose requests end.
        let (requests, receiver) = mpsc::channel(1);
        let create = WatchCreateRequest {
            key: self.key.as_bytes().to_vec(),
            start_revision: revision + 1,
            ..WatchCreateRequest::default()
        };
        let _ = requests.try_send(WatchRequest { request_union: Some(RequestUnion::CreateRequest(create)) });
        let mut watches = WatchClient::new(etcd.service());
        let mut answers = match timeout(ETCD_REQUEST_TIMEOUT, watches.watch(ReceiverStream::new(receiver))).await {
            Ok(Ok(answers)) => answers.into_inner(),
            Ok(Err(e)) => return Err(format!("watch: {:?}: {}", e.code(), with_causes(e.message(), &e))),
            Err(_) => return Err(format!("watch: no answer within {ETCD_REQUEST_TIMEOUT:?}")),
        };
        loop {
            tokio::select! {
                answer = answers.message() => {
                    let answer = match answer {
                        Ok(Some(answer)) => answer,
                        Ok(None) => return Err("etcd closed the watch stream".into()),
                        Err(e) => return Err(format!("watch: {:?}: {}", e.code(), with_causes(e.message(), &e))),
                    };
                    if answer.canceled {
                        return Err(format!("etcd canceled the watch: {}", answer.cancel_reason));
                    }
                    for event in answer.events {
                        match (event.r#type(), event.kv) {
                            (EventType::Put, Some(kv)) => self.offer(kv.value, false),
                            _ => tracing::warn!(key = %self.key,
                                "the configuration key was deleted; the configuration in force stays"),
                        }
                    }
                }
                _ = self.hangup.recv() => {
                    tracing::info!(key = %self.key, "SIGHUP: reading the configuration key again");
                    self.reread(&etcd, true).await?;
                }
            }
        }
    }

    /// Reads the key and takes its value if it changed, or in any case when `forced`; returns the
    /// revision read at.
    async fn reread(&mut self, etcd: &Connection, forced: bool) -> Result<i64, String> {
        let (value, revision) = read(etcd, &self.key).await?;
        match value {
            Some(value) => self.offer(value, forced),
            None => tracing::warn!(key = %self.key, "no configuration key in etcd; the configuration in force stays"),
        }
        Ok(revision)
    }

    fn offer(&mut self, value: Vec<u8>, forced: bool) {
        if self.seen.changed(&value) || forced {
            self.applier.take(text(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_value_not_seen_last_is_taken() {
        let mut seen = Seen(b"a".to_vec());
        assert!(!seen.changed(b"a"), "the value started with");
        assert!(seen.changed(b"b"));
        assert!(!seen.changed(b"b"), "read again after a reconnect");
        assert!(seen.changed(b"a"), "back to an earlier value");
    }
}
