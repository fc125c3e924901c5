//! The run: servers and clients built from a scenario, driven by one event queue until the
//! scenario's end, sampled at fixed intervals.
//!
//! Clients ask their leaf server; intermediate servers ask their parent when their ledger says
//! a request is due (at the refresh interval, or at once when a client's claim brought a new
//! resource, as `wake_parent_if_due` wakes the binary's parent task). Every message crosses the
//! simulated network, and a loss window at either end loses it. A service behind the resource
//! is handed the calls admitted whenever a client is about to report what they met, and when
//! the service changes.

use sluice_server::{
    core::{Choice, SubtreeWants},
    defaults::{CAPACITY_RPC_TIMEOUT, MIN_REFRESH_INTERVAL, REFRESH_DECAY, SWEEP_INTERVAL},
};
use sluice_sidecar::defaults::LEASE_CHECK_INTERVAL;

use crate::{
    client::{Client, Phase},
    clock::{Clock, Time},
    load::Boost,
    metrics::{self, Cause, ClientState, Sample, Summary},
    network::Network,
    protocol::{Reply, Request},
    routing::Outgoing,
    scenario::{Action, Crash, Mishaps, Scenario, ServiceChange, Spike},
    server::Server,
    service::{Call, Record, Service},
    topology::{ClientId, Node, ServerId, Topology},
};

/// A run's record: every sample and the summary.
pub struct Outcome {
    pub name: String,
    pub description: String,
    pub clients: usize,
    pub samples: Vec<Sample>,
    pub summary: Summary,
    /// What the calls met, with a service behind the resource.
    pub record: Option<Record>,
}

enum Event {
    /// The `n`th sample, at `n · sample_every` (counted, so that times do not drift).
    Sample(u32),
    Sweep(ServerId),
    Join(ClientId),
    Leave(ClientId),
    Step(ClientId),
    /// A client looks at its demand between refreshes, as the sidecar's lease loop does every
    /// `LEASE_CHECK_INTERVAL`, and may ask early.
    Check(ClientId),
    /// A client's lease client, or an intermediate server's ledger, may be due to ask; ignored
    /// unless it is the latest wake-up scheduled.
    Wake(Node),
    Timeout(Node, u64),
    // Messages are boxed: they are large, and events are moved about in the queue.
    ToServer {
        server: ServerId,
        replica: usize,
        from: Node,
        attempt: u64,
        request: Box<Request>,
    },
    Answer {
        to: Node,
        attempt: u64,
        reply: Box<Reply>,
    },
    Spike {
        clients: Vec<ClientId>,
        boost: Boost,
        lasts: Time,
    },
    SpikeEnd {
        client: ClientId,
        spike: u64,
    },
    Crash {
        server: ServerId,
        election: Time,
        restart: Option<Time>,
    },
    Elect {
        server: ServerId,
        dead: usize,
    },
    Restart {
        server: ServerId,
        replica: usize,
    },
    Loss {
        server: Option<ServerId>,
        rate: f64,
        lasts: Time,
    },
    Service(ServiceChange),
}

struct Simulation {
    clock: Clock<Event>,
    network: Network,
    servers: Vec<Server>,
    clients: Vec<Client>,
    resource: String,
    /// The template's: configured, or an adaptive one's initial capacity.
    capacity: f64,
    service: Option<(Service, Record)>,
    /// The servers pass up one Σ wants per band (`subtree_wants: sum`), not profiles.
    sums_up: bool,
    learning_end: Time,
    sample_every: Time,
    samples: Vec<Sample>,
    shifts: Vec<(Time, Cause, String)>,
}

