//! Sluice's sidecar: a transparent HTTP/1.1, HTTP/2 and gRPC reverse proxy that classifies each
//! request into resources, leases their capacity from the capacity servers (the Doorman client
//! half) and delays or rejects what exceeds the lease.
//!
//! Its floors, from the bottom: [`core`] holds the admission and lease logic and knows nothing of
//! clocks, locks or I/O; [`canonical`] reads a request's attributes one way; [`config`] is the
//! configuration file, read and checked; [`metrics`] names every series; [`enforce`] holds the
//! resources on the data path and the rules; [`plan`] makes a configuration ready for the data
//! path, its upstream clients ([`upstream`]) included; [`stack`] is the data path as tower layers,
//! served by [`listener`] over Sluice's HTTP (`sluice-http`); [`control`] is the rest of the
//! process (leasing, admin, reload) and [`kube`] puts the sidecar into Kubernetes pods.
#![forbid(unsafe_code)]

mod body;
pub mod canonical;
pub mod cli;
pub mod config;
pub mod control;
pub mod core;
pub mod defaults;
pub mod embed;
pub mod enforce;
pub mod kube;
mod listener;
mod metrics;
pub mod plan;
mod refusal;
mod rlqs;
pub mod rls;
mod stack;
mod upstream;
