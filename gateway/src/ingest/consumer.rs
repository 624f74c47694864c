//! The Kafka side: one consumer in a consumer group reading `device.upserted` and
//! `charge.upserted`, turning each record into effects, and storing a record's offset only
//! when all of its effects are durably accepted: written to their devices' queues in the
//! outbox ([`crate::store::outbox`]), or parked there as dead letters for Kafka
//! ([`crate::deliver::deadletter`]) — the read position is part of the data. Delivery to the devices
//! then proceeds from the outbox, so an offline printer does not hold back the partition.
//!
//! Records are planned one by one (decode, route, render) and written in batches: up to
//! `outbox.batch_max_records` records, or what arrived within `outbox.batch_max_delay_ms`,
//! in one outbox transaction (one fsync), together with the removals of the jobs finished
//! meanwhile. Their offsets are stored after that write. The write runs on a blocking
//! thread while the loop plans the next batch (group commit): one write in flight at a
//! time, so batches reach the outbox, and their jobs the dispatcher, in the order read,
//! and at most two batches are held in memory (reading stops while the next batch is full
//! and the write in flight has not returned).
//!
//! Settings (librdkafka): `enable.auto.offset.store=false` (we decide what is stored),
//! `enable.auto.commit=true` (stored offsets are committed every second),
//! `partition.assignment.strategy` from the config (default `range`, see
//! [`crate::config::KafkaConfig::assignment_strategy`]), optional static membership
//! (`group.instance.id`), `auto.offset.reset=earliest`.
//! Stored offsets are the contiguous done prefix of each partition ([`crate::ingest::offsets`]).
//!
//! Backpressure: a partition is paused while any of these holds, and resumed when none
//! does (pauses are applied again after a rebalance); the consumer keeps polling while
//! paused, as librdkafka requires:
//! - it has `max_pending_per_partition` records read and not yet written (until half);
//! - the outbox holds `outbox.max_jobs` jobs in all (all partitions; until half drained);
//! - it fed a job to a device whose queue holds `outbox.max_jobs_per_device` jobs (until
//!   that device's queue is half drained). Which partitions feed a device is only known
//!   when one of their records does, so the bound is soft by at most one record's jobs
//!   per partition.
//!
//! Shutdown (SIGTERM): stop fetching, write the batch, commit the stored offsets, close;
//! bounded by `shutdown_timeout_ms`. A SIGKILL at any point loses nothing either: what was
//! not committed is read again and deduplicated by message id.

use cdc;
use crate::config::Config;
use crate::clock::Clock;
use crate::ingest::offsets::OffsetTracker;
use crate::ingest::replay::Replay;
use crate::model::{Command, DeadLetter, DeadLetterReason, Finished, Outcome, Partition, Queued, SourceRef};
use crate::route::registry::{Applied, Registry};
use crate::route::render as jobs;
use crate::route::router::{Decision, Router};
use crate::store::{Accept, ChargeState, DeviceEntry, Outbox, OutboxError, Removal};
use crate::telemetry::health::PauseCause;
use crate::telemetry::{Monitor, Stats};
use cdc::ChargeRecord;

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, Notify};

/// Rebalance hooks: remember what changed so the loop can drop state of revoked partitions
/// and re-apply pauses to the new assignment.
#[derive(Default)]
struct Rebalances {
    revoked: Mutex<Vec<Partition>>,
    changed: AtomicBool,
    health: Arc<Monitor>,
}

impl ClientContext for Rebalances {
    /// librdkafka's statistics (`statistics.interval.ms`) feed readiness.
    fn stats(&self, statistics: rdkafka::statistics::Statistics) {
        self.health.kafka_statistics(&statistics);
    }
}

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

/// A record planned and waiting for its batch to be written.
struct Planned {
    rec: RecordRef,
    accept: Accept,
}

/// What [`Outbox::write`] returns per record: the jobs queued, the dead letters parked.
type Written = Vec<(Vec<Queued>, Vec<u64>)>;

/// A batch the outbox writer (a blocking thread) is writing while the loop plans the next.
struct Writing {
    /// The batch's records, finished once it is written.
    records: Vec<RecordRef>,
    /// The write; gives the batch back with the outcome, for a retry.
    handle: tokio::task::JoinHandle<(Vec<Accept>, Vec<Removal>, Result<Written, OutboxError>)>,
}

