//! The `rate_limit_service` section: its envoyproxy/ratelimit files read and checked, and each
//! limit of their domains made a resource of the sidecar's own kind — fixed, or keyed by what its
//! descriptor's open entries match — so that leasing, fallbacks, reloads, metrics and the status
//! page treat them as any other resource.

use std::{collections::HashSet, path::Path, sync::Arc};

use sluice_client::defaults::MAX_RESOURCES_PER_REQUEST;
use sluice_ratelimit::{Domain, MAX_FILES};

use super::{
    Burst, KeyAttribute, KeySpec, RateLimitService, Resource,
    document::RateLimitServiceDoc,
    values::{count, duration, fallback},
};
use crate::{
    core::{Capacity, Kind},
    defaults,
};

/// The files a configuration's text names, resolved against `base`: what a reload watches.
pub fn named_files(text: &str, base: &Path) -> Vec<std::path::PathBuf> {
    sluice_ratelimit::named_files(text, "rate_limit_service", base)
}

/// The service and its limits' resources; relative file names are read from `base`, the folder
/// of the configuration file that names them.
pub(super) fn rate_limit_service(
    doc: RateLimitServiceDoc,
    base: &Path,
    standalone: bool,
) -> Result<(RateLimitService, Vec<Resource>), String> {
    let at = |field: &str| format!("rate_limit_service.{field}");
    if doc.files.is_empty() || doc.files.len() > MAX_FILES {
        return Err(format!(
            "{}: from 1 to {MAX_FILES} envoyproxy/ratelimit files, got {}",
            at("files"),
            doc.files.len()
        ));
    }
    let max_requests =
        count(doc.max_requests, &at("max_requests"), defaults::MAX_REQUESTS, defaults::MAX_REQUESTS_LIMIT)?;
    let max_keys = count(doc.max_keys, &at("max_keys"), defaults::MAX_KEYS, MAX_RESOURCES_PER_REQUEST)?;
    let idle_timeout =
        doc.idle_timeout.as_deref().map_or(Ok(defaults::KEY_IDLE_TIMEOUT), |t| duration(t, &at("idle_timeout")))?;
    let when_unreachable = fallback(doc.when_unreachable);
    let mut domains = Vec::with_capacity(doc.files.len());
    let mut names = HashSet::new();
    let mut resources = Vec::new();
    for (i, file) in doc.files.iter().enumerate() {
        let here = format!("{}[{i}] ({})", at("files"), file.display());
        let text = sluice_ratelimit::read(&base.join(file)).map_err(|e| format!("{here}: cannot read: {e}"))?;
        let domain = Domain::parse(&text).map_err(|e| format!("{here}: {e}"))?;
        if !names.insert(domain.name.clone()) {
            return Err(format!("{here}: domain {:?} is in an earlier file too", domain.name));
        }
        for limit in &domain.limits {
            let Some(quota) = limit.quota else { continue };
            let rate = Capacity::saturating(quota.rate());
            if limit.detailed && limit.keyed && max_keys > defaults::MAX_KEYS_WITH_SERIES {
                return Err(format!(
                    "{here}: limit {:?} has detailed_metric: max_keys must be at most {} for series per value",
                    limit.id,
                    defaults::MAX_KEYS_WITH_SERIES
                ));
            }
            resources.push(Resource {
                id: limit.id.clone(),
                kind: Kind::Rate,
                capacity: standalone.then_some(rate),
                burst: Burst::Window(quota.window()),
                priority: 0,
                when_unreachable,
                // Until a server names a safe capacity, each sidecar holds the whole limit alone,
                // as one envoyproxy/ratelimit instance would.
                safe_capacity: Some(rate),
                key: limit.keyed.then(|| KeySpec {
                    per: KeyAttribute::Descriptor,
                    max_keys,
                    idle_timeout,
                    per_key_metrics: limit.detailed,
                }),
            });
        }
        domains.push(Arc::new(domain));
    }
    let service = RateLimitService { address: doc.address, files: doc.files, domains, max_requests };
    Ok((service, resources))
}
