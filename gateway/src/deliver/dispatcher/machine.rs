//! The dispatcher's rules as a state machine without I/O: every device's queue and
//! in-flight slot, fed events with the time they happen at, answering with [`Action`]s for
//! the runner ([`super::run`]) to carry out.
//!
//! Two clocks, both passed in: `now`, a [`tokio::time::Instant`], for ack timeouts and
//! backoff; `wall`, the injectable [`crate::clock::Clock`]'s reading, for jobs' time to live
//! (`expires_at`).

use super::action::{Action, Delivery, ReadBack};
use super::held::Held;
use super::queue::{DeviceQueue, Waiting};
use super::slot::{InFlight, Slot};
use crate::config::DeliveryConfig;
use crate::model::{Finished, Outcome, Queued, StoredJob};
use crate::telemetry::latency::Stage;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use device_protocol::{Ack, AckResult, EffectKind, Status};
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// Jobs queued and in flight, for `/stats` and readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Jobs queued or in flight, all devices.
    pub queued: usize,
    /// Jobs sent and awaiting their ack on a device that can take jobs.
    pub in_flight: usize,
}

/// Every device's line and the rules that move jobs along it.
#[derive(Debug)]
pub struct Machine {
    cfg: DeliveryConfig,
    devices: HashMap<String, DeviceQueue>,
    held: Held,
    /// Stage latencies seen since the last [`Machine::take_observed`].
    observed: Vec<(Stage, Duration)>,
}

impl Machine {
    /// A machine with the rules of `cfg`; every job keeps its wire bytes until
    /// [`read_back_beyond_budget`](Machine::read_back_beyond_budget).
    pub fn new(cfg: DeliveryConfig) -> Machine {
        Machine { cfg, devices: HashMap::new(), held: Held::unlimited(), observed: Vec::new() }
    }

    /// Queued jobs keep their wire bytes up to `delivery.held_payload_bytes` in all; the
    /// others are read back ([`Action::ReadBack`]) when sent. For a dispatcher with an
    /// outbox to read them from.
    pub fn read_back_beyond_budget(&mut self) {
        self.held = Held::up_to(self.cfg.held_payload_bytes);
    }

    /// Queues jobs stored before a restart, in their order, and returns the ones the
    /// supersede rule ends: a `display_qr` followed in its device's queue by its charge's
    /// paid/expired screen or receipt is over, even if its removal had not reached the disk
    /// before the crash (the next job may already have been carried out). Nothing is sent
    /// until [`start`](Machine::start).
    ///
    /// `jobs` are headers when read back is on (their wire bytes are read back when sent);
    /// otherwise whole jobs, serialized when sent.
    pub fn preload(&mut self, jobs: Vec<StoredJob>) -> Vec<Finished> {
        for stored in jobs {
            self.devices.entry(stored.device.clone()).or_default().queue.push_back(Waiting {
                stored,
                wire: None,
                accepted_at: None,
            });
        }
        let mut over = Vec::new();
        for q in self.devices.values_mut() {
            // Per charge, the last job that ends its QR (a map: a reloaded queue holds up to
            // `outbox.max_jobs_per_device` jobs, and a list would make this quadratic).
            let mut ends: HashMap<String, u64> = HashMap::new();
            for w in q.queue.iter().filter(|w| ends_qr(w.stored.job.kind)) {
                let last = ends.entry(w.stored.job.charge_id.clone()).or_default();
                *last = (*last).max(w.stored.job.seq);
            }
            over.extend(q.take_where(|w| {
                let j = &w.stored.job;
                j.kind == EffectKind::DisplayQr && ends.get(&j.charge_id).is_some_and(|&last| last > j.seq)
            }));
        }
        over.into_iter().map(|w| Finished { stored: w.stored, outcome: Outcome::Superseded }).collect()
    }

