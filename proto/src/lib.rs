//! Doorman's capacity protocol: the messages and the `doorman.Capacity` service, generated from
//! `doorman.proto` (proto2, field numbers identical to Doorman's).
#![forbid(unsafe_code)]

tonic::include_proto!("doorman");

/// The encoded `FileDescriptorSet` of `doorman.proto`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("doorman_descriptor");
