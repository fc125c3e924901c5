//! The `doorman.Capacity` gRPC service: validates each request, applies it to the ledger in
//! short holds of its lock, and answers in Doorman's messages.

use std::{
    future::Future,
    sync::{
        Arc, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use sluice_client::answer::name_denied;
use sluice_proto::{
    self as proto, DiscoveryRequest, DiscoveryResponse, GetCapacityRequest, GetCapacityResponse,
    GetServerCapacityRequest, GetServerCapacityResponse, Mastership, ReleaseCapacityRequest, ReleaseCapacityResponse,
    ResourceResponse, ServerCapacityResourceResponse, capacity_server::Capacity,
};
use tonic::{Code, Request, Response, Status};

use crate::{
    core::{Algorithm, Call, Denial, Full, Grant, Ledger, Owner, Policies, UnixSeconds},
    defaults::{DEMANDS_PER_LOCK, DENIAL_LOG_INTERVAL, DENIED_NAMES_BYTES},
    identity::Caller,
    metrics::{self, GET_CAPACITY, GET_SERVER_CAPACITY, RELEASE_CAPACITY},
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

/// Answers a GetCapacity from `identity` on `ledger` at `now` (the RPC without the network,
/// shared with the simulator): every claim is granted, or none if they do not fit.
pub fn get_capacity(
    ledger: &mut Ledger,
    now: UnixSeconds,
    req: &GetCapacityRequest,
    identity: Option<&Arc<str>>,
    max_resources: usize,
) -> Result<GetCapacityResponse, Status> {
    let claims = validate::get_capacity(req)?;
    let owner = admit(ledger.repository().policies(), identity, GET_CAPACITY, &req.client_id, &claims)?;
    owned(ledger, GET_CAPACITY, &req.client_id, owner)?;
    room(ledger, now, &req.client_id, owner, &claims, max_resources)?;
    let response = grant(ledger, now, &req.client_id, owner, &claims, capacity_response);
    Ok(GetCapacityResponse { response, mastership: None })
}

/// Answers a GetServerCapacity on `ledger` at `now`, like [`get_capacity`].
pub fn get_server_capacity(
    ledger: &mut Ledger,
    now: UnixSeconds,
    req: &GetServerCapacityRequest,
    identity: Option<&Arc<str>>,
    max_resources: usize,
) -> Result<GetServerCapacityResponse, Status> {
    let claims = validate::get_server_capacity(req)?;
    let owner = admit(ledger.repository().policies(), identity, GET_SERVER_CAPACITY, &req.server_id, &claims)?;
    owned(ledger, GET_SERVER_CAPACITY, &req.server_id, owner)?;
    room(ledger, now, &req.server_id, owner, &claims, max_resources)?;
    let response = grant(ledger, now, &req.server_id, owner, &claims, server_capacity_response);
    Ok(GetServerCapacityResponse { response, mastership: None })
}

/// Answers a ReleaseCapacity on `ledger` at `now`.
pub fn release_capacity(
    ledger: &mut Ledger,
    now: UnixSeconds,
    req: &ReleaseCapacityRequest,
    identity: Option<&Arc<str>>,
) -> Result<ReleaseCapacityResponse, Status> {
    let ids = validate::release_capacity(req)?;
    let owner = admit(ledger.repository().policies(), identity, RELEASE_CAPACITY, &req.client_id, &ids)?;
    owned(ledger, RELEASE_CAPACITY, &req.client_id, owner)?;
    release(ledger, now, &req.client_id, &ids);
    Ok(ReleaseCapacityResponse { mastership: None })
}

/// Something a request names resources in.
trait Names {
    fn id(&self) -> &str;
}

impl Names for ResourceClaim<'_> {
    fn id(&self) -> &str {
        self.0
    }
}

impl Names for &str {
    fn id(&self) -> &str {
        self
    }
}

/// Whether the policies let `identity` make this call: PERMISSION_DENIED if not; else the
/// identity a client id it uses becomes, with its bound (`None`: every caller is trusted).
fn admit<'a>(
    policies: &Policies,
    identity: Option<&'a Arc<str>>,
    method: &'static str,
    client: &str,
    named: &[impl Names],
) -> Result<Option<Owner<'a>>, Status> {
    let mut ids = named.iter().map(Names::id);
    let call = Call { client, resources: &mut ids, server_capacity: method == GET_SERVER_CAPACITY };
    match policies.admit(identity.map(|i| &**i), call) {
        Ok(bound) => Ok(bound.zip(identity).map(|(max_client_ids, identity)| Owner { identity, max_client_ids })),
        Err(denial) => Err(deny(method, identity, client, &denial)),
    }
}

