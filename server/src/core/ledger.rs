//! The ledger: every resource a server has seen, under the current templates, and since when the
//! server has been serving (which decides learning mode).

use std::sync::Arc;

use hashbrown::HashMap;

use crate::defaults::EXPIRY_PER_CLAIM;

use super::{
    resource::{Claim, Grant, Resource},
    store::UnixSeconds,
    template::Repository,
};

#[derive(Debug)]
pub struct Ledger {
    repository: Arc<Repository>,
    resources: HashMap<String, Resource>,
    serving_since: UnixSeconds,
}

impl Ledger {
    /// An empty ledger that starts serving — and learning — at `now`.
    pub fn new(repository: Arc<Repository>, now: UnixSeconds) -> Ledger {
        Ledger { repository, resources: HashMap::new(), serving_since: now }
    }

    pub fn repository(&self) -> &Arc<Repository> {
        &self.repository
    }

    /// Applies a new configuration to every resource at once.
    pub fn set_repository(&mut self, repository: Arc<Repository>) {
        for (id, resource) in &mut self.resources {
            resource.set_template(repository.find(id).clone());
        }
        self.repository = repository;
    }

    pub fn serving_since(&self) -> UnixSeconds {
        self.serving_since
    }

    /// Whether a resource is still rebuilding its picture of outstanding leases (SPEC §3.4).
    pub fn is_learning(&self, resource: &Resource, now: UnixSeconds) -> bool {
        learning(self.serving_since, resource, now)
    }

    pub fn claim(&mut self, now: UnixSeconds, client: &str, resource_id: &str, claim: &Claim) -> Grant {
        let repository = &self.repository;
        let resource = self
            .resources
            .entry_ref(resource_id)
            .or_insert_with(|| Resource::new(repository.find(resource_id).clone()));
        resource.expire(now, EXPIRY_PER_CLAIM);
        let learning = learning(self.serving_since, resource, now);
        resource.claim(client, claim, now, learning)
    }

    /// Forgets a client's lease on a resource; false if it held none.
    pub fn release(&mut self, client: &str, resource_id: &str) -> bool {
        self.resources.get_mut(resource_id).is_some_and(|r| r.release(client))
    }

    /// Forgets up to `budget` expired leases, and resources left without leases; returns how
    /// many leases.
    pub fn expire(&mut self, now: UnixSeconds, budget: usize) -> usize {
        let mut done = 0;
        self.resources.retain(|_, resource| {
            if done < budget {
                done += resource.expire(now, budget - done);
            }
            !resource.leases().is_empty()
        });
        done
    }

    /// How many resources the ledger holds.
    pub fn len(&self) -> usize {
        self.resources.len()
    }

    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }

    pub fn resource(&self, id: &str) -> Option<&Resource> {
        self.resources.get(id)
    }

    pub fn resources(&self) -> impl Iterator<Item = (&str, &Resource)> {
        self.resources.iter().map(|(id, r)| (id.as_str(), r))
    }
}

fn learning(serving_since: UnixSeconds, resource: &Resource, now: UnixSeconds) -> bool {
    now < serving_since.saturating_add(resource.template().algorithm.learning_seconds())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Algorithm, Kind, Template};

    #[test]
    fn a_claim_forgets_a_bounded_number_of_expired_leases() {
        let template = Template {
            identifier_glob: "*".into(),
            capacity: 1e9,
            safe_capacity: None,
            description: None,
            algorithm: Algorithm {
                kind: Kind::FairShare,
                lease_length: 10,
                refresh_interval: 1,
                parameters: vec![],
                learning_mode_duration: Some(0),
            },
        };
        let mut ledger = Ledger::new(Arc::new(Repository::new(vec![template]).unwrap()), 0);
        let claim = Claim { wants: 1.0, subclients: 1.0, has: None };
        let expired = EXPIRY_PER_CLAIM + 500;
        for i in 0..expired {
            ledger.claim(0, &format!("c{i}"), "r", &claim);
        }
        ledger.claim(10, "late", "r", &claim);
        assert_eq!(ledger.resource("r").unwrap().leases().len(), expired - EXPIRY_PER_CLAIM + 1);
        // The sweep takes the rest, and drops resources left without leases.
        assert_eq!(ledger.expire(10, usize::MAX), 500);
        assert_eq!(ledger.expire(20, usize::MAX), 1);
        assert!(ledger.is_empty());
    }
}
