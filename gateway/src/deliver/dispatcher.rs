//! Per-device delivery: one FIFO queue per device, one job in flight, the next sent only
//! after the device acknowledges the current one (Azure IoT Hub's cloud-to-device model:
//! completed / rejected / abandoned feedback, a maximum delivery count).
//!
//! Lifecycle of a job: queued → in flight → done | failed (dead letter) | expired |
//! superseded.
//! - No ack within `ack_timeout_ms`: sent again (same message id and seq; the device
//!   dedupes), with exponential backoff between attempts.
//! - `failed` ack: permanent → dead letter at once; transient → retried with backoff.
//! - `max_deliveries` sends without a `done` → dead letter.
//! - Its `expires_at` passed (by the injectable [`Clock`]) before it was done → expired:
//!   never sent again, dead-lettered with reason `expired` (a device that cannot take
//!   jobs has its queued ones checked every second, and the one in flight when its ack
//!   timeout passes, so they leave the outbox on time).
//! - A device whose status says offline, or a printer that cannot print (paper out, cover
//!   open), is not sent anything; its queue waits and resumes on the next good status.
//! - A queued `display_qr` for a charge whose paid/expired screen (or, on a printer that
//!   prints pay-with-Pix slips, whose receipt) is enqueued to the same device is
//!   superseded: a customer must never see the QR of a charge that is over.
//!
//! The dispatcher is one task owning the in-memory mirror of the durable outbox
//! ([`crate::store::outbox`]): jobs arrive already stored (with their `seq`), and at start-up it
//! is given every job the outbox still holds. Its queues are bounded by the outbox bound
//! (see [`crate::ingest::consumer`]). A job arrives with its wire bytes (its JSON as the outbox
//! stored it), published as they are. Queued jobs keep them in memory up to
//! `delivery.held_payload_bytes` in all; beyond that, and for jobs reloaded at start-up, only
//! the job's header is kept and the bytes are read back from the outbox when the job is
//! sent ([`Dispatcher::with_outbox`]): memory stays flat however full the outbox gets.

use crate::clock::Clock;
use crate::config::DeliveryConfig;
use crate::deliver::mqtt::Publisher;
use crate::model::{Command, Finished, Incoming, Outcome};
use crate::model::{Queued, StoredJob};
use crate::store::Outbox;
use crate::telemetry::{Monitor, Stats};
use bytes::Bytes;
use device_protocol::{AckResult, EffectKind, PrinterState, Topic};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A job waiting in its device's queue.
struct Pending {
    /// Without its payload.
    stored: StoredJob,
    /// What to publish, while `held_payload_bytes` allows; else read back when sent.
    wire: Option<Bytes>,
}

impl Pending {
    fn held(&self) -> usize {
        self.wire.as_ref().map_or(0, Bytes::len)
    }
}

struct InFlight {
    stored: StoredJob,
    /// What is published (and published again on a resend); read back if it was not held.
    wire: Option<Bytes>,
    attempts: u32,
    /// When to act next: the ack timeout if `awaiting_ack`, else the retry time.
    due: Instant,
    awaiting_ack: bool,
}

#[derive(Default)]
struct DeviceQueue {
    queue: VecDeque<Pending>,
    in_flight: Option<InFlight>,
    online: Option<bool>,
    printer: Option<PrinterState>,
}

impl DeviceQueue {
    /// Unknown status counts as reachable: the ack timeout covers a device that is not.
    fn can_send(&self) -> bool {
        self.online != Some(false) && self.printer.is_none_or(PrinterState::can_print)
    }

    /// Takes the queued jobs `pred` picks out of the queue, in queue order; the rest stay
    /// in order. The queue is only rebuilt when `pred` picks one.
    fn take_where(&mut self, pred: impl Fn(&Pending) -> bool) -> VecDeque<Pending> {
        if !self.queue.iter().any(&pred) {
            return VecDeque::new();
        }
        let (taken, kept) = std::mem::take(&mut self.queue).into_iter().partition(pred);
        self.queue = kept;
        taken
    }
}

/// The dispatcher's state. Run it with [`Dispatcher::run`].
pub struct Dispatcher {
    cfg: DeliveryConfig,
    publisher: Publisher,
    finished: mpsc::UnboundedSender<Finished>,
    stats: Arc<Stats>,
    health: Arc<Monitor>,
    clock: Clock,
    devices: HashMap<String, DeviceQueue>,
    /// Where wire bytes not held are read back from; `None`: every job is held (or, reloaded
    /// whole, serialized when sent).
    outbox: Option<Arc<Outbox>>,
    /// Wire bytes held by queued jobs (not the in-flight ones: at most one per device), bytes.
    held: usize,
}

