//! Sluice's capacity server: a Doorman-compatible gRPC service over a sans-I/O core.
#![forbid(unsafe_code)]

pub mod core;
