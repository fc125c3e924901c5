//! The sidecar into Kubernetes pods: `inject` over YAML files, and the admission webhook over the
//! pods the API server sends.

pub mod cluster;
pub mod hold;
pub mod inject;
pub mod webhook;
