//! The Kafka side: one consumer in a consumer group reading `device.upserted` and
//! `charge.upserted`, turning each record into effects, and storing a record's offset only
//! when all of its effects are durably accepted: written to their devices' queues in the
//! outbox ([`crate::outbox`]) or to the dead-letter topic — the read position is part of
//! the data. Delivery to the devices then proceeds from the outbox, so an offline printer
//! does not hold back the partition.
//!
//! Settings (librdkafka): `enable.auto.offset.store=false` (we decide what is stored),
//! `enable.auto.commit=true` (stored offsets are committed every second),
//! `partition.assignment.strategy` from the config (default `range`, see
//! [`crate::config::KafkaConfig::assignment_strategy`]), optional static membership
//! (`group.instance.id`), `auto.offset.reset=earliest`.
//! Stored offsets are the contiguous done prefix of each partition ([`crate::offsets`]).
//!
//! Backpressure: at most `max_pending_per_partition` unfinished records per partition;
//! at that bound the partition is paused (and re-paused after a rebalance) and resumed
//! when half of them are finished. Likewise all partitions pause while the outbox holds
//! `outbox.max_jobs` jobs, until it is half drained. The consumer keeps polling while
//! paused, as librdkafka requires.

use crate::cdc::{self, Envelope};
use crate::config::Config;
use crate::deadletter::{DeadLetter, DeadLetterWriter};
use crate::dispatch::{Command, Finished, Outcome};
use crate::jobs;
use crate::offsets::{OffsetTracker, Partition};
use crate::outbox::{ChargeState, Outbox, SourceRef, StoredJob};
use crate::registry::Registry;
use crate::router::{Decision, Router};
use crate::stats::Stats;
use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Rebalance hooks: remember what changed so the loop can drop state of revoked partitions
/// and re-apply pauses to the new assignment.
#[derive(Default)]
struct Rebalances {
    revoked: Mutex<Vec<Partition>>,
    changed: AtomicBool,
}

impl ClientContext for Rebalances {}

impl ConsumerContext for Rebalances {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => tracing::info!(partitions = tpl.count(), "partitions assigned"),
            Rebalance::Revoke(tpl) => {
                tracing::info!(partitions = tpl.count(), "partitions revoked");
                let mut revoked = self.revoked.lock().expect("rebalance lock");
                revoked.extend(tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())));
            }
            Rebalance::Error(e) => tracing::error!(error = %e, "rebalance error"),
        }
        self.changed.store(true, Ordering::SeqCst);
    }
}

type GatewayConsumer = StreamConsumer<Rebalances>;

/// A record being processed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RecordRef {
    part: Partition,
    offset: i64,
}


/// The consumer loop's state.
struct Pipeline {
    cfg: Config,
    stats: Arc<Stats>,
    registry: Registry,
    router: Router,
    tracker: OffsetTracker,
    /// Dead letters not yet written, per pending record.
    remaining: HashMap<RecordRef, usize>,
    paused: HashSet<Partition>,
    commands: mpsc::Sender<Command>,
    deadletters: DeadLetterWriter,
    /// Records one of whose dead letters Kafka now has.
    dl_done: mpsc::UnboundedSender<RecordRef>,
    outbox: Arc<Outbox>,
    /// Jobs in the outbox (queued or in flight).
    outbox_jobs: usize,
    /// All partitions paused because the outbox is full.
    outbox_full: bool,
    last_prune: Instant,
}

