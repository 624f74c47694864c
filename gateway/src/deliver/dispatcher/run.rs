//! The dispatcher's runner: owns the channels, the timers, the outbox read-back and the
//! transport, feeds events to the [`Machine`] and carries out the [`Action`]s it returns.

use super::action::{Action, Delivery, ReadBack};
use super::machine::Machine;
use crate::clock::Clock;
use crate::config::DeliveryConfig;
use crate::deliver::transport::{Transport, TransportError};
use crate::model::{Command, Finished, Incoming, Outcome, StoredJob};
use crate::store::Outbox;
use crate::telemetry::recent::{Recent, RecentState};
use crate::telemetry::{Monitor, Stats};
use device_protocol::PrinterState;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{interval, Instant};

/// How often due jobs are acted on (resends, in-flight expiry) and the counts reported to
/// `/stats` and readiness, ms: rather than after every event, as it walks every device.
const TICK_MS: u64 = 100;

/// How often queued jobs are checked for expiry on every device, ms.
const EXPIRY_SWEEP_MS: u64 = 1_000;

/// The per-device dispatcher, sending through a [`Transport`] `T`. Build it with
/// [`Dispatcher::new`], attach the outbox with [`Dispatcher::with_outbox`], give it what
/// the outbox holds with [`Dispatcher::preload`], then run it with [`Dispatcher::run`].
pub struct Dispatcher<T> {
    machine: Machine,
    transport: T,
    finished: mpsc::UnboundedSender<Finished>,
    stats: Arc<Stats>,
    health: Arc<Monitor>,
    clock: Clock,
    /// Where wire bytes not held are read back from; `None`: every job is held (or,
    /// reloaded whole, serialized when sent).
    outbox: Option<Arc<Outbox>>,
    /// The last jobs per device, for the dashboard.
    recent: Arc<Recent>,
    /// Devices' acks and status, read beside `commands` ([`Dispatcher::with_incoming`]).
    incoming: Option<mpsc::Receiver<Incoming>>,
}

