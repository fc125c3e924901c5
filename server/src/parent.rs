//! An intermediate server's link to its parent on the network (SPEC §3.6): sends the ledger's
//! bulk `GetServerCapacity` when it is due — at the refresh interval, or at once when a resource
//! appears — to the parent node's master, following redirects and re-discovering the master
//! after errors. A ledger with more resources than a request may carry asks in parts.

use std::{sync::Arc, time::Duration};

use sluice_client::{Answer, discovery::Servers};
use sluice_proto::{GetServerCapacityRequest, GetServerCapacityResponse};

use crate::{
    defaults::{MAX_RESOURCES_PER_REQUEST, PARENT_CHECK_INTERVAL},
    state::{self, State},
};

/// Runs for the life of the server.
pub async fn run(state: Arc<State>) {
    let Some(link) = state.parent() else { return };
    loop {
        if link.servers.renewed_since_failure() {
            state.ledger().retry_parent();
        }
        let now = state::precise_now();
        let due = state.ledger().parent_due();
        let wait = due.map_or(PARENT_CHECK_INTERVAL, |due| {
            Duration::from_secs_f64((due - now).clamp(0.0, PARENT_CHECK_INTERVAL.as_secs_f64()))
        });
        if !wait.is_zero() {
            tokio::select! {
                () = state.parent_wanted() => {}
                () = tokio::time::sleep(wait) => {}
            }
            continue;
        }
        let Some(request) = state.ledger().parent_request(now) else { continue };
        let answer = ask(&link.servers, request).await;
        let now = state::precise_now();
        match answer {
            Ok(response) => {
                if let Answer::Redirect(master) = state.ledger().on_parent_response(now, response) {
                    link.servers.redirect(master);
                }
            }
            Err(error) => {
                tracing::warn!(%error, parent = link.servers.address(), "asking the parent failed; leases stay until they expire");
                let untried = link.servers.move_on();
                state.ledger().on_parent_error(now, untried);
            }
        }
    }
}

/// Sends `request` in parts of at most [`MAX_RESOURCES_PER_REQUEST`] resources, what a parent
/// takes at once (ten leaves of 10,000 keys each make a region of 100,000), and takes their
/// answers as one. A part answered with a redirect ends it: the next round asks the master for
/// everything.
async fn ask(servers: &Servers, request: GetServerCapacityRequest) -> Result<GetServerCapacityResponse, String> {
    let mut whole = GetServerCapacityResponse::default();
    for part in parts(request) {
        let answer =
            servers.call("GetServerCapacity", |mut c| async move { c.get_server_capacity(part).await }).await?;
        if answer.mastership.is_some() {
            return Ok(answer);
        }
        whole.response.extend(answer.response);
    }
    Ok(whole)
}

/// `request` cut into requests of at most [`MAX_RESOURCES_PER_REQUEST`] resources (one, when it
/// has none: an empty request still says the server is there).
fn parts(request: GetServerCapacityRequest) -> Vec<GetServerCapacityRequest> {
    let GetServerCapacityRequest { server_id, mut resource } = request;
    let mut parts = Vec::with_capacity(resource.len().div_ceil(MAX_RESOURCES_PER_REQUEST).max(1));
    while resource.len() > MAX_RESOURCES_PER_REQUEST {
        let rest = resource.split_off(MAX_RESOURCES_PER_REQUEST);
        parts.push(GetServerCapacityRequest { server_id: server_id.clone(), resource });
        resource = rest;
    }
    parts.push(GetServerCapacityRequest { server_id, resource });
    parts
}

#[cfg(test)]
mod tests {
    use sluice_proto::ServerCapacityResourceRequest;

    use super::*;

    #[test]
    fn a_request_goes_in_parts_a_parent_takes() {
        let request = |n: usize| GetServerCapacityRequest {
            server_id: "leaf".into(),
            resource: (0..n)
                .map(|i| ServerCapacityResourceRequest { resource_id: i.to_string(), ..Default::default() })
                .collect(),
        };
        let sizes = |n| parts(request(n)).iter().map(|p| p.resource.len()).collect::<Vec<_>>();
        assert_eq!(sizes(0), [0]);
        assert_eq!(sizes(MAX_RESOURCES_PER_REQUEST), [MAX_RESOURCES_PER_REQUEST]);
        assert_eq!(sizes(2 * MAX_RESOURCES_PER_REQUEST + 1), [MAX_RESOURCES_PER_REQUEST, MAX_RESOURCES_PER_REQUEST, 1]);
        let ids: Vec<String> =
            parts(request(25_000)).into_iter().flat_map(|p| p.resource).map(|r| r.resource_id).collect();
        assert_eq!(ids, (0..25_000).map(|i| i.to_string()).collect::<Vec<_>>(), "every resource once, in order");
    }
}
