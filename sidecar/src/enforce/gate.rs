//! One resource on the data path: the core's [`Limiter`] behind a lock, requests parked in FIFO
//! order on channels while they wait their turn, the lease in force, and the resource's metric
//! handles (resolved once, so a request pays an atomic add per metric).

use std::{
    collections::HashMap,
    pin::pin,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc::UnboundedSender, oneshot};

use sluice_http::{sync, time};

use crate::{
    config::{Burst, Resource},
    core::{Applied, Capacity, Cost, Kind, Limiter, Offer, Seconds, Ticket},
    defaults,
    metrics::GateMetrics,
};

use super::outcomes::Outcomes;

pub struct Gate {
    pub id: Arc<str>,
    /// Fixed for the gate's life: a reload that changes it makes a new gate.
    pub kind: Kind,
    state: Mutex<State>,
    origin: Instant,
    used: AtomicBool,
    /// Wakes the waiters when the capacity changes, so that each sleeps until its new turn.
    retimed: Notify,
    /// The lease client's cue (`None` in standalone mode): it hears of the resource's first
    /// request.
    cue: Option<UnboundedSender<Arc<str>>>,
    pub metrics: GateMetrics,
    key: bool,
    /// What the calls forwarded for the resource met upstream since the last lease request.
    outcomes: Outcomes,
}

struct State {
    limiter: Limiter,
    waiters: HashMap<Ticket, oneshot::Sender<()>>,
    applied: Applied,
    settings: Resource,
    /// Answers from the capacity servers so far: a waiter queued before the latest knows
    /// whether the lease it may have waited for came.
    answers: u64,
}

/// Logs a resource's change of mode once, when it happens, so that the log shows when it fell
/// back on its fallback and when a lease came back, without a line per refresh.
fn log_mode_change(resource: &str, from: &'static str, to: &Applied) {
    let (mode, capacity) = (to.mode, to.capacity.get());
    if mode.starts_with("fallback") {
        tracing::warn!(resource, from, mode, capacity, "no valid lease: the fallback applies");
    } else if from.starts_with("fallback") {
        tracing::info!(resource, mode, capacity, expiry = to.expiry, "lease back: the fallback no longer applies");
    } else {
        tracing::info!(resource, from, mode, capacity, expiry = to.expiry, "mode changed");
    }
}

/// Why a request may not pass.
pub struct Denied {
    pub retry_after: Duration,
}

impl Gate {
    /// A gate at the resource's standalone capacity (0 when it has none, until a lease applies).
    pub fn new(settings: Resource, cue: Option<UnboundedSender<Arc<str>>>) -> Gate {
        let metrics = GateMetrics::new(&settings.id.as_str().into());
        Gate::made(settings, cue, metrics, false)
    }

    /// A keyed resource's key (see `keyed`): [`Gate::new`], recording into `metrics`, and its
    /// changes of mode logged at debug level (thousands of keys change together).
    pub fn key(settings: Resource, cue: Option<UnboundedSender<Arc<str>>>, metrics: GateMetrics) -> Gate {
        Gate::made(settings, cue, metrics, true)
    }

    fn made(settings: Resource, cue: Option<UnboundedSender<Arc<str>>>, metrics: GateMetrics, key: bool) -> Gate {
        let capacity = settings.capacity.unwrap_or(Capacity::ZERO);
        let mode = if cue.is_some() { "pending" } else { "standalone" };
        let burst = burst(&settings, capacity);
        let id: Arc<str> = settings.id.as_str().into();
        let limiter = Limiter::new(settings.kind, capacity.get(), burst.get(), 0.0);
        let gate = Gate {
            kind: settings.kind,
            state: Mutex::new(State {
                limiter: if cue.is_some() { limiter.leased() } else { limiter },
                waiters: HashMap::new(),
                applied: Applied { capacity, mode, expiry: None },
                settings,
                answers: 0,
            }),
            origin: Instant::now(),
            used: AtomicBool::new(false),
            retimed: Notify::new(),
            cue,
            metrics,
            key,
            id,
            outcomes: Outcomes::default(),
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
        let applied = match self.cue {
            None => Applied { capacity: settings.capacity.unwrap_or(Capacity::ZERO), ..state.applied.clone() },
            Some(_) => state.applied.clone(),
        };
        self.enforce(&mut state, applied.clone());
        drop(state);
        self.metrics.applied(&applied);
    }

    /// Whether a request has been charged to this resource yet.
    pub fn used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }

