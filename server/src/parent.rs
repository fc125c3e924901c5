//! An intermediate server's link to its parent on the network (SPEC §3.6): sends the ledger's
//! bulk `GetServerCapacity` when it is due — at the refresh interval, or at once when a resource
//! appears — to the parent node's master, following redirects and re-discovering the master
//! after errors.

use std::{sync::Arc, time::Duration};

use sluice_client::Answer;

use crate::{
    defaults::PARENT_CHECK_INTERVAL,
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
        let answer =
            link.servers.call("GetServerCapacity", |mut c| async move { c.get_server_capacity(request).await }).await;
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
