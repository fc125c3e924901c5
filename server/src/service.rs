//! The `doorman.Capacity` gRPC service: validates each request, applies it to the ledger under
//! one short lock, and answers in Doorman's messages.

use std::{
    sync::{Arc, MutexGuard},
    time::Instant,
};

use sluice_proto::{
    self as proto, DiscoveryRequest, DiscoveryResponse, GetCapacityRequest, GetCapacityResponse,
    GetServerCapacityRequest, GetServerCapacityResponse, Mastership, ReleaseCapacityRequest, ReleaseCapacityResponse,
    ResourceResponse, ServerCapacityResourceResponse, capacity_server::Capacity,
};
use tonic::{Code, Request, Response, Status};

use crate::{
    core::{Algorithm, Grant, Ledger, UnixSeconds},
    metrics,
    state::{self, Role, State},
    validate::{self, ResourceClaim},
};

pub struct CapacityService {
    state: Arc<State>,
    max_resources: usize,
}

impl CapacityService {
    pub fn new(state: Arc<State>, max_resources: usize) -> CapacityService {
        CapacityService { state, max_resources }
    }

    /// The mastership gate every RPC passes first (SPEC §3.8): the ledger while this server is
    /// the master and holds its lock, else `Err` with who the master is.
    fn master_ledger(&self) -> Result<MutexGuard<'_, Ledger>, Mastership> {
        self.state.master_ledger().map_err(|leader| Mastership { master_address: leader })
    }
}

/// Answers a GetCapacity on `ledger` at `now` (the RPC without the network, shared with the
/// simulator): every claim is granted, or none if the new resources would not fit.
pub fn get_capacity(
    ledger: &mut Ledger,
    now: UnixSeconds,
    req: &GetCapacityRequest,
    max_resources: usize,
) -> Result<GetCapacityResponse, Status> {
    let claims = validate::get_capacity(req)?;
    let response = grant(ledger, now, &req.client_id, &claims, max_resources, |id, grant, _| ResourceResponse {
        resource_id: id.to_owned(),
        gets: lease(grant),
        safe_capacity: Some(grant.safe_capacity),
    })?;
    Ok(GetCapacityResponse { response, mastership: None })
}

/// Answers a GetServerCapacity on `ledger` at `now`, like [`get_capacity`].
pub fn get_server_capacity(
    ledger: &mut Ledger,
    now: UnixSeconds,
    req: &GetServerCapacityRequest,
    max_resources: usize,
) -> Result<GetServerCapacityResponse, Status> {
    let claims = validate::get_server_capacity(req)?;
    let response = grant(ledger, now, &req.server_id, &claims, max_resources, |id, grant, ledger| {
        let resource = ledger.resource(id).expect("a resource exists once claimed");
        ServerCapacityResourceResponse {
            resource_id: id.to_owned(),
            gets: lease(grant),
            // The parent's algorithm at an intermediate server: one algorithm per tree.
            algorithm: Some(algorithm(resource.algorithm())),
            safe_capacity: Some(grant.safe_capacity),
        }
    })?;
    Ok(GetServerCapacityResponse { response, mastership: None })
}

/// Answers a ReleaseCapacity on `ledger` at `now`.
pub fn release_capacity(
    ledger: &mut Ledger,
    now: UnixSeconds,
    req: &ReleaseCapacityRequest,
) -> Result<ReleaseCapacityResponse, Status> {
    for id in validate::release_capacity(req)? {
        ledger.release(now, &req.client_id, id);
    }
    Ok(ReleaseCapacityResponse { mastership: None })
}

