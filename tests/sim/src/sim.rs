//! The run: servers and clients built from a scenario, driven by one event queue until the
//! scenario's end, sampled at fixed intervals.

use sluice_server::defaults::CAPACITY_RPC_TIMEOUT;
use sluice_server::defaults::SWEEP_INTERVAL;

use crate::{
    client::{Client, Outgoing, Phase},
    clock::{Clock, Time},
    load::Boost,
    metrics::{self, ClientState, Sample, Summary},
    network::Network,
    protocol::{Reply, Request},
    scenario::{Action, Crash, Mishaps, Scenario, Spike},
    server::Server,
    topology::{ClientId, ServerId, Topology},
};

/// A run's record: every sample and the summary.
pub struct Outcome {
    pub name: String,
    pub description: String,
    pub clients: usize,
    pub samples: Vec<Sample>,
    pub summary: Summary,
}

enum Event {
    /// The `n`th sample, at `n · sample_every` (counted, so that times do not drift).
    Sample(u32),
    Sweep(ServerId),
    Join(ClientId),
    Leave(ClientId),
    Step(ClientId),
    /// A client's lease client may be due; ignored unless it is the latest wake-up scheduled.
    Wake(ClientId),
    Timeout(ClientId, u64),
    // Messages are boxed: they are large, and events are moved about in the queue.
    ToServer {
        server: ServerId,
        replica: usize,
        from: ClientId,
        attempt: u64,
        request: Box<Request>,
    },
    ToClient {
        client: ClientId,
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
}

struct Simulation {
    clock: Clock<Event>,
    network: Network,
    servers: Vec<Server>,
    clients: Vec<Client>,
    /// The servers clients talk to, whose ledgers overshoot is measured on.
    leaves: Vec<ServerId>,
    resource: String,
    capacity: f64,
    learning_end: Time,
    sample_every: Time,
    samples: Vec<Sample>,
    shifts: Vec<(Time, String)>,
}

/// Runs a scenario to its end.
pub fn run(scenario: &Scenario) -> Result<Outcome, String> {
    let topology = Topology::build(&scenario.topology);
    if topology.depth() > 1 {
        return Err(format!(
            "{}: needs the server tree (phase 2): it has {} levels of servers, and only a root is simulated yet",
            scenario.name,
            topology.depth()
        ));
    }
    let repository = scenario.repository()?;
    let template = repository.find(&scenario.resource).clone();
    let mut seeds = fastrand::Rng::with_seed(scenario.seed);
    let replicas = scenario.topology.replicas;
    let servers = topology.servers.iter().map(|s| Server::new(s.name.clone(), replicas, repository.clone(), 0.0));
    let mut sim = Simulation {
        clock: Clock::default(),
        network: Network::new(scenario.network.clone(), seeds.u64(..)),
        servers: servers.collect(),
        clients: Vec::with_capacity(scenario.client_count()),
        leaves: topology.leaves.clone(),
        resource: scenario.resource.clone(),
        capacity: template.capacity,
        learning_end: template.algorithm.learning_seconds() as Time,
        sample_every: scenario.sample_every,
        samples: Vec::new(),
        shifts: Vec::new(),
    };
    for group in &scenario.clients {
        for _ in 0..group.count {
            let id = sim.clients.len();
            let server = topology.server_of(id);
            let client = Client::new(format!("client-{id}"), group, &sim.resource, server, replicas, seeds.u64(..));
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
    let rpcs = sim.servers.iter().map(|s| s.rpcs).sum();
    let refresh = template.algorithm.refresh_interval as Time;
    let summary = Summary::compute(&sim.samples, sim.shifts, sim.learning_end, refresh, rpcs);
    Ok(Outcome {
        name: scenario.name.clone(),
        description: scenario.description.clone(),
        clients: sim.clients.len(),
        samples: sim.samples,
        summary,
    })
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
                self.shifts.push((now, format!("{} joins", self.clients[c].id())));
                self.wake(c);
            }
            Event::Leave(c) => {
                let client = &mut self.clients[c];
                if let Some(request) = client.leave(now) {
                    let (server, replica) = (client.server, client.release_to());
                    self.send(server, replica, c, 0, request);
                }
                self.shifts.push((now, format!("{} leaves", self.clients[c].id())));
            }
            Event::Step(c) => {
                if self.clients[c].phase == Phase::Active {
                    self.clients[c].step(now);
                    if let Some(every) = self.clients[c].load().step_every() {
                        self.clock.after(every, Event::Step(c));
                    }
                }
            }
            Event::Wake(c) => {
                let client = &mut self.clients[c];
                if client.wake_at != Some(now) {
                    return;
                }
                client.wake_at = None;
                if client.due().is_some_and(|due| due <= now)
                    && let Some(outgoing) = client.ask(now)
                {
                    self.dispatch(c, outgoing);
                }
                self.wake(c);
            }
            Event::Timeout(c, attempt) => {
                self.clients[c].on_timeout(now, attempt);
                self.wake(c);
            }
            Event::ToServer { server, replica, from, attempt, request } => {
                if let Some(reply) = self.servers[server].handle(now, replica, &request)
                    && let Some(transit) = self.network.transit(now, server)
                {
                    self.clock.after(transit, Event::ToClient { client: from, attempt, reply: Box::new(reply) });
                }
            }
            Event::ToClient { client: c, attempt, reply } => {
                let client = &mut self.clients[c];
                if client.phase != Phase::Active {
                    return;
                }
                if let Some(outgoing) = client.on_reply(now, attempt, *reply, &self.servers[client.server]) {
                    self.dispatch(c, outgoing);
                }
                self.wake(c);
            }
            Event::Spike { clients, boost, lasts } => {
                for &c in &clients {
                    let client = &mut self.clients[c];
                    client.boost(now, Some(boost));
                    client.spikes += 1;
                    self.clock.after(lasts, Event::SpikeEnd { client: c, spike: client.spikes });
                    self.shifts.push((now, format!("{} spikes", client.id())));
                }
            }
            Event::SpikeEnd { client: c, spike } => {
                let client = &mut self.clients[c];
                if client.spikes == spike {
                    client.boost(now, None);
                    self.shifts.push((now, format!("{} calms down", client.id())));
                }
            }
            Event::Crash { server, election, restart } => {
                if let Some(dead) = self.servers[server].crash() {
                    self.shifts.push((now, format!("{} crashes", self.servers[server].address(dead))));
                    self.clock.after(election, Event::Elect { server, dead });
                    if let Some(restart) = restart {
                        self.clock.after(restart, Event::Restart { server, replica: dead });
                    }
                }
            }
            Event::Elect { server, dead } => {
                self.servers[server].elect(now, dead);
                self.shifts.push((now, format!("{} elects a master", self.servers[server].name)));
            }
            Event::Restart { server, replica } => self.servers[server].restart(replica),
            Event::Loss { server, rate, lasts } => {
                self.network.lose(server, rate, now + lasts);
                let name = server.map_or("every server", |s| &self.servers[s].name).to_owned();
                self.shifts.push((now, format!("{:.0}% loss at {name}", rate * 100.0)));
                self.shifts.push((now + lasts, format!("loss at {name} ends")));
            }
        }
    }