    /// Drops `devices`' queues and jobs in flight, reporting nothing: another replica owns
    /// them now (the central shape). A late ack of theirs then changes nothing. Returns
    /// the jobs that were sent and in flight, as (device, message id), for the transport to
    /// withdraw.
    pub fn forget(&mut self, devices: &[String]) -> Vec<(String, String)> {
        let mut sent = Vec::new();
        for d in devices {
            if let Some(mut q) = self.devices.remove(d) {
                if let Some(job) = q.slot.job().filter(|j| j.attempts > 0) {
                    sent.push((d.clone(), job.stored.job.message_id.clone()));
                }
                for w in q.take_where(|_| true) {
                    self.held.release(&w);
                }
            }
        }
        sent
    }

    /// Queues a taken partition's jobs ([`preload`](Machine::preload)'s rules, the
    /// supersede rule included) and sends each of their devices' head that can take it.
    pub fn restore(&mut self, jobs: Vec<StoredJob>, now: Instant, wall: DateTime<Utc>) -> Vec<Action> {
        let devices: std::collections::BTreeSet<String> = jobs.iter().map(|j| j.device.clone()).collect();
        let mut out: Vec<Action> = self.preload(jobs).into_iter().map(Action::Finish).collect();
        for device in devices {
            self.pump(&device, now, wall, &mut out);
        }
        out
    }

    /// Sends the head of every device's queue that can take it: what [`preload`](Machine::preload)
    /// queued.
    pub fn start(&mut self, now: Instant, wall: DateTime<Utc>) -> Vec<Action> {
        let mut out = Vec::new();
        let devices: Vec<String> = self.devices.keys().cloned().collect();
        for device in devices {
            self.pump(&device, now, wall, &mut out);
        }
        out
    }

    /// A job the outbox has stored, queued behind its device's others. A queued
    /// `display_qr` of the same charge is superseded by a job that ends its QR (a printer's
    /// pay-with-Pix slip is over once its receipt is due too): a customer must never see
    /// the QR of a charge that is over.
    pub fn enqueue(&mut self, queued: Queued, now: Instant, wall: DateTime<Utc>) -> Vec<Action> {
        let mut out = Vec::new();
        let device = queued.stored.device.clone();
        let q = self.devices.entry(device.clone()).or_default();
        let job = &queued.stored.job;
        if ends_qr(job.kind) {
            for w in
                q.take_where(|w| w.stored.job.kind == EffectKind::DisplayQr && w.stored.job.charge_id == job.charge_id)
            {
                self.held.release(&w);
                out.push(Action::Finish(Finished { stored: w.stored, outcome: Outcome::Superseded }));
            }
        }
        q.queue.push_back(self.held.shelve(queued));
        self.pump(&device, now, wall, &mut out);
        out
    }