    fn now(&self) -> Seconds {
        self.origin.elapsed().as_secs_f64()
    }

    /// Counts a call forwarded upstream: its latency until the response headers, and whether
    /// its answer says the service is overloaded ([`super::is_overload`]).
    pub fn record_outcome(&self, latency: Duration, overload: bool) {
        self.outcomes.record(latency, overload);
    }

    /// What the forwarded calls met since the last lease request: `None` for a resource no
    /// request was charged to yet, which has nothing to say.
    pub fn take_signals(&self) -> Option<sluice_proto::Signals> {
        self.used().then(|| self.outcomes.take(self.origin, Instant::now()))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        sync::lock(&self.state)
    }

    /// Asks to pass `cost`, waiting in FIFO order up to `max_wait`. `Ok` carries the time
    /// waited.
    pub async fn admit(&self, cost: Cost, max_wait: Duration) -> Result<Duration, Denied> {
        self.first_use();
        let (ticket, receiver, answers) = {
            let mut state = self.lock();
            let now = self.now();
            match state.limiter.offer(now, cost.get(), max_wait.as_secs_f64()) {
                Offer::Admitted => return Ok(Duration::ZERO),
                Offer::Rejected { retry_after } => return Err(self.refusal(retry_after)),
                Offer::Queued(ticket) => {
                    let (sender, receiver) = oneshot::channel();
                    state.waiters.insert(ticket, sender);
                    (ticket, receiver, state.answers)
                }
            }
        };
        let mut waiting = Waiting { gate: self, ticket, cost, answers, finished: false };
        let outcome = waiting.wait(receiver, max_wait).await;
        waiting.finished = true;
        outcome
    }

    /// Gives back what an admitted request will not use (another of its resources said no).
    pub fn refund(&self, cost: Cost) {
        let mut state = self.lock();
        let now = self.now();
        state.limiter.refund(now, cost.get());
        poll(&mut state, now);
    }

    /// Charges `cost` after the fact, into debt down to `max_debt` below empty at most (`None`:
    /// the burst); see [`Limiter::charge`].
    pub fn charge(&self, cost: Cost, max_debt: Option<Cost>) {
        let mut state = self.lock();
        let now = self.now();
        let max_debt = max_debt.map_or_else(|| state.limiter.burst(), Cost::get);
        state.limiter.charge(now, cost.get(), max_debt);
    }

    /// Load that was let through (or refused) elsewhere: by Envoy's own token buckets, as its
    /// RLQS usage reports tell. It counts as demand, as arrivals do, so the lease client asks
    /// for it (the first report tells it the resource is in use, as a first request does), and
    /// is taken from this gate's bucket down to empty at most — no debt — so that callers of
    /// the same resource through this gate share what is left and the bucket is whole again
    /// once the load stops.
    pub fn report(&self, cost: Cost) {
        self.first_use();
        self.charge(cost, Some(Cost::default()));
    }

    /// The resource's first use tells the lease client (once).
    fn first_use(&self) {
        if !self.used.load(Ordering::Relaxed)
            && !self.used.swap(true, Ordering::Relaxed)
            && let Some(cue) = &self.cue
        {
            let _ = cue.send(self.id.clone());
        }
    }

    /// An admitted concurrency request finished.
    fn release(&self, cost: Cost) {
        let mut state = self.lock();
        let now = self.now();
        state.limiter.release(now, cost.get());
        poll(&mut state, now);
    }

    /// The largest cost the resource takes at once as it is enforced now (see
    /// [`Limiter::largest_cost`]).
    pub fn largest_cost(&self) -> Cost {
        Cost::saturating(self.lock().limiter.largest_cost())
    }

