//! The `doorman.Capacity` gRPC service: validates each request, applies it to the ledger under
//! one short lock, and answers in Doorman's messages.

use std::{sync::Arc, time::Instant};

use sluice_proto::{
    self as proto, DiscoveryRequest, DiscoveryResponse, GetCapacityRequest, GetCapacityResponse,
    GetServerCapacityRequest, GetServerCapacityResponse, Mastership, ReleaseCapacityRequest, ReleaseCapacityResponse,
    ResourceResponse, ServerCapacityResourceResponse, capacity_server::Capacity,
};
use tonic::{Code, Request, Response, Status};

use crate::{
    core::{Algorithm, Grant, Ledger},
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

    /// The mastership gate every RPC passes first (SPEC §3.8): `Err` with who the master is
    /// when this server is not it.
    fn master_gate(&self) -> Result<(), Mastership> {
        match &self.state.standing().role {
            Role::Master => Ok(()),
            Role::Follower { leader } => Err(Mastership { master_address: leader.clone() }),
        }
    }

    /// Grants every claim under one hold of the ledger lock, answering each with `respond`; or
    /// none, if the new resources would not fit.
    fn grant<T>(
        &self,
        client: &str,
        claims: &[ResourceClaim<'_>],
        respond: impl Fn(&str, &Grant, &Ledger) -> T,
    ) -> Result<Vec<T>, Status> {
        let now = state::now();
        let mut ledger = self.state.ledger();
        // Counting the new resources costs a lookup each; only needed near the limit.
        let near_limit = ledger.len() + claims.len() > self.max_resources;
        let new = || claims.iter().filter(|(id, _)| ledger.resource(id).is_none()).count();
        if near_limit && ledger.len() + new() > self.max_resources {
            return Err(Status::resource_exhausted(format!(
                "this server keeps at most {} resources; the new ones in this request do not fit",
                self.max_resources
            )));
        }
        Ok(claims
            .iter()
            .map(|(id, claim)| {
                let grant = ledger.claim(now, client, id, claim);
                respond(id, &grant, &ledger)
            })
            .collect())
    }
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
            Ok(match self.master_gate() {
                Ok(()) => DiscoveryResponse {
                    mastership: Mastership { master_address: Some(self.state.advertise_address().to_owned()) },
                    is_master: true,
                },
                Err(mastership) => DiscoveryResponse { mastership, is_master: false },
            })
        })
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        observe("GetCapacity", || {
            if let Err(mastership) = self.master_gate() {
                return Ok(GetCapacityResponse { response: Vec::new(), mastership: Some(mastership) });
            }
            let req = request.get_ref();
            let claims = validate::get_capacity(req)?;
            let response = self.grant(&req.client_id, &claims, |id, grant, _| ResourceResponse {
                resource_id: id.to_owned(),
                gets: lease(grant),
                safe_capacity: Some(grant.safe_capacity),
            })?;
            Ok(GetCapacityResponse { response, mastership: None })
        })
    }

    async fn get_server_capacity(
        &self,
        request: Request<GetServerCapacityRequest>,
    ) -> Result<Response<GetServerCapacityResponse>, Status> {
        observe("GetServerCapacity", || {
            if let Err(mastership) = self.master_gate() {
                return Ok(GetServerCapacityResponse { response: Vec::new(), mastership: Some(mastership) });
            }
            let req = request.get_ref();
            let claims = validate::get_server_capacity(req)?;
            let response = self.grant(&req.server_id, &claims, |id, grant, ledger| {
                let template = ledger.resource(id).expect("a resource exists once claimed").template();
                ServerCapacityResourceResponse {
                    resource_id: id.to_owned(),
                    gets: lease(grant),
                    algorithm: Some(algorithm(&template.algorithm)),
                    safe_capacity: Some(grant.safe_capacity),
                }
            })?;
            Ok(GetServerCapacityResponse { response, mastership: None })
        })
    }

    async fn release_capacity(
        &self,
        request: Request<ReleaseCapacityRequest>,
    ) -> Result<Response<ReleaseCapacityResponse>, Status> {
        observe("ReleaseCapacity", || {
            if let Err(mastership) = self.master_gate() {
                return Ok(ReleaseCapacityResponse { mastership: Some(mastership) });
            }
            let req = request.get_ref();
            validate::release_capacity(req)?;
            let mut ledger = self.state.ledger();
            for id in &req.resource_id {
                ledger.release(&req.client_id, id);
            }
            Ok(ReleaseCapacityResponse { mastership: None })
        })
    }
}