/// Grants every claim, answering each with `respond`; or none, if the new resources would not
/// fit.
fn grant<T>(
    ledger: &mut Ledger,
    now: UnixSeconds,
    client: &str,
    claims: &[ResourceClaim<'_>],
    max_resources: usize,
    respond: impl Fn(&str, &Grant, &Ledger) -> T,
) -> Result<Vec<T>, Status> {
    // Counting the new resources costs a lookup each; only needed near the limit.
    let near_limit = ledger.len() + claims.len() > max_resources;
    let new = || claims.iter().filter(|(id, _)| ledger.resource(id).is_none()).count();
    if near_limit && ledger.len() + new() > max_resources {
        return Err(Status::resource_exhausted(format!(
            "this server keeps at most {max_resources} resources; the new ones in this request do not fit"
        )));
    }
    Ok(claims
        .iter()
        .map(|(id, claim)| {
            let grant = ledger.claim(now, client, id, claim);
            respond(id, &grant, ledger)
        })
        .collect())
}

/// Runs a handler, recording its outcome and duration.
fn observe<T>(method: &'static str, handle: impl FnOnce() -> Result<T, Status>) -> Result<Response<T>, Status> {
    let start = Instant::now();
    let result = handle();
    let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
    if let Err(status) = &result {
        tracing::debug!(method, code = ?code, message = status.message(), "request refused");
    }
    metrics::record_request(method, code, start.elapsed());
    result.map(Response::new)
}

fn lease(grant: &Grant) -> proto::Lease {
    proto::Lease { expiry_time: grant.expiry, refresh_interval: grant.refresh_interval, capacity: grant.capacity }
}

fn algorithm(a: &Algorithm) -> proto::Algorithm {
    let kind = proto::algorithm::Kind::from_str_name(a.kind.name()).expect("the core's kinds are Doorman's");
    proto::Algorithm {
        kind: kind.into(),
        lease_length: a.lease_length,
        refresh_interval: a.refresh_interval,
        parameters: a
            .parameters
            .iter()
            .map(|p| proto::NamedParameter { name: p.name.clone(), value: p.value.clone() })
            .collect(),
        learning_mode_duration: a.learning_mode_duration,
    }
}

#[tonic::async_trait]
impl Capacity for CapacityService {
    async fn discovery(&self, _: Request<DiscoveryRequest>) -> Result<Response<DiscoveryResponse>, Status> {
        observe("Discovery", || {
            // Only names the master: no ledger to guard, so the role is read without its lock.
            Ok(match &self.state.standing().role {
                Role::Master => DiscoveryResponse {
                    mastership: Mastership { master_address: Some(self.state.advertise_address().to_owned()) },
                    is_master: true,
                },
                Role::Follower { leader } => {
                    DiscoveryResponse { mastership: Mastership { master_address: leader.clone() }, is_master: false }
                }
            })
        })
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        observe("GetCapacity", || {
            let mut ledger = match self.master_ledger() {
                Ok(ledger) => ledger,
                Err(mastership) => {
                    return Ok(GetCapacityResponse { response: Vec::new(), mastership: Some(mastership) });
                }
            };
            let response = get_capacity(&mut ledger, state::now(), request.get_ref(), self.max_resources)?;
            self.state.wake_parent_if_due(&ledger);
            Ok(response)
        })
    }

    async fn get_server_capacity(
        &self,
        request: Request<GetServerCapacityRequest>,
    ) -> Result<Response<GetServerCapacityResponse>, Status> {
        observe("GetServerCapacity", || {
            let mut ledger = match self.master_ledger() {
                Ok(ledger) => ledger,
                Err(mastership) => {
                    return Ok(GetServerCapacityResponse { response: Vec::new(), mastership: Some(mastership) });
                }
            };
            let response = get_server_capacity(&mut ledger, state::now(), request.get_ref(), self.max_resources)?;
            self.state.wake_parent_if_due(&ledger);
            Ok(response)
        })
    }

    async fn release_capacity(
        &self,
        request: Request<ReleaseCapacityRequest>,
    ) -> Result<Response<ReleaseCapacityResponse>, Status> {
        observe("ReleaseCapacity", || match self.master_ledger() {
            Ok(mut ledger) => release_capacity(&mut ledger, state::now(), request.get_ref()),
            Err(mastership) => Ok(ReleaseCapacityResponse { mastership: Some(mastership) }),
        })
    }
}
