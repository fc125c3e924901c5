//! Keys unused for their resource's idle timeout are dropped, and their leases released, so
//! that memory and the servers' resources follow the live keys.

use std::sync::Arc;

use arc_swap::ArcSwap;
use sluice_http::sync::stopped;
use tokio::sync::watch;

use super::leasing::Leasing;
use crate::{defaults, plan::Plan};

/// Sweeps the keyed resources of the plan in force every [`defaults::KEY_SWEEP_INTERVAL`]
/// until `stop`; the leases of the keys dropped are released.
pub async fn sweep(live: Arc<ArcSwap<Plan>>, leasing: Option<Arc<Leasing>>, mut stop: watch::Receiver<bool>) {
    let mut ticks = tokio::time::interval(defaults::KEY_SWEEP_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopped(&mut stop) => return,
        }
        let plan = live.load_full();
        let dropped: Vec<String> = plan.keyed.iter().flat_map(|k| k.sweep()).collect();
        if dropped.is_empty() {
            continue;
        }
        tracing::debug!(keys = dropped.len(), "idle keys dropped");
        if let Some(leasing) = &leasing {
            leasing.forget(&plan, dropped).await;
        }
    }
}