impl Dispatcher {
    /// A dispatcher publishing through `publisher` and reporting to `finished`.
    ///
    /// `finished` is unbounded on purpose: its length is bounded by the jobs queued, which
    /// the consumer bounds, and a bounded channel here could deadlock against the
    /// consumer's bounded [`Command`] channel.
    pub fn new(cfg: DeliveryConfig, publisher: Publisher, finished: mpsc::UnboundedSender<Finished>, stats: Arc<Stats>, health: Arc<Monitor>, clock: Clock) -> Self {
        Dispatcher { cfg, publisher, finished, stats, health, clock, devices: HashMap::new(), outbox: None, held: 0 }
    }

    /// Reads the wire bytes of jobs whose bytes are not held (beyond
    /// `delivery.held_payload_bytes`, or reloaded at start-up) back from `outbox`, where every
    /// job the dispatcher is given is stored.
    pub fn with_outbox(mut self, outbox: Arc<Outbox>) -> Self {
        self.outbox = Some(outbox);
        self
    }

    /// A job to wait in a queue: its wire bytes held while the budget allows (always
    /// without an outbox to read them back from).
    fn shelve(&mut self, q: Queued) -> Pending {
        let keep = self.outbox.is_none() || self.held + q.wire.len() <= self.cfg.held_payload_bytes;
        let wire = keep.then_some(q.wire);
        self.held += wire.as_ref().map_or(0, Bytes::len);
        Pending { stored: q.stored, wire }
    }

    /// Queues jobs stored before a restart, in their order, applying the supersede rule
    /// again: a `display_qr` followed in its device's queue by its charge's paid/expired
    /// screen or receipt is over, even if its removal had not reached the disk before the
    /// crash (the next job may already have been carried out).
    ///
    /// `jobs` are headers ([`Outbox::pending_headers`]) when an outbox is attached: their
    /// wire bytes are read back when sent. Without one, the job is serialized when sent.
    pub fn preload(&mut self, jobs: Vec<StoredJob>) {
        for stored in jobs {
            self.devices.entry(stored.device.clone()).or_default().queue.push_back(Pending { stored, wire: None });
        }
        let mut over = Vec::new();
        for q in self.devices.values_mut() {
            // Per charge, the last job that ends its QR (a map: a reloaded queue holds up to
            // `outbox.max_jobs_per_device` jobs, and a list made this quadratic).
            let mut ends: HashMap<String, u64> = HashMap::new();
            for p in q.queue.iter().filter(|p| ends_qr(p.stored.job.kind)) {
                let last = ends.entry(p.stored.job.charge_id.clone()).or_default();
                *last = (*last).max(p.stored.job.seq);
            }
            over.extend(q.take_where(|p| {
                let s = &p.stored;
                s.job.kind == EffectKind::DisplayQr && ends.get(&s.job.charge_id).is_some_and(|&last| last > s.job.seq)
            }));
        }
        for p in over {
            self.finish(p.stored, Outcome::Superseded);
        }
    }

