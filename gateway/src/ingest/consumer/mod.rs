//! The consumer loop: one task that reads records, plans them, hands batches to the outbox
//! writer, stores offsets, applies backpressure and rebalances, and carries out replays;
//! the design is described in [`crate::ingest`].
//!
//! It waits on one event at a time (a record, a write returned, a job finished, a replay,
//! Kafka's answer about the device topic, the batch timer, the tick, shutdown), applies a rebalance librdkafka reported before
//! handling it, and applies [`Backpressure`]'s decisions to librdkafka and the health
//! monitor as they come.
//!
//! The upstream as it is: a tombstone is ignored ([`crate::ingest::upstream`]); a
//! `traceparent` header's trace id is the `trace_id` of a `record` span around the
//! record's planning and of the line about its accepted effects; a charge that would be
//! dead-lettered for a registry reason is held, with the rest of its partition, until the
//! registry has caught up ([`crate::ingest::registry_hold`]); a streak of consume errors is
//! logged once and named by readiness ([`crate::ingest::consume_error`]); a record-level
//! dead letter is replayed by routing its record again ([`crate::ingest::record_replay`]).

use crate::clock::Clock;
use crate::config::{Config, TtlConfig};
use crate::deliver::broker::PartitionLinks;
use crate::deliver::cloudprnt::board::Board;
use crate::deliver::direct::writes::Writes;
use crate::deliver::settle::PendingJob;
use crate::ingest::backoff::Backoff;
use crate::ingest::backpressure::{Action, Backpressure, Bounds, Decision};
use crate::ingest::batch::Batch;
use crate::ingest::cluster_reader::ClusterReader;
use crate::ingest::consume_error::{self, ConsumeErrors};
use crate::ingest::delivery_log::DeliveryLog;
use crate::ingest::device_jobs::{self, JobProducer};
use crate::ingest::group_reader::GroupReader;
use crate::ingest::group_watch::{self, Members, Watched};
use crate::ingest::handoff::{Attempt, Handoff, InFlight};
use crate::ingest::member::create;
use crate::ingest::offsets::{OffsetTracker, RecordRef};
use crate::ingest::ownership::{GivenUp, Ownership};
use crate::ingest::plan::{Planner, Source};
use crate::ingest::prune::Pruner;
use crate::ingest::rebalance::GatewayConsumer;
use crate::ingest::record_replay::{RecordReplay, RecordReplayed};
use crate::ingest::registry_hold::{RegistryAnswer, RegistryHold};
use crate::ingest::registry_wait::Judging;
use crate::ingest::replay::{Replay, Replayed};
use crate::ingest::restores::{self, Done, Restores};
use crate::ingest::retry::{blocking, until_stored};
use crate::ingest::route_changelog::RouteChangelog;
use crate::ingest::upstream;
use crate::model::{Command, DeadLetter, DeadLetterReason, Finished, Outcome, Partition, Queued, StoredJob};
use crate::shutdown::Shutdown;
use crate::store::free_space::{self, Watermark};
use crate::store::{Outbox, Removal, ReplayError};
use crate::telemetry::latency::Stage;
use crate::telemetry::{Monitor, Stats};

use anyhow::Context;
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedMessage};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};

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
    /// Plans records, its device registry restored from the outbox ([`Planner::restore`]).
    pub planner: Planner,
    /// Where stored jobs go: the dispatcher.
    pub commands: mpsc::Sender<Command>,
    /// Jobs that left their device's queue, from the dispatcher.
    pub finished: mpsc::UnboundedReceiver<Finished>,
    /// `pixgate deadletter replay` requests ([`Replay`]), carried out here between batch
    /// writes, then counted against the bounds and queued.
    pub replays: mpsc::Receiver<Replay>,
    /// Wakes the dead-letter publisher after dead letters are parked.
    pub deadletters: Arc<Notify>,
    /// Requested on SIGTERM.
    pub shutdown: Shutdown,
    /// With `cluster.enabled`: where the jobs planned from change events go (the
    /// device-jobs topic, read back by this same loop).
    pub jobs_out: Option<Arc<JobProducer>>,
    /// With `cluster.enabled`: the deliver stage's log, where each job read back is
    /// accepted and each job's end recorded, and from which a partition taken is restored.
    pub delivery_log: Option<Arc<DeliveryLog>>,
    /// With `cluster.enabled` and an external broker: the jobs connections, one per
    /// device-jobs partition owned, opened once the partition is claimed and closed when it
    /// is given up.
    pub partition_links: Option<Arc<PartitionLinks>>,
    /// With `cluster.enabled`: the route stage's changelog, where each charge state applied
    /// goes and from which a charge partition taken is restored.
    pub route_changelog: Option<Arc<RouteChangelog>>,
    /// The cloud printers' offers: closed at shutdown, and the jobs they were told of
    /// waited for before the last outbox write ([`Pipeline::settle_printers`]).
    pub cloud_printers: Option<Arc<Board>>,
    /// The direct printers' writes: closed at shutdown, and those under way waited for
    /// before the last outbox write ([`Pipeline::settle_printers`]).
    pub direct_writes: Option<Arc<Writes>>,
}

/// How long a revoke waits for the delivery log's producer to deliver the ends it holds
/// (inside librdkafka's rebalance hook: reading waits meanwhile).
const REVOKE_FLUSH: Duration = Duration::from_secs(2);

/// How long taking a partition waits for its connection to the devices' broker before it
/// hands the restored queues to the dispatcher anyway.
const PARTITION_CONNECT_WAIT: Duration = Duration::from_secs(5);

/// Ended restores waiting for the loop: more than the partitions one replica takes at once
/// never wait, and a full channel only holds their tasks back.
const RESTORES_WAITING: usize = 64;

/// What the loop waits on, one at a time.
enum Event {
    Shutdown,
    /// The batch write in flight returned.
    Written(Attempt),
    Finished(Finished),
    Replay(Replay),
    /// Kafka answered a question about the device topic's ends.
    RegistryAnswer(RegistryAnswer),
    Tick,
    /// A partition's restore ended ([`Restores`]).
    Restored(Done),
    /// The batch is due and no write is in flight.
    BatchDue,
    Record(KafkaResult<OwnedMessage>),
}

/// The consumer loop's state.
struct Pipeline {
    stats: Arc<Stats>,
    health: Arc<Monitor>,
    clock: Clock,
    /// Failed jobs' dead letters are written here; pruned.
    outbox: Arc<Outbox>,
    planner: Planner,
    tracker: OffsetTracker,
    batch: Batch,
    handoff: Handoff,
    backpressure: Backpressure,
    pruner: Pruner,
    /// The outbox file and its file system's watermark (`None`: `outbox.min_free_bytes` 0).
    space: Option<(std::path::PathBuf, Watermark)>,
    /// Charge records held until the device registry catches up.
    registry: RegistryHold,
    /// Record-level dead letters routed again.
    record_replay: RecordReplay,
    /// The current streak of consume errors.
    consume_errors: ConsumeErrors,
    /// Replayed jobs' times to live.
    ttl: TtlConfig,
    /// Records of this topic are registry changes.
    device_topic: String,
    /// Records of this topic are jobs to queue (`cluster.enabled`).
    device_jobs_topic: Option<String>,
    /// Wakes the dead-letter publisher after parking.
    deadletters: Arc<Notify>,
    /// Requested on SIGTERM: a failing dead-letter write then gives up instead of retrying.
    shutdown: Shutdown,
    /// With `cluster.enabled`: the deliver stage's log.
    delivery_log: Option<Arc<DeliveryLog>>,
    /// The device-jobs partitions owned and their devices.
    ownership: Ownership,
    /// Device-jobs partitions taken and given up by rebalances not yet carried out
    /// ([`Pipeline::move_queues`]).
    moves: Option<(Vec<i32>, Vec<GivenUp>)>,
    /// The jobs connections per partition owned (an external broker in the central shape).
    partition_links: Option<Arc<PartitionLinks>>,
    /// How long a partition whose claim was overtaken waits before it is claimed again
    /// (`kafka.session_timeout_ms`).
    reclaim_after: Duration,
    /// Device-jobs partitions the group gives here whose claim another replica overtook:
    /// their queues are dropped here, and each is claimed again at the instant noted
    /// ([`Pipeline::claims_overtaken`]).
    suspended: BTreeMap<i32, Instant>,
    /// For such a partition, the lowest offset whose record this replica had not stored
    /// when its claim was overtaken, or read while suspended (their jobs left to the
    /// owner the log named): read again from there when it is claimed again and the log
    /// has no position for it, since then no owner logged them.
    suspended_from: BTreeMap<i32, i64>,
    /// With `cluster.enabled`: the route changelog ([`Pipeline::restore_routes`]).
    route_changelog: Option<Arc<RouteChangelog>>,
    /// The charge topic.
    charge_topic: String,
    /// The charge partitions assigned, as of the last rebalance.
    charge_owned: BTreeSet<i32>,
    /// Charge partitions taken whose changelog restore is not yet started.
    route_restores: BTreeSet<i32>,
    /// The restores of partitions taken, running beside the loop.
    restores: Restores,
    /// Dead letters of jobs that ended while the outbox refused writes (a full disk), in
    /// the order they ended: written again at each tick ([`Pipeline::retry_dead_letters`])
    /// rather than waited for, so the loop goes on polling Kafka. At most the jobs queued.
    held_dead_letters: std::collections::VecDeque<(StoredJob, DeadLetter)>,
}