/// The consumer loop's state.
struct Pipeline {
    cfg: Config,
    stats: Arc<Stats>,
    health: Arc<Monitor>,
    clock: Clock,
    registry: Registry,
    router: Router,
    tracker: OffsetTracker,
    commands: mpsc::Sender<Command>,
    /// Wakes the dead-letter publisher after parking.
    deadletters: Arc<Notify>,
    outbox: Arc<Outbox>,
    /// Records planned, not yet written.
    batch: Vec<Planned>,
    /// When the oldest record of `batch` (or removal) must be written.
    batch_due: Option<tokio::time::Instant>,
    /// Finished jobs to remove from the outbox with the next write.
    removals: Vec<Removal>,
    /// Jobs in the outbox (queued or in flight), all devices and per device.
    outbox_jobs: usize,
    device_jobs: HashMap<String, usize>,
    /// Pause reasons per partition (see the module docs) and what is paused in librdkafka.
    pending_bound: HashSet<Partition>,
    waiting_on: HashMap<Partition, HashSet<String>>,
    outbox_full: bool,
    paused: HashSet<Partition>,
    last_prune: Instant,
    /// The prune of the dedupe window and dead letters running, if one is.
    pruning: Option<tokio::task::JoinHandle<()>>,
    /// Turns true on SIGTERM: a failing outbox write then gives up instead of retrying.
    shutdown: watch::Receiver<bool>,
    /// A batch was given up at shutdown: nothing more is written, so no later record's
    /// jobs get a `seq` before the given-up ones' (they are read again at the next start).
    gave_up: bool,
}

/// What the consumer loop works with, made by the binary's wiring (`app`).
pub struct Services {
    /// The whole configuration (`kafka`, `outbox`, `delivery`, `health`).
    pub cfg: Config,
    /// Counters for `/stats`.
    pub stats: Arc<Stats>,
    /// Observations for readiness: assignment, pauses, outbox failures, Kafka statistics.
    pub health: Arc<Monitor>,
    /// The wall clock jobs expire by.
    pub clock: Clock,
    /// The open outbox, whose jobs were handed to the dispatcher already.
    pub outbox: Arc<Outbox>,
    /// The jobs the outbox holds at start, per device (they count against the bounds).
    pub outbox_jobs: HashMap<String, usize>,
    /// Where stored jobs go: the dispatcher.
    pub commands: mpsc::Sender<Command>,
    /// Jobs that left their device's queue, from the dispatcher.
    pub finished: mpsc::UnboundedReceiver<Finished>,
    /// `pixgate deadletter replay` requests ([`Replay`]), carried out here between batch
    /// writes, then counted against the bounds and queued.
    pub replays: mpsc::Receiver<Replay>,
    /// Wakes the dead-letter publisher after dead letters are parked.
    pub deadletters: Arc<Notify>,
    /// Turns true on SIGTERM.
    pub shutdown: watch::Receiver<bool>,
}

