//! The sans-I/O core of the capacity server: plain data structures driven by the caller's clock
//! (every method that needs the time takes `now`). The gRPC service, the tests and the
//! simulator all drive this same code.
//!
//! - [`adaptive`]: capacities learned from the service a resource protects;
//! - [`band`]: demands ordered by wants per subclient, with exact running sums;
//! - [`algorithm`]: the four ways of sharing a capacity;
//! - [`store`]: the leases of one resource and their expiry;
//! - [`glob`]: resource id globs;
//! - [`template`]: configuration templates and their lookup;
//! - [`policy`]: who may use which client ids and ask for which resources;
//! - [`resource`]: a resource's template and leases, turning claims into grants;
//! - [`priority`]: demands by priority band, shared from the most important down;
//! - [`ledger`]: all resources of a server, and learning mode;
//! - [`parent`]: an intermediate server's requests to its parent (when to ask them is
//!   `sluice_client::Schedule`, shared with the sidecar's lease client).

pub mod adaptive;
pub mod algorithm;
pub mod band;
pub mod glob;
pub mod ledger;
pub mod parent;
pub mod policy;
pub mod priority;
pub mod resource;
pub mod store;
pub mod template;

pub use adaptive::{Adaptive, Controller, Decision, Fleet, Reason, Report};
pub use algorithm::{Algorithm, Choice, Kind, Parameter};
pub use band::{Band, Demand, Sums};
pub use ledger::{Full, Ledger, Owner};
pub use parent::Parent;
pub use policy::{Call, Denial, Policies, Policy};
pub use priority::{Bands, PriorityMode, SubtreeWants, Wants};
pub use resource::{Claim, Grant, ParentLease, Resource, Supply};
pub use store::{Holds, LeaseStore, LeaseView, UnixSeconds};
pub use template::{Repository, Template, TemplateError, check_algorithm};