/// How long closing the Kafka consumers may take at shutdown.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// How long the next batch may be full behind a write in flight before every partition
/// pauses ([`Backpressure::write_held`]): the loop then polls Kafka again, so a write
/// held for longer than `kafka.max_poll_interval_ms` (the disk refusing it, or, in the
/// central shape, Kafka not taking the batch's jobs) does not cost the group membership.
/// A record that still arrives goes into the full batch. A write of a healthy disk lands
/// well within it, so a steady drain never pauses.
const WRITE_HELD_AFTER: Duration = Duration::from_secs(1);

/// Runs the consumer until shutdown is requested, then writes what it read, commits and
/// returns (bounded by `shutdown_timeout_ms`).
///
/// # Errors
/// The consumer cannot be created, subscribing fails, or the outbox's device registry
/// cannot be read.
pub async fn run(services: Services) -> anyhow::Result<()> {
    if services.cfg.cluster.enabled {
        let (cfg, health, outbox) = (services.cfg.clone(), services.health.clone(), services.outbox.clone());
        let reader = tokio::task::spawn_blocking(move || ClusterReader::open(&cfg, health, outbox))
            .await
            .context("opening the central shape's consumers")??;
        reader.save_positions(&services.shutdown);
        if let Some(links) = services.partition_links.clone() {
            let log = services.delivery_log.clone();
            reader.on_deliver_revoke(move |p| {
                links.close(p);
                // The ends already produced reach the log before this member rejoins, so
                // before the next owner reads it: otherwise they come after its claim, are
                // left out as a stale owner's, and their jobs are sent again.
                if let Some(log) = &log {
                    if let Err(e) = log.flush(REVOKE_FLUSH) {
                        tracing::warn!(partition = p, error = %e, "the delivery log was not flushed when a partition was revoked: its next owner may send jobs again that are done");
                    }
                }
            });
        }
        let reader = Arc::new(reader);
        watch_groups(&services, Arc::downgrade(&reader));
        run_with(services, reader).await;
        return Ok(());
    }
    let group = services.cfg.kafka.group_id.clone();
    let consumer = Arc::new(create(&services.cfg, &services.health, &group, "")?);
    let topics = services.cfg.subscribed_topics();
    consumer.subscribe(&topics.iter().map(String::as_str).collect::<Vec<_>>()).context("subscribing")?;
    watch_groups(&services, EdgeMember { consumer: Arc::downgrade(&consumer), group, topics });
    run_with(services, consumer).await;
    Ok(())
}

/// The edge box's one member, for [`group_watch`].
struct EdgeMember {
    consumer: std::sync::Weak<GatewayConsumer>,
    group: String,
    topics: Vec<String>,
}

