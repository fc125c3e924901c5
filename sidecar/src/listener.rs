//! A configured listener, served: the accept loop of Sluice's HTTP with a stack per connection,
//! under the limits the configuration in force gives when it is accepted, and one bound on the
//! requests in flight over all its connections (`max_requests`), which a reload keeps.

use std::{sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use sluice_http::{h1::Limits, serve};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, watch},
};

use crate::{config, plan::Plan, refusal, stack};

/// Serves the `index`-th configured listener until `stop` turns true, then lets open
/// connections finish their requests for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    index: usize,
    live: Arc<ArcSwap<Plan>>,
    stop: watch::Receiver<bool>,
    grace: Duration,
) {
    let (max_connections, max_requests) = {
        let listener = &live.load().config.listeners[index];
        (listener.max_connections, listener.max_requests)
    };
    let in_flight = Arc::new(Semaphore::new(max_requests));
    let connection = || {
        let limits = limits(&live.load().config.listeners[index]);
        (stack::stack(live.clone(), index, in_flight.clone()), limits)
    };
    serve::serve(listener, max_connections, connection, refusal::reject, stop, grace).await;
}

/// A connection's limits, from its listener's configuration.
fn limits(l: &config::Listener) -> Limits {
    Limits {
        header_read_timeout: l.header_read_timeout,
        idle_timeout: l.idle_timeout,
        send_timeout: l.send_timeout,
        max_header_bytes: l.max_header_bytes,
    }
}
