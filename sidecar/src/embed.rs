//! A standalone sidecar inside another program (tests, tools): the data path of a configuration
//! served on the caller's runtime, without the process around it (no admin listener, reload,
//! signals or leasing).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};

use crate::{config, listener, plan::Plan};

/// A configuration's listeners, served until [`Embedded::stop`] or drop.
pub struct Embedded {
    /// Where each listener of the configuration listens, in its order (a port of 0 is the one
    /// the system chose).
    pub listeners: Vec<SocketAddr>,
    stop: watch::Sender<bool>,
    serving: Vec<JoinHandle<()>>,
}

impl Embedded {
    /// Serves the listeners of the configuration `yaml`, which must be standalone (no `server`).
    pub async fn start(yaml: &str) -> Result<Embedded, String> {
        let config = config::parse(yaml)?;
        if config.server.is_some() {
            return Err("an embedded sidecar is standalone: the configuration has a `server`".into());
        }
        let mut bound = Vec::new();
        for l in &config.listeners {
            let listener = TcpListener::bind(l.address).await.map_err(|e| format!("{}: {e}", l.address))?;
            bound.push(listener);
        }
        let listeners = bound.iter().map(|l| l.local_addr()).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
        let live = Arc::new(ArcSwap::from_pointee(Plan::build(config, None, None)?));
        let (stop, stopped) = watch::channel(false);
        let serving = bound
            .into_iter()
            .enumerate()
            .map(|(i, l)| tokio::spawn(listener::serve(l, i, live.clone(), stopped.clone(), Duration::ZERO)))
            .collect();
        Ok(Embedded { listeners, stop, serving })
    }

    /// Stops accepting and waits for the listeners to close their connections.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        for serving in self.serving.drain(..) {
            let _ = serving.await;
        }
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
