//! etcd's v3 API as far as the server uses it — leases and the election service for master
//! election, KV reads and watches for configuration from an etcd key, authentication — and the
//! auth administration its tests call: generated from `proto/`, a subset of etcd's own API files
//! with the same packages, names and field numbers, so the clients speak to any etcd 3.4 or later.
#![forbid(unsafe_code)]

/// `etcdserverpb`: the KV, watch, lease and auth services and the response header.
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// `mvccpb`: a key-value pair as etcd stores it, and a watch's events.
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

/// `authpb`: a role's permission on keys.
pub mod authpb {
    tonic::include_proto!("authpb");
}

/// `v3electionpb`: the election service (campaign, observe, resign).
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}
