//! The Kafka side: one consumer in a consumer group reading `device.upserted` and
//! `charge.upserted`, turning each record into effects, and storing a record's offset only
//! when all of its effects are finished (acknowledged by their device, superseded, or
//! durably dead-lettered) — the read position is part of the data.
//!
//! Settings (librdkafka): `enable.auto.offset.store=false` (we decide what is stored),
//! `enable.auto.commit=true` (stored offsets are committed every second),
//! `partition.assignment.strategy=cooperative-sticky`, `auto.offset.reset=earliest`.
//! Stored offsets are the contiguous done prefix of each partition ([`crate::offsets`]).
//!
//! Backpressure: at most `max_pending_per_partition` unfinished records per partition;
//! at that bound the partition is paused (and re-paused after a rebalance) and resumed
//! when half of them are finished. The consumer keeps polling while paused, as librdkafka
//! requires.

use crate::cdc::{self, Envelope};
use crate::config::Config;
use crate::deadletter::{DeadLetter, DeadLetterWriter};
use crate::dispatch::{Command, Finished, Outcome, RecordRef};
use crate::jobs;
use crate::offsets::{OffsetTracker, Partition};
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

/// The consumer loop's state.
struct Pipeline {
    cfg: Config,
    stats: Arc<Stats>,
    registry: Registry,
    router: Router,
    tracker: OffsetTracker,
    /// Effects not yet finished, per pending record.
    remaining: HashMap<RecordRef, usize>,
    paused: HashSet<Partition>,
    commands: mpsc::Sender<Command>,
    deadletters: DeadLetterWriter,
    dl_done: mpsc::UnboundedSender<RecordRef>,
}

/// Runs the consumer until `shutdown` turns true, then drains (bounded by 10 s), commits
/// and returns.
///
/// # Errors
/// The consumer cannot be created or subscribed.
pub async fn run(
    cfg: Config,
    stats: Arc<Stats>,
    commands: mpsc::Sender<Command>,
    mut finished: mpsc::UnboundedReceiver<Finished>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let k = &cfg.kafka;
    let consumer: GatewayConsumer = ClientConfig::new()
        .set("bootstrap.servers", &k.brokers)
        .set("group.id", &k.group_id)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", k.session_timeout_ms.to_string())
        .set("max.poll.interval.ms", k.max_poll_interval_ms.to_string())
        .set("queued.max.messages.kbytes", "16384")
        .create_with_context(Rebalances::default())
        .context("creating the Kafka consumer")?;
    consumer.subscribe(&[&k.device_topic, &k.charge_topic]).context("subscribing")?;
    let (dl_done, mut dl_done_rx) = mpsc::unbounded_channel();
    let deadletters = DeadLetterWriter::new(&k.brokers, &k.deadletter_topic)?;
    let mut p = Pipeline {
        cfg: cfg.clone(),
        stats: stats.clone(),
        registry: Registry::default(),
        router: Router::default(),
        tracker: OffsetTracker::default(),
        remaining: HashMap::new(),
        paused: HashSet::new(),
        commands,
        deadletters,
        dl_done,
    };
    stats.update(|s| s.consumer_running = true);
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
            self.on_device(consumer, &rec, &src);
        } else {
            self.on_charge(consumer, &rec, &src).await;
        }
        if self.tracker.pending(&part) >= self.cfg.kafka.max_pending_per_partition && self.paused.insert(part.clone()) {
            tracing::info!(topic = %part.0, partition = part.1, "pausing partition: pending bound reached");
            pause(consumer, &part, true);
            self.stats.update(|s| s.paused_partitions += 1);
        }
    }

    fn on_device(&mut self, consumer: &GatewayConsumer, rec: &RecordRef, src: &Source<'_>) {
        let env = match cdc::decode_envelope(src.value) {
            Ok(e) => e,
            Err(e) => return self.dead_record(rec, src, &e.reason(), e.to_string()),
        };
        let device = match env.full_document.as_ref().map(cdc::decode_device).transpose() {
            Ok(d) => d,
            Err(e) => return self.dead_record(rec, src, &e.reason(), e.to_string()),
        };
        self.registry.apply(&env.document_id, env.cluster_time, device);
        self.stats.update(|s| s.devices_applied += 1);
        self.record_finished(consumer, rec);
    }

    async fn on_charge(&mut self, consumer: &GatewayConsumer, rec: &RecordRef, src: &Source<'_>) {
        let env: Envelope = match cdc::decode_envelope(src.value) {
            Ok(e) => e,
            Err(e) => return self.dead_record(rec, src, &e.reason(), e.to_string()),
        };
        match self.router.route_charge(&env, &self.registry) {
            Decision::Ignored(reason) => {
                self.stats.ignored(reason);
                self.record_finished(consumer, rec);
            }
            Decision::DeadLetter { reason, detail } => self.dead_record(rec, src, &reason, detail),
            Decision::Effects { charge, effects, unroutable } => {
                self.stats.update(|s| s.records_with_effects += 1);
                self.remaining.insert(rec.clone(), effects.len() + unroutable.len());
                for (kind, reason) in unroutable {
                    let mut dl = DeadLetter::new(&reason, format!("{} has no device", kind.as_str()), src.topic, src.partition, src.offset, src.key, src.value);
                    dl.effect = Some(kind.as_str().to_string());
                    self.dead_effect(rec, dl);
                }
                for effect in effects {
                    match jobs::render_job(&env.event_id, &charge, &effect, &self.cfg.delivery.default_time_zone) {
                        Ok(job) => {
                            let cmd = Command::Enqueue { device: effect.device.id.clone(), job, record: rec.clone() };
                            if self.commands.send(cmd).await.is_err() {
                                tracing::error!("dispatcher is gone; record stays uncommitted");
                            }
                        }
                        Err(e) => {
                            let mut dl = DeadLetter::new(e.reason(), e.to_string(), src.topic, src.partition, src.offset, src.key, src.value);
                            dl.device = Some(effect.device.id.clone());
                            dl.effect = Some(effect.kind.as_str().to_string());
                            dl.message_id = Some(device_protocol::message_id(&env.event_id, &effect.device.id, effect.kind));
                            self.dead_effect(rec, dl);
                        }
                    }
                }
            }
        }
    }

    fn on_finished(&mut self, consumer: &GatewayConsumer, f: Finished) {
        match f.outcome {
            Outcome::Done => self.effect_finished(consumer, &f.record),
            Outcome::Superseded => {
                tracing::info!(device = %f.device, charge = %f.job.charge_id, "display_qr superseded before delivery");
                self.stats.update(|s| s.superseded += 1);
                self.effect_finished(consumer, &f.record);
            }
            Outcome::Failed(reason) => {
                let (p, o) = (&f.record.part, f.record.offset);
                let mut dl = DeadLetter::new("delivery_failed", reason, &p.0, p.1, o, Some(f.job.charge_id.as_bytes()), &[]);
                dl.value = serde_json::to_string(&f.job).ok();
                dl.device = Some(f.device);
                dl.effect = Some(f.job.kind.as_str().to_string());
                dl.message_id = Some(f.job.message_id);
                self.dead_effect(&f.record, dl);
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
            pause(consumer, part, false);
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
            let assigned = consumer.assignment().map(|a| a.count()).unwrap_or(0);
            self.stats.update(|s| {
                s.assigned_partitions = assigned as u64;
                s.paused_partitions = self.paused.len() as u64;
            });
        }
        let pending = self.tracker.total_pending() as u64;
        self.stats.update(|s| s.pending_records = pending);
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
