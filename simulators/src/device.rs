//! One simulated device (printer or card machine) on MQTT, speaking device-protocol v1.
//!
//! The device is one rumqttc [`AsyncClient`] with client id `dev-{id}`, a persistent session
//! (`clean_session = false`), keep-alive 5 s and a last will `{"v":1,"online":false}`
//! (retained, QoS 1) on its status topic. Two tasks:
//!
//! - the **poll task** drives the `EventLoop` continuously. After every ConnAck it publishes
//!   the retained status `{"v":1,"online":true,"printer":"ready"}` (no `printer` field for a
//!   card machine) and, when the broker did not resume the session, subscribes to its jobs
//!   topic at QoS 1. On a connection error it waits with exponential backoff and jitter
//!   (200 ms doubling to 5 s) and reconnects, forever, until shutdown. It never publishes
//!   itself (it spawns for that), so it cannot deadlock on rumqttc's request channel.
//! - the **worker** carries jobs out one at a time, in arrival order. Per job: a `message_id`
//!   already carried out is acked `done` with `duplicate: true` and nothing else happens;
//!   otherwise the job is carried out ([`crate::printer`], [`crate::terminal`]) and acked
//!   `done`, or `failed` with a reason (`permanent: true` for undecodable content, a wrong
//!   content type or an expired job). Every job's seq must be larger than the last new job's
//!   seq; violations are counted and logged. The MQTT PUBACK is sent only after the ack was
//!   published (manual acks), and only on the connection the job arrived on, so a job that
//!   was received but not carried out is redelivered by the broker.
//!
//! Shutdown (documented choice): the worker finishes the job it is on, then the device
//! publishes `{"v":1,"online":false}` retained itself and disconnects cleanly, so the last
//! will does not fire but the retained status still says offline.
//!
//! The set of carried-out message ids lives in memory: a restarted simulator process forgets
//! it (like a printer losing power).

use crate::effect::{EffectRecord, JobError};
use crate::printer::{print_job, PrinterSettings};
use crate::registry::DeviceSpec;
use crate::terminal::{show_job, TerminalSettings};
use anyhow::Result;
use device_protocol::{Ack, Job, PrinterState, Status, Topic};
use rumqttc::{
    AsyncClient, ConnectReturnCode, Event, EventLoop, LastWill, MqttOptions, Outgoing, Packet,
    Publish, QoS,
};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Largest MQTT packet a device accepts or sends (receipts with raster QR codes are large).
pub const MAX_PACKET_BYTES: usize = 4 * 1024 * 1024;

/// Where and how a device connects.
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// MQTT broker host.
    pub mqtt_host: String,
    /// MQTT broker port.
    pub mqtt_port: u16,
    /// Output root; the device writes into `{out_dir}/{id}/`.
    pub out_dir: PathBuf,
    /// Refuse (ack `failed`, permanent) jobs whose `expires_at` has passed, as the protocol
    /// requires. Turn off to replay old fixtures.
    pub honor_expiry: bool,
}

/// Counters and effects, shared by every device of a fleet (or owned by one device).
#[derive(Debug, Default)]
pub struct Stats {
    raw_jobs: AtomicU64,
    duplicates: AtomicU64,
    order_violations: AtomicU64,
    failed: AtomicU64,
    malformed: AtomicU64,
    effects: Mutex<Vec<EffectRecord>>,
}

/// A copy of [`Stats`] at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StatsSnapshot {
    /// Job publishes received, redeliveries included.
    pub raw_jobs: u64,
    /// Jobs whose message id had already been carried out (acked with `duplicate: true`).
    pub duplicates: u64,
    /// New jobs whose seq was not larger than the previous new job's seq on that device.
    pub order_violations: u64,
    /// Jobs acked `failed`.
    pub failed: u64,
    /// Job publishes that were not a valid [`Job`].
    pub malformed: u64,
    /// Jobs carried out.
    pub effects: u64,
}

impl Stats {
    /// Every effect so far, in the order carried out.
    pub fn effects(&self) -> Vec<EffectRecord> {
        self.effects.lock().expect("effects lock").clone()
    }
    /// Job publishes received, redeliveries included.
    pub fn raw_jobs(&self) -> u64 {
        self.raw_jobs.load(Ordering::Relaxed)
    }
    /// Duplicate jobs (already carried out).
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }
    /// Sequence violations.
    pub fn order_violations(&self) -> u64 {
        self.order_violations.load(Ordering::Relaxed)
    }
    /// All counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            raw_jobs: self.raw_jobs(),
            duplicates: self.duplicates(),
            order_violations: self.order_violations(),
            failed: self.failed.load(Ordering::Relaxed),
            malformed: self.malformed.load(Ordering::Relaxed),
            effects: self.effects.lock().expect("effects lock").len() as u64,
        }
    }
}

