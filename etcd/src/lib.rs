//! etcd's v3 lease and election services, as far as master election uses them: generated from
//! `proto/`, a subset of etcd's own API files with the same packages, names and field
//! numbers, so the clients speak to any etcd 3.4 or later.
#![forbid(unsafe_code)]

/// `etcdserverpb`: the lease service and the response header.
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// `mvccpb`: a key-value pair as etcd stores it.
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

/// `v3electionpb`: the election service (campaign, observe, resign).
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}
