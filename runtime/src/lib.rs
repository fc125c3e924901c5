//! What a Sluice process is made of besides its job, shared by the capacity server and the
//! sidecar:
//!
//! - [`cli`]: flags (one parser, exit code 64 on a bad one) and output that survives a closed pipe;
//! - [`telemetry`]: structured logs;
//! - [`reload`]: configuration files and TLS files polled and put into force when they change;
//! - [`admin`]: the HTTP admin listener on a thread of its own;
//! - [`process`]: start-up failures, the configuration file, termination signals;
//! - [`procstat`]: the process's CPU, memory and file descriptors, and its build, for /metrics;
//! - [`html`], [`when`], [`chart`], [`history`]: what the status pages are drawn with — escaping,
//!   dates and ages, small SVG charts, and the bounded history of samples they chart;
//! - [`clock`]: the wall clock in the protocol's terms.
#![forbid(unsafe_code)]

pub mod admin;
pub mod chart;
pub mod cli;
pub mod clock;
pub mod defaults;
pub mod history;
pub mod html;
pub mod process;
pub mod procstat;
pub mod reload;
pub mod telemetry;
pub mod when;
