//! Enforcement, below the data path's layers: the resources on the data path ([`Gate`], one per
//! key for a [`Keyed`] resource), the rules that say what a request is charged ([`Rules`]), one
//! way through a charge's gates ([`pass`]), what forwarded calls met upstream ([`outcomes`]), bodies charged by their bytes ([`Metered`]), and a
//! rate limit service domain's limits with their resources ([`DomainLimits`]).

mod domain;
mod gate;
mod keyed;
mod metered;
mod outcomes;
mod pass;
mod rules;

pub use domain::{DomainLimits, Enforced, Met};
pub use gate::{Denied, Gate, Permits};
pub use keyed::{Keyed, KeyedFigures};
pub use metered::{CutOff, Metered, up_front};
pub use outcomes::is_overload;
pub use pass::{Limited, pass};
pub use rules::{Charge, Charged, Costed, Resolved, Rules, attribute};
