//! Open-loop load for the adaptive capacity benchmark: one pod's `GET /job`, evenly paced, each
//! sent when it is due whatever is still outstanding, over a keep-alive HTTP/1.1 pool of the pod's
//! own, and what became of them, second by second.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use hdrhistogram::Histogram;
use http::{StatusCode, Uri};
use tokio::{task::JoinSet, time::Instant};

use crate::{
    http::{http1, send},
    upstream::SHED_HEADER,
};

/// What became of the requests one pod sent in one second (the second they were due in).
#[derive(Clone, Debug)]
pub(crate) struct Second {
    /// 2xx from the service.
    pub(crate) ok: u64,
    /// Turned away by the limiter: a sidecar's 429 (or its own 503), Envoy's 503.
    pub(crate) refused: u64,
    /// Turned away by the service's full queue (a 503 with [`SHED_HEADER`]).
    pub(crate) shed: u64,
    /// No answer in time, a connection error, another status, or never sent because the pod had
    /// its most requests outstanding.
    pub(crate) failed: u64,
    /// Latency (µs, from when each was due) of the admitted requests: all that got past the
    /// limiter, timeouts counted at the timeout. Its count is the number admitted.
    pub(crate) latency: Histogram<u64>,
}

impl Default for Second {
    fn default() -> Self {
        // Two significant digits keep a run's hundreds of histograms small (1% is finer than any
        // figure reported); the histogram grows to the largest latency recorded.
        let latency = Histogram::new(2).expect("2 significant digits");
        Second { ok: 0, refused: 0, shed: 0, failed: 0, latency }
    }
}

impl Second {
    pub(crate) fn admitted(&self) -> u64 {
        self.latency.len()
    }

    /// Adds what `other` counted.
    pub(crate) fn add(&mut self, other: &Second) {
        self.ok += other.ok;
        self.refused += other.refused;
        self.shed += other.shed;
        self.failed += other.failed;
        self.latency.add(&other.latency).expect("a histogram that grows adds any other");
    }

    fn count(&mut self, outcome: Outcome, took: Duration) {
        let admitted = match outcome {
            Outcome::Ok => {
                self.ok += 1;
                true
            }
            Outcome::Refused => {
                self.refused += 1;
                false
            }
            Outcome::Shed => {
                self.shed += 1;
                true
            }
            Outcome::Failed { admitted } => {
                self.failed += 1;
                admitted
            }
        };
        if admitted {
            self.latency.record(took.as_micros() as u64).expect("a histogram that grows records any latency");
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Outcome {
    Ok,
    Refused,
    Shed,
    Failed { admitted: bool },
}

/// The outcome of a request answered `answer` (its status, and whether it carried the service's
/// shed header) after `took`, or not answered: a request with no answer by `timeout` was admitted
/// and waited at the service or the proxy, one that failed sooner never got through.
pub(crate) fn classify(answer: Option<(StatusCode, bool)>, took: Duration, timeout: Duration) -> Outcome {
    match answer {
        Some((status, _)) if status.is_success() => Outcome::Ok,
        Some((StatusCode::SERVICE_UNAVAILABLE, true)) => Outcome::Shed,
        Some((StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE, false)) => Outcome::Refused,
        Some(_) => Outcome::Failed { admitted: true },
        None => Outcome::Failed { admitted: took >= timeout },
    }
}

/// One pod's load.
#[derive(Clone, Debug)]
pub(crate) struct Offer {
    pub(crate) uri: Uri,
    /// Requests a second.
    pub(crate) rate: f64,
    /// When the first request is due.
    pub(crate) start: Instant,
    pub(crate) seconds: u64,
    pub(crate) timeout: Duration,
    /// Requests outstanding at most; one due beyond it counts as failed.
    pub(crate) max_outstanding: usize,
}

/// Sends `offer`'s requests, each at its time, and waits for the last answer or timeout.
pub(crate) async fn offer(offer: Offer) -> Vec<Second> {
    let client = http1();
    let seconds = Arc::new(Mutex::new(vec![Second::default(); offer.seconds as usize]));
    let mut outstanding = JoinSet::new();
    for n in 0u64.. {
        let due = offer.start + Duration::from_secs_f64(n as f64 / offer.rate);
        let second = (due - offer.start).as_secs() as usize;
        if second as u64 >= offer.seconds {
            break;
        }
        tokio::time::sleep_until(due).await;
        while outstanding.try_join_next().is_some() {}
        if outstanding.len() >= offer.max_outstanding {
            seconds.lock().unwrap_or_else(PoisonError::into_inner)[second]
                .count(Outcome::Failed { admitted: false }, Duration::ZERO);
            continue;
        }
        let (client, uri, seconds) = (client.clone(), offer.uri.clone(), seconds.clone());
        outstanding.spawn(async move {
            let request = http::Request::get(uri).body(Default::default()).expect("a valid request");
            let answer = send(&client, request, offer.timeout).await;
            // From when it was due, not sent: a late sender must not hide the wait it caused.
            let took = due.elapsed();
            let outcome =
                classify(answer.map(|a| (a.status, a.headers.contains_key(SHED_HEADER))), took, offer.timeout);
            seconds.lock().unwrap_or_else(PoisonError::into_inner)[second].count(outcome, took.min(offer.timeout));
        });
    }
    while outstanding.join_next().await.is_some() {}
    let seconds = seconds.lock().unwrap_or_else(PoisonError::into_inner);
    seconds.clone()
}