impl Members for EdgeMember {
    fn each(&self, f: &mut dyn FnMut(Watched<'_>)) {
        if let Some(consumer) = self.consumer.upgrade() {
            f(Watched { consumer: &consumer, group: self.group.clone(), topics: self.topics.clone() });
        }
    }
}

/// Starts [`group_watch`] on `members` (dynamic members rejoin when `kafka.instance_id`
/// is empty).
fn watch_groups<M: Members>(services: &Services, members: M) {
    let h = &services.cfg.health;
    let rules = group_watch::Rules {
        unassigned_after: Duration::from_millis(h.unassigned_after_ms),
        stall_after: Duration::from_millis(h.stall_after_ms),
        dynamic: services.cfg.kafka.instance_id.is_empty(),
    };
    group_watch::spawn(members, rules, services.health.clone(), services.stats.clone(), &services.shutdown);
}

/// [`run`] on a member already subscribed to both topics: the loop itself, until
/// shutdown is requested; then the final write and commit.
pub async fn run_with<C: GroupReader>(services: Services, consumer: Arc<C>) {
    let Services {
        cfg,
        stats,
        health,
        clock,
        outbox,
        outbox_jobs,
        planner,
        commands,
        mut finished,
        mut replays,
        deadletters,
        shutdown,
        jobs_out,
        delivery_log,
        partition_links,
        route_changelog,
        cloud_printers,
        direct_writes,
    } = services;
    let mut handoff = Handoff::new(outbox.clone(), clock.clone(), commands, health.clone(), shutdown.clone());
    if let Some(producer) = jobs_out {
        handoff = handoff.routed(producer);
    }
    if let Some(log) = &delivery_log {
        handoff = handoff.logged(log.clone(), &cfg.cluster.device_jobs_topic);
    }
    if let Some(changelog) = &route_changelog {
        handoff = handoff.changelog(changelog.clone(), &cfg.kafka.charge_topic);
    }
    let mut backpressure = Backpressure::new(Bounds::of(&cfg), outbox_jobs);
    let total = backpressure.jobs();
    let (registry, mut answers) = RegistryHold::new(&cfg, health.clone());
    // Nothing is assigned yet: the hold applies from the first rebalance on.
    let _ = backpressure.hold_topic(registry.held_topic());
    let (restores, mut restored) = Restores::new(RESTORES_WAITING);
    let mut p = Pipeline {
        stats: stats.clone(),
        health: health.clone(),
        clock: clock.clone(),
        outbox: outbox.clone(),
        planner,
        tracker: OffsetTracker::default(),
        batch: Batch::new(cfg.outbox.batch_max_records, Duration::from_millis(cfg.outbox.batch_max_delay_ms)),
        handoff,
        backpressure,
        pruner: Pruner::new(&cfg.outbox, &cfg.reconcile),
        space: (cfg.outbox.min_free_bytes > 0)
            .then(|| (cfg.outbox.path.clone(), Watermark::new(cfg.outbox.min_free_bytes))),
        registry,
        record_replay: RecordReplay::new(&cfg.kafka.charge_topic, &cfg.kafka.brokers),
        consume_errors: ConsumeErrors::default(),
        ttl: cfg.delivery.ttl.clone(),
        device_topic: cfg.kafka.device_topic.clone(),
        device_jobs_topic: cfg.cluster.enabled.then(|| cfg.cluster.device_jobs_topic.clone()),
        deadletters,
        shutdown: shutdown.clone(),
        delivery_log: delivery_log.clone(),
        ownership: Ownership::default(),
        moves: None,
        partition_links,
        reclaim_after: Duration::from_millis(u64::from(cfg.kafka.session_timeout_ms)),
        suspended: BTreeMap::new(),
        suspended_from: BTreeMap::new(),
        route_changelog,
        charge_topic: cfg.kafka.charge_topic.clone(),
        charge_owned: BTreeSet::new(),
        route_restores: BTreeSet::new(),
        restores,
        held_dead_letters: std::collections::VecDeque::new(),
    };
    stats.update(|s| {
        s.consumer_running = true;
        s.outbox_jobs = total as u64;
    });
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut writing: Option<InFlight> = None;
    // Since when the next batch has been full behind the write in flight.
    let mut full_since: Option<tokio::time::Instant> = None;
    loop {
        // The batch timer runs only while no write is in flight: when one returns, what
        // waited meanwhile is written at once.
        let due = if writing.is_none() { p.batch.due() } else { None };
        let full = p.batch.is_full();
        let event = tokio::select! {
            biased;
            () = shutdown.requested() => Event::Shutdown,
            a = async { writing.as_mut().expect("guarded").attempt().await }, if writing.is_some() => Event::Written(a),
            Some(f) = finished.recv() => Event::Finished(f),
            Some(r) = replays.recv(), if writing.is_none() => Event::Replay(r),
            Some(a) = answers.recv() => Event::RegistryAnswer(a),
            Some(d) = restored.recv() => Event::Restored(d),
            _ = tick.tick() => Event::Tick,
            _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => Event::BatchDue,
            // A full batch waits for the write in flight: at most two batches in memory
            // (and what still arrives once every partition paused behind a held write).
            m = consumer.recv(), if !full || p.backpressure.is_write_held() => Event::Record(m),
        };
        // librdkafka reports a rebalance inside `recv`'s poll, which may have run in this
        // select although another branch won: applied first, so every event is handled
        // against the current assignment, and a newly assigned partition is paused before
        // the loop takes more than one record from it.
        let event = if p.delivery_log.is_some() {
            // Jobs finished before a revoke are ended in the log while their partition is
            // still this replica's: once it is given up their devices are unknown here,
            // and the next owner would send them again.
            let event = match event {
                Event::Finished(f) => {
                    p.on_finished(&*consumer, f).await;
                    Event::Tick
                }
                other => other,
            };
            while let Ok(f) = finished.try_recv() {
                p.on_finished(&*consumer, f).await;
            }
            event
        } else {
            event
        };
        p.after_rebalance(&*consumer);
        if !p.route_restores.is_empty() {
            p.restore_routes(&*consumer);
        }
        let event = if p.moves.is_some() {
            // The batch in flight lands first, then the one being filled, against the new
            // ownership: their jobs of a partition given up, or not claimed yet, are
            // forgotten, not logged, so the queues moved next are whole (no row of a job
            // on its way to the dispatcher is dropped under it) and a partition claimed
            // next logs nothing it read before its claim.
            p.handoff.owned(p.ownership.owned().clone());
            let event = match event {
                Event::Written(a) => {
                    writing = None;
                    p.on_written(&*consumer, a).await;
                    Event::Tick
                }
                other => {
                    if let Some(mut w) = writing.take() {
                        let a = w.attempt().await;
                        p.on_written(&*consumer, a).await;
                    }
                    other
                }
            };
            if let Some(mut w) = p.handoff.start(&mut p.batch) {
                let a = w.attempt().await;
                p.on_written(&*consumer, a).await;
            }
            p.move_queues(&*consumer).await;
            event
        } else {
            event
        };
        match event {
            Event::Shutdown => break,
            Event::Written(a) => {
                p.on_written(&*consumer, a).await;
                // Between two writes: a replay's seq falls between the two batches' (under
                // a steady drain there is always a next write, so the replay branch above
                // rarely runs).
                while let Ok(r) = replays.try_recv() {
                    p.on_replay(&*consumer, r).await;
                }
                writing = p.handoff.start(&mut p.batch);
            }
            Event::Finished(f) => p.on_finished(&*consumer, f).await,
            Event::Replay(r) => p.on_replay(&*consumer, r).await,
            Event::RegistryAnswer((q, answer)) => {
                p.registry.answered(q, answer);
                p.release_held(&*consumer);
            }
            Event::Tick => {
                p.retry_dead_letters(&*consumer).await;
                p.on_tick(&*consumer);
            }
            Event::Restored(d) => p.on_restored(&*consumer, d).await,
            Event::BatchDue => writing = p.handoff.start(&mut p.batch),
            Event::Record(Ok(m)) if p.restores.is_restoring_at(m.topic(), m.partition()) => {
                // Fetched before its partition was paused for the restore: read again
                // from here once restored.
                p.restores.dropped(&(m.topic().to_string(), m.partition()), m.offset());
            }
            Event::Record(Ok(m)) => {
                p.on_record(&*consumer, m);
                if p.batch.is_full() && writing.is_none() {
                    writing = p.handoff.start(&mut p.batch);
                }
            }
            Event::Record(Err(e)) => {
                // rust-rdkafka drops the failing partition from the error: located apart.
                if p.consume_errors.error(&e, Instant::now(), &health) {
                    consume_error::spawn_locate(&*consumer, &cfg.kafka.brokers, |t| cfg.group_of(t), health.clone());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let behind = p.batch.is_full() && writing.is_some();
        full_since = behind.then(|| full_since.unwrap_or_else(tokio::time::Instant::now));
        let held = full_since.is_some_and(|t| t.elapsed() >= WRITE_HELD_AFTER);
        let decisions = p.backpressure.write_held(held);
        p.apply(&*consumer, decisions);
    }

    p.restores.cancel_all();
    // No printer starts a job from here on; those under way are waited for below.
    let cloud = cloud_printers.as_deref().map(|b| (b, b.close()));
    let direct = direct_writes.as_deref().map(|w| (w, w.close()));
    tracing::info!(
        batch = p.batch.records(),
        writing = writing.is_some(),
        "stopping intake; writing what was read, then committing"
    );
    let bound = Duration::from_millis(cfg.shutdown_timeout_ms);
    // Printers' jobs under way are waited for at most half of the bound: the rest is the
    // last write's and the commit's.
    let settle_until = tokio::time::Instant::now() + bound / 2;
    let closed = tokio::time::timeout(bound, async {
        if let Some(mut w) = writing.take() {
            let a = w.attempt().await;
            p.on_written(&*consumer, a).await;
        }
        p.settle_printers(cloud, direct, settle_until).await;
        if p.delivery_log.is_some() {
            p.stop_sending().await;
        }
        // Jobs finished meanwhile are removed with the last batch rather than sent again
        // after the restart (the central shape: their ends are logged).
        while let Ok(f) = finished.try_recv() {
            p.on_finished(&*consumer, f).await;
        }
        if let Some(mut w) = p.handoff.start(&mut p.batch) {
            let a = w.attempt().await;
            p.on_written(&*consumer, a).await;
        }
        let committing = consumer.clone();
        let commit = tokio::task::spawn_blocking(move || committing.commit())
            .await
            .unwrap_or_else(|e| Err(KafkaError::Canceled).inspect_err(|_| tracing::error!(error = %e, "the final commit's thread failed")));
        match commit {
            Ok(()) => tracing::info!("final offsets committed"),
            // Every stored offset was already committed by the periodic commit
            // (`auto.commit.interval.ms`): nothing was left to commit.
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => tracing::info!("final offsets committed (already, by the last periodic commit)"),
            Err(e) => tracing::error!(error = %e, "final commit failed: what was not committed is read again at the next start, and its jobs deduplicated by message id"),
        }
    })
    .await;
    if closed.is_err() {
        tracing::error!(
            ms = cfg.shutdown_timeout_ms,
            "shutdown bound reached before the final commit; what was not committed is read again at the next start"
        );
    }
    if let Some(log) = delivery_log {
        // Jobs' ends not yet on Kafka: lost, their jobs would be sent again by the next owner.
        let flushed = tokio::task::spawn_blocking(move || log.flush(Duration::from_secs(5))).await;
        if !matches!(flushed, Ok(Ok(()))) {
            tracing::warn!("some jobs' ends did not reach the delivery log before shutdown: the partition's next owner sends those jobs again (their devices dedupe them)");
        }
    }
    stats.update(|s| s.consumer_running = false);
    // Closing leaves the groups (LeaveGroup), so that the others rebalance now rather than
    // a session timeout later. It can hang while Kafka is unreachable (rust-rdkafka #611):
    // bound it.
    let closing = Instant::now();
    match tokio::time::timeout(CLOSE_WAIT, tokio::task::spawn_blocking(move || drop(consumer))).await {
        Ok(_) => tracing::info!(ms = closing.elapsed().as_millis() as u64, "Kafka consumers closed"),
        Err(_) => tracing::warn!(
            ms = CLOSE_WAIT.as_millis() as u64,
            "Kafka consumers not closed in time: a group this replica has not left keeps it as a member until its session timeout (kafka.session_timeout_ms)"
        ),
    }
}

impl Pipeline {
    /// A record read: planned now (or held behind its partition's held records), its jobs
    /// counted against the bounds, added to the batch.
    fn on_record(&mut self, consumer: &impl GroupReader, m: OwnedMessage) {
        let part: Partition = (m.topic().to_string(), m.partition());
        self.tracker.read(&part, m.offset());
        // One update: a reader of /stats never sees the record read but not pending.
        let pending = self.tracker.total_pending() as u64;
        self.stats.update(|s| {
            *s.events_read.entry(part.0.clone()).or_default() += 1;
            s.pending_records = pending;
        });
        if self.registry.holds(&part) {
            // Behind a held record of its partition: it waits, in order.
            self.hold(consumer, part, m, Judging::Fresh);
            return;
        }
        let device = (m.topic() == self.device_topic).then(|| (m.partition(), m.offset()));
        self.plan_record(consumer, m, Judging::Fresh);
        if let Some((partition, offset)) = device {
            self.registry.device_applied(partition, offset);
            if self.registry.is_holding() {
                self.release_held(consumer);
            }
        }
    }

    /// Plans a record read now or held and released, and adds it to the batch; or holds it
    /// when its charge must wait for the registry.
    fn plan_record(&mut self, consumer: &impl GroupReader, m: OwnedMessage, judging: Judging) {
        let part: Partition = (m.topic().to_string(), m.partition());
        let trace = upstream::trace_parent(&m).map(|t| t.trace_id);
        let span = trace.as_ref().map(|t| tracing::info_span!("record", trace_id = %t));
        let entered = span.as_ref().map(tracing::Span::enter);
        let rec = RecordRef { part: part.clone(), offset: m.offset(), trace, planned_at: tokio::time::Instant::now() };
        let src = Source {
            topic: m.topic(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key(),
            value: m.payload().unwrap_or_default(),
            timestamp_ms: m.timestamp().to_millis(),
        };
        let accept = if self.device_jobs_topic.as_deref() == Some(m.topic()) {
            let device = std::str::from_utf8(src.key.unwrap_or_default()).unwrap_or_default();
            if self.delivery_log.is_some() && self.ownership.read(device, src.partition, src.offset) {
                // In the delivery log already: restored from there when the partition was taken.
                crate::store::Accept::default()
            } else {
                let mut accept = device_jobs::accept(&src, &self.stats);
                let ownership = &mut self.ownership;
                accept.jobs.retain(|(_, job)| !ownership.done_late(src.partition, &job.message_id));
                accept
            }
        } else if upstream::is_tombstone(&m) {
            self.planner.tombstone(&src)
        } else {
            let registry = &self.registry;
            match self.planner.plan(&src, |reason| registry.defers(reason, judging)) {
                Ok(accept) => accept,
                Err(_) => {
                    drop(entered);
                    self.hold(consumer, part, m, judging);
                    return;
                }
            }
        };
        drop(entered);
        if !accept.jobs.is_empty() || !accept.produced.is_empty() {
            self.observe_kafka_stage(&src);
        }
        // Counted as soon as planned (not when written), so a batch cannot overshoot a
        // device's bound: a device at its bound pauses this record's partition at once.
        // Jobs bound for the device-jobs topic count where they are read back, so a device
        // at its bound pauses its device-jobs partition, not a change event partition.
        let routed = self.device_jobs_topic.as_ref().is_some_and(|t| *t != part.0);
        let counted = accept.jobs.iter().filter(|_| !routed).map(|(device, _)| device.as_str());
        let decisions = self.backpressure.planned(&part, counted);
        self.apply(consumer, decisions);
        let at_bound = self.backpressure.devices_at_bound() as u64;
        self.stats.update(|s| s.devices_at_bound = at_bound);
        self.batch.push(rec, accept);
        let decision = self.backpressure.record_read(&part, self.tracker.pending(&part));
        self.apply(consumer, decision);
    }

    /// The `kafka` stage of a record with jobs: its timestamp to now, when the timestamp is
    /// not later than now (another host's clock may run ahead). Now is the host's clock, not
    /// the injectable [`Clock`]: a test clock set to the fixtures' day still reads records
    /// stamped today.
    fn observe_kafka_stage(&self, src: &Source<'_>) {
        let (Some(stamped), now) = (src.timestamp_ms, chrono::Utc::now().timestamp_millis()) else { return };
        if let Ok(took) = u64::try_from(now - stamped) {
            self.stats.observe(Stage::Kafka, Duration::from_millis(took));
        }
    }

    /// Holds `m` until the registry has caught up (it stays pending: no offset is stored
    /// past it), pausing its partition.
    fn hold(&mut self, consumer: &impl GroupReader, part: Partition, m: OwnedMessage, judging: Judging) {
        if self.registry.hold(part.clone(), m, judging) {
            let decision = self.backpressure.registry_wait(&part, true);
            self.apply(consumer, decision);
        }
        let decision = self.backpressure.record_read(&part, self.tracker.pending(&part));
        self.apply(consumer, decision);
    }

    /// Plans again, in order, the held records the registry can judge now; a record that
    /// must wait again is held anew with the rest of its queue behind it.
    fn release_held(&mut self, consumer: &impl GroupReader) {
        loop {
            let ready = self.registry.take_ready();
            if ready.is_empty() {
                break;
            }
            for (part, queue) in ready {
                let n = queue.len();
                for h in queue {
                    if self.registry.holds(&part) {
                        self.registry.hold_again(part.clone(), h);
                    } else {
                        self.plan_record(consumer, h.msg, Judging::Held(h.read_after));
                    }
                }
                if !self.registry.holds(&part) {
                    tracing::info!(topic = %part.0, partition = part.1, records = n, "the device registry has caught up: held records planned again, partition released");
                    let decision = self.backpressure.registry_wait(&part, false);
                    self.apply(consumer, decision);
                }
            }
        }
        self.registry.settle();
    }

    /// A batch write returned: once it is accepted (retried until then, see
    /// [`Handoff::land`]), its records are finished and their offsets stored.
    async fn on_written(&mut self, consumer: &impl GroupReader, attempt: Attempt) {
        let Some(accepted) = self.handoff.land(attempt).await else {
            // Given up at shutdown: its records stay pending, no offset is stored past them.
            return;
        };
        // Counted when planned; a job the dedupe window left out is not in the outbox.
        for took in &accepted.accept_times {
            self.stats.observe(Stage::Accept, *took);
        }
        for device in &accepted.left_out {
            let decisions = self.backpressure.left_out(device);
            self.apply(consumer, decisions);
        }
        // Counted in the outbox before the records count as finished: a reader of /stats
        // never sees a record done whose jobs are nowhere.
        let jobs = self.backpressure.jobs() as u64;
        self.stats.update(|s| s.outbox_jobs = jobs);
        for rec in &accepted.records {
            self.record_finished(consumer, rec);
        }
        if accepted.parked {
            self.deadletters.notify_one();
        }
        let decisions = self.backpressure.check_outbox_bound();
        self.apply(consumer, decisions);
    }

    /// Carries out a replay (no batch write is in flight): the dead letter's job goes back
    /// into its device's queue in the outbox, is counted in the outbox and against its
    /// device's bound like a planned job, and goes to the dispatcher before any later
    /// batch's jobs.
    async fn on_replay(&mut self, consumer: &impl GroupReader, r: Replay) {
        if self.delivery_log.is_some() {
            tracing::warn!(id = r.id, "replay refused: not supported with cluster.enabled yet");
            let _ = r.reply.send(Err(ReplayError::CentralShape(r.id)));
            return;
        }
        if self.record_replay.is_record(&self.outbox, r.id).await {
            return self.on_record_replay(consumer, r).await;
        }
        let result = self.handoff.replay(r.id, &self.ttl).await;
        match &result {
            Ok(stored) => {
                let job = &stored.job;
                tracing::info!(id = r.id, event_id = %job.event_id, message_id = %job.message_id, device = %stored.device, charge = %job.charge_id, kind = job.kind.as_str(), seq = job.seq, "dead letter replayed");
                self.queue_replayed(consumer, Queued::from_stored(stored.clone())).await;
            }
            Err(e) => tracing::warn!(id = r.id, error = %e, "replay refused"),
        }
        // The operator's request may have gone (a closed connection): the replay stands.
        let _ = r.reply.send(result.map(Replayed::Job));
    }

    /// Carries out a record replay ([`RecordReplay`]; no batch write is in flight): its
    /// jobs are counted and queued like a replayed job.
    async fn on_record_replay(&mut self, consumer: &impl GroupReader, r: Replay) {
        let result = self.record_replay.replay(r.id, &self.outbox, &mut self.planner, &self.handoff).await;
        let result = match result {
            Ok(RecordReplayed { queued, parked }) => {
                tracing::info!(
                    id = r.id,
                    jobs = queued.len(),
                    deadletters = parked.len(),
                    "record dead letter replayed: routed again with the current device registry"
                );
                let jobs = queued.iter().map(|q| q.stored.clone()).collect();
                for q in queued {
                    self.queue_replayed(consumer, q).await;
                }
                if !parked.is_empty() {
                    self.deadletters.notify_one();
                }
                Ok(Replayed::Record { jobs, deadletters: parked })
            }
            Err(e) => {
                tracing::warn!(id = r.id, error = %e, "replay refused");
                Err(e)
            }
        };
        // The operator's request may have gone (a closed connection): the replay stands.
        let _ = r.reply.send(result);
    }

    /// A replayed job: counted in the outbox and against its device's bound like a
    /// planned job, then sent to the dispatcher.
    async fn queue_replayed(&mut self, consumer: &impl GroupReader, q: Queued) {
        let decisions = self.backpressure.replayed(&q.stored.device);
        let jobs = self.backpressure.jobs() as u64;
        self.stats.update(|s| s.outbox_jobs = jobs);
        self.apply(consumer, decisions);
        self.handoff.enqueue(q).await;
    }

    /// A job left its device's queue: removed from the outbox with the next write, or
    /// dead-lettered there now; its bounds released.
    async fn on_finished(&mut self, consumer: &impl GroupReader, f: Finished) {
        let mut stored = f.stored;
        let (reason, detail) = match f.outcome {
            Outcome::Done | Outcome::Superseded => {
                if f.outcome == Outcome::Superseded {
                    let job = &stored.job;
                    tracing::info!(event_id = %job.event_id, message_id = %job.message_id, device = %stored.device, charge = %job.charge_id, kind = job.kind.as_str(), seq = job.seq, "display_qr superseded before delivery");
                    self.stats.update(|s| s.superseded += 1);
                }
                // Removed with the next write (within `batch_max_delay_ms`), or apart from
                // a write the disk refuses, to free pages for it.
                let removal = Removal {
                    device: stored.device.clone(),
                    seq: stored.job.seq,
                    superseded: f.outcome == Outcome::Superseded,
                    durable: self.planner.is_cloud_printer(&stored.device),
                };
                if let Some(removal) = self.handoff.offer_removal(removal) {
                    self.batch.remove(removal);
                }
                (None, String::new())
            }
            Outcome::Failed(reason) => (Some(DeadLetterReason::DeliveryFailed), reason),
            Outcome::Expired => {
                let at = stored.job.expires_at.map(|t| t.to_rfc3339()).unwrap_or_default();
                (
                    Some(DeadLetterReason::Expired),
                    format!("{} not done before its expires_at {at}", stored.job.kind.as_str()),
                )
            }
        };
        if let Some(reason) = reason {
            if reason == DeadLetterReason::DeliveryFailed {
                self.stats.dead_effect(&reason);
            }
            let dl = DeadLetter::for_job(reason, detail, &stored);
            let job = &stored.job;
            tracing::warn!(event_id = %job.event_id, message_id = %job.message_id, device = %stored.device, charge = %job.charge_id, kind = job.kind.as_str(), seq = job.seq, reason = %dl.reason, detail = %dl.detail, "job dead-lettered");
            if !self.held_dead_letters.is_empty() {
                // After those waiting: a device's dead letters stay in the order its jobs ended.
                self.held_dead_letters.push_back((stored, dl));
                return;
            }
            match self.write_dead_letter(stored, dl).await {
                Ok(written) => stored = written,
                Err(held) => {
                    self.held_dead_letters.push_back(held);
                    return;
                }
            }
        }
        self.after_finished(consumer, stored).await;
    }

    /// One attempt at writing `stored`'s dead letter (on a blocking thread). Refused, it is
    /// given back to be tried again at the next tick, and the failure reported to health.
    async fn write_dead_letter(
        &mut self,
        stored: StoredJob,
        dl: DeadLetter,
    ) -> Result<StoredJob, (StoredJob, DeadLetter)> {
        let (outbox, now_ms) = (self.outbox.clone(), self.clock.now_ms());
        let (stored, dl, result) = blocking(move || {
            let result = outbox.fail_job(&stored, dl.clone(), now_ms);
            (stored, dl, result)
        })
        .await;
        match result {
            Ok(_) => {
                self.deadletters.notify_one();
                Ok(stored)
            }
            Err(e) => {
                tracing::error!(error = %e, device = %stored.device, seq = stored.job.seq, "cannot store a dead letter in the outbox; trying again every 500 ms (the job stays queued meanwhile)");
                self.health.outbox_failing(Some(e.to_string()));
                Err((stored, dl))
            }
        }
    }

    /// The dead letters held back by a refusing outbox, written in order until one is
    /// refused again. At shutdown they are left: their jobs stay in the outbox and are
    /// reloaded (and expired or delivered) at the next start.
    async fn retry_dead_letters(&mut self, consumer: &impl GroupReader) {
        let mut written = false;
        while let Some((stored, dl)) = self.held_dead_letters.pop_front() {
            match self.write_dead_letter(stored, dl).await {
                Ok(stored) => {
                    written = true;
                    self.after_finished(consumer, stored).await;
                }
                Err(held) => {
                    self.held_dead_letters.push_front(held);
                    return;
                }
            }
        }
        // Cleared here only when no batch is held too: that one's own retries say when
        // the disk takes writes again.
        if written && !self.handoff.write_held() {
            self.health.outbox_failing(None);
        }
    }

    /// What follows a job's end once its removal is on its way or its dead letter stored:
    /// its end logged (central shape), its device's bound released.
    async fn after_finished(&mut self, consumer: &impl GroupReader, stored: StoredJob) {
        if let Some(log) = &self.delivery_log {
            // A replayed job was never logged: its end is not either.
            if let Some(p) = self.ownership.partition_of(&stored.device) {
                if let Err(e) = log.ended(p, &stored).await {
                    tracing::error!(device = %stored.device, seq = stored.job.seq, error = %e, "cannot log a job's end: its partition's next owner sends it again (the device dedupes it)");
                }
            }
        }
        let decisions = self.backpressure.finished(&stored.device);
        self.apply(consumer, decisions);
        let (jobs, at_bound) = (self.backpressure.jobs() as u64, self.backpressure.devices_at_bound() as u64);
        self.stats.update(|s| {
            s.outbox_jobs = jobs;
            s.devices_at_bound = at_bound;
        });
    }

    fn on_tick(&mut self, consumer: &impl GroupReader) {
        self.stats.polled();
        if self.registry.device_topic_due() {
            let decisions = self.backpressure.hold_topic(None);
            self.apply(consumer, decisions);
        }
        if self.registry.is_holding() {
            self.registry_positions(consumer);
        }
        // Asks again after a failed question, and releases what can go.
        if self.registry.is_holding() {
            self.release_held(consumer);
        }
        self.consume_errors.tick(Instant::now(), &self.health);
        self.claims_overtaken(consumer);
        let pending = self.tracker.total_pending() as u64;
        self.stats.update(|s| s.pending_records = pending);
        self.pruner.tick(&self.outbox, &self.clock);
        self.look_at_space(consumer);
    }

    /// Pauses every partition while the outbox's file system is below its watermark, and
    /// resumes them once it has room ([`free_space`]). A file system that cannot be asked
    /// leaves things as they are.
    fn look_at_space(&mut self, consumer: &impl GroupReader) {
        let Some((path, mark)) = &mut self.space else { return };
        let free = match free_space::available(path) {
            Ok(free) => free,
            Err(e) => {
                tracing::debug!(error = %e, path = %path.display(), "cannot ask the outbox's file system for its free bytes");
                return;
            }
        };
        let Some(low) = mark.look(free) else { return };
        let min = mark.min();
        if low {
            tracing::warn!(free, min_free_bytes = min, path = %path.display(), "the outbox's file system is low on space: pausing every partition until half as much again is free");
        } else {
            tracing::info!(free, min_free_bytes = min, "the outbox's file system has room again: resuming");
        }
        self.health.low_space(low.then_some((free, min)));
        let decisions = self.backpressure.low_space(low);
        self.apply(consumer, decisions);
    }

    /// The device topic's positions as applied, in both shapes: a transactional producer's
    /// commit marker takes an offset no record is read at, so the last record read is one
    /// short of the end Kafka names, and a held charge would wait for it for good; the
    /// position passes it. (Outside the group they also start where the outbox saved them:
    /// records below were applied in earlier runs.) Every device record returned by `recv`
    /// is planned at once, so the position never runs ahead of what was applied.
    fn registry_positions(&mut self, consumer: &impl GroupReader) {
        match consumer.positions() {
            Ok(positions) => {
                for ((topic, p), at) in positions {
                    if let Some(next) = at.filter(|n| *n > 0 && topic == self.device_topic) {
                        self.registry.device_applied(p, next - 1);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the device topic's positions; tried again in 500 ms"),
        }
    }

    /// A record's effects are all accepted: stores its partition's offset if it moved, and
    /// releases the partition's pending bound at half.
    fn record_finished(&mut self, consumer: &impl GroupReader, rec: &RecordRef) {
        let part = &rec.part;
        if let Some(next) = self.tracker.done(part, rec.offset) {
            match consumer.store_offset(part, next) {
                Ok(()) => {}
                // After a revoke librdkafka refuses (`__STATE`): the new owner redelivers.
                Err(KafkaError::StoreOffset(RDKafkaErrorCode::State)) => {
                    tracing::debug!(topic = %part.0, partition = part.1, "offset not stored: partition no longer assigned")
                }
                // Not lost: the next record done on this partition stores a later
                // position, which covers this one; until then a restart reads it again.
                Err(e) => {
                    tracing::warn!(error = %e, topic = %part.0, partition = part.1, offset = next, "offset not stored")
                }
            }
        }
        let pending = self.tracker.total_pending() as u64;
        self.stats.update(|s| s.pending_records = pending);
        let decision = self.backpressure.record_done(part, self.tracker.pending(part));
        self.apply(consumer, decision);
    }

    /// Applies a rebalance librdkafka reported (inside its last poll): forgets revoked
    /// partitions and pauses again what must stay paused, since pauses do not survive a
    /// reassignment.
    fn after_rebalance(&mut self, consumer: &impl GroupReader) {
        let Some(revoked) = consumer.rebalanced() else {
            return;
        };
        for part in &revoked {
            // Its records still in the batch are written anyway: the router already
            // applied them, and the new owner's copies are deduplicated by message id.
            self.tracker.forget(part);
        }
        self.registry.revoked(&revoked);
        let assigned: Vec<Partition> = match consumer.assignment() {
            Ok(parts) => {
                self.health.assigned(parts.iter().cloned());
                self.registry.assigned(&parts);
                if self.route_changelog.is_some() {
                    let gone: BTreeSet<i32> =
                        revoked.iter().filter(|(t, _)| *t == self.charge_topic).map(|(_, p)| *p).collect();
                    let now: BTreeSet<i32> =
                        parts.iter().filter(|(t, _)| *t == self.charge_topic).map(|(_, p)| *p).collect();
                    // Revoked and assigned again: another replica may have applied states meanwhile.
                    let kept: BTreeSet<i32> = self.charge_owned.difference(&gone).copied().collect();
                    self.route_restores.retain(|p| now.contains(p));
                    for p in &gone {
                        self.restores.cancel(&(self.charge_topic.clone(), *p));
                    }
                    self.route_restores.extend(now.difference(&kept));
                    self.charge_owned = now;
                }
                if let (Some(topic), Some(_)) = (&self.device_jobs_topic, &self.delivery_log) {
                    let gone: BTreeSet<i32> = revoked.iter().filter(|(t, _)| t == topic).map(|(_, p)| *p).collect();
                    // A suspended partition revoked is done with; one the group keeps here
                    // stays suspended until its time (a fresh assignment is claimed now).
                    self.suspended.retain(|p, _| !gone.contains(p));
                    self.suspended_from.retain(|p, _| !gone.contains(p));
                    let now: BTreeSet<i32> = parts
                        .iter()
                        .filter(|(t, p)| t == topic && !self.suspended.contains_key(p))
                        .map(|(_, p)| *p)
                        .collect();
                    let (taken, given_up) = self.ownership.reassigned(now, &gone);
                    if !taken.is_empty() || !given_up.is_empty() {
                        let moves = self.moves.get_or_insert_with(Default::default);
                        moves.0.retain(|p| !given_up.iter().any(|(g, _)| g == p));
                        moves.0.extend(taken);
                        moves.1.extend(given_up);
                    }
                }
                parts
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot read the assignment after a rebalance: until the next one, the outbox bound pauses no partition");
                Vec::new()
            }
        };
        let count = assigned.len() as u64;
        let decisions = self.backpressure.rebalanced(&revoked, assigned);
        self.apply(consumer, decisions);
        let paused = self.backpressure.paused_count() as u64;
        self.stats.update(|s| {
            s.assigned_partitions = count;
            s.paused_partitions = paused;
        });
    }

    /// Device-jobs partitions whose claim in the delivery log another replica has overtaken
    /// (found by a partition connection the broker closed,
    /// [`DeliveryLog::still_owner_blocking`]): at once, each is suspended, given up as by a
    /// revoke (its devices' queues dropped from the dispatcher and the outbox, so nothing
    /// of it is retried, expired or dead-lettered here while its owner delivers it; its
    /// records read meanwhile are left to the owner: not logged, offsets not stored). If
    /// the group still gives it here a session timeout later, it is taken again: claimed
    /// anew, its queues restored from the log, read on from the log's position. The wait
    /// is what keeps two replicas from taking the partition from each other over and over:
    /// the one that was stale (frozen while the group moved the partition) hears of its
    /// revoke within it.
    fn claims_overtaken(&mut self, consumer: &impl GroupReader) {
        let (Some(log), Some(topic)) = (&self.delivery_log, &self.device_jobs_topic) else { return };
        if self.moves.is_some() {
            return;
        }
        let owned = self.ownership.owned().clone();
        let lost: BTreeMap<i32, Instant> = log
            .overtaken()
            .into_iter()
            .filter(|(p, _)| owned.contains(p) && !self.suspended.contains_key(p))
            .map(|(p, since)| (p, since + self.reclaim_after))
            .collect();
        let now = Instant::now();
        let due: BTreeSet<i32> = self.suspended.iter().filter(|(_, at)| **at <= now).map(|(p, _)| *p).collect();
        if lost.is_empty() && due.is_empty() {
            return;
        }
        if !lost.is_empty() {
            tracing::warn!(partitions = ?lost.keys().collect::<Vec<_>>(), wait_ms = self.reclaim_after.as_millis() as u64, "another replica's claim overtook this one's: the partitions' queues are dropped here and claimed again after the wait if the group still gives them here");
        }
        let assigned: BTreeSet<i32> = match consumer.assignment() {
            Ok(parts) => parts.iter().filter(|(t, _)| t == topic).map(|(_, p)| *p).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the assignment to claim overtaken partitions again; tried at the next tick");
                owned.iter().chain(due.iter()).copied().collect()
            }
        };
        for p in &due {
            self.suspended.remove(p);
        }
        let reclaim: BTreeSet<i32> = due.intersection(&assigned).copied().collect();
        if !reclaim.is_empty() {
            tracing::warn!(partitions = ?reclaim, "partitions whose claim was overtaken are still given here by the group a session timeout later: claiming them again");
        }
        for p in lost.keys().chain(&reclaim) {
            // Its records read meanwhile are left to the owner; after a claim they are
            // read again from the log's position, or from the lowest not stored here.
            let part = (topic.clone(), *p);
            if let Some(at) = self.tracker.unstored_from(&part) {
                let from = self.suspended_from.entry(*p).or_insert(at);
                *from = (*from).min(at);
            }
            self.tracker.forget(&part);
            let decision = self.backpressure.record_done(&part, 0);
            self.apply(consumer, decision);
        }
        let lost_parts: BTreeSet<i32> = lost.keys().copied().collect();
        let keep: BTreeSet<i32> = owned.difference(&lost_parts).copied().chain(reclaim).collect();
        self.suspended.extend(lost);
        let (taken, given_up) = self.ownership.reassigned(keep, &lost_parts);
        if !taken.is_empty() || !given_up.is_empty() {
            self.moves = Some((taken, given_up));
        }
    }

    /// Charge partitions taken (`cluster.enabled`): before any of their records is routed,
    /// each one's route changelog partition is read to its end, beside the loop
    /// ([`Restores`]; the partition is paused meanwhile), and the states newer than what
    /// this replica knows are kept ([`Pipeline::states_restored`]), so an event another
    /// replica's state makes stale is ignored here too. A read that fails is tried again,
    /// from where it got to, until the partition is revoked or shutdown.
    fn restore_routes(&mut self, consumer: &impl GroupReader) {
        let Some(changelog) = self.route_changelog.clone() else { return };
        let partitions = std::mem::take(&mut self.route_restores);
        for p in partitions {
            if !self.charge_owned.contains(&p) || self.shutdown.is_requested() {
                continue;
            }
            let part = (self.charge_topic.clone(), p);
            let decision = self.backpressure.restoring(&part, true);
            self.apply(consumer, decision);
            let (changelog, shutdown) = (changelog.clone(), self.shutdown.clone());
            self.restores.start(part, async move {
                let mut backoff = Backoff::default();
                let mut reading = changelog.states_of(p);
                loop {
                    let read = tokio::task::spawn_blocking(move || {
                        let r = reading.read_blocking(Duration::from_secs(10));
                        (reading, r)
                    })
                    .await;
                    let e = match read {
                        Ok((done, Ok(()))) => {
                            let (states, unreadable) = done.finish();
                            return restores::Outcome::States(states, unreadable);
                        }
                        // A failed try keeps what it read: the next goes on from there.
                        Ok((partial, Err(e))) => {
                            reading = partial;
                            e
                        }
                        Err(e) => {
                            reading = changelog.states_of(p);
                            anyhow::anyhow!("the changelog reader's thread: {e}")
                        }
                    };
                    tracing::error!(partition = p, error = %format!("{e:#}"), retry_ms = backoff.next_ms(), "cannot read a charge partition's route changelog; retrying (its records wait)");
                    if backoff.wait(&shutdown).await {
                        // Cancelled with the loop's other restores.
                        std::future::pending::<()>().await;
                    }
                }
            });
        }
    }

    /// A restore ended ([`Restores`]): one cancelled or replaced since is dropped (a claim it
    /// won is released when its partition is not this replica's); otherwise the partition's
    /// state is applied, it is read on from where it must be, and resumed.
    async fn on_restored(&mut self, consumer: &impl GroupReader, done: Done) {
        let (current, dropped_from) = self.restores.finished(&done);
        let (part, started) = (done.part.clone(), done.started);
        if !current {
            if let (restores::Outcome::Claimed(_), Some(log)) = (&done.outcome, &self.delivery_log) {
                if !self.ownership.owned().contains(&part.1) && !self.restores.is_restoring(&part) {
                    log.release(part.1);
                }
            }
            return;
        }
        let read_from = match done.outcome {
            restores::Outcome::States(states, unreadable) => {
                if !self.states_restored(part.1, states, unreadable, started).await {
                    return;
                }
                dropped_from
            }
            restores::Outcome::Claimed(restored) => {
                let suspended_from = self.suspended_from.remove(&part.1);
                match self.queues_restored(consumer, part.1, *restored, started).await {
                    None => return,
                    // No owner logged a position: what this replica read and did not
                    // store before (a claim of its own overtaken) is read again.
                    Some(None) => [dropped_from, suspended_from].into_iter().flatten().min(),
                    Some(pos) => pos,
                }
            }
        };
        if let Some(offset) = read_from {
            self.read_on_from(consumer, &part, offset).await;
        }
        let decision = self.backpressure.restoring(&part, false);
        self.apply(consumer, decision);
    }

    /// Reads `part` on from `offset` (a seek, retried until it takes or the partition is
    /// no longer assigned); for a device-jobs partition, `offset` is also stored as the
    /// group's offset (every record below it is in the delivery log).
    async fn read_on_from(&mut self, consumer: &impl GroupReader, part: &Partition, offset: i64) {
        let mut backoff = Backoff::default();
        loop {
            match consumer.seek(part, offset) {
                Ok(()) => {
                    if self.device_jobs_topic.as_deref() == Some(part.0.as_str()) {
                        if let Err(e) = consumer.store_offset(part, offset) {
                            tracing::warn!(partition = part.1, pos = offset, error = %e, "the delivery log's position not stored as the group's offset; stored with the next record done");
                        }
                    }
                    return;
                }
                Err(e) if consumer.assignment().is_ok_and(|a| !a.contains(part)) => {
                    tracing::info!(topic = %part.0, partition = part.1, error = %e, "partition revoked before it was read on from its restored position");
                    return;
                }
                Err(e) => {
                    tracing::error!(topic = %part.0, partition = part.1, offset, error = %e, retry_ms = backoff.next_ms(), "cannot read a restored partition on from its position; retrying");
                    if backoff.wait(&self.shutdown).await {
                        return;
                    }
                }
            }
        }
    }

    /// Keeps the states of charge partition `p` read from the route changelog that are
    /// newer than what this replica knows, in the router's memory and the outbox; `false`
    /// when shutdown came first.
    async fn states_restored(
        &mut self,
        p: i32,
        states: std::collections::HashMap<String, crate::store::ChargeState>,
        unreadable: usize,
        started: Instant,
    ) -> bool {
        if unreadable > 0 {
            let topic = self.route_changelog.as_ref().map(|c| c.topic().to_string()).unwrap_or_default();
            tracing::warn!(
                partition = p,
                records = unreadable,
                topic,
                "route changelog records that do not read: left out"
            );
        }
        let charges = states.len();
        let newer = match self.planner.restore_charge_states(states) {
            Ok(newer) => newer,
            Err(e) => {
                // The router keeps what it did take; the rest is read again at the next take.
                tracing::error!(partition = p, error = %e, "cannot read charge states from the outbox while restoring a charge partition's states; some are not restored");
                Vec::new()
            }
        };
        let count = newer.len();
        if !newer.is_empty() {
            let (_, stored) = until_stored(
                &self.health,
                "restored charge states",
                &self.shutdown,
                (self.outbox.clone(), newer),
                |(outbox, newer)| outbox.store_charge_states(newer),
            )
            .await;
            if stored.is_none() {
                return false;
            }
        }
        tracing::info!(
            partition = p,
            charges,
            newer = count,
            ms = started.elapsed().as_millis() as u64,
            "charge partition taken: its charges' states read from the route changelog"
        );
        true
    }

    /// At shutdown, once intake has stopped and the printers' gates are closed (`cloud`:
    /// what [`Board::close`] returned; `direct`: what [`Writes::close`] returned): the jobs
    /// cloud printers were told of and those direct printers are writing are waited for,
    /// until `until` at most; then their acks are handed to the dispatcher
    /// ([`Command::Barrier`]), so that those jobs' ends go into the last outbox write. A printer on the HTTP method or Epson's need not remember
    /// job tokens: a confirmation that came after that write would leave the printed
    /// receipt queued, to print again after the restart. A direct printer's job cut short
    /// by the exit would be printed again under the reprint header (or, with
    /// `interruptedJob = hold`, handed to an operator).
    async fn settle_printers(
        &mut self,
        cloud: Option<(&Board, Vec<PendingJob>)>,
        direct: Option<(&Writes, Vec<PendingJob>)>,
        until: tokio::time::Instant,
    ) {
        if self.handoff.gave_up() || (cloud.is_none() && direct.is_none()) {
            // Nothing to wait for, or the outbox takes no more writes: nothing waited for
            // could be written.
            return;
        }
        let ms = until.saturating_duration_since(tokio::time::Instant::now()).as_millis() as u64;
        let (board, unconfirmed) = cloud.map_or((None, Vec::new()), |(b, u)| (Some(b), u));
        let (writes, unfinished) = direct.map_or((None, Vec::new()), |(w, u)| (Some(w), u));
        if !unconfirmed.is_empty() {
            tracing::info!(
                jobs = unconfirmed.len(),
                ms,
                "waiting for cloud printers to confirm the jobs they were told of"
            );
        }
        if !unfinished.is_empty() {
            tracing::info!(jobs = unfinished.len(), ms, "waiting for direct printers to finish writing their jobs");
        }
        let (unconfirmed, unfinished) = tokio::join!(
            async {
                match board {
                    Some(b) => b.settle(unconfirmed, until).await,
                    None => unconfirmed,
                }
            },
            async {
                match writes {
                    Some(w) => w.settle(unfinished, until).await,
                    None => unfinished,
                }
            },
        );
        for u in unconfirmed {
            tracing::warn!(device = %u.device, seq = u.seq, message_id = %u.message_id, "a cloud printer was told of this job and did not confirm it before shutdown: it is offered again after the restart, and if it did print, prints again");
        }
        for u in unfinished {
            tracing::warn!(device = %u.device, seq = u.seq, message_id = %u.message_id, "a direct printer was still writing this job at shutdown: it is printed again after the restart under the reprint header (or held for an operator with interruptedJob = hold)");
        }
        self.barrier().await;
    }

    /// Waits until the dispatcher has handled every command and device message sent before
    /// now ([`Command::Barrier`]): each job they finished is then in `finished`.
    async fn barrier(&mut self) {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.handoff.command(Command::Barrier(answer)).await;
        if answered.await.is_err() {
            tracing::warn!(
                "the dispatcher ended before answering: jobs it finished since may be sent again after the restart"
            );
        }
    }

    /// The central shape's shutdown, once intake has stopped: the dispatcher drops every
    /// owned partition's queues and sends nothing more, and this waits until it has (a
    /// [`Command::Barrier`]), so every job it finished before is already reported and its
    /// end can be logged. Without it the dispatcher sends on until it closes, and the jobs
    /// it finishes then are left in the log for the next owner to send again. A job in
    /// flight is sent again by the next owner (its device dedupes it). The last batch's
    /// jobs are written and logged but not sent ([`Handoff::stop_sending`]): sent now, they
    /// would overtake the forgotten ones.
    async fn stop_sending(&mut self) {
        let devices = self.ownership.devices();
        if !devices.is_empty() {
            self.handoff.command(Command::Forget(devices)).await;
        }
        self.handoff.stop_sending();
        self.barrier().await;
    }

    /// Carries out the device-jobs partitions' moves noted at a rebalance (`docs/cluster.md`
    /// "Hand-over"): a partition given up has its restore cancelled and its devices' queues
    /// dropped from the dispatcher and the outbox (its new owner restores them from the
    /// delivery log); a partition taken is paused and claimed beside the loop
    /// ([`Restores`]: the claim reads its log, and is tried again, from where it got to,
    /// until it wins or the partition is revoked), then restored
    /// ([`Pipeline::queues_restored`]).
    async fn move_queues(&mut self, consumer: &impl GroupReader) {
        let Some((taken, given_up)) = self.moves.take() else { return };
        let Some(log) = self.delivery_log.clone() else { return };
        let Some(topic) = self.device_jobs_topic.clone() else { return };
        self.handoff.owned(self.ownership.owned().clone());
        if !given_up.is_empty() {
            // The ends logged up to now reach Kafka before the next owner reads the log, as
            // far as this replica can hurry them (the group does not wait for it).
            let flushing = log.clone();
            if !matches!(tokio::task::spawn_blocking(move || flushing.flush(REVOKE_FLUSH)).await, Ok(Ok(()))) {
                tracing::warn!("the delivery log was not flushed when partitions were given up: their next owners may send jobs again that are done");
            }
        }
        for (p, devices) in given_up {
            // A claim still running stops before the partition's connection closes.
            self.restores.cancel(&(topic.clone(), p));
            if let Some(links) = &self.partition_links {
                links.close(p);
            }
            log.release(p);
            self.handoff.command(Command::Forget(devices.clone())).await;
            for d in &devices {
                let decisions = self.backpressure.forgotten(d);
                self.apply(consumer, decisions);
            }
            let outbox = self.outbox.clone();
            let names = devices.clone();
            let forgotten =
                crate::ingest::retry::blocking(move || outbox.forget_devices(names.iter().map(String::as_str))).await;
            match forgotten {
                Ok(jobs) => tracing::info!(partition = p, devices = devices.len(), jobs, "device-jobs partition given up: its queues are dropped here, its new owner restores them from the delivery log"),
                Err(e) => tracing::warn!(partition = p, error = %e, "device-jobs partition given up, but its queues could not be dropped from the outbox; dropped at the next start"),
            }
        }
        for p in taken {
            if !self.ownership.owned().contains(&p) {
                continue;
            }
            if self.shutdown.is_requested() {
                // A replica on its way out claims nothing: its queues would be sent and
                // then left without their ends logged (`Pipeline::stop_sending`).
                tracing::info!(partition = p, "device-jobs partition not taken: shutting down");
                continue;
            }
            let part = (topic.clone(), p);
            let decision = self.backpressure.restoring(&part, true);
            self.apply(consumer, decision);
            let (log, links, shutdown) = (log.clone(), self.partition_links.clone(), self.shutdown.clone());
            self.restores.start(part, async move {
                let mut backoff = Backoff::default();
                let mut progress = log.take_of(p);
                let mut restored = loop {
                    match log.claim(&mut progress, Duration::from_secs(10)).await {
                        Ok(r) => break r,
                        Err(e) => {
                            tracing::error!(partition = p, error = %format!("{e:#}"), retry_ms = backoff.next_ms(), "cannot claim a partition taken in its delivery log; retrying (its devices wait)");
                            if backoff.wait(&shutdown).await {
                                // Cancelled with the loop's other restores.
                                std::future::pending::<()>().await;
                            }
                        }
                    }
                };
                if let Some(links) = links {
                    // The fence: the broker closes the previous owner's connection of this
                    // client id before this one sends anything.
                    links.open(p);
                    if !links.wait_up(p, PARTITION_CONNECT_WAIT).await {
                        tracing::warn!(partition = p, wait_ms = PARTITION_CONNECT_WAIT.as_millis() as u64, "the partition's connection to the devices' broker is not up yet; its jobs go out once it is (at their ack timeout)");
                    }
                }
                // The previous owner delivered until it heard of the claim: the ends it
                // logged meanwhile spare their jobs a second sending.
                let reading = log.clone();
                let late = tokio::task::spawn_blocking(move || {
                    let n = reading.late_ends_blocking(p, &mut restored, Duration::from_secs(10));
                    (restored, n)
                })
                .await;
                let restored = match late {
                    Ok((restored, Ok(n))) => {
                        if n > 0 {
                            tracing::info!(partition = p, jobs = n, "jobs the previous owner finished after the claim: not sent again");
                        }
                        restored
                    }
                    Ok((restored, Err(e))) => {
                        tracing::warn!(partition = p, error = %format!("{e:#}"), "cannot read the ends the previous owner logged after the claim: its last jobs may be sent again (their devices dedupe them)");
                        restored
                    }
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                };
                restores::Outcome::Claimed(Box::new(restored))
            });
        }
        let jobs = self.backpressure.jobs() as u64;
        self.stats.update(|s| s.outbox_jobs = jobs);
    }

    /// Device-jobs partition `p` claimed with what its delivery log holds: its devices'
    /// queues replace what the outbox had of them (their `seq`s kept) and go to the
    /// dispatcher with the supersede rule applied again, and its records below the log's
    /// `pos` are skipped when read again. Returns the log's `pos` (where to read on from;
    /// `None` inside: none yet), or `None` when shutdown came first.
    async fn queues_restored(
        &mut self,
        consumer: &impl GroupReader,
        p: i32,
        mut restored: crate::model::delivery_log::Restored,
        started: Instant,
    ) -> Option<Option<i64>> {
        if restored.stale > 0 {
            tracing::warn!(
                partition = p,
                records = restored.stale,
                "delivery log records written by a replica after it had lost the partition: left out"
            );
        }
        for (key, why) in &restored.unreadable {
            tracing::warn!(partition = p, key, why, "a delivery log record cannot be read; left out");
        }
        let devices: BTreeSet<String> =
            restored.seqs.keys().cloned().chain(restored.jobs.iter().map(|j| j.device.clone())).collect();
        let done_late = std::mem::take(&mut restored.done_late);
        if !done_late.is_empty() {
            tracing::info!(
                partition = p,
                jobs = done_late.len(),
                "jobs the previous owner accepted and finished after the claim: left out when read again"
            );
        }
        self.ownership.restored(p, restored.pos, devices.iter().map(String::as_str), done_late);
        self.handoff.restored(p, restored.pos);
        let (jobs, seqs) = (restored.jobs, restored.seqs);
        let state = (self.outbox.clone(), jobs, seqs);
        let (_, headers) =
            until_stored(&self.health, "a restored queue", &self.shutdown, state, |(outbox, jobs, seqs)| {
                outbox.restore(jobs.clone(), seqs)
            })
            .await;
        let headers = headers?;
        for h in &headers {
            let decisions = self.backpressure.replayed(&h.device);
            self.apply(consumer, decisions);
        }
        let count = headers.len();
        if count > 0 {
            self.handoff.command(Command::Restore(headers)).await;
        }
        let jobs = self.backpressure.jobs() as u64;
        self.stats.update(|s| s.outbox_jobs = jobs);
        let epoch = restored.owner.as_ref().map_or(0, |o| o.epoch);
        tracing::info!(partition = p, epoch, devices = devices.len(), jobs = count, pos = ?restored.pos, ms = started.elapsed().as_millis() as u64, "device-jobs partition taken: its queues restored from the delivery log");
        Some(restored.pos)
    }

    /// Carries out [`Backpressure`]'s decisions: pauses or resumes the partitions in
    /// librdkafka and reports their causes to the health monitor.
    fn apply(&self, consumer: &impl GroupReader, decisions: impl IntoIterator<Item = Decision>) {
        let mut changed = false;
        for d in decisions {
            self.health.paused(&d.part, d.cause);
            if let Some(action) = d.action {
                pause(consumer, &d.part, action);
                changed = true;
            }
        }
        if changed {
            let paused = self.backpressure.paused_count() as u64;
            self.stats.update(|s| s.paused_partitions = paused);
        }
    }
}

fn pause(consumer: &impl GroupReader, part: &Partition, action: Action) {
    let result = consumer.pause(part, action);
    if let Err(e) = result {
        tracing::warn!(error = %e, topic = %part.0, partition = part.1, pause = action == Action::Pause, "pause/resume failed");
    }
}

#[cfg(test)]
mod tests;