/// Runs a scenario to its end.
pub fn run(scenario: &Scenario) -> Result<Outcome, String> {
    let topology = Topology::build(&scenario.topology);
    let repository = scenario.repository()?;
    let template = repository.find(&scenario.resource).clone();
    let mut seeds = fastrand::Rng::with_seed(scenario.seed);
    let replicas = scenario.topology.replicas;
    let network = Network::new(scenario.network.clone(), seeds.u64(..));
    // Every server has the same repository: an intermediate server's own template only decides
    // what it hands out before its parent first answers (safe capacity).
    let servers = topology.servers.iter().map(|spec| {
        let parent = spec.parent.map(|parent| (parent, replicas));
        Server::new(spec.name.clone(), replicas, parent, repository.clone(), 0.0, seeds.u64(..))
    });
    let mut sim = Simulation {
        clock: Clock::new(LEASE_CHECK_INTERVAL.as_secs_f64()),
        network,
        servers: servers.collect(),
        clients: Vec::with_capacity(scenario.client_count()),
        resource: scenario.resource.clone(),
        capacity: template.capacity,
        service: scenario.service.as_ref().map(|spec| {
            let service = Service::new(spec);
            let record = Record::new(&service, scenario.client_count(), scenario.duration);
            (service, record)
        }),
        sums_up: SubtreeWants::of(&template.algorithm) == SubtreeWants::Sum,
        learning_end: template.algorithm.learning_seconds() as Time,
        sample_every: scenario.sample_every,
        samples: Vec::new(),
        shifts: Vec::new(),
    };
    for group in &scenario.clients {
        for _ in 0..group.count {
            let id = sim.clients.len();
            let server = topology.server_of(id);
            let calling = sim.service.is_some();
            let client =
                Client::new(format!("client-{id}"), group, &sim.resource, server, replicas, calling, seeds.u64(..));
            sim.clock.at(group.join, Event::Join(id));
            if let Some(leave) = group.leave {
                sim.clock.at(leave, Event::Leave(id));
            }
            sim.clients.push(client);
        }
    }
    for spec in &scenario.events {
        let event = sim.scenario_event(&topology, &spec.action)?;
        sim.clock.at(spec.at, event);
    }
    if let Some(mishaps) = &scenario.mishaps {
        sim.mishaps(&topology, mishaps, scenario.duration, &mut fastrand::Rng::with_seed(seeds.u64(..)));
    }
    for server in 0..sim.servers.len() {
        sim.clock.at(0.0, Event::Sweep(server));
    }
    sim.clock.at(0.0, Event::Sample(0));
    while let Some(event) = sim.clock.next_until(scenario.duration) {
        sim.handle(event);
    }
    let record = sim.finish();
    let rpcs = sim.servers.iter().map(|s| s.rpcs).sum();
    let refresh = leaf_refresh(template.algorithm.refresh_interval, topology.depth());
    let horizon = template.algorithm.lease_length as Time;
    let (root_rpcs, shifts) = (sim.servers[0].rpcs, sim.shifts);
    let summary = Summary::compute(&sim.samples, shifts, sim.learning_end, refresh, horizon, rpcs, root_rpcs);
    Ok(Outcome {
        name: scenario.name.clone(),
        description: scenario.description.clone(),
        clients: sim.clients.len(),
        samples: sim.samples,
        summary,
        record,
    })
}

/// The refresh interval the servers clients talk to hand out, `depth` levels from the root
/// whose template says `root`: each level hands out `REFRESH_DECAY` of what it got, in whole
/// seconds, at least `MIN_REFRESH_INTERVAL` (the core's rule, for measuring against).
pub fn leaf_refresh(root: i64, depth: usize) -> Time {
    let decayed = (1..depth).fold(root, |r, _| ((r as f64 * REFRESH_DECAY) as i64).max(MIN_REFRESH_INTERVAL));
    decayed as Time
}

impl Simulation {
    fn scenario_event(&self, topology: &Topology, action: &Action) -> Result<Event, String> {
        let server = |name: &str| topology.find(name).ok_or_else(|| format!("no server {name:?}"));
        Ok(match action {
            Action::Spike(Spike { clients, add, to, lasts }) => {
                let boost = match (add, to) {
                    (Some(add), _) => Boost::Add(*add),
                    (None, to) => Boost::To(to.unwrap_or_default()),
                };
                Event::Spike { clients: clients.clone(), boost, lasts: *lasts }
            }
            Action::Crash(Crash { server: name, election, restart }) => {
                Event::Crash { server: server(name)?, election: *election, restart: *restart }
            }
            Action::Loss(loss) => Event::Loss {
                server: loss.server.as_deref().map(server).transpose()?,
                rate: loss.rate,
                lasts: loss.lasts,
            },
            Action::Service(change) => Event::Service(change.clone()),
        })
    }