    /// Runs until `commands` closes.
    pub async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let devices: Vec<String> = self.devices.keys().cloned().collect();
        for d in devices {
            self.pump(&d).await;
        }
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut expiry_tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                cmd = commands.recv() => match cmd {
                    Some(cmd) => self.handle(cmd).await,
                    None => return,
                },
                _ = tick.tick() => {
                    self.on_tick().await;
                    self.report();
                }
                _ = expiry_tick.tick() => self.expire_queued(),
            }
        }
    }

    /// Jobs queued and in flight, for `/stats` and readiness: every 100 ms rather than
    /// after every event (it walks every device).
    fn report(&self) {
        let (mut queued, mut in_flight) = (0, 0);
        for d in self.devices.values() {
            queued += d.queue.len() + d.in_flight.is_some() as usize;
            in_flight += (d.can_send() && d.in_flight.as_ref().is_some_and(|f| f.awaiting_ack)) as usize;
        }
        self.stats.update(|s| s.queued_jobs = queued as u64);
        self.health.in_flight(in_flight);
    }

    async fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Enqueue(queued) => {
                let device = queued.stored.device.clone();
                let q = self.devices.entry(device.clone()).or_default();
                let job = &queued.stored.job;
                // A printer's pay-with-Pix slip (`display_qr`) is over once its receipt is due too.
                if ends_qr(job.kind) {
                    for p in q.take_where(|p| p.stored.job.kind == EffectKind::DisplayQr && p.stored.job.charge_id == job.charge_id) {
                        self.held -= p.held();
                        self.finish(p.stored, Outcome::Superseded);
                    }
                }
                let pending = self.shelve(queued);
                self.devices.get_mut(&device).expect("just inserted").queue.push_back(pending);
                self.pump(&device).await;
            }
            Command::Device(Incoming::Ack { device, ack }) => {
                self.health.acked();
                let Some(q) = self.devices.get_mut(&device) else { return };
                let Some(f) = q.in_flight.as_mut() else { return };
                if f.stored.job.message_id != ack.message_id {
                    return; // a late duplicate ack of an earlier job
                }
                match ack.result {
                    AckResult::Done => {
                        let f = q.in_flight.take().expect("checked");
                        self.stats.effect_done(f.stored.job.kind.as_str());
                        self.finish(f.stored, Outcome::Done);
                    }
                    AckResult::Failed => {
                        let reason = ack.reason.unwrap_or_else(|| "unspecified".into());
                        if ack.permanent || f.attempts >= self.cfg.max_deliveries {
                            let f = q.in_flight.take().expect("checked");
                            let why = format!("device_rejected: {reason} (after {} deliveries)", f.attempts);
                            self.finish(f.stored, Outcome::Failed(why));
                        } else {
                            f.awaiting_ack = false;
                            f.due = Instant::now() + backoff(&self.cfg, f.attempts);
                        }
                    }
                }
                self.pump(&device).await;
            }
            Command::Device(Incoming::Status { device, status }) => {
                let q = self.devices.entry(device.clone()).or_default();
                let was_sendable = q.can_send();
                q.online = Some(status.online);
                q.printer = status.printer;
                if q.can_send() && !was_sendable {
                    // Back: resend what was in flight now rather than after its timeout.
                    if let Some(f) = q.in_flight.as_mut() {
                        f.awaiting_ack = false;
                        f.due = Instant::now();
                    }
                }
                self.pump(&device).await;
            }
        }
    }

    /// Sends the next job of `device` if nothing is in flight and the device can take it,
    /// or resends the in-flight one when it is due. An in-flight job due again whose time
    /// to live passed is expired even while the device cannot take jobs (offline, paper
    /// out), so it does not hold its place in the bounds until the device is back; only
    /// once its ack timeout has passed, as a device that took it before it went away may
    /// still report it done.
    async fn pump(&mut self, device: &str) {
        let Some(q) = self.devices.get_mut(device) else { return };
        let can_send = q.can_send();
        let now = Instant::now();
        let wall_now = self.clock.now();
        if q.in_flight.is_none() {
            if !can_send {
                return;
            }
            let Some(p) = q.queue.pop_front() else { return };
            self.held -= p.held();
            q.in_flight = Some(InFlight { stored: p.stored, wire: p.wire, attempts: 0, due: now, awaiting_ack: false });
        }
        let f = q.in_flight.as_mut().expect("set above");
        if f.due > now {
            return;
        }
        if f.stored.job.expires_at.is_some_and(|at| at <= wall_now) {
            // Never sent after its time to live, not even again: a late QR or "paid" screen
            // misleads the customer in front of the card machine.
            let f = q.in_flight.take().expect("checked");
            self.expired(f.stored);
            return Box::pin(self.pump(device)).await;
        }
        if !can_send {
            return;
        }
        if f.awaiting_ack || f.attempts > 0 {
            if f.attempts >= self.cfg.max_deliveries {
                let f = q.in_flight.take().expect("checked");
                let why = format!("no_ack: no acknowledgement after {} deliveries", f.attempts);
                self.finish(f.stored, Outcome::Failed(why));
                return Box::pin(self.pump(device)).await;
            }
            self.stats.update(|s| s.job_redeliveries += 1);
        }
        if f.wire.is_none() {
            if let Some(outbox) = &self.outbox {
                match outbox.wire(device, f.stored.job.seq) {
                    Ok(Some(wire)) => f.wire = Some(wire),
                    Ok(None) => {
                        // Not in the outbox any more (finished by an earlier run): nothing to send.
                        tracing::error!(device, seq = f.stored.job.seq, message_id = %f.stored.job.message_id, "queued job is no longer in the outbox; dropped");
                        // Reported finished, so the consumer's outbox bounds count it out.
                        let f = q.in_flight.take().expect("checked");
                        self.finish(f.stored, Outcome::Done);
                        return Box::pin(self.pump(device)).await;
                    }
                    Err(e) => {
                        tracing::error!(device, seq = f.stored.job.seq, error = %e, "cannot read the job from the outbox; retrying");
                        f.due = now + backoff(&self.cfg, f.attempts.max(1));
                        return;
                    }
                }
            }
        }
        f.attempts += 1;
        f.awaiting_ack = true;
        f.due = now + Duration::from_millis(self.cfg.ack_timeout_ms) + backoff(&self.cfg, f.attempts - 1);
        // Without an outbox, a job reloaded whole is serialized here.
        let payload = f.wire.clone().unwrap_or_else(|| Bytes::from(f.stored.job.to_json()));
        let topic = Topic::Jobs(device.to_string()).path();
        if let Err(e) = self.publisher.publish(topic, payload).await {
            tracing::error!(device, error = %e, "cannot publish job; will retry at its timeout");
        }
    }

    async fn on_tick(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .devices
            .iter()
            .filter(|(_, q)| q.in_flight.as_ref().is_some_and(|f| f.due <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for device in due {
            self.pump(&device).await;
        }
    }

    /// Drops queued jobs whose time to live passed, for every device (those that can send
    /// find them at the head of their queue anyway; this reaches devices that cannot).
    fn expire_queued(&mut self) {
        let now = self.clock.now();
        let mut expired = Vec::new();
        for q in self.devices.values_mut() {
            expired.extend(q.take_where(|p| p.stored.job.expires_at.is_some_and(|at| at <= now)));
        }
        for p in expired {
            self.held -= p.held();
            self.expired(p.stored);
        }
    }

    fn expired(&self, stored: StoredJob) {
        tracing::info!(device = %stored.device, kind = stored.job.kind.as_str(), charge = %stored.job.charge_id, expires_at = ?stored.job.expires_at, "job expired before delivery");
        self.stats.expired(stored.job.kind.as_str());
        self.finish(stored, Outcome::Expired);
    }

    fn finish(&self, stored: StoredJob, outcome: Outcome) {
        let _ = self.finished.send(Finished { stored, outcome });
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
    use device_protocol::{Ack, Job, Status};

    struct Harness {
        cmd: mpsc::Sender<Command>,
        sent: mpsc::Receiver<(String, Bytes)>,
        finished: mpsc::UnboundedReceiver<Finished>,
        stats: Arc<Stats>,
        clock: Clock,
    }

    fn harness(ack_timeout_ms: u64, max_deliveries: u32) -> Harness {
        let cfg = DeliveryConfig { ack_timeout_ms, backoff_initial_ms: 10, backoff_max_ms: 20, max_deliveries, ..DeliveryConfig::default() };
        let (publisher, sent) = Publisher::channel(64);
        let (ftx, finished) = mpsc::unbounded_channel();
        let stats = Arc::new(Stats::default());
        let (cmd, rx) = mpsc::channel(64);
        let clock = Clock::default();
        tokio::spawn(Dispatcher::new(cfg, publisher, ftx, stats.clone(), Arc::new(Monitor::default()), clock.clone()).run(rx));
        Harness { cmd, sent, finished, stats, clock }
    }

    fn job(id: &str, kind: EffectKind, charge: &str) -> Job {
        Job {
            v: 1,
            message_id: id.into(),
            seq: 0,
            kind,
            event_id: format!("ev-{id}"),
            charge_id: charge.into(),
            content_type: "x".into(),
            payload: String::new(),
            expires_at: None,
        }
    }

    impl Harness {
        /// Enqueues as the outbox would: `seq` = 1 + the device's previous (offset order).
        async fn enqueue(&self, dev: &str, mut j: Job, seq: i64) {
            j.seq = seq as u64;
            let source = crate::model::SourceRef { topic: "charge.upserted".into(), partition: 0, offset: seq, key: None };
            self.cmd.send(Command::Enqueue(Queued::from_stored(StoredJob { device: dev.into(), job: j, source }))).await.unwrap();
        }
        async fn ack(&self, dev: &str, id: &str, result: AckResult, permanent: bool) {
            let ack = match result {
                AckResult::Done => Ack::done(id, 0, false),
                AckResult::Failed => Ack::failed(id, 0, "r", permanent),
            };
            self.cmd.send(Command::Device(Incoming::Ack { device: dev.into(), ack })).await.unwrap();
        }
        async fn status(&self, dev: &str, online: bool, printer: Option<PrinterState>) {
            let status = Status { v: 1, online, printer };
            self.cmd.send(Command::Device(Incoming::Status { device: dev.into(), status })).await.unwrap();
        }
        async fn next_sent(&mut self) -> Job {
            let (topic, payload) = tokio::time::timeout(Duration::from_secs(2), self.sent.recv()).await.expect("a publish").unwrap();
            let j: Job = serde_json::from_slice(&payload).unwrap();
            assert_eq!(topic, format!("pixgate/v1/devices/{}/jobs", topic.split('/').nth(3).unwrap()));
            j
        }
        async fn nothing_sent(&mut self, ms: u64) {
            assert!(tokio::time::timeout(Duration::from_millis(ms), self.sent.recv()).await.is_err(), "unexpected publish");
        }
        async fn next_finished(&mut self) -> Finished {
            tokio::time::timeout(Duration::from_secs(2), self.finished.recv()).await.expect("a finished job").unwrap()
        }
    }

    #[tokio::test]
    async fn one_in_flight_per_device_in_order() {
        let mut h = harness(10_000, 10);
        h.enqueue("d1", job("a", EffectKind::DisplayQr, "c1"), 1).await;
        h.enqueue("d1", job("b", EffectKind::PaymentConfirmed, "c2"), 2).await;
        h.enqueue("d2", job("x", EffectKind::PrintReceipt, "c3"), 1).await;
        let first = h.next_sent().await;
        let other = h.next_sent().await;
        assert_eq!((first.message_id.as_str(), first.seq), ("a", 1));
        assert_eq!((other.message_id.as_str(), other.seq), ("x", 1), "other devices are not held back");
        h.nothing_sent(150).await;
        h.ack("d1", "a", AckResult::Done, false).await;
        assert_eq!(h.next_finished().await.outcome, Outcome::Done);
        let second = h.next_sent().await;
        assert_eq!((second.message_id.as_str(), second.seq), ("b", 2));
    }

    #[tokio::test]
    async fn unacknowledged_job_is_resent_then_dead_lettered() {
        let mut h = harness(30, 3);
        h.enqueue("d1", job("a", EffectKind::DisplayQr, "c1"), 1).await;
        for _ in 0..3 {
            let j = h.next_sent().await;
            assert_eq!((j.message_id.as_str(), j.seq), ("a", 1), "same id and seq on every delivery");
        }
        let f = h.next_finished().await;
        assert!(matches!(&f.outcome, Outcome::Failed(r) if r.starts_with("no_ack")), "{:?}", f.outcome);
        assert_eq!(h.stats.snapshot().job_redeliveries, 2);
    }

    #[tokio::test]
    async fn permanent_failure_dead_letters_and_moves_on() {
        let mut h = harness(10_000, 10);
        h.enqueue("p", job("a", EffectKind::PrintReceipt, "c1"), 1).await;
        h.enqueue("p", job("b", EffectKind::PrintReceipt, "c2"), 2).await;
        h.next_sent().await;
        h.ack("p", "a", AckResult::Failed, true).await;
        assert!(matches!(h.next_finished().await.outcome, Outcome::Failed(_)));
        assert_eq!(h.next_sent().await.message_id, "b");
    }

    #[tokio::test]
    async fn transient_failure_is_retried() {
        let mut h = harness(10_000, 10);
        h.enqueue("p", job("a", EffectKind::PrintReceipt, "c1"), 1).await;
        h.next_sent().await;
        h.ack("p", "a", AckResult::Failed, false).await;
        assert_eq!(h.next_sent().await.message_id, "a", "retried after backoff");
        h.ack("p", "a", AckResult::Done, false).await;
        assert_eq!(h.next_finished().await.outcome, Outcome::Done);
    }

    #[tokio::test]
    async fn offline_and_paper_out_hold_the_queue() {
        let mut h = harness(10_000, 10);
        h.status("p", true, Some(PrinterState::PaperOut)).await;
        h.status("t", false, None).await;
        h.enqueue("p", job("a", EffectKind::PrintReceipt, "c1"), 1).await;
        h.enqueue("t", job("b", EffectKind::DisplayQr, "c2"), 1).await;
        h.nothing_sent(200).await;
        h.status("p", true, Some(PrinterState::Ready)).await;
        assert_eq!(h.next_sent().await.message_id, "a");
        h.status("t", true, None).await;
        assert_eq!(h.next_sent().await.message_id, "b");
    }

    #[tokio::test]
    async fn queued_qr_is_superseded_by_the_paid_screen() {
        let mut h = harness(10_000, 10);
        h.enqueue("t", job("busy", EffectKind::DisplayQr, "c0"), 1).await;
        h.enqueue("t", job("qr", EffectKind::DisplayQr, "c1"), 2).await;
        h.enqueue("t", job("paid", EffectKind::PaymentConfirmed, "c1"), 3).await;
        let f = h.next_finished().await;
        assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("qr", Outcome::Superseded));
        assert_eq!(h.next_sent().await.message_id, "busy");
        h.ack("t", "busy", AckResult::Done, false).await;
        h.next_finished().await;
        assert_eq!(h.next_sent().await.message_id, "paid");
    }

    /// A device offline for 25 minutes (by the injected clock): its backlog comes in order
    /// when it is back, without the jobs whose time to live passed, which are recorded.
    #[tokio::test]
    async fn offline_backlog_keeps_order_and_expires_what_outlived_its_ttl() {
        let mut h = harness(10_000, 10);
        let at = |min: i64| Some(h.clock.now() + chrono::Duration::minutes(min));
        h.status("t", false, None).await;
        let mut jobs = vec![
            job("qr-old", EffectKind::DisplayQr, "c1"),   // QR of a charge expiring in 15 min
            job("paid-old", EffectKind::PaymentConfirmed, "c0"), // 10 min TTL
            job("receipt", EffectKind::PrintReceipt, "c0"), // 24 h TTL
            job("qr-new", EffectKind::DisplayQr, "c2"),   // expires in 60 min
        ];
        for (j, ttl) in jobs.iter_mut().zip([15, 10, 1440, 60]) {
            j.expires_at = at(ttl);
        }
        for (i, j) in jobs.into_iter().enumerate() {
            h.enqueue("t", j, i as i64 + 1).await;
        }
        h.nothing_sent(150).await;
        h.clock.advance(25 * 60_000);
        // The 1 s expiry sweep finds them while the device is still offline.
        let mut gone = vec![h.next_finished().await, h.next_finished().await];
        gone.sort_by(|a, b| a.stored.job.seq.cmp(&b.stored.job.seq));
        assert_eq!(gone.iter().map(|f| (f.stored.job.message_id.as_str(), f.outcome.clone())).collect::<Vec<_>>(), [("qr-old", Outcome::Expired), ("paid-old", Outcome::Expired)]);
        assert_eq!(h.stats.snapshot().expired.values().sum::<u64>(), 2);
        h.status("t", true, None).await;
        let first = h.next_sent().await;
        assert_eq!((first.message_id.as_str(), first.seq), ("receipt", 3));
        h.ack("t", "receipt", AckResult::Done, false).await;
        h.next_finished().await;
        assert_eq!(h.next_sent().await.message_id, "qr-new");
    }

    /// A job whose TTL passes while it waits for its ack is not sent again.
    #[tokio::test]
    async fn in_flight_job_expires_instead_of_being_resent() {
        let mut h = harness(300, 10);
        let mut j = job("paid", EffectKind::PaymentConfirmed, "c1");
        j.expires_at = Some(h.clock.now() + chrono::Duration::minutes(10));
        h.enqueue("t", j, 1).await;
        assert_eq!(h.next_sent().await.message_id, "paid");
        h.clock.advance(11 * 60_000);
        let f = h.next_finished().await;
        assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("paid", Outcome::Expired));
        h.nothing_sent(200).await;
    }

    /// A job in flight when its device went offline expires while the device stays away
    /// (not only when it comes back), once its ack timeout has passed; the device's next
    /// job goes out when it is back.
    #[tokio::test]
    async fn in_flight_job_of_an_offline_device_expires_while_it_is_away() {
        let mut h = harness(1_000, 10);
        let mut j = job("paid", EffectKind::PaymentConfirmed, "c1");
        j.expires_at = Some(h.clock.now() + chrono::Duration::minutes(10));
        h.enqueue("t", j, 1).await;
        h.enqueue("t", job("receipt", EffectKind::PrintReceipt, "c1"), 2).await;
        assert_eq!(h.next_sent().await.message_id, "paid");
        h.status("t", false, None).await;
        // Past its TTL but within its ack timeout (1 s): the device may still report it done.
        h.clock.advance(11 * 60_000);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(h.finished.try_recv().is_err(), "expired before its ack timeout");
        // At the first tick after the ack timeout.
        let f = tokio::time::timeout(Duration::from_secs(5), h.finished.recv()).await.expect("expired after its ack timeout").unwrap();
        assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("paid", Outcome::Expired));
        assert_eq!(h.stats.snapshot().expired.values().sum::<u64>(), 1);
        h.nothing_sent(200).await;
        h.status("t", true, None).await;
        assert_eq!(h.next_sent().await.message_id, "receipt");
    }

    /// After a crash the outbox may still hold a QR whose removal had not reached the disk,
    /// ahead of its charge's "paid" screen: it is superseded at load, never sent.
    #[tokio::test]
    async fn preload_supersedes_a_qr_followed_by_its_charges_end() {
        let cfg = DeliveryConfig { ack_timeout_ms: 10_000, ..DeliveryConfig::default() };
        let (publisher, mut sent) = Publisher::channel(64);
        let (ftx, mut finished) = mpsc::unbounded_channel();
        let mut d = Dispatcher::new(cfg, publisher, ftx, Arc::new(Stats::default()), Arc::new(Monitor::default()), Clock::default());
        let src = crate::model::SourceRef { topic: "charge.upserted".into(), partition: 0, offset: 1, key: None };
        let stored = |id: &str, kind, charge: &str, seq| {
            let mut j = job(id, kind, charge);
            j.seq = seq;
            StoredJob { device: "t".into(), job: j, source: src.clone() }
        };
        // A QR queued after its charge's end (seq 8) is not ended by it.
        d.preload(vec![
            stored("qr1", EffectKind::DisplayQr, "c1", 5),
            stored("paid1", EffectKind::PaymentConfirmed, "c1", 6),
            stored("qr2", EffectKind::DisplayQr, "c2", 7),
            stored("qr1-later", EffectKind::DisplayQr, "c1", 8),
        ]);
        let (cmd, rx) = mpsc::channel(8);
        tokio::spawn(d.run(rx));
        let f = finished.recv().await.unwrap();
        assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("qr1", Outcome::Superseded));
        for want in ["paid1", "qr2", "qr1-later"] {
            let (_, payload) = sent.recv().await.unwrap();
            assert_eq!(serde_json::from_slice::<Job>(&payload).unwrap().message_id, want);
            cmd.send(Command::Device(Incoming::Ack { device: "t".into(), ack: Ack::done(want, 0, false) })).await.unwrap();
            let f = finished.recv().await.unwrap();
            assert_eq!((f.stored.job.message_id.as_str(), f.outcome), (want, Outcome::Done));
        }
    }

    #[tokio::test]
    async fn queued_pix_slip_is_superseded_by_the_receipt() {
        let mut h = harness(10_000, 10);
        h.enqueue("p", job("busy", EffectKind::PrintReceipt, "c0"), 1).await;
        h.enqueue("p", job("slip", EffectKind::DisplayQr, "c1"), 2).await;
        h.enqueue("p", job("receipt", EffectKind::PrintReceipt, "c1"), 3).await;
        let f = h.next_finished().await;
        assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("slip", Outcome::Superseded));
    }

    /// A source to store test jobs with.
    fn src() -> crate::model::SourceRef {
        crate::model::SourceRef { topic: "charge.upserted".into(), partition: 0, offset: 1, key: None }
    }

    /// A receipt job whose payload names it.
    fn with_payload(id: &str) -> Job {
        let mut j = job(id, EffectKind::PrintReceipt, &format!("c-{id}"));
        j.payload = Job::encode_payload(format!("receipt bytes of {id}").as_bytes());
        j
    }

    /// With an outbox attached and no memory for payloads, queued jobs keep only their
    /// header and are read back when sent: each device still gets every job whole, in
    /// order, whether it was reloaded at start-up or enqueued behind a busy head; a failed
    /// one's dead letter keeps the stored job, payload included.
    #[tokio::test]
    async fn queued_jobs_shed_their_payload_and_are_sent_whole() {
        let (_dir, outbox) = crate::test_fixtures::temp_outbox("dispatch-payload");
        let src = src();
        // Two stored before a "restart" (reloaded without payloads), two after (queued behind a busy head).
        let before = outbox.accept(None, vec![("p".into(), with_payload("a")), ("p".into(), with_payload("b"))], &src, 1).unwrap();
        assert_eq!(before.len(), 2);
        let cfg = DeliveryConfig { ack_timeout_ms: 10_000, held_payload_bytes: 0, ..DeliveryConfig::default() };
        let (publisher, mut sent) = Publisher::channel(64);
        let (ftx, mut finished) = mpsc::unbounded_channel();
        let mut d = Dispatcher::new(cfg, publisher, ftx, Arc::new(Stats::default()), Arc::new(Monitor::default()), Clock::default()).with_outbox(outbox.clone());
        let headers = outbox.pending_headers().unwrap();
        assert!(headers.iter().all(|s| s.job.payload.is_empty()), "loaded without payloads");
        d.preload(headers);
        let (cmd, rx) = mpsc::channel(8);
        tokio::spawn(d.run(rx));
        let after = outbox.accept(None, vec![("p".into(), with_payload("c")), ("p".into(), with_payload("d"))], &src, 2).unwrap();
        for s in after {
            cmd.send(Command::Enqueue(s)).await.unwrap();
        }
        for id in ["a", "b", "c", "d"] {
            let (_, payload) = sent.recv().await.unwrap();
            let j: Job = serde_json::from_slice(&payload).unwrap();
            assert_eq!(j.message_id, id, "in order");
            assert_eq!(j.payload_bytes().unwrap(), format!("receipt bytes of {id}").as_bytes(), "{id} sent whole");
            if id == "d" {
                cmd.send(Command::Device(Incoming::Ack { device: "p".into(), ack: Ack::failed(id, j.seq, "jam", true) })).await.unwrap();
            } else {
                cmd.send(Command::Device(Incoming::Ack { device: "p".into(), ack: Ack::done(id, j.seq, false) })).await.unwrap();
            }
        }
        for _ in 0..4 {
            let f = finished.recv().await.unwrap();
            if f.outcome == Outcome::Done {
                outbox.complete(&f.stored.device, f.stored.job.seq, false).unwrap();
                continue;
            }
            // What the consumer does with a failed job: its dead letter keeps the job whole.
            let dl = crate::model::DeadLetter::for_job(crate::model::DeadLetterReason::DeliveryFailed, "jam".into(), &f.stored);
            let id = outbox.fail_job(&f.stored, dl, 3).unwrap();
            let parked = outbox.parked_deadletters(10).unwrap().into_iter().find(|p| p.id == id).unwrap();
            let kept = parked.job.unwrap();
            assert_eq!(kept.job.payload_bytes().unwrap(), b"receipt bytes of d");
            let value: Job = serde_json::from_str(parked.dead_letter.job.as_deref().unwrap()).unwrap();
            assert_eq!(value.payload_bytes().unwrap(), b"receipt bytes of d", "the dead letter's job is the whole job");
        }
        assert!(outbox.pending().unwrap().is_empty());
    }

    /// Queued jobs keep their wire bytes in memory up to `held_payload_bytes`, and are sent
    /// from memory; beyond it they are read back from the outbox. Told apart here by taking
    /// both rows out of the outbox while they wait: the held job still goes out whole, the
    /// other one is found gone and not sent.
    #[tokio::test]
    async fn queued_jobs_are_held_up_to_the_budget_then_read_back() {
        let (_dir, outbox) = crate::test_fixtures::temp_outbox("dispatch-held");
        let src = src();
        let queued = outbox.accept(None, ["head", "held", "read"].map(|id| ("p".to_string(), with_payload(id))).to_vec(), &src, 1).unwrap();
        // Room for one of the two that wait behind the head.
        let cfg = DeliveryConfig { ack_timeout_ms: 10_000, held_payload_bytes: queued[1].wire.len(), ..DeliveryConfig::default() };
        let (publisher, mut sent) = Publisher::channel(64);
        let (ftx, mut finished) = mpsc::unbounded_channel();
        let d = Dispatcher::new(cfg, publisher, ftx, Arc::new(Stats::default()), Arc::new(Monitor::default()), Clock::default()).with_outbox(outbox.clone());
        let (cmd, rx) = mpsc::channel(8);
        tokio::spawn(d.run(rx));
        for q in queued {
            cmd.send(Command::Enqueue(q)).await.unwrap();
        }
        let (_, wire) = sent.recv().await.unwrap();
        assert_eq!(serde_json::from_slice::<Job>(&wire).unwrap().message_id, "head");
        outbox.complete("p", 2, false).unwrap();
        outbox.complete("p", 3, false).unwrap();
        cmd.send(Command::Device(Incoming::Ack { device: "p".into(), ack: Ack::done("head", 1, false) })).await.unwrap();
        assert_eq!(finished.recv().await.unwrap().outcome, Outcome::Done);
        let (_, wire) = sent.recv().await.unwrap();
        let j: Job = serde_json::from_slice(&wire).unwrap();
        assert_eq!((j.message_id.as_str(), j.payload_bytes().unwrap()), ("held", b"receipt bytes of held".to_vec()), "sent from memory");
        cmd.send(Command::Device(Incoming::Ack { device: "p".into(), ack: Ack::done("held", 2, false) })).await.unwrap();
        assert_eq!(finished.recv().await.unwrap().outcome, Outcome::Done);
        assert!(tokio::time::timeout(Duration::from_millis(300), sent.recv()).await.is_err(), "the job not held was read back, found gone, and not sent");
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let cfg = DeliveryConfig { backoff_initial_ms: 100, backoff_max_ms: 1000, ..DeliveryConfig::default() };
        let got: Vec<u64> = (0..7).map(|a| backoff(&cfg, a).as_millis() as u64).collect();
        assert_eq!(got, [0, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(&cfg, 64).as_millis(), 1000, "no overflow");
    }
}
