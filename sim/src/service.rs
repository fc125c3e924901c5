//! The service a resource protects, and what the sidecars see of it: a service that can be
//! overloaded as `sluice-upstream --workers` is (its `Model`) — `workers` calls served at once,
//! each taking a worker for the service time, up to `queue` more waiting for one in arrival
//! order, and a call that finds the queue full answered as overloaded at once (its 503) — so that
//! latency is the wait in the queue plus the service time.
//!
//! Calls are handed over in batches, every client's admitted calls up to a moment merged in
//! arrival order, and each is answered when a worker takes it: its answer time is known then,
//! ahead of the clock, so the service costs no events. A sidecar counts an answer from that time
//! on ([`Outcomes`]); the run's figures count it by the second it was sent in, as the benchmark
//! does ([`Record`]).

use std::collections::VecDeque;

use sluice_proto::Signals;

use crate::{clock::Time, scenario::ServiceSpec, topology::ClientId};

/// A call a client's limiter admitted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Call {
    pub client: ClientId,
    pub at: Time,
}

/// What became of a call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Answer {
    pub call: Call,
    /// When the answer reaches the client.
    pub done: Time,
    /// Turned away by the full queue.
    pub overload: bool,
}

impl Answer {
    pub fn latency(&self) -> Time {
        self.done - self.call.at
    }
}

pub struct Service {
    /// When each worker is next free.
    workers: Vec<Time>,
    service_time: Time,
    waiting: VecDeque<Call>,
    queue: usize,
}

impl Service {
    pub fn new(spec: &ServiceSpec) -> Service {
        Service {
            workers: vec![0.0; spec.workers as usize],
            service_time: spec.service_time,
            waiting: VecDeque::new(),
            queue: spec.queue,
        }
    }

    /// Calls served a second.
    pub fn capacity(&self) -> f64 {
        self.workers.len() as f64 / self.service_time
    }

    /// Takes `calls`, in arrival order and none before the last call taken, and serves the
    /// queue up to `now`: every call a worker takes is answered into `answers`.
    pub fn serve(&mut self, calls: &[Call], now: Time, answers: &mut Vec<Answer>) {
        for &call in calls {
            self.advance(call.at, answers);
            let idle = self.waiting.is_empty() && self.workers[self.next_free()] <= call.at;
            if idle || self.waiting.len() < self.queue {
                self.waiting.push_back(call);
                self.advance(call.at, answers);
            } else {
                answers.push(Answer { call, done: call.at, overload: true });
            }
        }
        self.advance(now, answers);
    }

    /// New settings from `now` (the queue served up to it): a new service time for the calls
    /// workers take from now on; more workers free at once, or fewer, the busy ones retiring as
    /// they finish — the first to finish first, as `sluice-upstream` retires them.
    pub fn change(&mut self, now: Time, workers: Option<u32>, service_time: Option<Time>) {
        self.service_time = service_time.unwrap_or(self.service_time);
        let Some(workers) = workers.map(|n| n as usize) else { return };
        self.workers.sort_by(f64::total_cmp);
        if workers < self.workers.len() {
            self.workers.drain(..self.workers.len() - workers);
        }
        self.workers.resize(workers, now);
    }

    /// Lets the workers free by `t` take the calls waiting, in order.
    fn advance(&mut self, t: Time, answers: &mut Vec<Answer>) {
        while !self.waiting.is_empty() {
            let worker = self.next_free();
            let free = self.workers[worker];
            if free > t {
                return;
            }
            let call = self.waiting.pop_front().expect("a call waits");
            let done = free.max(call.at) + self.service_time;
            self.workers[worker] = done;
            answers.push(Answer { call, done, overload: false });
        }
    }

    fn next_free(&self) -> usize {
        (0..self.workers.len()).min_by(|&a, &b| self.workers[a].total_cmp(&self.workers[b])).expect("a worker")
    }
}

/// What one sidecar's calls met, counted as the sidecar counts them (`enforce/outcomes.rs`) and
/// taken as the proto's `Signals` with each lease request: an answer counts once it has arrived.
pub struct Outcomes {
    /// Answers on their way.
    awaited: Vec<Answer>,
    /// When the counts were last taken.
    since: Time,
}

impl Outcomes {
    pub fn new(since: Time) -> Outcomes {
        Outcomes { awaited: Vec::new(), since }
    }

    pub fn expect(&mut self, answer: Answer) {
        self.awaited.push(answer);
    }

    /// The signals of the answers arrived since the last take, counting anew from `now`.
    pub fn take(&mut self, now: Time) -> Signals {
        let (mut completed, mut errors, mut latency_sum, mut min_latency) = (0, 0, 0.0, None::<f64>);
        self.awaited.retain(|answer| {
            if answer.done > now {
                return true;
            }
            completed += 1;
            if answer.overload {
                errors += 1;
            } else {
                latency_sum += answer.latency();
                min_latency = Some(min_latency.map_or(answer.latency(), |m| m.min(answer.latency())));
            }
            false
        });
        let seconds = now - std::mem::replace(&mut self.since, now);
        Signals {
            completed: Some(completed),
            errors: Some(errors),
            latency_sum: Some(latency_sum),
            min_latency,
            seconds: Some(seconds),
        }
    }
}

