//! Sluice's capacity server: a Doorman-compatible gRPC service over a sans-I/O core.
//!
//! [`core`] holds the allocation logic and knows nothing of time sources, locks or I/O; the other
//! modules put it on the network.
#![forbid(unsafe_code)]

pub mod accept;
pub mod admin;
pub mod app;
pub mod cli;
pub mod config;
pub mod core;
pub mod defaults;
pub mod election;
pub mod etcd;
pub mod etcd_config;
pub mod identity;
pub mod inflight;
pub mod metrics;
pub mod parent;
pub mod service;
pub mod state;
pub mod status;
pub mod tls;
pub mod validate;