/// Runs the consumer until `shutdown` turns true, then drains (bounded by 10 s), commits
/// and returns.
///
/// # Errors
/// The consumer cannot be created or subscribed.
/// `outbox` is open and its `outbox_jobs` jobs were handed to the dispatcher.
pub async fn run(
    cfg: Config,
    stats: Arc<Stats>,
    outbox: Arc<Outbox>,
    outbox_jobs: usize,
    commands: mpsc::Sender<Command>,
    mut finished: mpsc::UnboundedReceiver<Finished>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let k = &cfg.kafka;
    let mut client = ClientConfig::new();
    if !k.instance_id.is_empty() {
        client.set("group.instance.id", &k.instance_id);
    }
    let consumer: GatewayConsumer = client
        .set("bootstrap.servers", &k.brokers)
        .set("group.id", &k.group_id)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", &k.assignment_strategy)
        .set("session.timeout.ms", k.session_timeout_ms.to_string())
        .set("max.poll.interval.ms", k.max_poll_interval_ms.to_string())
        .set("queued.max.messages.kbytes", "16384")
        .create_with_context(Rebalances::default())
        .context("creating the Kafka consumer")?;
    consumer.subscribe(&[&k.device_topic, &k.charge_topic]).context("subscribing")?;
    let (dl_done, mut dl_done_rx) = mpsc::unbounded_channel();
    let deadletters = DeadLetterWriter::new(&k.brokers, &k.deadletter_topic)?;
    let mut registry = Registry::default();
    for (id, at, doc) in outbox.devices()? {
        match doc.as_ref().map(cdc::decode_device).transpose() {
            Ok(device) => {
                registry.apply(&id, at, device);
            }
            Err(e) => tracing::error!(device = %id, error = %e, "stored registry entry no longer decodes"),
        }
    }
    tracing::info!(devices = registry.len(), "device registry restored");
    let mut router = Router::default();
    router.restore(outbox.charges()?.into_iter().map(|(id, st)| (id, st.version, st.status)));
    let mut p = Pipeline {
        cfg: cfg.clone(),
        stats: stats.clone(),
        registry,
        router,
        tracker: OffsetTracker::default(),
        remaining: HashMap::new(),
        paused: HashSet::new(),
        commands,
        deadletters,
        dl_done,
        outbox,
        outbox_jobs,
        outbox_full: false,
        last_prune: Instant::now(),
    };
    stats.update(|s| {
        s.consumer_running = true;
        s.outbox_jobs = outbox_jobs as u64;
    });
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            Some(f) = finished.recv() => p.on_finished(&consumer, f),
            Some(r) = dl_done_rx.recv() => p.effect_finished(&consumer, &r),
            _ = tick.tick() => p.on_tick(&consumer),
            msg = consumer.recv() => match msg {
                Ok(m) => { let m = m.detach(); p.on_message(&consumer, m).await; }
                Err(e) => {
                    tracing::error!(error = %e, "Kafka consume error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            },
        }
    }

    tracing::info!(pending = p.tracker.total_pending(), "stopping intake; draining");
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.tracker.total_pending() > 0 && Instant::now() < deadline {
        tokio::select! {
            Some(f) = finished.recv() => p.on_finished(&consumer, f),
            Some(r) = dl_done_rx.recv() => p.effect_finished(&consumer, &r),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) => tracing::info!("final offsets committed"),
        Err(e) => tracing::warn!(error = %e, "final commit (nothing new to commit is fine)"),
    }
    stats.update(|s| s.consumer_running = false);
    // Closing can hang while Kafka is unreachable (rust-rdkafka #611): bound it.
    let _ = tokio::time::timeout(Duration::from_secs(5), tokio::task::spawn_blocking(move || drop(consumer))).await;
    Ok(())
}

impl Pipeline {
    async fn on_message(&mut self, consumer: &GatewayConsumer, m: OwnedMessage) {
        let part: Partition = (m.topic().to_string(), m.partition());
        let rec = RecordRef { part: part.clone(), offset: m.offset() };
        self.stats.read(m.topic());
        self.tracker.read(&part, m.offset());
        let value = m.payload().unwrap_or_default();
        let src = Source { topic: m.topic(), partition: m.partition(), offset: m.offset(), key: m.key(), value };
        if m.topic() == self.cfg.kafka.device_topic {
            self.on_device(consumer, &rec, &src).await;
        } else {
            self.on_charge(consumer, &rec, &src).await;
        }
        self.check_outbox_bound(consumer);
        if self.tracker.pending(&part) >= self.cfg.kafka.max_pending_per_partition && self.paused.insert(part.clone()) {
            tracing::info!(topic = %part.0, partition = part.1, "pausing partition: pending bound reached");
            pause(consumer, &part, true);
            self.stats.update(|s| s.paused_partitions += 1);
        }
    }

    async fn on_device(&mut self, consumer: &GatewayConsumer, rec: &RecordRef, src: &Source<'_>) {
        let env = match cdc::decode_envelope(src.value) {
            Ok(e) => e,
            Err(e) => return self.dead_record(rec, src, &e.reason(), e.to_string()),
        };
        let device = match env.full_document.as_ref().map(cdc::decode_device).transpose() {
            Ok(d) => d,
            Err(e) => return self.dead_record(rec, src, &e.reason(), e.to_string()),
        };
        if self.registry.apply(&env.document_id, env.cluster_time, device) != crate::registry::Applied::Stale {
            let outbox = &self.outbox;
            until_stored("the registry entry", || outbox.put_device(&env.document_id, env.cluster_time, env.full_document.as_ref())).await;
        }
        self.stats.update(|s| s.devices_applied += 1);
        self.record_finished(consumer, rec);
    }

    async fn on_charge(&mut self, consumer: &GatewayConsumer, rec: &RecordRef, src: &Source<'_>) {
        let env: Envelope = match cdc::decode_envelope(src.value) {
            Ok(e) => e,
            Err(e) => return self.dead_record(rec, src, &e.reason(), e.to_string()),
        };
        let decision = self.router.route_charge(&env, &self.registry);
        let applied = self.router.take_applied().map(|(id, version, status)| (id, ChargeState { version, status }));
        match decision {
            Decision::Ignored(reason) => {
                self.stats.ignored(reason);
                if applied.is_some() {
                    self.accept(applied, Vec::new(), src).await;
                }
                self.record_finished(consumer, rec);
            }
            Decision::DeadLetter { reason, detail } => self.dead_record(rec, src, &reason, detail),
            Decision::Effects { charge, effects, unroutable } => {
                self.stats.update(|s| s.records_with_effects += 1);
                let mut dead = Vec::new();
                for (kind, reason) in unroutable {
                    let mut dl = DeadLetter::new(&reason, format!("{} has no device", kind.as_str()), src.topic, src.partition, src.offset, src.key, src.value);
                    dl.effect = Some(kind.as_str().to_string());
                    dead.push(dl);
                }
                let mut jobs = Vec::new();
                for effect in effects {
                    match jobs::render_job(&env.event_id, &charge, &effect, &self.cfg.delivery.default_time_zone) {
                        Ok(job) => jobs.push((effect.device.id.clone(), job)),
                        Err(e) => {
                            let mut dl = DeadLetter::new(e.reason(), e.to_string(), src.topic, src.partition, src.offset, src.key, src.value);
                            dl.device = Some(effect.device.id.clone());
                            dl.effect = Some(effect.kind.as_str().to_string());
                            dl.message_id = Some(device_protocol::message_id(&env.event_id, &effect.device.id, effect.kind));
                            dead.push(dl);
                        }
                    }
                }
                let stored = self.accept(applied, jobs, src).await;
                for s in stored {
                    if self.commands.send(Command::Enqueue(s)).await.is_err() {
                        tracing::error!("dispatcher is gone; the job stays in the outbox for the next start");
                    }
                }
                if dead.is_empty() {
                    self.record_finished(consumer, rec);
                } else {
                    self.remaining.insert(rec.clone(), dead.len());
                    for dl in dead {
                        self.dead_effect(rec, dl);
                    }
                }
            }
        }
    }

    /// Writes `jobs` (and the charge state) to the outbox, durably, retrying until the disk
    /// takes it: reading on past an effect that is not stored would lose it.
    async fn accept(&mut self, charge: Option<(String, ChargeState)>, jobs: Vec<(String, device_protocol::Job)>, src: &Source<'_>) -> Vec<StoredJob> {
        let source = SourceRef {
            topic: src.topic.to_string(),
            partition: src.partition,
            offset: src.offset,
            key: src.key.map(|k| String::from_utf8_lossy(k).into_owned()),
        };
        let outbox = &self.outbox;
        let stored = until_stored("the jobs", || {
            let now_ms = chrono::Utc::now().timestamp_millis().max(0) as u64;
            let charge = charge.as_ref().map(|(id, st)| (id.as_str(), *st));
            outbox.accept(charge, jobs.clone(), &source, now_ms)
        })
        .await;
        self.outbox_jobs += stored.len();
        self.stats.update(|s| s.outbox_jobs = self.outbox_jobs as u64);
        stored
    }

    fn on_finished(&mut self, consumer: &GatewayConsumer, f: Finished) {
        let stored = f.stored;
        self.outbox_jobs = self.outbox_jobs.saturating_sub(1);
        self.stats.update(|s| s.outbox_jobs = self.outbox_jobs as u64);
        match f.outcome {
            Outcome::Done | Outcome::Superseded => {
                if f.outcome == Outcome::Superseded {
                    tracing::info!(device = %stored.device, charge = %stored.job.charge_id, "display_qr superseded before delivery");
                    self.stats.update(|s| s.superseded += 1);
                }
                if let Err(e) = tokio::task::block_in_place(|| self.outbox.complete(&stored.device, stored.job.seq)) {
                    // Left in the outbox: redelivered after a restart, deduped by the device.
                    tracing::error!(error = %e, device = %stored.device, seq = stored.job.seq, "cannot remove a finished job from the outbox");
                }
            }
            Outcome::Failed(reason) => {
                let src = &stored.source;
                let mut dl = DeadLetter::new("delivery_failed", reason, &src.topic, src.partition, src.offset, src.key.as_deref().map(str::as_bytes), &[]);
                dl.value = serde_json::to_string(&stored.job).ok();
                dl.device = Some(stored.device.clone());
                dl.effect = Some(stored.job.kind.as_str().to_string());
                dl.message_id = Some(stored.job.message_id.clone());
                self.stats.dead_effect(&dl.reason);
                tracing::warn!(device = %stored.device, detail = %dl.detail, "job dead-lettered");
                // Its record was committed when the job was stored: nothing to finish here.
                let (writer, outbox) = (self.deadletters.clone(), self.outbox.clone());
                tokio::spawn(async move {
                    writer.write(&dl).await;
                    let (device, seq) = (stored.device.clone(), stored.job.seq);
                    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || outbox.complete(&device, seq)).await {
                        tracing::error!(error = %e, "cannot remove a dead-lettered job from the outbox");
                    }
                });
            }
        }
        self.check_outbox_bound(consumer);
    }

    /// Pauses every assigned partition while the outbox holds `max_jobs`; resumes at half.
    fn check_outbox_bound(&mut self, consumer: &GatewayConsumer) {
        let max = self.cfg.outbox.max_jobs;
        let full = if self.outbox_full { self.outbox_jobs > max / 2 } else { self.outbox_jobs >= max };
        if full == self.outbox_full {
            return;
        }
        self.outbox_full = full;
        tracing::info!(jobs = self.outbox_jobs, full, "outbox bound: {} all partitions", if full { "pausing" } else { "resuming" });
        if let Ok(assignment) = consumer.assignment() {
            for e in assignment.elements() {
                let part = (e.topic().to_string(), e.partition());
                // A partition paused for its own pending bound stays paused.
                if full || !self.paused.contains(&part) {
                    pause(consumer, &part, full);
                }
            }
        }
    }

    /// Dead-letters the whole record (it had no effects planned).
    fn dead_record(&mut self, rec: &RecordRef, src: &Source<'_>, reason: &str, detail: String) {
        tracing::warn!(topic = src.topic, partition = src.partition, offset = src.offset, reason, %detail, "dead letter");
        self.stats.dead_record(reason);
        self.remaining.insert(rec.clone(), 1);
        let dl = DeadLetter::new(reason, detail, src.topic, src.partition, src.offset, src.key, src.value);
        self.spawn_dead_letter(rec, dl);
    }

    /// Dead-letters one effect of a record whose `remaining` count is already set.
    fn dead_effect(&mut self, rec: &RecordRef, dl: DeadLetter) {
        tracing::warn!(reason = %dl.reason, detail = %dl.detail, device = ?dl.device, "effect dead-lettered");
        self.stats.dead_effect(&dl.reason);
        self.spawn_dead_letter(rec, dl);
    }

    /// The effect counts as finished only once Kafka has the dead letter.
    fn spawn_dead_letter(&self, rec: &RecordRef, dl: DeadLetter) {
        let (writer, done, rec) = (self.deadletters.clone(), self.dl_done.clone(), rec.clone());
        tokio::spawn(async move {
            writer.write(&dl).await;
            let _ = done.send(rec);
        });
    }

    fn effect_finished(&mut self, consumer: &GatewayConsumer, rec: &RecordRef) {
        let Some(n) = self.remaining.get_mut(rec) else { return };
        *n -= 1;
        if *n == 0 {
            self.remaining.remove(rec);
            self.record_finished(consumer, rec);
        }
    }

    fn record_finished(&mut self, consumer: &GatewayConsumer, rec: &RecordRef) {
        let part = &rec.part;
        if let Some(next) = self.tracker.done(part, rec.offset) {
            let mut tpl = TopicPartitionList::new();
            if tpl.add_partition_offset(&part.0, part.1, Offset::Offset(next)).is_ok() {
                if let Err(e) = consumer.store_offsets(&tpl) {
                    // After a revoke librdkafka refuses (`__STATE`): the new owner redelivers.
                    tracing::debug!(error = %e, topic = %part.0, partition = part.1, "offset not stored");
                }
            }
        }
        if self.paused.contains(part) && self.tracker.pending(part) <= self.cfg.kafka.max_pending_per_partition / 2 {
            self.paused.remove(part);
            if !self.outbox_full {
                pause(consumer, part, false);
            }
            tracing::info!(topic = %part.0, partition = part.1, "resuming partition");
            self.stats.update(|s| s.paused_partitions = s.paused_partitions.saturating_sub(1));
        }
    }

    fn on_tick(&mut self, consumer: &GatewayConsumer) {
        self.stats.polled();
        let ctx = consumer.context();
        if ctx.changed.swap(false, Ordering::SeqCst) {
            for part in std::mem::take(&mut *ctx.revoked.lock().expect("rebalance lock")) {
                self.tracker.forget(&part);
                self.remaining.retain(|r, _| r.part != part);
                self.paused.remove(&part);
            }
            // Pauses do not survive a reassignment: apply them again.
            for part in &self.paused {
                pause(consumer, part, true);
            }
            if self.outbox_full {
                self.outbox_full = false;
                self.check_outbox_bound(consumer);
            }
            let assigned = consumer.assignment().map(|a| a.count()).unwrap_or(0);
            self.stats.update(|s| {
                s.assigned_partitions = assigned as u64;
                s.paused_partitions = self.paused.len() as u64;
            });
        }
        let pending = self.tracker.total_pending() as u64;
        self.stats.update(|s| s.pending_records = pending);
        if self.last_prune.elapsed() > Duration::from_secs(60) {
            self.last_prune = Instant::now();
            let outbox = self.outbox.clone();
            let retention_ms = self.cfg.outbox.dedupe_retention_hours * 3_600_000;
            let cutoff = (chrono::Utc::now().timestamp_millis().max(0) as u64).saturating_sub(retention_ms);
            tokio::task::spawn_blocking(move || match outbox.prune_seen(cutoff) {
                Ok(n) if n > 0 => tracing::info!(forgotten = n, "dedupe window pruned"),
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "dedupe window prune failed"),
            });
        }
    }
}

/// Runs `write` against the outbox until it succeeds, backing off from 100 ms doubling to
/// 10 s: reading on past an effect or registry change that is not stored would lose it, so
/// the consumer holds here (and `/readyz` goes red) while the disk refuses.
async fn until_stored<T>(what: &str, mut write: impl FnMut() -> Result<T, crate::outbox::OutboxError>) -> T {
    let mut delay = Duration::from_millis(100);
    loop {
        match tokio::task::block_in_place(&mut write) {
            Ok(v) => return v,
            Err(e) => {
                tracing::error!(error = %e, "cannot store {what} in the outbox; retrying (reading is held)");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// Where a record came from, for dead letters.
struct Source<'a> {
    topic: &'a str,
    partition: i32,
    offset: i64,
    key: Option<&'a [u8]>,
    value: &'a [u8],
}

fn pause(consumer: &GatewayConsumer, part: &Partition, pause: bool) {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&part.0, part.1);
    let result = if pause { consumer.pause(&tpl) } else { consumer.resume(&tpl) };
    if let Err(e) = result {
        tracing::warn!(error = %e, topic = %part.0, partition = part.1, pause, "pause/resume failed");
    }
}