    /// One mishap every `every` seconds, its kind, victim and details drawn from `rng`.
    fn mishaps(&mut self, topology: &Topology, mishaps: &Mishaps, end: Time, rng: &mut fastrand::Rng) {
        let mut at = mishaps.from;
        while at < end {
            let mut kinds = Vec::new();
            if let Some(spike) = &mishaps.spike {
                let client = rng.usize(..self.clients.len());
                kinds.push(Event::Spike { clients: vec![client], boost: Boost::Add(spike.add), lasts: spike.lasts });
            }
            if let Some(crash) = &mishaps.crash {
                let server = rng.usize(..topology.servers.len());
                kinds.push(Event::Crash { server, election: crash.election, restart: crash.restart });
            }
            if let Some(outage) = &mishaps.outage {
                let server = Some(rng.usize(..topology.servers.len()));
                kinds.push(Event::Loss { server, rate: 1.0, lasts: outage.lasts });
            }
            let chosen = rng.usize(..kinds.len());
            self.clock.at(at, kinds.swap_remove(chosen));
            at += mishaps.every;
        }
    }

    fn now(&self) -> Time {
        self.clock.now()
    }

    fn handle(&mut self, event: Event) {
        let now = self.now();
        match event {
            Event::Sample(n) => {
                self.sample();
                self.clock.at(f64::from(n + 1) * self.sample_every, Event::Sample(n + 1));
            }
            Event::Sweep(server) => {
                self.servers[server].sweep(now);
                self.clock.after(SWEEP_INTERVAL.as_secs_f64(), Event::Sweep(server));
            }
            Event::Join(c) => {
                self.clients[c].join(now);
                if let Some(every) = self.clients[c].load().step_every() {
                    self.clock.after(every, Event::Step(c));
                }
                self.clock.after_period(Event::Check(c));
                self.shifts.push((now, Cause::Demand, format!("{} joins", self.clients[c].id())));
                self.wake(Node::Client(c));
            }
            Event::Leave(c) => {
                let client = &mut self.clients[c];
                if let Some(request) = client.leave(now) {
                    let (server, replica) = (client.server, client.release_to());
                    self.send(server, replica, Node::Client(c), 0, request);
                }
                self.shifts.push((now, Cause::Demand, format!("{} leaves", self.clients[c].id())));
            }
            Event::Check(c) => {
                if self.clients[c].phase == Phase::Active {
                    self.clients[c].check_demand(now);
                    self.wake(Node::Client(c));
                    self.clock.after_period(Event::Check(c));
                }
            }
            Event::Step(c) => {
                if self.clients[c].phase == Phase::Active {
                    self.clients[c].step(now);
                    if let Some(every) = self.clients[c].load().step_every() {
                        self.clock.after(every, Event::Step(c));
                    }
                }
            }
            Event::Wake(node) => {
                let outgoing = match node {
                    Node::Client(c) => {
                        let client = &mut self.clients[c];
                        if client.wake_at != Some(now) {
                            return;
                        }
                        client.wake_at = None;
                        if client.due().is_some_and(|due| due <= now) {
                            // What it reports has to be served first.
                            self.serve();
                            self.clients[c].ask(now)
                        } else {
                            None
                        }
                    }
                    Node::Server(s) => {
                        let server = &mut self.servers[s];
                        if server.wake_at != Some(now) {
                            return;
                        }
                        server.wake_at = None;
                        if server.parent_due().is_some_and(|due| due <= now) { server.ask_parent(now) } else { None }
                    }
                };
                if let Some(outgoing) = outgoing {
                    self.dispatch(node, outgoing);
                }
                self.wake(node);
            }
            Event::Timeout(node, attempt) => {
                match node {
                    Node::Client(c) => self.clients[c].on_timeout(now, attempt),
                    Node::Server(s) => self.servers[s].on_parent_timeout(now, attempt),
                }
                self.wake(node);
            }
            Event::ToServer { server, replica, from, attempt, request } => {
                if let Some(reply) = self.servers[server].handle(now, replica, &request)
                    && let Some(transit) = self.network.transit(now, &ends(server, from))
                {
                    self.clock.after(transit, Event::Answer { to: from, attempt, reply: Box::new(reply) });
                }
                // A claim that brought a new resource makes the request to the parent due at
                // once, as `wake_parent_if_due` wakes the binary's parent task.
                self.wake(Node::Server(server));
            }
            Event::Answer { to: Node::Client(c), attempt, reply } => {
                let client = &mut self.clients[c];
                if client.phase != Phase::Active {
                    return;
                }
                if let Some(outgoing) = client.on_reply(now, attempt, *reply, &self.servers[client.server]) {
                    self.dispatch(Node::Client(c), outgoing);
                }
                self.wake(Node::Client(c));
            }
            Event::Answer { to: Node::Server(s), attempt, reply } => {
                let parent = self.servers[s].parent.expect("only intermediate servers ask");
                // Parents come before their children.
                let (before, after) = self.servers.split_at_mut(s);
                if let Some(outgoing) = after[0].on_parent_reply(now, attempt, *reply, &before[parent]) {
                    self.dispatch(Node::Server(s), outgoing);
                }
                self.wake(Node::Server(s));
            }
            Event::Spike { clients, boost, lasts } => {
                for &c in &clients {
                    let client = &mut self.clients[c];
                    client.boost(now, Some(boost));
                    client.spikes += 1;
                    self.clock.after(lasts, Event::SpikeEnd { client: c, spike: client.spikes });
                    self.shifts.push((now, Cause::Demand, format!("{} spikes", client.id())));
                }
            }
            Event::SpikeEnd { client: c, spike } => {
                let client = &mut self.clients[c];
                if client.spikes == spike {
                    client.boost(now, None);
                    self.shifts.push((now, Cause::Demand, format!("{} calms down", client.id())));
                }
            }
            Event::Crash { server, election, restart } => {
                if let Some(dead) = self.servers[server].crash() {
                    self.shifts.push((now, Cause::Failure, format!("{} crashes", self.servers[server].address(dead))));
                    self.clock.after(election, Event::Elect { server, dead });
                    if let Some(restart) = restart {
                        self.clock.after(restart, Event::Restart { server, replica: dead });
                    }
                }
            }
            Event::Elect { server, dead } => {
                self.servers[server].elect(now, dead);
                self.shifts.push((now, Cause::Failure, format!("{} elects a master", self.servers[server].name)));
                self.wake(Node::Server(server));
            }
            Event::Restart { server, replica } => self.servers[server].restart(replica),
            Event::Loss { server, rate, lasts } => {
                self.network.lose(server, rate, now + lasts);
                let name = server.map_or("every server", |s| &self.servers[s].name).to_owned();
                self.shifts.push((now, Cause::Failure, format!("{:.0}% loss at {name}", rate * 100.0)));
                self.shifts.push((now + lasts, Cause::Failure, format!("loss at {name} ends")));
            }
            Event::Service(ServiceChange { workers, service_time }) => {
                self.serve();
                let Some((service, record)) = &mut self.service else { return };
                service.change(now, workers, service_time);
                record.capacity.push((now, service.capacity()));
                let what = format!("the service serves {:.0} calls/s", service.capacity());
                self.shifts.push((now, Cause::Failure, what));
            }
        }
    }

