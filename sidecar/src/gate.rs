//! One resource on the data path: the core's [`Limiter`] behind a lock, requests parked in FIFO
//! order on channels while they wait their turn, the lease in force, and the resource's metric
//! handles (resolved once, so a request pays an atomic add per metric).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::{mpsc::UnboundedSender, oneshot};

use crate::{
    config::Resource,
    core::{Kind, Limiter, Offer, Seconds, Ticket},
    defaults,
    metrics::GateMetrics,
    sync,
};

/// The lease a gate currently enforces, for status and metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// INFINITY: no limit.
    pub capacity: f64,
    /// e.g. "leased", "standalone", "fallback_safe".
    pub mode: &'static str,
    /// Unix seconds, when leased.
    pub expiry: Option<i64>,
}

pub struct Gate {
    pub id: Arc<str>,
    /// Fixed for the gate's life: a reload that changes it makes a new gate.
    pub kind: Kind,
    state: Mutex<State>,
    origin: Instant,
    used: AtomicBool,
    first_use: Option<UnboundedSender<Arc<str>>>,
    pub metrics: GateMetrics,
}

struct State {
    limiter: Limiter,
    waiters: HashMap<Ticket, oneshot::Sender<()>>,
    applied: Applied,
    settings: Resource,
}

/// Why a request may not pass.
pub struct Refused {
    pub retry_after: Duration,
}

impl Gate {
    /// A gate at the resource's standalone capacity (0 when it has none, until a lease applies).
    pub fn new(settings: Resource, first_use: Option<UnboundedSender<Arc<str>>>) -> Gate {
        let capacity = settings.capacity.unwrap_or(0.0);
        let mode = if first_use.is_some() { "pending" } else { "standalone" };
        let burst = burst(&settings, capacity);
        let id: Arc<str> = settings.id.as_str().into();
        let metrics = GateMetrics::new(&id);
        let gate = Gate {
            kind: settings.kind,
            state: Mutex::new(State {
                limiter: Limiter::new(settings.kind, capacity, burst, 0.0),
                waiters: HashMap::new(),
                applied: Applied { capacity, mode, expiry: None },
                settings,
            }),
            origin: Instant::now(),
            used: AtomicBool::new(false),
            first_use,
            metrics,
            id,
        };
        gate.metrics.applied(&gate.applied());
        gate
    }

    /// Takes a reload's settings for this resource (of the same kind) in place: its tokens,
    /// in-flight count, queue and demand history carry over, and a new standalone capacity or
    /// burst applies from now as a new lease would, without a burst of its own.
    pub fn reconfigure(&self, settings: &Resource) {
        let mut state = self.lock();
        if state.settings == *settings {
            return;
        }
        state.settings = settings.clone();
        let applied = match self.first_use {
            None => Applied { capacity: settings.capacity.unwrap_or(0.0), ..state.applied.clone() },
            Some(_) => state.applied.clone(),
        };
        self.enforce(&mut state, applied);
    }