    /// Enforces a new lease (or fallback) from now on, in place.
    pub fn apply(&self, applied: Applied) {
        let previous = {
            let mut state = self.lock();
            if state.applied == applied {
                return;
            }
            let previous = state.applied.mode;
            self.enforce(&mut state, applied.clone());
            previous
        };
        if previous != applied.mode && self.key {
            tracing::debug!(resource = %self.id, from = previous, mode = applied.mode, "mode changed");
        } else if previous != applied.mode {
            log_mode_change(&self.id, previous, &applied);
        }
        self.metrics.applied(&applied);
    }

    fn enforce(&self, state: &mut State, applied: Applied) {
        let now = self.now();
        let burst = burst(&state.settings, applied.capacity);
        let moved = (state.limiter.capacity(), state.limiter.burst()) != (applied.capacity.get(), burst.get());
        state.limiter.set_capacity(now, applied.capacity.get(), burst.get());
        poll(state, now);
        if moved {
            // The turns of those still waiting moved: they look again.
            self.retimed.notify_waiters();
        }
        state.applied = applied;
    }

    /// A capacity server answered (its lease, if any, is applied by now): waiters look again,
    /// as one that waited for a larger lease may now know it will not come.
    pub fn answered(&self) {
        let mut state = self.lock();
        state.answers += 1;
        if !state.waiters.is_empty() {
            self.retimed.notify_waiters();
        }
    }

    /// A waiter left the queue, or gave back what it took: those behind it may go now, or at
    /// another time than they were told.
    fn queue_changed(&self, state: &mut State) {
        poll(state, self.now());
        self.retimed.notify_waiters();
    }

    /// Sets the resource's gauges afresh (before a scrape, so that they are not taken as stale).
    pub fn show_metrics(&self) {
        self.metrics.applied(&self.applied());
        self.wants();
    }

    pub fn applied(&self) -> Applied {
        self.lock().applied.clone()
    }

    /// No lease holds (the lease client is on the fallback): nothing is on its way to wait for.
    pub fn unleased(&self) {
        self.lock().limiter.unleased();
    }

    /// What to ask the capacity server for, as a request to it is built.
    pub fn ask(&self) -> f64 {
        let now = self.now();
        let wants = self.lock().limiter.ask(now);
        self.metrics.wants(wants);
        wants
    }

    /// What the load offered lately asks for: the core's estimate.
    pub fn wants(&self) -> f64 {
        let now = self.now();
        let wants = self.lock().limiter.wants(now);
        self.metrics.wants(wants);
        wants
    }

    /// A rate's tokens and seconds until its bucket is full (see [`Limiter::level`]).
    pub fn level(&self) -> (f64, Seconds) {
        let now = self.now();
        self.lock().limiter.level(now)
    }

    /// In-flight cost and queued requests, for the status page.
    pub fn load(&self) -> (f64, usize) {
        let state = self.lock();
        (state.limiter.in_flight(), state.limiter.queued())
    }

    /// The refusal to answer with: when to retry, as the limiter predicts it (a day at most: at a
    /// sliver of a rate its prediction may be ages away) or, when it cannot, the default.
    fn refusal(&self, retry_after: Option<Seconds>) -> Denied {
        let retry_after = match retry_after {
            Some(seconds) if seconds > 0.0 => time::seconds(seconds).min(defaults::MAX_RETRY_AFTER),
            _ => defaults::RETRY_AFTER,
        };
        Denied { retry_after }
    }
}

/// A request in the queue. Dropped before it finishes (the caller went away), it leaves the
/// queue, or gives back what it was admitted with.
struct Waiting<'a> {
    gate: &'a Gate,
    ticket: Ticket,
    cost: Cost,
    /// The gate's answer count when it was queued.
    answers: u64,
    finished: bool,
}

