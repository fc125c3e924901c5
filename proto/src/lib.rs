//! The wire protocols Sluice speaks: Doorman's capacity protocol (the messages and the
//! `doorman.Capacity` service, generated from `doorman.proto`, proto2, field numbers identical to
//! Doorman's) at the top, and under [`envoy`] the parts of Envoy's rate limit service (RLS v3) and
//! rate limit quota service (RLQS v3) that the sidecar serves to Envoy's `ratelimit` and
//! `rate_limit_quota` filters, with Envoy's package, names and numbers (RLQS's as Envoy 1.40
//! really uses them: see `docs/rlqs.md`).
#![forbid(unsafe_code)]

tonic::include_proto!("doorman");

/// The encoded `FileDescriptorSet` of `doorman.proto`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("doorman_descriptor");

/// Envoy's packages, nested as the generated code refers to them.
pub mod envoy {
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
        pub mod rate_limit_quota {
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }

    /// The encoded `FileDescriptorSet` of the RLS and RLQS protocols, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("envoy_rls_descriptor");
}
