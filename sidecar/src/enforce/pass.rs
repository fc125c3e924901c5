//! One way through a charge's gates, for a request and for a paced body's next piece alike: each
//! gate in order, waiting its turn as long as the deadline leaves; refused by one, the gates
//! before it get back what they granted.

use std::{
    fmt,
    sync::Arc,
    time::{Duration, Instant},
};

use super::gate::{Gate, Permits};
use crate::core::{Cost, Kind};

/// A limit's refusal: of a request, or of a paced request body's next piece.
#[derive(Clone, Debug)]
pub struct Limited {
    pub resource: Arc<str>,
    pub rule: String,
    pub kind: Kind,
    /// What the resource's limit allows now, for the RateLimit headers.
    pub capacity: f64,
    pub retry_after: Duration,
}

impl fmt::Display for Limited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Limited { resource, rule, .. } = self;
        write!(f, "rate limited by sluice: resource {resource:?} is over its capacity (rule {rule:?})")
    }
}

impl std::error::Error for Limited {}

/// Passes `cost` through `gates` (those of rule `rule`) in order, each waiting its turn until
/// `deadline` (`None`: no waiting). Each admission is told to `admitted` with the time it
/// waited; a concurrency gate's permit goes into `permits`. A refusal is counted; under
/// `shadow` the request goes on past it, otherwise the rate gates before it get their tokens
/// back (concurrency permits go with `permits`) and it is the refusal returned.
pub async fn pass(
    rule: &str,
    gates: &[Arc<Gate>],
    cost: Cost,
    deadline: Option<Instant>,
    shadow: bool,
    permits: &mut Permits,
    mut admitted: impl FnMut(&Gate, Duration),
) -> Result<(), Limited> {
    for (i, gate) in gates.iter().enumerate() {
        let budget = deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(Instant::now()));
        match gate.admit(cost, budget).await {
            Ok(waited) => admitted(gate, waited),
            Err(_) if shadow => {
                gate.metrics.record_refused(true);
                continue;
            }
            Err(denied) => {
                gate.metrics.record_refused(false);
                for earlier in gates[..i].iter().filter(|g| g.kind == Kind::Rate) {
                    earlier.refund(cost);
                }
                return Err(Limited {
                    resource: gate.id.clone(),
                    rule: rule.to_owned(),
                    kind: gate.kind,
                    capacity: gate.applied().capacity.get(),
                    retry_after: denied.retry_after,
                });
            }
        }
        if gate.kind == Kind::Concurrency {
            permits.push(gate.clone(), cost);
        }
    }
    Ok(())
}
