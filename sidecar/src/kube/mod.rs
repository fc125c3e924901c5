//! The sidecar into Kubernetes pods: `inject` over YAML files, and the admission webhook over the
//! pods the API server sends.

pub mod inject;
pub mod webhook;
