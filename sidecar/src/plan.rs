//! A configuration made ready for the data path: each listener's target and compiled rules, a
//! gate per resource and a client per upstream. A reload builds a new plan that keeps the
//! upstream clients whose settings did not change, with their pooled connections (a CA bundle
//! rotated on disk renews its upstream's client: `ca_rotation`), and the gate
//! of every resource whose kind did not change, its other settings changed in place: tokens,
//! in-flight counts, queued requests and demand history carry over, so a reload never lets a
//! resource's limit lapse. (A resource that changes kind starts afresh: rate tokens and
//! in-flight requests are not the same measure.)

use std::{collections::HashMap, sync::Arc};

use tokio::sync::mpsc::UnboundedSender;

use crate::{
    config::Config,
    enforce::{Charge, DomainLimits, Enforced, Gate, Keyed, Rules},
    metrics::UpstreamTiming,
    upstream::UpstreamClient,
};

pub struct Plan {
    pub config: Arc<Config>,
    /// In the configuration's order, which a reload cannot change.
    pub listeners: Vec<Arc<ListenerPlan>>,
    /// The fixed resources, in the configuration's order.
    pub gates: Vec<Arc<Gate>>,
    /// The keyed resources, in the configuration's order.
    pub keyed: Vec<Arc<Keyed>>,
    /// The rate limit service's domains by name.
    pub domains: HashMap<String, Arc<DomainLimits>>,
    upstreams: HashMap<String, Arc<UpstreamClient>>,
}

pub struct ListenerPlan {
    pub name: Arc<str>,
    pub target: Target,
    pub rules: Rules,
    pub timing: UpstreamTiming,
}

pub enum Target {
    Fixed(Arc<UpstreamClient>),
    /// Lower-case host (no port) → upstream.
    ByHost(HashMap<String, Arc<UpstreamClient>>),
}

impl Plan {
    /// `cue` tells the lease client of each resource's first request and of demand surging past
    /// its lease; `None` in standalone mode, where gates hold their configured capacity.
    pub fn build(
        config: Config,
        previous: Option<&Plan>,
        cue: Option<&UnboundedSender<Arc<str>>>,
    ) -> Result<Plan, String> {
        Plan::assemble(config, previous, cue, HashMap::new())
    }

    /// This plan with `renewed` upstream clients in place of theirs (CA bundles rotated), each
    /// only if its upstream's settings are still those it was made for.
    pub fn renew(
        &self,
        renewed: HashMap<String, Arc<UpstreamClient>>,
        cue: Option<&UnboundedSender<Arc<str>>>,
    ) -> Result<Plan, String> {
        Plan::assemble(Config::clone(&self.config), Some(self), cue, renewed)
    }

    /// The upstream clients.
    pub fn upstreams(&self) -> impl Iterator<Item = &Arc<UpstreamClient>> {
        self.upstreams.values()
    }

    fn assemble(
        config: Config,
        previous: Option<&Plan>,
        cue: Option<&UnboundedSender<Arc<str>>>,
        mut renewed: HashMap<String, Arc<UpstreamClient>>,
    ) -> Result<Plan, String> {
        let mut upstreams = HashMap::new();
        for u in &config.upstreams {
            let kept = previous.and_then(|p| p.upstream(&u.name)).filter(|c| c.config() == u).cloned();
            let client = match renewed.remove(&u.name).filter(|c| c.config() == u).or(kept) {
                Some(c) => c,
                None => Arc::new(UpstreamClient::new(u).map_err(|e| format!("upstreams ({}): {e}", u.name))?),
            };
            upstreams.insert(u.name.clone(), client);
        }
        // Gates change in place here, so nothing after this point may fail: a rejected reload
        // must leave the configuration in force untouched.
        let gates: Vec<Arc<Gate>> = config
            .resources
            .iter()
            .filter(|r| r.key.is_none())
            .map(|r| match previous.and_then(|p| p.gate(&r.id)).filter(|g| g.kind == r.kind) {
                Some(g) => {
                    g.reconfigure(r);
                    g.clone()
                }
                None => Arc::new(Gate::new(r.clone(), cue.cloned())),
            })
            .collect();
        let keyed: Vec<Arc<Keyed>> = config
            .resources
            .iter()
            .filter(|r| r.key.is_some())
            .map(|r| match previous.and_then(|p| p.keyed(&r.id)).filter(|k| k.keeps(r)) {
                Some(k) => {
                    k.reconfigure(r);
                    k.clone()
                }
                None => Arc::new(Keyed::new(r.clone(), cue.cloned())),
            })
            .collect();
        let gate = |id: &str| gates.iter().find(|g| &*g.id == id).cloned();
        let keyed_at = |id: &str| keyed.iter().find(|k| &*k.id == id).cloned();
        let listeners = config
            .listeners
            .iter()
            .map(|l| {
                let target = match &l.upstream {
                    Some(name) => Target::Fixed(upstreams[name].clone()),
                    None => Target::ByHost(
                        config
                            .upstreams
                            .iter()
                            .flat_map(|u| u.hosts.iter().map(|h| (h.clone(), upstreams[&u.name].clone())))
                            .collect(),
                    ),
                };
                let rules = config
                    .rules
                    .iter()
                    .filter(|r| r.matcher.listener.as_ref().is_none_or(|name| name == &l.name))
                    .map(|r| {
                        let charge = Charge {
                            rule: r.name.clone(),
                            gates: r.resources.iter().filter_map(|id| gate(id)).collect(),
                            keyed: (r.resources.iter().enumerate())
                                .filter_map(|(i, id)| Some((i, keyed_at(id)?)))
                                .collect(),
                            cost: r.cost.clone(),
                            on_limit: r.on_limit,
                            max_wait: r.max_wait,
                        };
                        (r.matcher.clone(), Arc::new(charge))
                    })
                    .collect();
                let name: Arc<str> = l.name.as_str().into();
                Arc::new(ListenerPlan {
                    timing: UpstreamTiming::new(name.clone()),
                    name,
                    target,
                    rules: Rules::new(rules),
                })
            })
            .collect();
        let domains = match &config.rate_limit_service {
            Some(service) => {
                let fixed: HashMap<&str, &Arc<Gate>> = gates.iter().map(|g| (&*g.id, g)).collect();
                let by_key: HashMap<&str, &Arc<Keyed>> = keyed.iter().map(|k| (&*k.id, k)).collect();
                let enforced = |limit: &sluice_ratelimit::Limit| match (fixed.get(&*limit.id), by_key.get(&*limit.id)) {
                    (Some(gate), _) => Enforced::Fixed(Arc::clone(gate)),
                    (None, Some(keyed)) => Enforced::Keyed(Arc::clone(keyed)),
                    // The configuration made no resource of it: it has no quota.
                    (None, None) => Enforced::Unlimited,
                };
                (service.domains.iter())
                    .map(|d| (d.name.clone(), Arc::new(DomainLimits::new(d.clone(), enforced))))
                    .collect()
            }
            None => HashMap::new(),
        };
        Ok(Plan { config: Arc::new(config), listeners, gates, keyed, domains, upstreams })
    }