/// PERMISSION_DENIED unless `client` is no one's or already `owner`'s: a caller may not renew,
/// grow or release another identity's leases.
fn owned(ledger: &Ledger, method: &'static str, client: &str, owner: Option<Owner<'_>>) -> Result<(), Status> {
    match (owner, ledger.owner(client)) {
        (Some(owner), Some(holder)) if holder != owner.identity => {
            Err(deny(method, Some(owner.identity), client, &Denial::Owned))
        }
        _ => Ok(()),
    }
}

/// When a denial was last logged, in seconds of the process's clock: one line a second at most,
/// however many calls a misconfigured or hostile client makes.
static LAST_DENIAL_LOGGED: AtomicU64 = AtomicU64::new(0);

/// A policy's refusal, counted, logged and answered.
fn deny(method: &'static str, identity: Option<&Arc<str>>, client: &str, denial: &Denial) -> Status {
    metrics::record_denial(method, denial.reason());
    let message = denial.message(identity.map(|i| &**i), client);
    let second = state::precise_now() as u64;
    let last = LAST_DENIAL_LOGGED.load(Ordering::Relaxed);
    if second >= last.saturating_add(DENIAL_LOG_INTERVAL.as_secs())
        && LAST_DENIAL_LOGGED.compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    {
        tracing::warn!(method, client, reason = denial.reason(), "{message}");
    }
    let mut status = Status::permission_denied(message);
    if let Denial::Resources(ids) = denial {
        // So that a Sluice client asks again without them and keeps the others' leases.
        name_denied(&mut status, ids, DENIED_NAMES_BYTES);
    }
    status
}

fn release(ledger: &mut Ledger, now: UnixSeconds, client: &str, ids: &[&str]) {
    for id in ids {
        ledger.release(now, client, id);
    }
}

fn capacity_response(id: &str, grant: &Grant, _: &Ledger) -> ResourceResponse {
    ResourceResponse { resource_id: id.to_owned(), gets: lease(grant), safe_capacity: Some(grant.safe_capacity) }
}

fn server_capacity_response(id: &str, grant: &Grant, ledger: &Ledger) -> ServerCapacityResourceResponse {
    let resource = ledger.resource(id).expect("a resource exists once claimed");
    ServerCapacityResourceResponse {
        resource_id: id.to_owned(),
        gets: lease(grant),
        // The parent's algorithm at an intermediate server: one algorithm per tree.
        algorithm: Some(algorithm(resource.algorithm())),
        safe_capacity: Some(grant.safe_capacity),
    }
}

/// RESOURCE_EXHAUSTED unless `claims` fit in the ledger (see [`Ledger::room`]).
fn room(
    ledger: &Ledger,
    now: UnixSeconds,
    client: &str,
    owner: Option<Owner<'_>>,
    claims: &[ResourceClaim<'_>],
    max_resources: usize,
) -> Result<(), Status> {
    ledger.room(now, client, owner, claims, max_resources).map_err(|full| {
        let (bound, message) = match full {
            Full::Resources(limit) => (
                "resources",
                format!("this server keeps at most {limit} resources; the new ones in this request do not fit"),
            ),
            Full::Leases(limit) => (
                "leases",
                format!(
                    "this server holds at most {limit} leases (--max-leases); the new ones in this request do not \
                     fit (leases already held renew as before)"
                ),
            ),
            Full::Clients(limit) => (
                "clients_per_resource",
                format!(
                    "a resource in this request has {limit} clients, the most (--max-clients-per-resource); \
                     clients holding leases renew as before"
                ),
            ),
            Full::ClientIds(limit) => (
                "client_ids_per_identity",
                format!(
                    "this identity holds leases with {limit} client ids, the most its policy allows \
                     (max_client_ids); {client:?} would be one more"
                ),
            ),
        };
        metrics::record_bound(bound);
        Status::resource_exhausted(message)
    })
}

/// Grants every claim for `owner`, answering each with `respond`.
fn grant<T>(
    ledger: &mut Ledger,
    now: UnixSeconds,
    client: &str,
    owner: Option<Owner<'_>>,
    claims: &[ResourceClaim<'_>],
    respond: impl Fn(&str, &Grant, &Ledger) -> T,
) -> Vec<T> {
    let identity = owner.map(|o| o.identity);
    claims
        .iter()
        .map(|(id, claim)| {
            let grant = ledger.claim_for(now, client, identity, id, claim);
            respond(id, &grant, ledger)
        })
        .collect()
}

/// A request's claims in parts of at most [`DEMANDS_PER_LOCK`] demands (one claim at least).
fn parts<'a, 'b>(claims: &'a [ResourceClaim<'b>]) -> Vec<&'a [ResourceClaim<'b>]> {
    let (mut parts, mut start, mut demands) = (Vec::new(), 0, 0);
    for (i, (_, claim)) in claims.iter().enumerate() {
        if i > start && demands + claim.wants.len() > DEMANDS_PER_LOCK {
            parts.push(&claims[start..i]);
            (start, demands) = (i, 0);
        }
        demands += claim.wants.len();
    }
    parts.push(&claims[start..]);
    parts
}