/// A running simulated device.
pub struct DeviceHandle {
    id: String,
    client: AsyncClient,
    ready: watch::Receiver<bool>,
    stop_worker: watch::Sender<bool>,
    stop_poll: watch::Sender<bool>,
    worker: JoinHandle<()>,
    poll: JoinHandle<()>,
    is_printer: bool,
}

impl DeviceHandle {
    /// The device's registry id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Connected and subscribed to its jobs topic right now.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the device is connected and subscribed.
    ///
    /// # Errors
    /// Not ready within `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let mut rx = self.ready.clone();
        tokio::time::timeout(timeout, rx.wait_for(|r| *r))
            .await
            .map_err(|_| anyhow::anyhow!("device {} not connected after {timeout:?}", self.id))?
            .map_err(|_| anyhow::anyhow!("device {} stopped", self.id))?;
        Ok(())
    }

    /// Stops the device: finishes the current job, publishes offline status (retained) and
    /// disconnects cleanly. Bounded: gives up waiting after a few seconds.
    pub async fn shutdown(self) {
        let _ = self.stop_worker.send(true);
        let mut worker = self.worker;
        if tokio::time::timeout(Duration::from_secs(30), &mut worker)
            .await
            .is_err()
        {
            tracing::warn!(device = %self.id, "worker did not stop in time");
            worker.abort();
        }
        let offline = status_payload(false, self.is_printer);
        let status_topic = Topic::Status(self.id.clone()).path();
        let connected = *self.ready.borrow();
        if connected {
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                self.client
                    .publish(status_topic, QoS::AtLeastOnce, true, offline),
            )
            .await;
            let _ = tokio::time::timeout(Duration::from_secs(2), self.client.disconnect()).await;
        } else {
            let _ = self.stop_poll.send(true);
        }
        let mut poll = self.poll;
        if tokio::time::timeout(Duration::from_secs(3), &mut poll)
            .await
            .is_err()
        {
            let _ = self.stop_poll.send(true);
            if tokio::time::timeout(Duration::from_secs(1), &mut poll)
                .await
                .is_err()
            {
                poll.abort();
            }
        }
    }
}

/// The status JSON: `{"v":1,"online":..}` plus `"printer":"ready"` for an online printer.
pub fn status_payload(online: bool, is_printer: bool) -> Vec<u8> {
    let s = Status {
        v: 1,
        online,
        printer: (online && is_printer).then_some(PrinterState::Ready),
    };
    serde_json::to_vec(&s).expect("status serialises")
}

/// What the device does with a job: print it or show it.
#[derive(Debug, Clone)]
enum Effector {
    Printer(PrinterSettings),
    Terminal(TerminalSettings),
}

/// Starts a simulated device; it connects in the background (see [`DeviceHandle::wait_ready`]).
/// Must be called inside a tokio runtime.
pub fn spawn_device(spec: &DeviceSpec, opts: &DeviceOptions, stats: Arc<Stats>) -> DeviceHandle {
    let id = spec.id().to_string();
    let effector = match spec {
        DeviceSpec::Printer {
            paper_width_mm,
            code_page,
            model,
            ..
        } => Effector::Printer(PrinterSettings::for_paper(*paper_width_mm, *code_page).with_model(model)),
        DeviceSpec::Terminal {
            width_px,
            height_px,
            locale,
            time_zone,
            ..
        } => Effector::Terminal(TerminalSettings {
            width_px: *width_px,
            height_px: *height_px,
            locale: locale.clone(),
            time_zone: time_zone.clone(),
        }),
    };
    let is_printer = matches!(effector, Effector::Printer(_));
    let status_topic = Topic::Status(id.clone()).path();
    let mut mo = MqttOptions::new(format!("dev-{id}"), opts.mqtt_host.clone(), opts.mqtt_port);
    mo.set_clean_session(false)
        .set_keep_alive(Duration::from_secs(5))
        .set_last_will(LastWill::new(
            status_topic,
            status_payload(false, false),
            QoS::AtLeastOnce,
            true,
        ))
        .set_max_packet_size(MAX_PACKET_BYTES, MAX_PACKET_BYTES)
        .set_manual_acks(true);
    let (client, mut eventloop) = AsyncClient::new(mo, 64);
    let mut net = eventloop.network_options();
    net.set_connection_timeout(5);
    eventloop.set_network_options(net);

    let (ready_tx, ready_rx) = watch::channel(false);
    let (stop_worker, stop_worker_rx) = watch::channel(false);
    let (stop_poll, stop_poll_rx) = watch::channel(false);
    let (jobs_tx, jobs_rx) = mpsc::unbounded_channel::<(Publish, u64)>();
    let generation = Arc::new(AtomicU64::new(0));

    let worker = tokio::spawn(
        Worker {
            id: id.clone(),
            client: client.clone(),
            effector,
            dir: opts.out_dir.join(crate::effect::file_safe(&id)),
            honor_expiry: opts.honor_expiry,
            stats,
            generation: generation.clone(),
            done: HashSet::new(),
            attempted: HashMap::new(),
            last_seq: None,
        }
        .run(jobs_rx, stop_worker_rx),
    );
    let poll = tokio::spawn(poll_loop(
        id.clone(),
        is_printer,
        client.clone(),
        eventloop,
        jobs_tx,
        ready_tx,
        generation,
        stop_poll_rx,
    ));
    DeviceHandle {
        id,
        client,
        ready: ready_rx,
        stop_worker,
        stop_poll,
        worker,
        poll,
        is_printer,
    }
}

