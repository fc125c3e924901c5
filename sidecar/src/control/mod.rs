//! The sidecar's control side, around the data path: the lease client toward the capacity
//! servers ([`leasing`]), idle keys swept away ([`sweep`]), CA bundles rotated into upstream
//! clients ([`ca_rotation`]), the admin listener and its status pages ([`admin`], [`status`]), and
//! the process wired together ([`app`]).

mod admin;
pub mod app;
mod ca_rotation;
mod leasing;
mod status;
mod sweep;
