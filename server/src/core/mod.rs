//! The sans-I/O core of the capacity server: plain data structures driven by the caller's clock
//! (every method that needs the time takes `now`). The gRPC service, the tests and the
//! simulator all drive this same code.
//!
//! - [`band`]: demands ordered by wants per subclient, with exact running sums;
//! - [`algorithm`]: the four ways of sharing a capacity;
//! - [`store`]: the leases of one resource and their expiry;
//! - [`template`]: configuration templates and their lookup;
//! - [`resource`]: a resource's template and leases, turning claims into grants;
//! - [`ledger`]: all resources of a server, and learning mode.

pub mod algorithm;
pub mod band;
pub mod ledger;
pub mod resource;
pub mod store;
pub mod template;

pub use algorithm::{Algorithm, Kind, Parameter};
pub use band::{Band, Demand, Sums};
pub use ledger::Ledger;
pub use resource::{Claim, Grant, Resource};
pub use store::{LeaseStore, LeaseView, UnixSeconds};
pub use template::{Repository, Template, TemplateError};