/// Resolves once `rx` says `true` or its sender is gone.
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// A small xorshift for backoff jitter (no need for a real RNG here).
fn jitter(seed: &mut u64, max_ms: u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    if max_ms == 0 {
        0
    } else {
        *seed % max_ms
    }
}

#[allow(clippy::too_many_arguments)]
async fn poll_loop(
    id: String,
    is_printer: bool,
    client: AsyncClient,
    mut eventloop: EventLoop,
    jobs_tx: mpsc::UnboundedSender<(Publish, u64)>,
    ready: watch::Sender<bool>,
    generation: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) {
    let jobs_topic = Topic::Jobs(id.clone()).path();
    let status_topic = Topic::Status(id.clone()).path();
    let mut failures: u32 = 0;
    let mut seed: u64 = id.bytes().fold(0x9E37_79B9_7F4A_7C15, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
    }) | 1;
    loop {
        let ev = tokio::select! {
            _ = stopped(&mut stop) => break,
            ev = eventloop.poll() => ev,
        };
        match ev {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                if ack.code != ConnectReturnCode::Success {
                    tracing::warn!(device = %id, code = ?ack.code, "connection refused");
                    continue;
                }
                failures = 0;
                let gen = generation.fetch_add(1, Ordering::SeqCst) + 1;
                tracing::info!(device = %id, session_present = ack.session_present, gen, "connected");
                let (c, jt, st) = (client.clone(), jobs_topic.clone(), status_topic.clone());
                let online = status_payload(true, is_printer);
                let resume = ack.session_present;
                let ready_now = ready.clone();
                tokio::spawn(async move {
                    if !resume {
                        if let Err(e) = c.subscribe(jt, QoS::AtLeastOnce).await {
                            tracing::warn!("subscribe request failed: {e}");
                        }
                    }
                    if let Err(e) = c.publish(st, QoS::AtLeastOnce, true, online).await {
                        tracing::warn!("status request failed: {e}");
                    }
                    if resume {
                        let _ = ready_now.send(true);
                    }
                });
            }
            Ok(Event::Incoming(Packet::SubAck(_))) => {
                let _ = ready.send(true);
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if p.topic == jobs_topic {
                    let _ = jobs_tx.send((p, generation.load(Ordering::SeqCst)));
                } else {
                    tracing::debug!(device = %id, topic = %p.topic, "ignoring publish");
                    let _ = client.try_ack(&p);
                }
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) => {
                tracing::info!(device = %id, "disconnected");
                let _ = ready.send(false);
                break;
            }
            Ok(_) => {}
            Err(e) => {
                let _ = ready.send(false);
                failures = failures.saturating_add(1);
                let base = (200u64 << failures.min(5).saturating_sub(1)).min(5000);
                let wait = base / 2 + jitter(&mut seed, base / 2 + 1);
                tracing::warn!(device = %id, "mqtt: {e}; reconnecting in {wait} ms");
                tokio::select! {
                    _ = stopped(&mut stop) => break,
                    _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                }
            }
        }
    }
}