impl Waiting<'_> {
    async fn wait(&self, mut admitted: oneshot::Receiver<()>, max_wait: Duration) -> Result<Duration, Denied> {
        let gate = self.gate;
        let start = Instant::now();
        let deadline = time::after(start, max_wait);
        loop {
            // Listening for a capacity change from before the turn is computed, under the lock,
            // so that no change is missed in between.
            let retimed = gate.retimed.notified();
            let mut retimed = pin!(retimed);
            let wake = {
                let mut state = gate.lock();
                retimed.as_mut().enable();
                let now = gate.now();
                // The first waiter to look admits everyone whose turn has come.
                let wake = match state.waiters.contains_key(&self.ticket) {
                    true => poll(&mut state, now),
                    false => None,
                };
                if !state.waiters.contains_key(&self.ticket) {
                    return Ok(start.elapsed());
                }
                // Past its time; or it may have waited for a surge's lease, and an answer came
                // since with no capacity at all and no further surge to ask for.
                let answered_nothing =
                    state.answers > self.answers && state.limiter.capacity() == 0.0 && !state.limiter.surged(now);
                if Instant::now() >= deadline || answered_nothing {
                    state.waiters.remove(&self.ticket);
                    state.limiter.cancel(self.ticket);
                    gate.queue_changed(&mut state);
                    return Err(gate.refusal(None));
                }
                wake
            };
            // Sleep until the limiter says the head may go, the capacity changes or this
            // request's time is up.
            // A turn too far off to name (a sliver of a lease) is as good as none.
            let turn = wake.and_then(|at| Duration::try_from_secs_f64(at.max(0.0)).ok());
            let until = turn.and_then(|at| gate.origin.checked_add(at)).map_or(deadline, |at| deadline.min(at));
            tokio::select! {
                _ = &mut admitted => return Ok(start.elapsed()),
                _ = retimed => {}
                _ = tokio::time::sleep_until(until.into()) => {}
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
            state.limiter.refund(now, self.cost.get());
        }
        self.gate.queue_changed(&mut state);
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

/// The bucket's depth as [`Burst`] says, from the rate in force (no limit: as deep as any cost).
fn burst(settings: &Resource, capacity: Capacity) -> Cost {
    match settings.burst {
        Burst::Depth(depth) => depth,
        Burst::Default => Cost::saturating((capacity.get() * defaults::BURST_SECONDS).max(2.0)),
        Burst::Window(seconds) => Cost::saturating((capacity.get() * seconds).max(1.0)),
    }
}

/// What an admitted request holds until its response ends: its place among its listener's
/// requests in flight, and its concurrency permits.
#[derive(Default)]
pub struct Permits {
    slot: Option<OwnedSemaphorePermit>,
    gates: Vec<(Arc<Gate>, Cost)>,
}

impl Permits {
    /// Holding the request's place (`slot`) and no concurrency permit yet.
    pub fn holding(slot: Option<OwnedSemaphorePermit>) -> Permits {
        Permits { slot, gates: Vec::new() }
    }

    pub fn push(&mut self, gate: Arc<Gate>, cost: Cost) {
        self.gates.push((gate, cost));
    }

    /// Whether it holds no concurrency permit.
    pub fn is_empty(&self) -> bool {
        self.gates.is_empty()
    }
}

impl Drop for Permits {
    fn drop(&mut self) {
        for (gate, cost) in self.gates.drain(..) {
            gate.release(cost);
        }
        drop(self.slot.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Fallback;

    #[tokio::test]
    async fn a_sliver_of_a_rate_refuses_with_a_bounded_retry_after() {
        let settings = Resource {
            id: "r".into(),
            kind: Kind::Rate,
            capacity: Capacity::new(1e-25),
            burst: Burst::Depth(Cost::ONE),
            priority: 0,
            when_unreachable: Fallback::Safe,
            safe_capacity: None,
            key: None,
        };
        let gate = Gate::new(settings, None);
        assert!(gate.admit(Cost::ONE, Duration::ZERO).await.is_ok(), "the bucket starts full");
        // The next token is 1e25 s away: more than a Duration holds.
        let Err(refused) = gate.admit(Cost::ONE, Duration::ZERO).await else { panic!("refused") };
        assert_eq!(refused.retry_after, defaults::MAX_RETRY_AFTER);
    }
}