    /// Sends a client's RPC, with a timeout for its answer.
    fn dispatch(&mut self, c: ClientId, outgoing: Outgoing) {
        let Outgoing { replica, request, attempt } = outgoing;
        self.send(self.clients[c].server, replica, c, attempt, request);
        self.clock.after(CAPACITY_RPC_TIMEOUT.as_secs_f64(), Event::Timeout(c, attempt));
    }

    fn send(&mut self, server: ServerId, replica: usize, from: ClientId, attempt: u64, request: Request) {
        if let Some(transit) = self.network.transit(self.now(), server) {
            self.clock.after(transit, Event::ToServer { server, replica, from, attempt, request: Box::new(request) });
        }
    }

    /// Schedules a wake-up for when the client's lease client is next due.
    fn wake(&mut self, c: ClientId) {
        let now = self.now();
        let client = &mut self.clients[c];
        if let Some(due) = client.due() {
            let at = due.max(now);
            if client.wake_at != Some(at) {
                client.wake_at = Some(at);
                self.clock.at(at, Event::Wake(c));
            }
        }
    }

    fn sample(&mut self) {
        let now = self.now();
        let mut states = Vec::with_capacity(self.clients.len());
        let (mut wants, mut admitted) = (0.0, 0.0);
        for client in self.clients.iter_mut().filter(|c| c.phase == Phase::Active) {
            wants += client.wants(now);
            admitted += client.take_admitted();
            states.push(ClientState { demand: client.demand(), has: client.has(now) });
        }
        let elapsed = self.samples.last().map_or(0.0, |s| now - s.t);
        self.samples.push(Sample {
            t: now,
            capacity: self.capacity,
            wants,
            demand: states.iter().map(|s| s.demand).sum(),
            has: states.iter().map(|s| s.has).sum(),
            granted: self.leaves.iter().map(|&s| self.servers[s].granted(&self.resource, now)).sum(),
            admitted: if elapsed > 0.0 { admitted / elapsed } else { 0.0 },
            jain: (now >= self.learning_end).then(|| metrics::jain(self.capacity, &states)).flatten(),
        });
    }
}