    /// The unit tests' plan, standalone: see [`crate::config::for_test`].
    #[cfg(test)]
    pub fn for_test(rest: &str) -> Plan {
        Plan::build(crate::config::for_test(rest), None, None).expect("a plan")
    }

    pub fn gate(&self, id: &str) -> Option<&Arc<Gate>> {
        self.gates.iter().find(|g| &*g.id == id)
    }

    pub fn keyed(&self, id: &str) -> Option<&Arc<Keyed>> {
        self.keyed.iter().find(|k| &*k.id == id)
    }

    /// The gate of a resource the lease client knows: a fixed resource, or a live key.
    pub fn lease_gate(&self, id: &str) -> Option<Arc<Gate>> {
        self.gate(id).cloned().or_else(|| self.keyed.iter().find_map(|k| k.find(id)))
    }

    /// Every gate: the fixed resources', then the live keys'.
    pub fn all_gates(&self) -> Vec<Arc<Gate>> {
        let mut gates = self.gates.clone();
        gates.extend(self.keyed.iter().flat_map(|k| k.gates()));
        gates
    }

    fn upstream(&self, name: &str) -> Option<&Arc<UpstreamClient>> {
        self.upstreams.get(name)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{config, core::Cost};

    fn plan(resource: &str, previous: Option<&Plan>) -> Plan {
        let config = config::for_test(&format!("resources:\n  - {resource}\nrules:\n  - {{resource: r}}\n"));
        Plan::build(config, previous, None).unwrap()
    }

    #[tokio::test]
    async fn a_reload_changes_a_resource_in_place() {
        let first = plan("{id: r, kind: concurrency, capacity: 1}", None);
        let gate = first.gate("r").unwrap().clone();
        assert!(gate.admit(Cost::ONE, Duration::ZERO).await.is_ok());

        let second = plan("{id: r, kind: concurrency, capacity: 2, priority: 3}", Some(&first));
        assert!(Arc::ptr_eq(second.gate("r").unwrap(), &gate), "the same gate");
        assert_eq!((gate.load().0, gate.applied().capacity.get()), (1.0, 2.0), "the request in flight still counts");
        assert!(gate.admit(Cost::ONE, Duration::ZERO).await.is_ok());
        assert!(gate.admit(Cost::ONE, Duration::ZERO).await.is_err(), "two in flight fill the new capacity");

        let third = plan("{id: r, kind: rate, capacity: 2}", Some(&second));
        assert!(!Arc::ptr_eq(third.gate("r").unwrap(), &gate), "another kind, another gate");
    }

    #[tokio::test]
    async fn a_raised_capacity_lets_waiters_go_at_once() {
        let first = plan("{id: r, capacity: 0.5, burst: 1}", None);
        let gate = first.gate("r").unwrap().clone();
        assert!(gate.admit(Cost::ONE, Duration::ZERO).await.is_ok());
        let started = Instant::now();
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.admit(Cost::ONE, Duration::from_secs(10)).await.is_ok() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(gate.load().1, 1, "waiting");
        let _second = plan("{id: r, capacity: 1000, burst: 1}", Some(&first));
        assert!(waiter.await.unwrap());
        assert!(started.elapsed() < Duration::from_secs(1), "its turn at the old rate was 2 s away");
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_lets_those_behind_it_go() {
        let first = plan("{id: r, kind: concurrency, capacity: 5}", None);
        let gate = first.gate("r").unwrap().clone();
        for _ in 0..4 {
            assert!(gate.admit(Cost::ONE, Duration::ZERO).await.is_ok());
        }
        let started = Instant::now();
        let wait = |cost: f64, max_wait: u64| {
            let (gate, cost) = (gate.clone(), Cost::new(cost).unwrap());
            tokio::spawn(async move { gate.admit(cost, Duration::from_millis(max_wait)).await.is_ok() })
        };
        let (big, small) = (wait(5.0, 300), wait(1.0, 5000));
        assert!(!big.await.unwrap(), "too big to fit beside the four");
        assert!(small.await.unwrap());
        assert!(started.elapsed() < Duration::from_secs(2), "it fitted as soon as the head left");
    }
}
