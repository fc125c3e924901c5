//! Envoy's rate limit quota service (RLQS v3, `StreamRateLimitQuotas`) served from the sidecar's
//! leases, beside the RLS on the same gRPC server: each stream is one Envoy's `domain`; each
//! bucket it reports is found in that domain's limits as a descriptor of its entries, its usage
//! charged to the limit's gate as demand ([`session`]), and the rate the gate holds (its lease)
//! pushed as a token bucket for Envoy to enforce ([`assign`]). At most `max_requests` streams
//! are open at once, the next refused (UNAVAILABLE).

mod assign;
mod session;

use std::{pin::Pin, sync::Arc, time::Instant};

use arc_swap::ArcSwap;
use sluice_proto::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
    rate_limit_quota_service_server::{RateLimitQuotaService, RateLimitQuotaServiceServer},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use crate::{defaults, plan::Plan};

type Reply = Result<RateLimitQuotaResponse, Status>;

pub struct Service {
    live: Arc<ArcSwap<Plan>>,
    streams: Arc<Semaphore>,
    /// True once the server stops: every stream ends, so that the graceful shutdown does not
    /// wait on streams that never end by themselves.
    stopping: watch::Receiver<bool>,
}

/// The service for the rate limit service's server: `max_streams` open at once; streams end
/// when `stopping` turns true.
pub fn service(
    live: Arc<ArcSwap<Plan>>,
    max_streams: usize,
    stopping: watch::Receiver<bool>,
) -> RateLimitQuotaServiceServer<Service> {
    let service = Service { live, streams: Arc::new(Semaphore::new(max_streams)), stopping };
    RateLimitQuotaServiceServer::new(service).max_decoding_message_size(defaults::RLQS_MAX_REPORT_BYTES)
}

#[tonic::async_trait]
impl RateLimitQuotaService for Service {
    type StreamRateLimitQuotasStream = Pin<Box<dyn Stream<Item = Reply> + Send>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let Ok(turn) = self.streams.clone().try_acquire_owned() else {
            return Err(Status::unavailable("rate limit quota service: too many streams open (max_requests)"));
        };
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(run(request.into_inner(), tx, self.live.clone(), self.stopping.clone(), turn));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// One stream until Envoy ends it, it goes wrong or the server stops.
async fn run(
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    tx: mpsc::Sender<Reply>,
    live: Arc<ArcSwap<Plan>>,
    mut stopping: watch::Receiver<bool>,
    _turn: OwnedSemaphorePermit,
) {
    let mut session = session::Session::new(defaults::RLQS_MAX_BUCKETS);
    let mut ticks = tokio::time::interval(defaults::RLQS_TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let answer = tokio::select! {
            report = reports.message() => match report {
                Ok(Some(report)) => session.report(&report, Instant::now(), &live.load()),
                // Envoy ended the stream, or it broke.
                Ok(None) | Err(_) => return,
            },
            _ = ticks.tick() => Ok(session.tick(Instant::now(), &live.load())),
            _ = stopping.wait_for(|stop| *stop) => return,
            _ = tx.closed() => return,
        };
        let reply = match answer {
            Ok(actions) if actions.is_empty() => continue,
            Ok(bucket_action) => Ok(RateLimitQuotaResponse { bucket_action }),
            Err(status) => Err(status),
        };
        let end = reply.is_err();
        if tx.send(reply).await.is_err() || end {
            return;
        }
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