    /// Whether a request has been charged to this resource yet.
    pub fn used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }

    fn now(&self) -> Seconds {
        self.origin.elapsed().as_secs_f64()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        sync::lock(&self.state)
    }

    /// Asks to pass `cost`, waiting in FIFO order up to `max_wait`. `Ok` carries the time
    /// waited.
    pub async fn admit(&self, cost: f64, max_wait: Duration) -> Result<Duration, Refused> {
        if !self.used.load(Ordering::Relaxed)
            && !self.used.swap(true, Ordering::Relaxed)
            && let Some(first_use) = &self.first_use
        {
            let _ = first_use.send(self.id.clone());
        }
        let (ticket, receiver, wake) = {
            let mut state = self.lock();
            let now = self.now();
            match state.limiter.offer(now, cost, max_wait.as_secs_f64()) {
                Offer::Admitted => return Ok(Duration::ZERO),
                Offer::Rejected { retry_after } => return Err(self.refusal(retry_after)),
                Offer::Queued(ticket) => {
                    let (sender, receiver) = oneshot::channel();
                    state.waiters.insert(ticket, sender);
                    (ticket, receiver, poll(&mut state, now))
                }
            }
        };
        let mut waiting = Waiting { gate: self, ticket, cost, finished: false };
        let outcome = waiting.wait(receiver, wake, max_wait).await;
        waiting.finished = true;
        outcome
    }

    /// Gives back what an admitted request will not use (another of its resources said no).
    pub fn refund(&self, cost: f64) {
        let mut state = self.lock();
        let now = self.now();
        state.limiter.refund(now, cost);
        poll(&mut state, now);
    }

    /// An admitted concurrency request finished.
    fn release(&self, cost: f64) {
        let mut state = self.lock();
        let now = self.now();
        state.limiter.release(now, cost);
        poll(&mut state, now);
    }

    /// Enforces a new lease (or fallback) from now on, in place.
    pub fn apply(&self, applied: Applied) {
        let mut state = self.lock();
        if state.applied != applied {
            self.enforce(&mut state, applied);
        }
    }

    fn enforce(&self, state: &mut State, applied: Applied) {
        let now = self.now();
        let burst = burst(&state.settings, applied.capacity);
        state.limiter.set_capacity(now, applied.capacity, burst);
        poll(state, now);
        self.metrics.applied(&applied);
        state.applied = applied;
    }

    pub fn applied(&self) -> Applied {
        self.lock().applied.clone()
    }

    /// What to ask the capacity server for: the core's estimate from offered load.
    pub fn wants(&self) -> f64 {
        let now = self.now();
        let wants = self.lock().limiter.wants(now);
        self.metrics.wants.set(wants);
        wants
    }

    /// In-flight cost and queued requests, for the status page.
    pub fn load(&self) -> (f64, usize) {
        let state = self.lock();
        (state.limiter.in_flight(), state.limiter.queued())
    }

    fn refusal(&self, retry_after: Option<Seconds>) -> Refused {
        let retry_after =
            retry_after.filter(|s| s.is_finite() && *s > 0.0).map_or(defaults::RETRY_AFTER, Duration::from_secs_f64);
        Refused { retry_after }
    }
}

/// A request in the queue. Dropped before it finishes (the caller went away), it leaves the
/// queue, or gives back what it was admitted with.
struct Waiting<'a> {
    gate: &'a Gate,
    ticket: Ticket,
    cost: f64,
    finished: bool,
}

impl Waiting<'_> {
    async fn wait(
        &self,
        mut admitted: oneshot::Receiver<()>,
        mut wake: Option<Seconds>,
        max_wait: Duration,
    ) -> Result<Duration, Refused> {
        let gate = self.gate;
        let start = Instant::now();
        let deadline = start + max_wait;
        loop {
            // Sleep until the limiter says the head may go or this request's time is up; the
            // first waiter to wake admits everyone whose turn has come.
            let until = match wake {
                Some(at) if at.is_finite() => deadline.min(gate.origin + Duration::from_secs_f64(at.max(0.0))),
                _ => deadline,
            };
            tokio::select! {
                _ = &mut admitted => return Ok(start.elapsed()),
                _ = tokio::time::sleep_until(until.into()) => {}
            }
            let mut state = gate.lock();
            let now = gate.now();
            if state.waiters.contains_key(&self.ticket) {
                wake = poll(&mut state, now);
            }
            if !state.waiters.contains_key(&self.ticket) {
                return Ok(start.elapsed());
            }
            if Instant::now() >= deadline {
                state.waiters.remove(&self.ticket);
                state.limiter.cancel(self.ticket);
                return Err(gate.refusal(None));
            }
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut state = self.gate.lock();
        let now = self.gate.now();
        if state.waiters.remove(&self.ticket).is_some() {
            state.limiter.cancel(self.ticket);
        } else {
            state.limiter.refund(now, self.cost);
        }
        poll(&mut state, now);
    }
}

/// Admits the waiters whose turn has come; returns when to look again.
fn poll(state: &mut State, now: Seconds) -> Option<Seconds> {
    let State { limiter, waiters, .. } = state;
    limiter.poll(now, |ticket| {
        if let Some(sender) = waiters.remove(&ticket) {
            let _ = sender.send(());
        }
    })
}

fn burst(settings: &Resource, capacity: f64) -> f64 {
    settings.burst.unwrap_or_else(|| (capacity * defaults::BURST_SECONDS).max(2.0))
}

/// Concurrency permits an admitted request holds until its response ends.
#[derive(Default)]
pub struct Permits(Vec<(Arc<Gate>, f64)>);

impl Permits {
    pub fn push(&mut self, gate: Arc<Gate>, cost: f64) {
        self.0.push((gate, cost));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Drop for Permits {
    fn drop(&mut self) {
        for (gate, cost) in self.0.drain(..) {
            gate.release(cost);
        }
    }
}