/// Runs the consumer until `shutdown` turns true, then writes what it read, commits and
/// returns (bounded by `shutdown_timeout_ms`).
///
/// # Errors
/// The consumer cannot be created, or subscribing fails.
pub async fn run(services: Services) -> anyhow::Result<()> {
    let Services { cfg, stats, health, clock, outbox, outbox_jobs, commands, mut finished, mut replays, deadletters, mut shutdown } = services;
    let k = &cfg.kafka;
    let mut client = ClientConfig::new();
    if !k.instance_id.is_empty() {
        client.set("group.instance.id", &k.instance_id);
    }
    if !k.debug.is_empty() {
        client.set("debug", &k.debug);
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
        .set("fetch.wait.max.ms", k.fetch_wait_max_ms.to_string())
        .set("queued.max.messages.kbytes", "16384")
        .set("statistics.interval.ms", cfg.health.statistics_interval_ms.to_string())
        .create_with_context(Rebalances { health: health.clone(), revoked: Mutex::default(), changed: AtomicBool::default() })
        .context("creating the Kafka consumer")?;
    consumer.subscribe(&[&k.device_topic, &k.charge_topic]).context("subscribing")?;
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
    // Charge states are read back from the outbox as needed: memory does not grow with
    // the charges seen.
    let cache = cfg.outbox.charge_cache_entries.max(4 * cfg.outbox.batch_max_records.max(1));
    let router = Router::with_store(crate::route::router::DEFAULT_SEEN_CAPACITY, outbox.clone(), cache);
    let total: usize = outbox_jobs.values().sum();
    let mut p = Pipeline {
        cfg: cfg.clone(),
        stats: stats.clone(),
        health,
        clock,
        registry,
        router,
        tracker: OffsetTracker::default(),
        commands,
        deadletters,
        outbox,
        batch: Vec::new(),
        batch_due: None,
        removals: Vec::new(),
        outbox_jobs: total,
        device_jobs: outbox_jobs,
        pending_bound: HashSet::new(),
        waiting_on: HashMap::new(),
        outbox_full: false,
        paused: HashSet::new(),
        last_prune: Instant::now(),
        pruning: None,
        shutdown: shutdown.clone(),
        gave_up: false,
    };
    stats.update(|s| {
        s.consumer_running = true;
        s.outbox_jobs = total as u64;
    });
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let max_batch = cfg.outbox.batch_max_records.max(1);
    let mut writing: Option<Writing> = None;
    loop {
        // The batch timer runs only while no write is in flight: when one returns, what
        // waited meanwhile is written at once.
        let due = if writing.is_none() { p.batch_due } else { None };
        let full = p.batch.len() >= max_batch;
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            r = async { (&mut writing.as_mut().expect("guarded").handle).await }, if writing.is_some() => {
                let w = writing.take().expect("guarded");
                p.on_written(&consumer, w.records, r.expect("the outbox writer panicked")).await;
                // Between two writes: a replay's seq falls between the two batches' (under
                // a steady drain there is always a next write, so the arm below rarely runs).
                while let Ok(r) = replays.try_recv() {
                    p.on_replay(&consumer, r).await;
                }
                writing = p.start_write();
            }
            Some(f) = finished.recv() => p.on_finished(&consumer, f).await,
            Some(r) = replays.recv(), if writing.is_none() => p.on_replay(&consumer, r).await,
            _ = tick.tick() => p.on_tick(&consumer),
            _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => writing = p.start_write(),
            // A full batch waits for the write in flight: at most two batches in memory.
            msg = consumer.recv(), if !full => match msg {
                Ok(m) => {
                    let m = m.detach();
                    p.after_rebalance(&consumer);
                    p.on_message(&consumer, m);
                    if p.batch.len() >= max_batch && writing.is_none() {
                        writing = p.start_write();
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "Kafka consume error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            },
        }
    }

    tracing::info!(batch = p.batch.len(), writing = writing.is_some(), "stopping intake; writing what was read, then committing");
    let bound = Duration::from_millis(cfg.shutdown_timeout_ms);
    let closed = tokio::time::timeout(bound, async {
        if let Some(w) = writing.take() {
            p.on_written(&consumer, w.records, w.handle.await.expect("the outbox writer panicked")).await;
        }
        // Jobs finished meanwhile are removed with the last batch rather than sent again
        // after the restart.
        while let Ok(f) = finished.try_recv() {
            p.on_finished(&consumer, f).await;
        }
        if let Some(w) = p.start_write() {
            p.on_written(&consumer, w.records, w.handle.await.expect("the outbox writer panicked")).await;
        }
        match tokio::task::block_in_place(|| consumer.commit_consumer_state(CommitMode::Sync)) {
            Ok(()) => tracing::info!("final offsets committed"),
            // Every stored offset was already committed by the periodic commit
            // (`auto.commit.interval.ms`): nothing was left to commit.
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => tracing::info!("final offsets committed (already, by the last periodic commit)"),
            Err(e) => tracing::error!(error = %e, "final commit failed: what was not committed is read again at the next start, and its jobs deduplicated by message id"),
        }
    })
    .await;
    if closed.is_err() {
        tracing::error!(ms = cfg.shutdown_timeout_ms, "shutdown bound reached before the final commit; what was not committed is read again at the next start");
    }
    stats.update(|s| s.consumer_running = false);
    // Closing can hang while Kafka is unreachable (rust-rdkafka #611): bound it.
    let _ = tokio::time::timeout(Duration::from_secs(5), tokio::task::spawn_blocking(move || drop(consumer))).await;
    Ok(())
}

impl Pipeline {
    fn on_message(&mut self, consumer: &GatewayConsumer, m: OwnedMessage) {
        let part: Partition = (m.topic().to_string(), m.partition());
        let rec = RecordRef { part: part.clone(), offset: m.offset() };
        self.tracker.read(&part, m.offset());
        // One update: a reader of /stats never sees the record read but not pending.
        let pending = self.tracker.total_pending() as u64;
        self.stats.update(|s| {
            *s.events_read.entry(part.0.clone()).or_default() += 1;
            s.pending_records = pending;
        });
        let value = m.payload().unwrap_or_default();
        let src = Source { topic: m.topic(), partition: m.partition(), offset: m.offset(), key: m.key(), value };
        let mut accept = if m.topic() == self.cfg.kafka.device_topic { self.plan_device(&src) } else { self.plan_charge(&src) };
        accept.source = Some(SourceRef {
            topic: src.topic.to_string(),
            partition: src.partition,
            offset: src.offset,
            key: src.key.map(|k| String::from_utf8_lossy(k).into_owned()),
        });
        if self.batch_due.is_none() {
            self.batch_due = Some(tokio::time::Instant::now() + Duration::from_millis(self.cfg.outbox.batch_max_delay_ms));
        }
        self.count_planned(consumer, &part, &accept);
        self.batch.push(Planned { rec, accept });
        if self.tracker.pending(&part) >= self.cfg.kafka.max_pending_per_partition && self.pending_bound.insert(part.clone()) {
            tracing::info!(topic = %part.0, partition = part.1, "pausing partition: pending bound reached");
            self.reconcile(consumer, &part);
        }
    }

    /// A registry change: applied in memory now, stored with the batch.
    fn plan_device(&mut self, src: &Source<'_>) -> Accept {
        let env = match cdc::decode_envelope(src.value) {
            Ok(e) => e,
            Err(e) => return self.dead_record(src, DeadLetterReason::of_decode(&e), e.to_string()),
        };
        let device = match env.full_document.as_ref().map(cdc::decode_device).transpose() {
            Ok(d) => d,
            Err(e) => return self.dead_record(src, DeadLetterReason::of_decode(&e), e.to_string()),
        };
        self.stats.update(|s| s.devices_applied += 1);
        if self.registry.apply(&env.document_id, env.cluster_time, device) == Applied::Stale {
            return Accept::default();
        }
        Accept { device: Some(DeviceEntry { id: env.document_id, cluster_time: env.cluster_time, document: env.full_document }), ..Accept::default() }
    }

    /// A charge change: routed and rendered now, its jobs and dead letters stored with the batch.
    fn plan_charge(&mut self, src: &Source<'_>) -> Accept {
        let ChargeRecord { event_id, operation, cluster_time: event_time, charge, .. } = match cdc::decode_charge_record(src.value) {
            Ok(r) => r,
            Err(e) => return self.dead_record(src, DeadLetterReason::of_decode(&e), e.to_string()),
        };
        let decision = self.router.route_decoded(&event_id, operation, charge, &self.registry);
        let charge_state = self.router.take_applied().map(|(id, version, status)| (id, ChargeState { version, status }));
        let mut accept = Accept { charge: charge_state, event_time, ..Accept::default() };
        match decision {
            Decision::Ignored(reason) => self.stats.ignored(reason),
            Decision::DeadLetter { reason, detail } => {
                let dead = self.dead_record(src, reason, detail);
                accept.deadletters = dead.deadletters;
            }
            Decision::Effects { charge, effects, unroutable } => {
                self.stats.update(|s| s.records_with_effects += 1);
                for (kind, reason) in unroutable {
                    let mut dl = DeadLetter::new(reason, format!("{} has no device", kind.as_str()), src.topic, src.partition, src.offset, src.key, src.value);
                    dl.effect = Some(kind.as_str().to_string());
                    self.dead_effect(&dl);
                    accept.deadletters.push(dl);
                }
                let now = self.clock.now();
                for effect in effects {
                    match jobs::render_job(&event_id, &charge, &effect, &self.cfg.delivery.default_time_zone) {
                        Ok(mut job) => {
                            job.expires_at = Some(jobs::expires_at(effect.kind, &charge, now, &self.cfg.delivery.ttl));
                            accept.jobs.push((effect.device.id.clone(), job));
                        }
                        Err(e) => {
                            let mut dl = DeadLetter::new(e.reason(), e.to_string(), src.topic, src.partition, src.offset, src.key, src.value);
                            dl.device = Some(effect.device.id.clone());
                            dl.effect = Some(effect.kind.as_str().to_string());
                            dl.message_id = Some(device_protocol::message_id(&event_id, &effect.device.id, effect.kind));
                            self.dead_effect(&dl);
                            accept.deadletters.push(dl);
                        }
                    }
                }
            }
        }
        accept
    }

    /// Hands the batch and the pending removals to the outbox writer, on a blocking thread;
    /// `None` when there is nothing to write. The caller keeps at most one in flight.
    fn start_write(&mut self) -> Option<Writing> {
        self.batch_due = None;
        if self.gave_up || (self.batch.is_empty() && self.removals.is_empty()) {
            return None;
        }
        let (records, accepts): (Vec<RecordRef>, Vec<Accept>) = std::mem::take(&mut self.batch).into_iter().map(|p| (p.rec, p.accept)).unzip();
        let removals = std::mem::take(&mut self.removals);
        let (outbox, now) = (self.outbox.clone(), self.clock.now_ms());
        let handle = tokio::task::spawn_blocking(move || {
            let mut accepts = accepts;
            let r = outbox.write(&mut accepts, &removals, now);
            (accepts, removals, r)
        });
        Some(Writing { records, handle })
    }

    /// A write returned: on failure it is retried here until the disk takes it (reading on
    /// past an effect that is not stored would lose it, so reading holds meanwhile); then
    /// the jobs go to the dispatcher and the records' offsets are stored.
    async fn on_written(&mut self, consumer: &GatewayConsumer, records: Vec<RecordRef>, (mut accepts, removals, result): (Vec<Accept>, Vec<Removal>, Result<Written, OutboxError>)) {
        let written = match result {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "cannot store the batch in the outbox; retrying (reading is held)");
                self.health.outbox_failing(Some(e.to_string()));
                // A first pause before the retries (`until_stored` then sees a shutdown at once).
                pause_unless_shutdown(&mut self.shutdown.clone(), Duration::from_millis(100)).await;
                let (outbox, clock) = (&self.outbox, &self.clock);
                match until_stored(&self.health, "the batch", &self.shutdown, || outbox.write(&mut accepts, &removals, clock.now_ms())).await {
                    Some(w) => w,
                    None => {
                        // Its records stay pending: no offset is stored past them.
                        self.gave_up = true;
                        return;
                    }
                }
            }
        };
        let mut parked = false;
        for (accept, (queued, dls)) in accepts.iter().zip(written) {
            parked |= !dls.is_empty();
            // Counted when planned; a job the dedupe window left out is not in the outbox.
            for (device, job) in &accept.jobs {
                if !queued.iter().any(|q| q.stored.job.message_id == job.message_id) {
                    self.outbox_jobs = self.outbox_jobs.saturating_sub(1);
                    if let Some(n) = self.device_jobs.get_mut(device) {
                        *n = n.saturating_sub(1);
                    }
                }
            }
            for q in queued {
                self.enqueue(q).await;
            }
        }
        // Counted in the outbox before the records count as finished: a reader of /stats
        // never sees a record done whose jobs are nowhere.
        self.stats.update(|s| s.outbox_jobs = self.outbox_jobs as u64);
        for rec in records {
            self.record_finished(consumer, &rec);
        }
        if parked {
            self.deadletters.notify_one();
        }
        self.check_outbox_bound(consumer);
    }

    /// Counts a planned record's jobs against the bounds as soon as it is planned (not when
    /// its batch is written), so a batch cannot overshoot a device's bound: a device at its
    /// bound pauses the partition this record came from at once.
    fn count_planned(&mut self, consumer: &GatewayConsumer, part: &Partition, accept: &Accept) {
        for (device, _) in &accept.jobs {
            self.outbox_jobs += 1;
            let n = self.device_jobs.entry(device.clone()).or_default();
            *n += 1;
            if *n >= self.cfg.outbox.max_jobs_per_device && self.waiting_on.entry(part.clone()).or_default().insert(device.clone()) {
                tracing::warn!(device = %device, topic = %part.0, partition = part.1, bound = self.cfg.outbox.max_jobs_per_device, "device queue at its bound: pausing the partition feeding it");
                self.reconcile(consumer, part);
            }
        }
        let at_bound = self.devices_at_bound();
        self.stats.update(|s| s.devices_at_bound = at_bound);
        self.check_outbox_bound(consumer);
    }

    /// Carries out a replay (no batch write is in flight): the dead letter's job goes back
    /// into its device's queue in the outbox, is counted in the outbox and against its
    /// device's bound like a planned job (its device's next records pause their partitions
    /// if it is over), and goes to the dispatcher before any later batch's jobs.
    async fn on_replay(&mut self, consumer: &GatewayConsumer, r: Replay) {
        let (outbox, now, ttl) = (&self.outbox, self.clock.now_ms(), &self.cfg.delivery.ttl);
        let result = tokio::task::block_in_place(|| outbox.replay(r.id, now, |k| jobs::ttl_of(k, ttl)));
        match &result {
            Ok(stored) => {
                tracing::info!(id = r.id, device = %stored.device, seq = stored.job.seq, "dead letter replayed");
                self.on_replayed(consumer, Queued::from_stored(stored.clone())).await;
            }
            Err(e) => tracing::warn!(id = r.id, error = %e, "replay refused"),
        }
        // The operator's request may have gone (a closed connection): the replay stands.
        let _ = r.reply.send(result);
    }

    async fn on_replayed(&mut self, consumer: &GatewayConsumer, q: Queued) {
        self.outbox_jobs += 1;
        *self.device_jobs.entry(q.stored.device.clone()).or_default() += 1;
        self.stats.update(|s| s.outbox_jobs = self.outbox_jobs as u64);
        self.check_outbox_bound(consumer);
        self.enqueue(q).await;
    }

    /// Hands a job the outbox holds to the dispatcher.
    async fn enqueue(&self, q: Queued) {
        if self.commands.send(Command::Enqueue(q)).await.is_err() {
            tracing::error!("dispatcher is gone; the job stays in the outbox for the next start");
        }
    }

    async fn on_finished(&mut self, consumer: &GatewayConsumer, f: Finished) {
        let stored = f.stored;
        self.outbox_jobs = self.outbox_jobs.saturating_sub(1);
        let left = self.device_jobs.get_mut(&stored.device).map(|n| {
            *n = n.saturating_sub(1);
            *n
        });
        let (reason, detail) = match f.outcome {
            Outcome::Done | Outcome::Superseded => {
                if f.outcome == Outcome::Superseded {
                    tracing::info!(device = %stored.device, charge = %stored.job.charge_id, "display_qr superseded before delivery");
                    self.stats.update(|s| s.superseded += 1);
                }
                // Removed with the next write (within `batch_max_delay_ms`).
                self.removals.push(Removal { device: stored.device.clone(), seq: stored.job.seq, superseded: f.outcome == Outcome::Superseded });
                if self.batch_due.is_none() {
                    self.batch_due = Some(tokio::time::Instant::now() + Duration::from_millis(self.cfg.outbox.batch_max_delay_ms));
                }
                (None, String::new())
            }
            Outcome::Failed(reason) => (Some(DeadLetterReason::DeliveryFailed), reason),
            Outcome::Expired => {
                let at = stored.job.expires_at.map(|t| t.to_rfc3339()).unwrap_or_default();
                (Some(DeadLetterReason::Expired), format!("{} not done before its expires_at {at}", stored.job.kind.as_str()))
            }
        };
        if let Some(reason) = reason {
            if reason == DeadLetterReason::DeliveryFailed {
                self.stats.dead_effect(&reason);
            }
            let dl = DeadLetter::for_job(reason, detail, &stored);
            tracing::warn!(device = %stored.device, reason = %dl.reason, detail = %dl.detail, "job dead-lettered");
            let (outbox, clock) = (&self.outbox, &self.clock);
            // Given up at shutdown: the job stays in the outbox and is reloaded (and
            // expired or delivered) at the next start.
            if until_stored(&self.health, "a dead letter", &self.shutdown, || outbox.fail_job(&stored, dl.clone(), clock.now_ms())).await.is_some() {
                self.deadletters.notify_one();
            }
        }
        if left.is_some_and(|n| n <= self.cfg.outbox.max_jobs_per_device / 2) {
            let parts: Vec<Partition> = self.waiting_on.iter().filter(|(_, d)| d.contains(&stored.device)).map(|(p, _)| p.clone()).collect();
            for part in parts {
                if let Some(d) = self.waiting_on.get_mut(&part) {
                    d.remove(&stored.device);
                    if d.is_empty() {
                        self.waiting_on.remove(&part);
                    }
                }
                tracing::info!(device = %stored.device, "device queue drained below half its bound");
                self.reconcile(consumer, &part);
            }
        }
        self.stats.update(|s| {
            s.outbox_jobs = self.outbox_jobs as u64;
            s.devices_at_bound = self.devices_at_bound();
        });
        self.check_outbox_bound(consumer);
    }

    /// Devices at their bound (one may hold back several partitions).
    fn devices_at_bound(&self) -> u64 {
        self.waiting_on.values().flatten().collect::<HashSet<_>>().len() as u64
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
        self.reconcile_all(consumer);
    }

    /// Pauses or resumes `part` in librdkafka to match its pause reasons.
    fn reconcile(&mut self, consumer: &GatewayConsumer, part: &Partition) {
        let want = self.outbox_full || self.pending_bound.contains(part) || self.waiting_on.get(part).is_some_and(|d| !d.is_empty());
        self.health.paused(part, PauseCause::new(self.pending_bound.contains(part), self.outbox_full, self.waiting_on.get(part)));
        if want == self.paused.contains(part) {
            return;
        }
        pause(consumer, part, want);
        if want {
            self.paused.insert(part.clone());
        } else {
            self.paused.remove(part);
            tracing::info!(topic = %part.0, partition = part.1, "resuming partition");
        }
        self.stats.update(|s| s.paused_partitions = self.paused.len() as u64);
    }

    /// [`Pipeline::reconcile`] for every assigned partition.
    fn reconcile_all(&mut self, consumer: &GatewayConsumer) {
        if let Ok(assignment) = consumer.assignment() {
            let parts: Vec<Partition> = assignment.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect();
            for part in parts {
                self.reconcile(consumer, &part);
            }
        }
    }

    /// Dead-letters the whole record (it had no effects planned): the returned [`Accept`]
    /// parks it.
    fn dead_record(&mut self, src: &Source<'_>, reason: DeadLetterReason, detail: String) -> Accept {
        tracing::warn!(topic = src.topic, partition = src.partition, offset = src.offset, %reason, %detail, "dead letter");
        self.stats.dead_record(&reason);
        let dl = DeadLetter::new(reason, detail, src.topic, src.partition, src.offset, src.key, src.value);
        Accept { deadletters: vec![dl], ..Accept::default() }
    }

    /// Counts and logs one dead-lettered effect of a record.
    fn dead_effect(&self, dl: &DeadLetter) {
        tracing::warn!(reason = %dl.reason, detail = %dl.detail, device = ?dl.device, "effect dead-lettered");
        self.stats.dead_effect(&dl.reason);
    }

    fn record_finished(&mut self, consumer: &GatewayConsumer, rec: &RecordRef) {
        let part = &rec.part;
        if let Some(next) = self.tracker.done(part, rec.offset) {
            let mut tpl = TopicPartitionList::new();
            if tpl.add_partition_offset(&part.0, part.1, Offset::Offset(next)).is_ok() {
                match consumer.store_offsets(&tpl) {
                    Ok(()) => {}
                    // After a revoke librdkafka refuses (`__STATE`): the new owner redelivers.
                    Err(KafkaError::StoreOffset(RDKafkaErrorCode::State)) => tracing::debug!(topic = %part.0, partition = part.1, "offset not stored: partition no longer assigned"),
                    // Not lost: the next record done on this partition stores a later
                    // position, which covers this one; until then a restart reads it again.
                    Err(e) => tracing::warn!(error = %e, topic = %part.0, partition = part.1, offset = next, "offset not stored"),
                }
            }
        }
        let pending = self.tracker.total_pending() as u64;
        self.stats.update(|s| s.pending_records = pending);
        if self.pending_bound.contains(part) && self.tracker.pending(part) <= self.cfg.kafka.max_pending_per_partition / 2 {
            self.pending_bound.remove(part);
            self.reconcile(consumer, part);
        }
    }

    fn on_tick(&mut self, consumer: &GatewayConsumer) {
        self.stats.polled();
        self.after_rebalance(consumer);
        let pending = self.tracker.total_pending() as u64;
        self.stats.update(|s| s.pending_records = pending);
        // One prune at a time: a window large enough to take over a minute to scan would
        // otherwise be scanned twice at once.
        let idle = self.pruning.as_ref().is_none_or(|p| p.is_finished());
        if idle && self.last_prune.elapsed() > Duration::from_secs(60) {
            self.last_prune = Instant::now();
            let outbox = self.outbox.clone();
            let now = self.clock.now_ms();
            let seen_cutoff = now.saturating_sub(self.cfg.outbox.dedupe_retention_hours * 3_600_000);
            let dl_cutoff = now.saturating_sub(self.cfg.outbox.deadletter_retention_hours * 3_600_000);
            self.pruning = Some(tokio::task::spawn_blocking(move || {
                match outbox.prune_seen(seen_cutoff) {
                    Ok(n) if n > 0 => tracing::info!(forgotten = n, "dedupe window pruned"),
                    Ok(_) => {}
                    Err(e) => tracing::error!(error = %e, "dedupe window prune failed"),
                }
                match outbox.prune_deadletters(dl_cutoff) {
                    Ok(n) if n > 0 => tracing::info!(forgotten = n, "published dead letters past their retention pruned"),
                    Ok(_) => {}
                    Err(e) => tracing::error!(error = %e, "dead-letter prune failed"),
                }
            }));
        }
    }

    /// Applies a rebalance librdkafka reported (inside its last poll): forgets revoked
    /// partitions and pauses again what must stay paused, since pauses do not survive a
    /// reassignment. Called before each record is planned, so a newly assigned partition
    /// is paused before the loop takes more than the one record from it.
    fn after_rebalance(&mut self, consumer: &GatewayConsumer) {
        let ctx = consumer.context();
        // A plain load first: this runs for every record, and a rebalance is rare.
        if ctx.changed.load(Ordering::Relaxed) && ctx.changed.swap(false, Ordering::SeqCst) {
            for part in std::mem::take(&mut *ctx.revoked.lock().expect("rebalance lock")) {
                self.tracker.forget(&part);
                // Its records still in the batch are written anyway: the router already
                // applied them, and the new owner's copies are deduplicated by message id.
                self.pending_bound.remove(&part);
                self.waiting_on.remove(&part);
                self.paused.remove(&part);
            }
            // Pauses do not survive a reassignment: apply them again.
            self.paused.clear();
            let mut assigned = 0;
            if let Ok(a) = consumer.assignment() {
                self.health.assigned(a.elements().iter().map(|e| (e.topic().to_string(), e.partition())));
                assigned = a.count();
            }
            self.reconcile_all(consumer);
            self.stats.update(|s| {
                s.assigned_partitions = assigned as u64;
                s.paused_partitions = self.paused.len() as u64;
            });
        }
    }
}

/// Sleeps `delay`, or less if shutdown is (or becomes) requested.
async fn pause_unless_shutdown(shutdown: &mut watch::Receiver<bool>, delay: Duration) {
    if *shutdown.borrow_and_update() {
        return;
    }
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown.changed() => {}
    }
}