    /// A device's ack. `done` finishes the job in flight; `failed` dead-letters it if
    /// permanent or after `max_deliveries`, else sends it again after a backoff. An ack of
    /// anything but the job in flight (a late duplicate) changes nothing.
    pub fn ack(&mut self, device: &str, ack: Ack, now: Instant, wall: DateTime<Utc>) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(q) = self.devices.get_mut(device) else { return out };
        let Some(job) = q.slot.take_acked(&ack.message_id) else { return out };
        match ack.result {
            AckResult::Done => {
                if let Some(sent) = job.first_sent {
                    self.observed.push((Stage::Device, now.saturating_duration_since(sent)));
                }
                out.push(Action::Finish(Finished { stored: job.stored, outcome: Outcome::Done }));
            }
            AckResult::Failed => {
                let reason = ack.reason.unwrap_or_else(|| "unspecified".into());
                if ack.permanent || job.attempts >= self.cfg.max_deliveries {
                    let why = format!("device_rejected: {reason} (after {} deliveries)", job.attempts);
                    out.push(Action::Finish(Finished { stored: job.stored, outcome: Outcome::Failed(why) }));
                } else {
                    let at = now + backoff(&self.cfg, job.attempts);
                    q.slot = Slot::Scheduled { job, at };
                }
            }
        }
        self.pump(device, now, wall, &mut out);
        out
    }

    /// A device's status. Offline, or a printer that cannot print, holds its queue; when it
    /// can take jobs again the job in flight is sent again now rather than after its ack
    /// timeout.
    pub fn status(&mut self, device: &str, status: Status, now: Instant, wall: DateTime<Utc>) -> Vec<Action> {
        let mut out = Vec::new();
        let q = self.devices.entry(device.to_string()).or_default();
        let could_send = q.can_send();
        q.online = Some(status.online);
        q.printer = status.printer;
        if q.can_send() && !could_send {
            q.slot.reschedule(now);
        }
        self.pump(device, now, wall, &mut out);
        out
    }

    /// What the outbox gave back for an [`Action::ReadBack`] of `device`'s job `seq`: the
    /// job is sent, reported [`Action::Vanished`] (and the next one goes), or tried again
    /// after a backoff. Anything else in flight by then (not possible when the runner
    /// answers before its next event) is left alone.
    pub fn read_back(
        &mut self,
        device: &str,
        seq: u64,
        got: ReadBack,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(q) = self.devices.get_mut(device) else { return out };
        let (mut job, due) = match std::mem::take(&mut q.slot) {
            Slot::Scheduled { job, at } if job.stored.job.seq == seq => (job, at),
            other => {
                q.slot = other;
                return out;
            }
        };
        match got {
            ReadBack::Wire(wire) => {
                job.wire = Some(wire);
                q.slot = Slot::Scheduled { job, at: due };
            }
            ReadBack::Gone => out.push(Action::Vanished(job.stored)),
            ReadBack::Failed => {
                let at = now + backoff(&self.cfg, job.attempts.max(1));
                q.slot = Slot::Scheduled { job, at };
            }
        }
        self.pump(device, now, wall, &mut out);
        out
    }

    /// Acts on every device whose job in flight is due by `now`: sent (again), or expired,
    /// or dead-lettered after `max_deliveries`.
    pub fn due(&mut self, now: Instant, wall: DateTime<Utc>) -> Vec<Action> {
        let mut out = Vec::new();
        let due: Vec<String> = self
            .devices
            .iter()
            .filter(|(_, q)| q.slot.due().is_some_and(|due| due <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for device in due {
            self.pump(&device, now, wall, &mut out);
        }
        out
    }

    /// Expires queued jobs whose time to live passed by `wall`, on every device (one that
    /// can send finds them at the head of its queue anyway; this reaches the ones that
    /// cannot, so they leave the outbox on time).
    pub fn expire_queued(&mut self, wall: DateTime<Utc>) -> Vec<Action> {
        let mut out = Vec::new();
        for q in self.devices.values_mut() {
            for w in q.take_where(|w| w.stored.job.expires_at.is_some_and(|at| at <= wall)) {
                self.held.release(&w);
                out.push(Action::Finish(Finished { stored: w.stored, outcome: Outcome::Expired }));
            }
        }
        out
    }

    /// The stage latencies seen since the last call: a job's first send (`queue`, from
    /// its record's acceptance, for jobs this run stored) and its `done` ack (`device`,
    /// from its first send).
    pub fn take_observed(&mut self) -> Vec<(Stage, Duration)> {
        std::mem::take(&mut self.observed)
    }

    /// Jobs queued and in flight, all devices (walks every device).
    pub fn counts(&self) -> Counts {
        let (mut queued, mut in_flight) = (0, 0);
        for q in self.devices.values() {
            queued += q.queue.len() + usize::from(q.slot.job().is_some());
            in_flight += usize::from(q.can_send() && q.slot.awaiting_ack());
        }
        Counts { queued, in_flight }
    }

    /// Moves `device`'s line along as far as it goes at `now`: takes the head of the queue
    /// into the idle slot if the device can take it, then, if the job in flight is due:
    /// - its time to live passed → expired, the next job taken (even while the device
    ///   cannot take jobs, so it does not hold its place in the outbox's bounds until the
    ///   device is back; only once its ack timeout has passed, as a device that took it
    ///   before it went away may still report it done);
    /// - the device cannot take it → it waits, due;
    /// - sent `max_deliveries` times without an ack → dead letter `no_ack`, the next taken;
    /// - its bytes not held → [`Action::ReadBack`], continued in [`Machine::read_back`];
    /// - else → [`Action::Send`], awaiting its ack.
    fn pump(&mut self, device: &str, now: Instant, wall: DateTime<Utc>, out: &mut Vec<Action>) {
        let Some(q) = self.devices.get_mut(device) else { return };
        loop {
            let can_send = q.can_send();
            let (mut job, due) = match q.slot.take_due(now) {
                Some(due_job) => due_job,
                None if can_send && matches!(q.slot, Slot::Idle) => match q.queue.pop_front() {
                    Some(next) => {
                        self.held.release(&next);
                        (InFlight::new(next), now)
                    }
                    None => return,
                },
                // Waiting for its ack or its retry time, or nothing to send to a device that
                // cannot take it.
                None => return,
            };
            if job.expired(wall) {
                // Never sent after its time to live, not even again: a late QR or "paid"
                // screen misleads the customer in front of the card machine.
                out.push(Action::Finish(Finished { stored: job.stored, outcome: Outcome::Expired }));
                continue;
            }
            if !can_send {
                q.slot = Slot::Scheduled { job, at: due };
                return;
            }
            if job.attempts > 0 && job.attempts >= self.cfg.max_deliveries {
                let why = format!("no_ack: no acknowledgement after {} deliveries", job.attempts);
                out.push(Action::Finish(Finished { stored: job.stored, outcome: Outcome::Failed(why) }));
                continue;
            }
            let wire = match &job.wire {
                Some(wire) => wire.clone(),
                None if self.held.reads_back() => {
                    out.push(Action::ReadBack { device: device.to_string(), seq: job.stored.job.seq });
                    q.slot = Slot::Scheduled { job, at: due };
                    return;
                }
                // No outbox: a job reloaded whole is serialized here.
                None => Bytes::from(job.stored.job.to_json()),
            };
            job.attempts += 1;
            if job.first_sent.is_none() {
                job.first_sent = Some(now);
                if let Some(at) = job.accepted_at {
                    self.observed.push((Stage::Queue, now.saturating_duration_since(at)));
                }
            }
            let deadline = now + Duration::from_millis(self.cfg.ack_timeout_ms) + backoff(&self.cfg, job.attempts - 1);
            let j = &job.stored.job;
            out.push(Action::Send(Delivery {
                device: device.to_string(),
                seq: j.seq,
                message_id: j.message_id.clone(),
                attempt: job.attempts,
                wire,
            }));
            q.slot = Slot::AwaitingAck { job, deadline };
            return;
        }
    }

    /// `device`'s in-flight slot.
    #[cfg(test)]
    fn slot(&self, device: &str) -> &Slot {
        static IDLE: Slot = Slot::Idle;
        self.devices.get(device).map_or(&IDLE, |q| &q.slot)
    }
}

/// Whether a job of `kind` ends its charge's QR on the same device (paid or expired screen,
/// or a printer's receipt after its pay-with-Pix slip).
fn ends_qr(kind: EffectKind) -> bool {
    matches!(kind, EffectKind::PaymentConfirmed | EffectKind::ChargeExpired | EffectKind::PrintReceipt)
}

/// Delay before attempt `attempt + 1`: `backoff_initial_ms · 2^(attempt-1)`, capped at
/// `backoff_max_ms`; zero before the first attempt.
fn backoff(cfg: &DeliveryConfig, attempt: u32) -> Duration {
    if attempt == 0 {
        return Duration::ZERO;
    }
    let ms = cfg.backoff_initial_ms.saturating_mul(1u64 << (attempt - 1).min(20));
    Duration::from_millis(ms.min(cfg.backoff_max_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use device_protocol::Job;

    /// 1 s ack timeout, backoff 100 ms doubling to 400 ms, 3 deliveries.
    fn cfg(held_payload_bytes: usize) -> DeliveryConfig {
        DeliveryConfig {
            ack_timeout_ms: 1_000,
            backoff_initial_ms: 100,
            backoff_max_ms: 400,
            max_deliveries: 3,
            held_payload_bytes,
            ..DeliveryConfig::default()
        }
    }

    fn queued(device: &str, id: &str, seq: u64) -> Queued {
        let job = Job {
            v: 1,
            message_id: id.into(),
            seq,
            kind: EffectKind::PrintReceipt,
            event_id: format!("ev-{id}"),
            charge_id: format!("c-{id}"),
            content_type: "x".into(),
            payload: Job::encode_payload(format!("receipt bytes of {id}").as_bytes()),
            expires_at: None,
        };
        let source =
            crate::model::SourceRef { topic: "charge.upserted".into(), partition: 0, offset: seq as i64, key: None };
        Queued::from_stored(StoredJob { device: device.into(), job, source })
    }

    /// `actions` in short: `send a#1` (id, attempt), `read_back 2` (seq), `done a`,
    /// `failed a: reason`, `vanished a`.
    fn said(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                Action::Send(d) => format!("send {}#{}", d.message_id, d.attempt),
                Action::ReadBack { seq, .. } => format!("read_back {seq}"),
                Action::Finish(f) => match &f.outcome {
                    Outcome::Failed(why) => format!("failed {}: {why}", f.stored.job.message_id),
                    other => format!("{} {}", format!("{other:?}").to_lowercase(), f.stored.job.message_id),
                },
                Action::Vanished(s) => format!("vanished {}", s.job.message_id),
            })
            .collect()
    }

    fn ms(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let cfg = DeliveryConfig { backoff_initial_ms: 100, backoff_max_ms: 1000, ..DeliveryConfig::default() };
        let got: Vec<u64> = (0..7).map(|a| backoff(&cfg, a).as_millis() as u64).collect();
        assert_eq!(got, [0, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(&cfg, 64).as_millis(), 1000, "no overflow");
    }

    /// Each delivery's ack deadline is the ack timeout plus the backoff of the attempts
    /// before it; at the last deadline the job is dead-lettered `no_ack` and the next goes.
    #[test]
    fn unacknowledged_deliveries_follow_the_ack_timeout_plus_backoff() {
        let (t0, wall) = (Instant::now(), Utc::now());
        let mut m = Machine::new(cfg(0));
        assert_eq!(said(&m.enqueue(queued("d", "a", 1), t0, wall)), ["send a#1"]);
        assert_eq!(said(&m.enqueue(queued("d", "b", 2), t0, wall)), Vec::<String>::new(), "one in flight per device");
        let mut deadline = ms(t0, 1_000);
        for (attempt, backoff_ms) in [(2, 100), (3, 200)] {
            assert!(m.due(deadline - Duration::from_millis(1), wall).is_empty(), "not before its deadline");
            assert_eq!(said(&m.due(deadline, wall)), [format!("send a#{attempt}")]);
            let next = deadline + Duration::from_millis(1_000 + backoff_ms);
            assert!(matches!(m.slot("d"), Slot::AwaitingAck { deadline: d, .. } if *d == next));
            deadline = next;
        }
        assert_eq!(deadline, ms(t0, 3_300));
        assert!(m.due(ms(t0, 3_299), wall).is_empty());
        assert_eq!(
            said(&m.due(ms(t0, 3_300), wall)),
            ["failed a: no_ack: no acknowledgement after 3 deliveries", "send b#1"]
        );
    }

    #[test]
    fn a_transient_failure_waits_its_backoff_and_a_permanent_one_ends_the_job() {
        let (t0, wall) = (Instant::now(), Utc::now());
        let mut m = Machine::new(cfg(0));
        m.enqueue(queued("d", "a", 1), t0, wall);
        m.enqueue(queued("d", "b", 2), t0, wall);
        assert!(m.ack("d", Ack::failed("a", 1, "jam", false), ms(t0, 50), wall).is_empty());
        assert!(
            matches!(m.slot("d"), Slot::Scheduled { at, job } if *at == ms(t0, 150) && job.attempts == 1),
            "{:?}",
            m.slot("d")
        );
        assert!(m.due(ms(t0, 149), wall).is_empty());
        assert_eq!(said(&m.due(ms(t0, 150), wall)), ["send a#2"]);
        assert_eq!(
            said(&m.ack("d", Ack::failed("a", 1, "undecodable", true), ms(t0, 200), wall)),
            ["failed a: device_rejected: undecodable (after 2 deliveries)", "send b#1"]
        );
    }

    /// Only the ack of the job in flight counts: one of an earlier job (a late duplicate),
    /// or of a device with nothing in flight, changes nothing.
    #[test]
    fn an_ack_of_anything_but_the_job_in_flight_changes_nothing() {
        let (t0, wall) = (Instant::now(), Utc::now());
        let mut m = Machine::new(cfg(0));
        assert!(m.ack("d", Ack::done("a", 1, false), t0, wall).is_empty(), "unknown device");
        m.enqueue(queued("d", "a", 1), t0, wall);
        m.enqueue(queued("d", "b", 2), t0, wall);
        assert_eq!(said(&m.ack("d", Ack::done("a", 1, false), t0, wall)), ["done a", "send b#1"]);
        assert!(m.ack("d", Ack::done("a", 1, true), t0, wall).is_empty(), "a duplicate of a's ack");
        assert!(matches!(m.slot("d"), Slot::AwaitingAck { job, .. } if job.stored.job.message_id == "b"));
    }

    /// Read back on: a job not held is read back before it is sent, and what the outbox
    /// answers decides what follows: the bytes are sent; a row gone is reported vanished
    /// and the next job goes; a failed read is tried again after a backoff.
    #[test]
    fn a_job_not_held_is_read_back_before_it_is_sent() {
        let (t0, wall) = (Instant::now(), Utc::now());
        let mut m = Machine::new(cfg(0));
        m.read_back_beyond_budget();
        let (a, b) = (queued("d", "a", 1), queued("d", "b", 2));
        let a_wire = a.wire.clone();
        assert_eq!(said(&m.enqueue(a, t0, wall)), ["read_back 1"]);
        m.enqueue(b, t0, wall);
        assert!(m.read_back("d", 1, ReadBack::Failed, t0, wall).is_empty());
        assert!(m.due(ms(t0, 99), wall).is_empty());
        assert_eq!(said(&m.due(ms(t0, 100), wall)), ["read_back 1"], "again after the first backoff");
        assert!(
            m.read_back("d", 7, ReadBack::Wire(Bytes::new()), ms(t0, 100), wall).is_empty(),
            "not the job in flight"
        );
        let sent = m.read_back("d", 1, ReadBack::Wire(a_wire.clone()), ms(t0, 100), wall);
        assert!(matches!(&sent[..], [Action::Send(d)] if d.wire == a_wire && d.attempt == 1));
        assert_eq!(said(&m.ack("d", Ack::done("a", 1, false), ms(t0, 200), wall)), ["done a", "read_back 2"]);
        assert_eq!(said(&m.read_back("d", 2, ReadBack::Gone, ms(t0, 200), wall)), ["vanished b"]);
        assert!(matches!(m.slot("d"), Slot::Idle));
    }

    /// Queued jobs hold their bytes while the budget has room; the job in flight does not
    /// count against it, nor does a job that left its queue.
    #[test]
    fn the_held_budget_counts_queued_jobs_only() {
        let (t0, wall) = (Instant::now(), Utc::now());
        let one = queued("d", "a", 1).wire.len();
        let mut m = Machine::new(cfg(one));
        m.read_back_beyond_budget();
        assert_eq!(said(&m.enqueue(queued("d", "a", 1), t0, wall)), ["send a#1"]);
        assert_eq!(m.held.bytes(), 0, "in flight: not counted");
        m.enqueue(queued("d", "b", 2), t0, wall);
        m.enqueue(queued("d", "c", 3), t0, wall);
        assert_eq!(m.held.bytes(), one, "b held, c beyond the budget");
        assert_eq!(said(&m.ack("d", Ack::done("a", 1, false), t0, wall)), ["done a", "send b#1"], "b from memory");
        assert_eq!(m.held.bytes(), 0);
        assert_eq!(said(&m.ack("d", Ack::done("b", 2, false), t0, wall)), ["done b", "read_back 3"]);
        assert_eq!(m.counts(), Counts { queued: 1, in_flight: 0 });
    }

    /// A job's first send is timed from its record's acceptance (`queue`), its `done` ack
    /// from its first send (`device`), resends included; a job stored by an earlier run
    /// has no `queue` figure, and a failed job no `device` one.
    #[test]
    fn stage_latencies_are_timed_from_acceptance_and_from_the_first_send() {
        let (t0, wall) = (Instant::now(), Utc::now());
        let mut m = Machine::new(cfg(0));
        let mut a = queued("d", "a", 1);
        a.accepted_at = Some(t0);
        let mut b = queued("d", "b", 2);
        b.accepted_at = Some(ms(t0, 5));
        m.enqueue(a, ms(t0, 2), wall);
        m.enqueue(b, ms(t0, 5), wall);
        assert_eq!(m.take_observed(), [(Stage::Queue, Duration::from_millis(2))]);
        assert!(m.take_observed().is_empty(), "taken once");
        assert_eq!(said(&m.due(ms(t0, 1_002), wall)), ["send a#2"]);
        assert!(m.take_observed().is_empty(), "a resend is not a first send");
        assert_eq!(said(&m.ack("d", Ack::done("a", 1, false), ms(t0, 1_010), wall)), ["done a", "send b#1"]);
        assert_eq!(
            m.take_observed(),
            [(Stage::Device, Duration::from_millis(1_008)), (Stage::Queue, Duration::from_millis(1_005))],
            "a's ack from its first send; b waited behind a"
        );
        assert!(m.ack("d", Ack::failed("b", 2, "jam", true), ms(t0, 1_020), wall).len() == 1);
        m.preload(vec![queued("e", "c", 1).stored]);
        assert_eq!(said(&m.start(ms(t0, 1_030), wall)), ["send c#1"]);
        assert_eq!(said(&m.ack("e", Ack::done("c", 1, false), ms(t0, 1_040), wall)), ["done c"]);
        assert_eq!(m.take_observed(), [(Stage::Device, Duration::from_millis(10))], "no queue figure for c");
    }

    /// A device that cannot take jobs keeps its queue and its due job; its job in flight
    /// expires once due (its ack timeout passed), and when it is back the next job is sent
    /// at once.
    #[test]
    fn a_device_that_cannot_take_jobs_holds_its_line() {
        let (t0, wall) = (Instant::now(), Utc::now());
        let mut m = Machine::new(cfg(0));
        let mut paid = queued("t", "paid", 1);
        paid.stored.job.expires_at = Some(wall + chrono::Duration::minutes(10));
        m.enqueue(paid, t0, wall);
        m.enqueue(queued("t", "receipt", 2), t0, wall);
        let offline = Status { v: 1, online: false, printer: None };
        assert!(m.status("t", offline, ms(t0, 10), wall).is_empty());
        assert_eq!(m.counts(), Counts { queued: 2, in_flight: 0 }, "awaiting its ack on a device that is away");
        let later = wall + chrono::Duration::minutes(11);
        assert!(m.due(ms(t0, 999), later).is_empty(), "within its ack timeout");
        assert_eq!(said(&m.due(ms(t0, 1_000), later)), ["expired paid"]);
        assert!(matches!(m.slot("t"), Slot::Idle), "nothing taken for a device that is away");
        let online = Status { v: 1, online: true, printer: None };
        assert_eq!(said(&m.status("t", online, ms(t0, 2_000), later)), ["send receipt#1"]);
    }
}
