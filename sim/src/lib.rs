//! Sluice's simulator: a deployment of capacity servers and sidecars on a simulated clock, with
//! simulated network delay and loss, driving the real sans-I/O cores — the server's
//! [`Ledger`](sluice_server::core::Ledger) with its algorithms and learning mode, and the
//! sidecar's [`LeaseClient`](sluice_sidecar::core::LeaseClient) and
//! [`Limiter`](sluice_sidecar::core::Limiter) — so that a seed replays a run exactly.
//!
//! - [`scenario`]: the scenario file format; [`topology`]: the server tree it describes;
//! - [`clock`]: the event queue; [`network`]: delay and loss;
//! - [`load`]: offered load; [`client`]: a sidecar; [`server`]: a replicated capacity server,
//!   a root or one leasing from its parent; [`routing`]: how either reaches a server's master;
//!   [`protocol`]: the server's handling of each RPC; [`service`]: a service that can be
//!   overloaded, behind the resource;
//! - [`sim`]: the run; [`metrics`] and [`fairness`]: what it is judged by; [`adaptive`]: what a
//!   run with a service is judged by;
//! - [`report`] and [`svg`]: the table, CSV files and plots.
#![forbid(unsafe_code)]

pub mod adaptive;
pub mod client;
pub mod clock;
pub mod fairness;
pub mod load;
pub mod metrics;
pub mod network;
pub mod protocol;
pub mod report;
pub mod routing;
pub mod scenario;
pub mod server;
pub mod service;
pub mod sim;
pub mod svg;
pub mod topology;

pub use scenario::Scenario;
pub use sim::{Outcome, run};
