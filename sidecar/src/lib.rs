//! Sluice's sidecar: a transparent HTTP/1.1, HTTP/2 and gRPC reverse proxy that classifies each
//! request into resources, leases their capacity from the capacity servers (the Doorman client
//! half) and delays or rejects what exceeds the lease.
//!
//! [`core`] holds the admission and lease logic and knows nothing of clocks, locks or I/O. The
//! data path is the tower stack in [`stack`]: [`rescue`] → [`route`] → [`classify`] →
//! [`admission`] → [`metrics`] → [`proxy`]. [`h1`] speaks HTTP/1.1 to the application and the
//! upstreams, and [`pool`] dials upstreams and pools their connections. [`leasing`] drives the
//! lease client against the capacity servers.
#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod app;
pub mod body;
pub mod ca_rotation;
pub mod canonical;
pub mod classify;
pub mod cli;
pub mod config;
pub mod core;
pub mod embed;
pub mod defaults;
pub mod gate;
pub mod h1;
pub mod inject;
pub mod keyed;
pub mod leasing;
pub mod listener;
pub mod metered;
pub mod metrics;
pub mod plan;
pub mod pool;
pub mod proxy;
pub mod rescue;
pub mod respond;
pub mod route;
pub mod stack;
pub mod status;
pub mod sync;
pub mod time;
pub mod webhook;