/// Runs a handler, recording its outcome and duration.
async fn observe<T>(
    method: &'static str,
    handle: impl Future<Output = Result<T, Status>>,
) -> Result<Response<T>, Status> {
    let start = Instant::now();
    let result = handle.await;
    let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
    if let Err(status) = &result {
        tracing::debug!(method, code = ?code, message = status.message(), "request refused");
    }
    metrics::record_request(method, code, start.elapsed());
    result.map(Response::new)
}

/// Who calls, as the connection's TLS client certificate says.
fn identity<T>(request: &Request<T>) -> Option<Arc<str>> {
    request.extensions().get::<Caller>().and_then(|caller| caller.identity.clone())
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

impl CapacityService {
    /// Grants `client`'s claims, already validated, on this master's ledger: in [`parts`], one
    /// hold of the lock each, letting other calls in between, so that no request holds the
    /// lock for long however much it claims. The whole request must fit when it starts, and each
    /// part again when its turn comes (others may have taken the room meanwhile: then the parts
    /// before stay granted). `Ok(Err)` with who the master is once this server is not.
    async fn grant_in_parts<T>(
        &self,
        method: &'static str,
        client: &str,
        owner: Option<Owner<'_>>,
        claims: &[ResourceClaim<'_>],
        respond: impl Fn(&str, &Grant, &Ledger) -> T,
    ) -> Result<Result<Vec<T>, Mastership>, Status> {
        let mut responses = Vec::with_capacity(claims.len());
        for (i, part) in parts(claims).into_iter().enumerate() {
            if i > 0 {
                tokio::task::yield_now().await;
            }
            let mut ledger = match self.master_ledger() {
                Ok(ledger) => ledger,
                Err(mastership) => return Ok(Err(mastership)),
            };
            let now = state::now();
            owned(&ledger, method, client, owner)?;
            room(&ledger, now, client, owner, if i == 0 { claims } else { part }, self.max_resources)?;
            responses.extend(grant(&mut ledger, now, client, owner, part, &respond));
            self.state.wake_parent_if_due(&ledger);
        }
        Ok(Ok(responses))
    }
}

#[tonic::async_trait]
impl Capacity for CapacityService {
    async fn discovery(&self, _: Request<DiscoveryRequest>) -> Result<Response<DiscoveryResponse>, Status> {
        observe("Discovery", async {
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
        .await
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        observe(GET_CAPACITY, async {
            let (req, identity) = (request.get_ref(), identity(&request));
            // Checked before the lock is taken: a large request's checks hold up no one.
            let claims = validate::get_capacity(req)?;
            let owner =
                admit(self.state.config().policies(), identity.as_ref(), GET_CAPACITY, &req.client_id, &claims)?;
            Ok(match self.grant_in_parts(GET_CAPACITY, &req.client_id, owner, &claims, capacity_response).await? {
                Ok(response) => GetCapacityResponse { response, mastership: None },
                Err(mastership) => GetCapacityResponse { response: Vec::new(), mastership: Some(mastership) },
            })
        })
        .await
    }

    async fn get_server_capacity(
        &self,
        request: Request<GetServerCapacityRequest>,
    ) -> Result<Response<GetServerCapacityResponse>, Status> {
        observe(GET_SERVER_CAPACITY, async {
            let (req, identity) = (request.get_ref(), identity(&request));
            let claims = validate::get_server_capacity(req)?;
            let policies = self.state.config();
            let owner = admit(policies.policies(), identity.as_ref(), GET_SERVER_CAPACITY, &req.server_id, &claims)?;
            Ok(
                match self
                    .grant_in_parts(GET_SERVER_CAPACITY, &req.server_id, owner, &claims, server_capacity_response)
                    .await?
                {
                    Ok(response) => GetServerCapacityResponse { response, mastership: None },
                    Err(mastership) => GetServerCapacityResponse { response: Vec::new(), mastership: Some(mastership) },
                },
            )
        })
        .await
    }

    async fn release_capacity(
        &self,
        request: Request<ReleaseCapacityRequest>,
    ) -> Result<Response<ReleaseCapacityResponse>, Status> {
        observe(RELEASE_CAPACITY, async {
            let (req, identity) = (request.get_ref(), identity(&request));
            let ids = validate::release_capacity(req)?;
            let owner =
                admit(self.state.config().policies(), identity.as_ref(), RELEASE_CAPACITY, &req.client_id, &ids)?;
            Ok(match self.master_ledger() {
                Ok(mut ledger) => {
                    owned(&ledger, RELEASE_CAPACITY, &req.client_id, owner)?;
                    release(&mut ledger, state::now(), &req.client_id, &ids);
                    ReleaseCapacityResponse { mastership: None }
                }
                Err(mastership) => ReleaseCapacityResponse { mastership: Some(mastership) },
            })
        })
        .await
    }
}