/// The next message on `incoming`; pending forever without one.
async fn next_incoming(incoming: &mut Option<mpsc::Receiver<Incoming>>) -> Option<Incoming> {
    match incoming {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

impl<T: Transport> Dispatcher<T> {
    /// A dispatcher with the rules of `cfg`, sending through `transport` and reporting each
    /// job that leaves its queue to `finished`. `clock` is the wall clock jobs' time to live
    /// is read on.
    ///
    /// `finished` is unbounded on purpose: its length is bounded by the jobs queued, which
    /// the consumer bounds, and a bounded channel here could deadlock against the
    /// consumer's bounded [`Command`] channel.
    pub fn new(
        cfg: DeliveryConfig,
        transport: T,
        finished: mpsc::UnboundedSender<Finished>,
        stats: Arc<Stats>,
        health: Arc<Monitor>,
        clock: Clock,
    ) -> Self {
        let recent = Arc::default();
        Dispatcher {
            machine: Machine::new(cfg),
            transport,
            finished,
            stats,
            health,
            clock,
            outbox: None,
            recent,
            incoming: None,
        }
    }

    /// Reads devices' acks and status from `incoming` too, as [`Command::Device`]s. The
    /// messages already there when a command is read are handled before it: a
    /// [`Command::Barrier`] is answered once every message sent before it is handled (a
    /// printer's confirmation before the last outbox write), and an ack is not lost to a
    /// [`Command::Forget`] read after it.
    pub fn with_incoming(mut self, incoming: mpsc::Receiver<Incoming>) -> Self {
        self.incoming = Some(incoming);
        self
    }

    /// Records each job sent and finished in `recent` (the dashboard's view).
    pub fn with_recent(mut self, recent: Arc<Recent>) -> Self {
        self.recent = recent;
        self
    }

    /// Reads the wire bytes of jobs whose bytes are not held (beyond
    /// `delivery.held_payload_bytes`, or reloaded at start-up) back from `outbox`, where
    /// every job the dispatcher is given is stored.
    pub fn with_outbox(mut self, outbox: Arc<Outbox>) -> Self {
        self.machine.read_back_beyond_budget();
        self.outbox = Some(outbox);
        self
    }

    /// Queues jobs stored before a restart, in their order, applying the supersede rule
    /// again: a `display_qr` followed in its device's queue by its charge's paid/expired
    /// screen or receipt is over, even if its removal had not reached the disk before the
    /// crash (the next job may already have been carried out); it is reported superseded
    /// at once. The rest are sent once [`run`](Dispatcher::run) starts.
    ///
    /// `jobs` are headers ([`Outbox::pending_headers`]) when an outbox is attached: their
    /// wire bytes are read back when sent. Without one, whole jobs, serialized when sent.
    pub fn preload(&mut self, jobs: Vec<StoredJob>) {
        for f in self.machine.preload(jobs) {
            self.finish(f);
        }
    }

    /// Runs until `commands` closes: sends what [`preload`](Dispatcher::preload) queued,
    /// then handles commands and devices' messages as they come, acts on due jobs every
    /// 100 ms (and reports the counts to `/stats` and `health.in_flight`), and expires
    /// queued jobs every second.
    pub async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let actions = self.machine.start(Instant::now(), self.clock.now());
        self.carry_out(actions).await;
        let mut incoming = self.incoming.take();
        let mut tick = interval(Duration::from_millis(TICK_MS));
        let mut expiry_sweep = interval(Duration::from_millis(EXPIRY_SWEEP_MS));
        loop {
            tokio::select! {
                cmd = commands.recv() => {
                    let Some(cmd) = cmd else { return };
                    // Device messages that came first are handled first: an ack before the
                    // `Forget` of its device's queue, every ack before a `Barrier`. Only
                    // those queued now: a flood of them would otherwise hold commands back.
                    for _ in 0..incoming.as_ref().map_or(0, mpsc::Receiver::len) {
                        let Some(msg) = incoming.as_mut().and_then(|rx| rx.try_recv().ok()) else { break };
                        let actions = self.handle(Command::Device(msg));
                        self.carry_out(actions).await;
                    }
                    let actions = self.handle(cmd);
                    self.carry_out(actions).await;
                }
                msg = next_incoming(&mut incoming) => match msg {
                    Some(msg) => {
                        let actions = self.handle(Command::Device(msg));
                        self.carry_out(actions).await;
                    }
                    // Every device listener has ended.
                    None => incoming = None,
                },
                _ = tick.tick() => {
                    let actions = self.machine.due(Instant::now(), self.clock.now());
                    self.carry_out(actions).await;
                    self.report();
                }
                _ = expiry_sweep.tick() => {
                    let actions = self.machine.expire_queued(self.clock.now());
                    self.carry_out(actions).await;
                }
            }
        }
    }

    fn handle(&mut self, cmd: Command) -> Vec<Action> {
        let (now, wall) = (Instant::now(), self.clock.now());
        match cmd {
            Command::Enqueue(queued) => self.machine.enqueue(queued, now, wall),
            Command::Forget(devices) => {
                // The next owner offers them from its own board: this one must not too.
                for (device, message_id) in self.machine.forget(&devices) {
                    self.transport.withdraw(&device, &message_id);
                }
                Vec::new()
            }
            Command::Restore(jobs) => self.machine.restore(jobs, now, wall),
            Command::Barrier(answer) => {
                let _ = answer.send(());
                Vec::new()
            }
            Command::Device(Incoming::Ack { device, ack }) => {
                self.health.acked();
                self.machine.ack(&device, ack, now, wall)
            }
            Command::Device(Incoming::Status { device, status }) => {
                let held = match status.printer {
                    _ if !status.online => Some("offline"),
                    Some(PrinterState::PaperOut) => Some("paper_out"),
                    Some(PrinterState::CoverOpen) => Some("cover_open"),
                    _ => None,
                };
                self.stats.device_status(&device, held);
                self.machine.status(&device, status, now, wall)
            }
        }
    }

    /// Carries out `actions` in order; what a read-back leads to is carried out right after
    /// it, before the rest. The stage latencies the machine saw deciding them are reported
    /// first, so `/stats` never counts a job done before its `device` figure.
    async fn carry_out(&mut self, actions: Vec<Action>) {
        self.report_observed();
        let mut todo = VecDeque::from(actions);
        while let Some(action) = todo.pop_front() {
            match action {
                Action::Send(delivery) => self.send(delivery).await,
                Action::ReadBack { device, seq } => {
                    let got = self.read_back(&device, seq);
                    let next = self.machine.read_back(&device, seq, got, Instant::now(), self.clock.now());
                    self.report_observed();
                    for a in next.into_iter().rev() {
                        todo.push_front(a);
                    }
                }
                Action::Finish(f) => self.finish(f),
                Action::Vanished(stored) => {
                    let job = &stored.job;
                    tracing::error!(event_id = %job.event_id, message_id = %job.message_id, device = %stored.device, charge = %job.charge_id, kind = job.kind.as_str(), seq = job.seq, "queued job is no longer in the outbox; dropped");
                    // Reported finished, so the consumer's outbox bounds count it out.
                    let _ = self.finished.send(Finished { stored, outcome: Outcome::Done });
                }
            }
        }
    }

    /// Reports the stage latencies the machine saw since the last report.
    fn report_observed(&mut self) {
        for (stage, took) in self.machine.take_observed() {
            self.stats.observe(stage, took);
        }
    }

    async fn send(&self, d: Delivery) {
        if d.is_redelivery() {
            self.stats.update(|s| s.job_redeliveries += 1);
        }
        self.recent.sent(&d.device, d.seq, &d.message_id, d.attempt, &d.wire, self.clock.now().timestamp_millis());
        match self.transport.send(&d.device, d.wire).await {
            Ok(()) => {}
            Err(e @ TransportError::Down(_)) => {
                tracing::debug!(device = %d.device, seq = d.seq, message_id = %d.message_id, error = %e, "cannot send job; will retry at its timeout");
            }
            Err(e) => {
                tracing::error!(device = %d.device, seq = d.seq, message_id = %d.message_id, error = %e, "cannot send job; will retry at its timeout");
            }
        }
    }

    fn read_back(&self, device: &str, seq: u64) -> ReadBack {
        let Some(outbox) = &self.outbox else {
            // The machine reads back only once `with_outbox` attached one.
            tracing::error!(device, seq, "job to read back without an outbox attached");
            return ReadBack::Failed;
        };
        match outbox.wire(device, seq) {
            Ok(Some(wire)) => ReadBack::Wire(wire),
            Ok(None) => ReadBack::Gone,
            Err(e) => {
                tracing::error!(device, seq, error = %e, "cannot read the job from the outbox; retrying");
                ReadBack::Failed
            }
        }
    }

    /// Reports a job that left its queue to the consumer, counting it.
    fn finish(&self, f: Finished) {
        let (job, device) = (&f.stored.job, &f.stored.device);
        let state = match f.outcome {
            Outcome::Done => RecentState::Done,
            Outcome::Expired => RecentState::Expired,
            Outcome::Superseded => RecentState::Superseded,
            Outcome::Failed(_) => RecentState::Failed,
        };
        let at_ms = self.clock.now().timestamp_millis();
        self.recent.finished(device, job, state, at_ms);
        match f.outcome {
            Outcome::Done => {
                tracing::info!(event_id = %job.event_id, message_id = %job.message_id, device = %device, charge = %job.charge_id, kind = job.kind.as_str(), seq = job.seq, "job done");
                self.stats.effect_done(job.kind.as_str());
            }
            Outcome::Expired => {
                tracing::info!(event_id = %job.event_id, message_id = %job.message_id, device = %device, charge = %job.charge_id, kind = job.kind.as_str(), seq = job.seq, expires_at = ?job.expires_at, "job expired before delivery");
                self.stats.expired(job.kind.as_str());
            }
            Outcome::Superseded | Outcome::Failed(_) => {}
        }
        if !matches!(f.outcome, Outcome::Done) {
            // Ended here, not by the device's ack: a printer that fetches its jobs must
            // not find it still offered.
            self.transport.withdraw(device, &job.message_id);
        }
        let _ = self.finished.send(f);
    }

    /// Jobs queued and in flight, to `/stats` and readiness.
    fn report(&self) {
        let counts = self.machine.counts();
        self.stats.update(|s| s.queued_jobs = counts.queued as u64);
        self.health.in_flight(counts.in_flight);
    }
}