/// What the clients' calls met, second by second (of sending), and the service's capacity over
/// the run: what the run's figures are made of.
pub struct Record {
    pub seconds: Vec<Second>,
    /// The service's capacity, calls a second, from each time on.
    pub capacity: Vec<(Time, f64)>,
    /// A call's latency at the idle service: its service time at the start.
    pub unloaded: Time,
}

/// The calls sent in one second.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Second {
    /// Answered, not turned away.
    pub ok: u64,
    /// Turned away by the full queue.
    pub shed: u64,
    /// Calls each client's limiter admitted.
    pub admitted: Vec<u64>,
    /// Latency of every call admitted (0 for one turned away).
    pub latencies: Vec<Time>,
}

impl Record {
    pub fn new(service: &Service, clients: usize, duration: Time) -> Record {
        let second = Second { admitted: vec![0; clients], ..Second::default() };
        Record {
            seconds: vec![second; duration.ceil() as usize],
            capacity: vec![(0.0, service.capacity())],
            unloaded: service.service_time,
        }
    }

    pub fn add(&mut self, answer: &Answer) {
        let Some(second) = self.seconds.get_mut(answer.call.at as usize) else { return };
        match answer.overload {
            true => second.shed += 1,
            false => second.ok += 1,
        }
        second.admitted[answer.call.client] += 1;
        second.latencies.push(answer.latency());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(workers: u32, queue: usize) -> Service {
        Service::new(&ServiceSpec { workers, service_time: 0.01, queue })
    }

    fn call(at: Time) -> Call {
        Call { client: 0, at }
    }

    /// (sent, latency, overload) of each answer, rounded to the microsecond.
    fn seen(answers: &[Answer]) -> Vec<(Time, Time, bool)> {
        let us = |t: Time| (t * 1e6).round() / 1e6;
        answers.iter().map(|a| (us(a.call.at), us(a.latency()), a.overload)).collect()
    }

    #[test]
    fn calls_wait_for_a_worker_in_order_and_a_full_queue_turns_them_away() {
        let mut s = service(2, 1);
        let mut answers = Vec::new();
        s.serve(&[call(0.0), call(0.0), call(0.001), call(0.002), call(0.012)], 0.05, &mut answers);
        // Two served at once, one waits until 10 ms, the fourth finds the queue full (answered
        // at once, before the one waiting is taken); by 12 ms a worker is free again.
        assert_eq!(
            seen(&answers),
            [(0.0, 0.01, false), (0.0, 0.01, false), (0.002, 0.0, true), (0.001, 0.019, false), (0.012, 0.01, false)]
        );
    }

    #[test]
    fn calls_are_answered_once_a_worker_takes_them() {
        let mut s = service(1, 10);
        let mut answers = Vec::new();
        s.serve(&[call(0.0), call(0.001), call(0.002)], 0.005, &mut answers);
        assert_eq!(answers.len(), 1, "the others wait");
        s.serve(&[], 0.015, &mut answers);
        assert_eq!(seen(&answers)[1], (0.001, 0.019, false));
        assert_eq!(answers.len(), 2);
    }

    #[test]
    fn fewer_workers_retire_as_they_finish() {
        let mut s = service(3, 100);
        let mut answers = Vec::new();
        s.serve(&[call(0.0), call(0.005), call(0.009)], 0.009, &mut answers);
        s.change(0.009, Some(1), Some(0.02));
        assert_eq!(s.capacity(), 50.0);
        // The worker that finishes last stays, and takes the next call at 19 ms for 20 ms.
        s.serve(&[call(0.010)], 1.0, &mut answers);
        assert_eq!(seen(&answers)[3], (0.01, 0.029, false));
        s.change(1.0, Some(4), None);
        s.serve(&[call(1.0), call(1.0), call(1.0), call(1.0)], 2.0, &mut answers);
        assert!(seen(&answers)[4..].iter().all(|&(_, latency, _)| latency == 0.02));
    }

    #[test]
    fn a_take_counts_the_answers_arrived_and_starts_anew() {
        let mut outcomes = Outcomes::new(1.0);
        let answer = |at: Time, done: Time, overload: bool| Answer { call: call(at), done, overload };
        outcomes.expect(answer(1.0, 1.01, false));
        outcomes.expect(answer(1.2, 1.23, false));
        outcomes.expect(answer(1.3, 1.3, true));
        outcomes.expect(answer(1.9, 2.1, false));
        let s = outcomes.take(2.0);
        assert_eq!((s.completed, s.errors, s.seconds), (Some(3), Some(1), Some(1.0)));
        assert!((s.latency_sum.unwrap() - 0.04).abs() < 1e-12, "errors' latencies are not the service's");
        assert!((s.min_latency.unwrap() - 0.01).abs() < 1e-12);
        let s = outcomes.take(3.0);
        assert_eq!(s.completed, Some(1), "the answer on its way when last taken");
    }
}
