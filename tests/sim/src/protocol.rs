//! The server's half of the RPCs, done as the gRPC service does it: the server's own validation
//! turns a request into claims, the ledger grants them, and the answer is built in Doorman's
//! messages. The only module that knows the shape of a claim.

use sluice_proto::{
    DiscoveryResponse, GetCapacityRequest, GetCapacityResponse, Lease, Mastership, ReleaseCapacityRequest,
    ResourceResponse,
};
use sluice_server::{
    core::{Grant, Ledger, UnixSeconds},
    validate,
};

/// An RPC as a capacity server receives it.
#[derive(Clone, Debug)]
pub enum Request {
    Discovery,
    GetCapacity(GetCapacityRequest),
    Release(ReleaseCapacityRequest),
}

/// A server's answer; `Err` is an error status, by its message.
#[derive(Clone, Debug)]
pub enum Reply {
    Discovery(DiscoveryResponse),
    GetCapacity(Result<GetCapacityResponse, String>),
}

pub fn get_capacity(
    ledger: &mut Ledger,
    now: UnixSeconds,
    req: &GetCapacityRequest,
) -> Result<GetCapacityResponse, String> {
    let claims = validate::get_capacity(req).map_err(|status| status.message().to_owned())?;
    let response = claims
        .iter()
        .map(|(id, claim)| {
            let grant = ledger.claim(now, &req.client_id, id, claim);
            ResourceResponse {
                resource_id: (*id).to_owned(),
                gets: lease(&grant),
                safe_capacity: Some(grant.safe_capacity),
            }
        })
        .collect();
    Ok(GetCapacityResponse { response, mastership: None })
}

pub fn release_capacity(ledger: &mut Ledger, req: &ReleaseCapacityRequest) -> Result<(), String> {
    validate::release_capacity(req).map_err(|status| status.message().to_owned())?;
    for id in &req.resource_id {
        ledger.release(&req.client_id, id);
    }
    Ok(())
}

/// What a replica that is not the master answers to GetCapacity: who is, if it knows.
pub fn not_master(master: Option<String>) -> GetCapacityResponse {
    GetCapacityResponse { response: Vec::new(), mastership: Some(Mastership { master_address: master }) }
}

pub fn discovery(master: Option<String>, is_master: bool) -> DiscoveryResponse {
    DiscoveryResponse { mastership: Mastership { master_address: master }, is_master }
}

fn lease(grant: &Grant) -> Lease {
    Lease { expiry_time: grant.expiry, refresh_interval: grant.refresh_interval, capacity: grant.capacity }
}