struct Worker {
    id: String,
    client: AsyncClient,
    effector: Effector,
    dir: PathBuf,
    honor_expiry: bool,
    stats: Arc<Stats>,
    generation: Arc<AtomicU64>,
    /// Message ids carried out.
    done: HashSet<String>,
    /// Message ids seen (carried out or not) with their seq, so a retry of a failed job is
    /// not an order violation.
    attempted: HashMap<String, u64>,
    last_seq: Option<u64>,
}

impl Worker {
    async fn run(
        mut self,
        mut jobs: mpsc::UnboundedReceiver<(Publish, u64)>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let next = tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                j = jobs.recv() => j,
            };
            let Some((publish, gen)) = next else { break };
            self.handle(&publish).await;
            if gen == self.generation.load(Ordering::SeqCst) {
                if let Err(e) = self.client.ack(&publish).await {
                    tracing::warn!(device = %self.id, "puback: {e}");
                }
            }
        }
    }

    async fn send_ack(&self, ack: &Ack) {
        let topic = Topic::Acks(self.id.clone()).path();
        let payload = serde_json::to_vec(ack).expect("ack serialises");
        if let Err(e) = self
            .client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
        {
            tracing::warn!(device = %self.id, "ack publish: {e}");
        }
    }

    async fn handle(&mut self, publish: &Publish) {
        self.stats.raw_jobs.fetch_add(1, Ordering::Relaxed);
        let job: Job = match serde_json::from_slice(&publish.payload) {
            Ok(j) => j,
            Err(e) => {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(device = %self.id, "malformed job: {e}");
                // Ack what can be identified, so the gateway does not retry forever.
                let v: serde_json::Value =
                    serde_json::from_slice(&publish.payload).unwrap_or_default();
                if let Some(mid) = v.get("message_id").and_then(|m| m.as_str()) {
                    self.stats.failed.fetch_add(1, Ordering::Relaxed);
                    let seq = v.get("seq").and_then(|s| s.as_u64()).unwrap_or(0);
                    self.send_ack(&failed_ack(
                        mid,
                        seq,
                        &JobError::permanent(format!("malformed job: {e}")),
                    ))
                    .await;
                }
                return;
            }
        };
        if self.done.contains(&job.message_id) {
            self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
            tracing::info!(device = %self.id, seq = job.seq, message_id = %job.message_id, "duplicate job, acking again");
            self.send_ack(&Ack::done(&job.message_id, job.seq, true)).await;
            return;
        }
        if !self.attempted.contains_key(&job.message_id) {
            if let Some(last) = self.last_seq {
                if job.seq <= last {
                    self.stats.order_violations.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(device = %self.id, seq = job.seq, last, "ORDER VIOLATION: job seq not increasing");
                }
            }
            self.last_seq = Some(self.last_seq.map_or(job.seq, |l| l.max(job.seq)));
            self.attempted.insert(job.message_id.clone(), job.seq);
        }
        let outcome = self.carry_out(&job).await;
        match outcome {
            Ok(file) => {
                self.done.insert(job.message_id.clone());
                tracing::info!(device = %self.id, seq = job.seq, kind = job.kind.as_str(), charge = %job.charge_id, "carried out");
                self.stats
                    .effects
                    .lock()
                    .expect("effects lock")
                    .push(EffectRecord {
                        device: self.id.clone(),
                        kind: job.kind,
                        charge: job.charge_id.clone(),
                        message_id: job.message_id.clone(),
                        seq: job.seq,
                        file: file.display().to_string(),
                    });
                self.send_ack(&Ack::done(&job.message_id, job.seq, false)).await;
            }
            Err(e) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(device = %self.id, seq = job.seq, message_id = %job.message_id, "job failed: {e}");
                self.send_ack(&failed_ack(&job.message_id, job.seq, &e))
                    .await;
            }
        }
    }

    async fn carry_out(&self, job: &Job) -> Result<PathBuf, JobError> {
        if self.honor_expiry {
            if let Some(exp) = job.expires_at {
                if exp < chrono::Utc::now() {
                    return Err(JobError::permanent(format!("job expired at {exp}")));
                }
            }
        }
        let (effector, job, dir) = (self.effector.clone(), job.clone(), self.dir.clone());
        tokio::task::spawn_blocking(move || match effector {
            Effector::Printer(s) => print_job(&s, &job, &dir),
            Effector::Terminal(s) => show_job(&s, &job, &dir),
        })
        .await
        .unwrap_or_else(|e| Err(JobError::transient(format!("device crashed: {e}"))))
    }
}

fn failed_ack(message_id: &str, seq: u64, e: &JobError) -> Ack {
    Ack::failed(message_id, seq, e.reason.clone(), e.permanent)
}
