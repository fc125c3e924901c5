//! The server's request validation (SPEC §3.9): any GetCapacity, GetServerCapacity or
//! ReleaseCapacity message decoded from the input is refused with INVALID_ARGUMENT or passes
//! with only bounded, finite amounts and valid, distinct ids; what passes is then served by a
//! ledger without a panic, every lease finite and within what was wanted.
#![no_main]
#![forbid(unsafe_code)]

use std::{
    collections::HashSet,
    sync::{Arc, LazyLock},
};

use libfuzzer_sys::fuzz_target;
use prost::Message;
use sluice_proto::{GetCapacityRequest, GetServerCapacityRequest, ReleaseCapacityRequest};
use sluice_server::{
    config,
    core::{Claim, Ledger, Repository},
    defaults::{MAX_AMOUNT, MAX_ID_BYTES},
    service, validate,
};
use tonic::Code;

const REPOSITORY: &str = "
resources:
  - {identifier_glob: 'f*', capacity: 100, algorithm: {kind: FAIR_SHARE, lease_length: 60, refresh_interval: 5}}
  - {identifier_glob: 'p*', capacity: 100, algorithm: {kind: PROPORTIONAL_SHARE, lease_length: 60, refresh_interval: 5}}
  - {identifier_glob: '*', capacity: 10, algorithm: {kind: STATIC, lease_length: 60, refresh_interval: 5}}
";

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_BYTES && !id.chars().any(char::is_control)
}

fn valid_claims(claims: &[(&str, Claim)]) {
    let mut ids = HashSet::new();
    for (id, claim) in claims {
        assert!(valid_id(id) && ids.insert(*id), "id {id:?}");
        assert!(!claim.wants.is_empty());
        for w in &claim.wants {
            assert!((0.0..=MAX_AMOUNT).contains(&w.wants), "wants {}", w.wants);
            assert!(w.subclients >= 0.0 && w.subclients.is_finite(), "subclients {}", w.subclients);
        }
        assert!((0.0..=MAX_AMOUNT).contains(&claim.total_wants()));
        assert!(claim.has.is_none_or(|h| (0.0..=MAX_AMOUNT).contains(&h)), "has {:?}", claim.has);
    }
}

/// Parsed once: parsing and compiling the globs would cost more than a run.
static REPOSITORY_PARSED: LazyLock<Arc<Repository>> =
    LazyLock::new(|| Arc::new(config::parse(REPOSITORY, std::path::Path::new("")).expect("valid")));

fuzz_target!(|data: &[u8]| {
    let Some((&kind, message)) = data.split_first() else { return };
    let mut ledger = Ledger::new(REPOSITORY_PARSED.clone(), 0);
    let now = 1_000;
    match kind % 3 {
        0 => {
            let Ok(req) = GetCapacityRequest::decode(message) else { return };
            match validate::get_capacity(&req) {
                Err(status) => assert_eq!(status.code(), Code::InvalidArgument),
                Ok(claims) => {
                    assert!(valid_id(&req.client_id));
                    valid_claims(&claims);
                    let response = service::get_capacity(&mut ledger, now, &req, None, usize::MAX).expect("validated");
                    for (answer, (id, claim)) in response.response.iter().zip(&claims) {
                        assert_eq!(answer.resource_id, *id);
                        let capacity = answer.gets.capacity;
                        assert!(capacity.is_finite() && (0.0..=claim.total_wants()).contains(&capacity));
                    }
                }
            }
        }
        1 => {
            let Ok(req) = GetServerCapacityRequest::decode(message) else { return };
            match validate::get_server_capacity(&req) {
                Err(status) => assert_eq!(status.code(), Code::InvalidArgument),
                Ok(claims) => {
                    assert!(valid_id(&req.server_id));
                    valid_claims(&claims);
                    let response =
                        service::get_server_capacity(&mut ledger, now, &req, None, usize::MAX).expect("validated");
                    for answer in &response.response {
                        let capacity = answer.gets.capacity;
                        assert!(capacity.is_finite() && capacity >= 0.0, "capacity {capacity}");
                    }
                }
            }
        }
        _ => {
            let Ok(req) = ReleaseCapacityRequest::decode(message) else { return };
            match validate::release_capacity(&req) {
                Err(status) => assert_eq!(status.code(), Code::InvalidArgument),
                Ok(ids) => {
                    assert!(valid_id(&req.client_id));
                    assert!(ids.iter().all(|id| valid_id(id)));
                    service::release_capacity(&mut ledger, now, &req, None).expect("validated");
                }
            }
        }
    }
});