    /// Hands every client's calls admitted up to now to the service, in the order they were
    /// sent, and its answers to the clients and the record.
    fn serve(&mut self) {
        let now = self.now();
        let Some((service, record)) = &mut self.service else { return };
        let mut calls = Vec::new();
        for (client, c) in self.clients.iter_mut().enumerate() {
            calls.extend(c.take_calls(now).into_iter().map(|at| Call { client, at }));
        }
        // Stable: calls sent at the same instant go in the clients' order.
        calls.sort_by(|a, b| a.at.total_cmp(&b.at));
        let mut answers = Vec::new();
        service.serve(&calls, now, &mut answers);
        for answer in answers {
            record.add(&answer);
            self.clients[answer.call.client].expect(answer);
        }
    }

    /// The record of what the calls met, every call sent by the end answered.
    fn finish(&mut self) -> Option<Record> {
        self.serve();
        let (mut service, mut record) = self.service.take()?;
        let mut answers = Vec::new();
        service.serve(&[], f64::INFINITY, &mut answers);
        answers.iter().for_each(|answer| record.add(answer));
        Some(record)
    }

    /// Sends a node's RPC to its server (a client's leaf, a server's parent), with a timeout
    /// for its answer.
    fn dispatch(&mut self, node: Node, outgoing: Outgoing) {
        let Outgoing { replica, request, attempt } = outgoing;
        let server = match node {
            Node::Client(c) => self.clients[c].server,
            Node::Server(s) => self.servers[s].parent.expect("only intermediate servers ask"),
        };
        self.send(server, replica, node, attempt, request);
        self.clock.after(CAPACITY_RPC_TIMEOUT.as_secs_f64(), Event::Timeout(node, attempt));
    }

