//! Envoy's rate limit service (RLS v3) served from the sidecar's leases: `ShouldRateLimit` is
//! answered at once from the gates of the resources the configured domains' limits became
//! ([`decide`]), so a call costs no round trip beyond Envoy's own to the sidecar; at most
//! `max_requests` calls are answered at once, the next refused at once (UNAVAILABLE), as the
//! HTTP listeners shed load. The same server serves Envoy's rate limit quota service (RLQS,
//! [`crate::rlqs`]) from the same domains and gates.

mod decide;

use std::{net::SocketAddr, sync::Arc};

use arc_swap::ArcSwap;
use sluice_proto::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
    rate_limit_response::Code,
    rate_limit_service_server::{RateLimitService, RateLimitServiceServer},
};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, watch},
};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, transport::Server};

use crate::{defaults, metrics, plan::Plan, rlqs};

struct Service {
    live: Arc<ArcSwap<Plan>>,
    in_flight: Arc<Semaphore>,
}

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let Ok(_turn) = self.in_flight.try_acquire() else {
            return Err(Status::unavailable("rate limit service: too many calls in flight (max_requests)"));
        };
        let call = request.into_inner();
        let plan = self.live.load_full();
        let limits = plan.domains.get(&call.domain);
        let domain = limits.map(|l| l.domain.name.as_str());
        match decide::decide(limits.map(Arc::as_ref), &call).await {
            Ok(answer) => {
                let code = if answer.overall_code == i32::from(Code::OverLimit) { "over_limit" } else { "ok" };
                metrics::record_rls(domain, code);
                Ok(Response::new(answer))
            }
            Err(why) => {
                metrics::record_rls(domain, "invalid");
                Err(Status::invalid_argument(why))
            }
        }
    }
}

/// Serves the rate limit service and the rate limit quota service on `listener` until `stopped`
/// resolves (RLQS streams end then); at most `max_requests` RLS calls and as many RLQS streams
/// at once.
pub async fn serve(
    listener: TcpListener,
    live: Arc<ArcSwap<Plan>>,
    max_requests: usize,
    stopped: impl Future<Output = ()>,
) -> Result<(), String> {
    let address: Option<SocketAddr> = listener.local_addr().ok();
    let (stop, stopping) = watch::channel(false);
    let quota = rlqs::service(live.clone(), max_requests, stopping);
    let service = Service { live, in_flight: Arc::new(Semaphore::new(max_requests)) };
    let stopped = async move {
        stopped.await;
        let _ = stop.send(true);
    };
    Server::builder()
        .timeout(defaults::RLS_CALL_TIMEOUT)
        .max_concurrent_streams(defaults::RLS_MAX_STREAMS)
        .tcp_nodelay(true)
        .add_service(RateLimitServiceServer::new(service).max_decoding_message_size(defaults::RLS_MAX_REQUEST_BYTES))
        .add_service(quota)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stopped)
        .await
        .map_err(|e| format!("rate limit service on {address:?}: {e}"))
}