/// Runs `write` against the outbox until it succeeds, backing off from 100 ms doubling to
/// 10 s: reading on past an effect or registry change that is not stored would lose it, so
/// the consumer holds here (and `/readyz` goes red, naming the failure) while the disk
/// refuses. `None` when shutdown is requested while it still fails: the shutdown stays
/// within its bound, and what was not stored is read again at the next start.
async fn until_stored<T>(health: &Monitor, what: &str, shutdown: &watch::Receiver<bool>, mut write: impl FnMut() -> Result<T, OutboxError>) -> Option<T> {
    let mut delay = Duration::from_millis(100);
    let mut shutdown = shutdown.clone();
    loop {
        match tokio::task::block_in_place(&mut write) {
            Ok(v) => {
                // Clears what this call or its caller reported (a no-op when nothing was).
                health.outbox_failing(None);
                return Some(v);
            }
            Err(e) => {
                health.outbox_failing(Some(e.to_string()));
                if *shutdown.borrow() {
                    tracing::error!(error = %e, "cannot store {what} in the outbox, and shutdown is requested: given up (it is read again at the next start)");
                    return None;
                }
                tracing::error!(error = %e, "cannot store {what} in the outbox; retrying (reading is held)");
                pause_unless_shutdown(&mut shutdown, delay).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A real refusal: an outbox where no folder can be made.
    fn refused() -> Result<(), OutboxError> {
        Outbox::open(std::path::Path::new("/proc/pixgate-no-such-folder/outbox.redb")).map(|_| ())
    }

    /// A write the disk keeps refusing is retried while the gateway runs, and given up
    /// once shutdown is requested, so SIGTERM stays within its bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_write_is_retried_until_shutdown_then_given_up() {
        let health = Monitor::default();
        let (tx, rx) = watch::channel(false);
        let tries = std::sync::atomic::AtomicUsize::new(0);
        let retrying = until_stored(&health, "a test", &rx, || {
            tries.fetch_add(1, Ordering::SeqCst);
            refused()
        });
        tokio::pin!(retrying);
        // Retrying: 100 ms, then 200 ms between tries; still no answer after 500 ms.
        assert!(tokio::time::timeout(Duration::from_millis(500), &mut retrying).await.is_err());
        assert!(tries.load(Ordering::SeqCst) >= 2, "retried");
        tx.send(true).unwrap();
        let given_up = tokio::time::timeout(Duration::from_secs(5), &mut retrying).await.expect("gives up at shutdown");
        assert_eq!(given_up, None);

        // It still succeeds when the disk takes it, also during shutdown.
        assert_eq!(until_stored(&health, "a test", &rx, || Ok::<_, OutboxError>(7)).await, Some(7));
    }
}