    fn send(&mut self, server: ServerId, replica: usize, from: Node, attempt: u64, request: Request) {
        if let Some(transit) = self.network.transit(self.now(), &ends(server, from)) {
            self.clock.after(transit, Event::ToServer { server, replica, from, attempt, request: Box::new(request) });
        }
    }

    /// Schedules a wake-up for when the node is next due to ask.
    fn wake(&mut self, node: Node) {
        let now = self.now();
        let (due, wake_at) = match node {
            Node::Client(c) => {
                let client = &mut self.clients[c];
                (client.due(), &mut client.wake_at)
            }
            Node::Server(s) => {
                let server = &mut self.servers[s];
                (server.parent_due(), &mut server.wake_at)
            }
        };
        if let Some(due) = due {
            let at = due.max(now);
            if *wake_at != Some(at) {
                *wake_at = Some(at);
                self.clock.at(at, Event::Wake(node));
            }
        }
    }

    fn sample(&mut self) {
        let now = self.now();
        let mut states = Vec::with_capacity(self.clients.len());
        let (mut wants, mut admitted, mut granted, mut unleased) = (0.0, 0.0, 0.0, 0);
        for client in self.clients.iter_mut().filter(|c| c.phase == Phase::Active) {
            wants += client.wants(now);
            admitted += client.take_admitted();
            states.push(ClientState { server: client.server, demand: client.demand(), has: client.has(now) });
            match client.leased(now) {
                Some(lease) => granted += lease,
                None => unleased += 1,
            }
        }
        let elapsed = self.samples.last().map_or(0.0, |s| now - s.t);
        let capacity = self.servers[0].learned(&self.resource).unwrap_or(self.capacity);
        let (jain, flat_jain, tree_jain) = if now >= self.learning_end {
            let parents: Vec<Option<ServerId>> = self.servers.iter().map(|s| s.parent).collect();
            metrics::jain(capacity, self.sums_up.then_some(&parents), &states)
        } else {
            (None, None, None)
        };
        self.samples.push(Sample {
            t: now,
            capacity,
            wants,
            demand: states.iter().map(|s| s.demand).sum(),
            has: states.iter().map(|s| s.has).sum(),
            granted,
            unleased,
            reserved: self.servers[0].granted(&self.resource, now),
            admitted: if elapsed > 0.0 { admitted / elapsed } else { 0.0 },
            jain,
            flat_jain,
            tree_jain,
        });
    }
}

/// The servers at the ends of a message between `server` and `node`: a loss window at either
/// end loses it.
fn ends(server: ServerId, node: Node) -> [ServerId; 2] {
    match node {
        Node::Client(_) => [server; 2],
        Node::Server(other) => [server, other],
    }
}
