//! A configuration made ready for the data path: each listener's target and compiled rules, a
//! gate per resource and a client per upstream. A reload builds a new plan that keeps the gates
//! and upstream clients whose settings did not change, so their tokens, in-flight counts, demand
//! history and pooled connections carry over.

use std::{collections::HashMap, sync::Arc};

use tokio::sync::mpsc::UnboundedSender;

use crate::{
    classify::{Charge, Rules},
    config::Config,
    gate::Gate,
    metrics::UpstreamTiming,
    proxy::UpstreamClient,
};

pub struct Plan {
    pub config: Arc<Config>,
    /// In the configuration's order, which a reload cannot change.
    pub listeners: Vec<Arc<ListenerPlan>>,
    /// In the configuration's order.
    pub gates: Vec<Arc<Gate>>,
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
    /// `first_use` hears of each resource's first request (the lease client's cue); `None` in
    /// standalone mode, where gates hold their configured capacity.
    pub fn build(
        config: Config,
        previous: Option<&Plan>,
        first_use: Option<&UnboundedSender<Arc<str>>>,
    ) -> Result<Plan, String> {
        let mut upstreams = HashMap::new();
        for u in &config.upstreams {
            let kept = previous.and_then(|p| p.upstream(&u.name)).filter(|c| c.config() == u);
            let client = match kept {
                Some(c) => c.clone(),
                None => Arc::new(UpstreamClient::new(u).map_err(|e| format!("upstreams ({}): {e}", u.name))?),
            };
            upstreams.insert(u.name.clone(), client);
        }
        let gates: Vec<Arc<Gate>> = config
            .resources
            .iter()
            .map(|r| match previous.and_then(|p| p.gate(&r.id)).filter(|g| g.settings() == r) {
                Some(g) => g.clone(),
                None => Arc::new(Gate::new(r.clone(), first_use.cloned())),
            })
            .collect();
        let gate = |id: &str| gates.iter().find(|g| &*g.id == id).cloned().expect("rules name declared resources");
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
                            gates: r.resources.iter().map(|id| gate(id)).collect(),
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
        Ok(Plan { config: Arc::new(config), listeners, gates, upstreams })
    }

    pub fn gate(&self, id: &str) -> Option<&Arc<Gate>> {
        self.gates.iter().find(|g| &*g.id == id)
    }

    fn upstream(&self, name: &str) -> Option<&Arc<UpstreamClient>> {
        self.upstreams.get(name)
    }
}
