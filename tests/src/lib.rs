//! Support for Sluice's end-to-end tests, load generator and demo: starting the real binaries
//! and talking to them. The tests' kit: `config` (typed configurations of both binaries, the one
//! writer of their files), `harness` (a launcher for each binary), `wait` (`eventually`, with one
//! patience) and `spelling` (the spellings of one value that keys must not tell apart).
#![forbid(unsafe_code)]

pub mod apiserver;
pub mod bench_adaptive;
pub mod bench_rls;
pub mod bench_sidecar;
pub mod browser;
pub mod cli;
pub mod config;
pub mod connections;
pub mod demo;
pub mod docker;
pub mod envoy;
pub mod etcd;
pub mod faults;
pub mod harness;
pub mod hostile;
pub mod http;
pub mod kube;
pub mod loadgen;
pub mod pki;
pub mod prometheus;
pub mod raw;
pub mod relay;
pub mod rlqs;
pub mod soak;
pub mod spelling;
pub mod upstream;
pub mod wait;
