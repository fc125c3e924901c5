//! The ledger: every resource a server has seen, under the current templates, and since when the
//! server has been serving (which decides learning mode).

use std::{collections::HashMap, sync::Arc};

use super::{
    resource::{Claim, Grant, Resource},
    store::UnixSeconds,
    template::Repository,
};

#[derive(Debug)]
pub struct Ledger {
    repository: Arc<Repository>,
    resources: HashMap<Box<str>, Resource>,
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
        if !self.resources.contains_key(resource_id) {
            let template = self.repository.find(resource_id).clone();
            self.resources.insert(resource_id.into(), Resource::new(template));
        }
        let resource = self.resources.get_mut(resource_id).expect("inserted above");
        resource.expire(now, usize::MAX);
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

    pub fn resource(&self, id: &str) -> Option<&Resource> {
        self.resources.get(id)
    }

    pub fn resources(&self) -> impl Iterator<Item = (&str, &Resource)> {
        self.resources.iter().map(|(id, r)| (&**id, r))
    }
}

fn learning(serving_since: UnixSeconds, resource: &Resource, now: UnixSeconds) -> bool {
    now < serving_since + resource.template().algorithm.learning_seconds()
}
