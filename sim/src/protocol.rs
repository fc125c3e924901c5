//! The server's half of the RPCs: the gRPC service's own functions (validation, claims, the
//! answer in Doorman's messages) without the network.

use sluice_proto::{
    DiscoveryResponse, GetCapacityRequest, GetCapacityResponse, GetServerCapacityRequest, GetServerCapacityResponse,
    Mastership, ReleaseCapacityRequest,
};
use sluice_server::{
    core::{Ledger, UnixSeconds},
    service,
};

/// An RPC as a capacity server receives it.
#[derive(Clone, Debug)]
pub enum Request {
    Discovery,
    GetCapacity(GetCapacityRequest),
    /// From an intermediate server to its parent.
    GetServerCapacity(GetServerCapacityRequest),
    Release(ReleaseCapacityRequest),
}

impl From<GetCapacityRequest> for Request {
    fn from(request: GetCapacityRequest) -> Request {
        Request::GetCapacity(request)
    }
}

impl From<GetServerCapacityRequest> for Request {
    fn from(request: GetServerCapacityRequest) -> Request {
        Request::GetServerCapacity(request)
    }
}

/// A server's answer; `Err` is an error status, by its message.
#[derive(Clone, Debug)]
pub enum Reply {
    Discovery(DiscoveryResponse),
    GetCapacity(Result<GetCapacityResponse, String>),
    GetServerCapacity(Result<GetServerCapacityResponse, String>),
}

/// Most resources a simulated server keeps: the binary's default.
const MAX_RESOURCES: usize = sluice_server::defaults::MAX_RESOURCES;

pub fn get_capacity(
    ledger: &mut Ledger,
    now: UnixSeconds,
    req: &GetCapacityRequest,
) -> Result<GetCapacityResponse, String> {
    service::get_capacity(ledger, now, req, None, MAX_RESOURCES).map_err(|status| status.message().to_owned())
}

pub fn get_server_capacity(
    ledger: &mut Ledger,
    now: UnixSeconds,
    req: &GetServerCapacityRequest,
) -> Result<GetServerCapacityResponse, String> {
    service::get_server_capacity(ledger, now, req, None, MAX_RESOURCES).map_err(|status| status.message().to_owned())
}

pub fn release_capacity(ledger: &mut Ledger, now: UnixSeconds, req: &ReleaseCapacityRequest) -> Result<(), String> {
    service::release_capacity(ledger, now, req, None).map(drop).map_err(|status| status.message().to_owned())
}

/// What a replica that is not the master answers to GetCapacity: who is, if it knows.
pub fn not_master(master: Option<String>) -> GetCapacityResponse {
    GetCapacityResponse { response: Vec::new(), mastership: Some(Mastership { master_address: master }) }
}

/// What a replica that is not the master answers to GetServerCapacity.
pub fn not_master_to_server(master: Option<String>) -> GetServerCapacityResponse {
    GetServerCapacityResponse { response: Vec::new(), mastership: Some(Mastership { master_address: master }) }
}

pub fn discovery(master: Option<String>, is_master: bool) -> DiscoveryResponse {
    DiscoveryResponse { mastership: Mastership { master_address: master }, is_master }
}
