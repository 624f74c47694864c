//! The hand-off seam: where rendered jobs leave routing and enter the durable per-device
//! queue.
//!
//! Upstream of it records are read in each partition's order, planned into [`Accept`]s
//! (jobs by device, dead letters, state changes: [`crate::ingest::plan`]) and batched
//! ([`crate::ingest::batch`]). Downstream each device's queue in the outbox holds its jobs
//! in `seq` order, and the dispatcher delivers them one at a time
//! ([`crate::deliver::dispatcher`]). A record is *durably accepted*, and its offset may be
//! stored, once its batch has crossed the seam.
//!
//! On the edge box the hand-off is a step within one process, [`Handoff`]: a batch's
//! `Accept`s are written to the outbox in one transaction ([`Outbox::write`]: each job gets
//! its device's next `seq`; a job whose message id is in the dedupe window is left out), on
//! a blocking thread while the consumer plans the next batch; then each job stored goes to
//! the dispatcher as [`Command::Enqueue`], in the order written. With `cluster.enabled`
//! ([`Handoff::routed`]) it is a Kafka topic keyed by device (the repartition by a new key
//! of Kafka Streams, [`crate::ingest::device_jobs`]): the jobs planned from change events
//! are produced to it before the batch's write, and the jobs read back from it are
//! written and go to the dispatcher as above.
//!
//! What holds across the seam, in either form:
//! - per device, jobs are queued in the order their records were read: one batch in
//!   flight at a time, a replay only between two batches, and nothing more once a batch
//!   was given up ([`Handoff::gave_up`]);
//! - a batch is accepted whole or not at all, and a refused write is retried in the
//!   batch's task until the disk takes it ([`crate::ingest::retry`]): the consumer goes
//!   on polling Kafka (its group membership survives), reads no further than its bounds
//!   and stores no offset past the batch;
//! - a job is queued at most once per message id (the outbox's dedupe window), so a
//!   record read again after a restart or a rebalance queues nothing twice.

use crate::clock::Clock;
use crate::config::TtlConfig;
use crate::ingest::backoff::Backoff;
use crate::ingest::batch::{Batch, Sealed};
use crate::ingest::delivery_log::{DeliveryLog, LogError};
use crate::ingest::device_jobs::{self, JobProducer};
use crate::ingest::held_removals::HeldRemovals;
use crate::ingest::offsets::RecordRef;
use crate::ingest::retry::{blocking, until_stored, until_stored_or};
use crate::ingest::route_changelog::{RouteChangelog, StateRecord};
use crate::model::{Command, Queued, StoredJob};
use crate::route::render as jobs;
use crate::shutdown::Shutdown;
use crate::store::{Accept, Outbox, OutboxError, Removal, ReplayError, Written};
use crate::telemetry::Monitor;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The write-then-enqueue step: the outbox the jobs are written to, and the dispatcher
/// they go to.
pub struct Handoff {
    outbox: Arc<Outbox>,
    /// With `cluster.enabled`: the jobs planned from change events go to the device-jobs
    /// topic through it, before the rest of their records is written ([`Handoff::routed`]).
    jobs_out: Option<Arc<JobProducer>>,
    /// With `cluster.enabled`: the route changelog and the charge topic whose records'
    /// states go to it ([`Handoff::changelog`]).
    changelog: Option<(Arc<RouteChangelog>, String)>,
    /// Stamps the writes (jobs' acceptance time, a replayed job's expiry).
    clock: Clock,
    /// The dispatcher's commands.
    commands: mpsc::Sender<Command>,
    /// Told while outbox writes fail.
    health: Arc<Monitor>,
    /// Turns true on SIGTERM: a failing write then gives up instead of retrying.
    shutdown: Shutdown,
    /// A batch was given up at shutdown: nothing more is written, so no later record's
    /// jobs get a `seq` before the given-up ones' (they are read again at the next start).
    gave_up: bool,
    /// False once the dispatcher has forgotten every device at shutdown
    /// ([`Handoff::stop_sending`]): jobs landed later are stored and logged, not sent.
    sending: bool,
    /// With `cluster.enabled`: the deliver stage's log, the device-jobs topic and the
    /// partitions of it this replica owns ([`Handoff::logged`]).
    log: Option<Logged>,
    /// Finished jobs' removals while a batch's write is held, written apart from it.
    held_removals: Arc<HeldRemovals>,
}

/// The deliver stage's log and what it needs to know (`cluster.enabled`).
struct Logged {
    log: Arc<DeliveryLog>,
    device_jobs_topic: String,
    owned: BTreeSet<i32>,
    /// Per owned partition, the `pos` the log has: never written lower (records below it
    /// read again are skipped, and a lower `pos` would have the next owner queue them
    /// twice).
    pos: BTreeMap<i32, i64>,
}

/// A batch being written by a task of its own, retried there until it is stored: the
/// consumer loop goes on polling Kafka meanwhile (its partitions pause at their bounds),
/// so a write the disk refuses for minutes never exceeds `max.poll.interval.ms`.
pub struct InFlight {
    /// The write; gives the batch back with the outcome.
    handle: JoinHandle<Attempt>,
}

/// A batch's write, returned from its task: stored, or refused until shutdown.
pub struct Attempt {
    records: Vec<RecordRef>,
    accepts: Vec<Accept>,
    result: Result<Written, HandoffError>,
}

/// Why a batch did not cross the seam (it is tried again).
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// The outbox refused the write.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// Kafka did not take a job record (`cluster.enabled`).
    #[error("producing jobs to the device-jobs topic: {0}")]
    Produce(#[from] rdkafka::error::KafkaError),
    /// Kafka did not take a charge state (`cluster.enabled`).
    #[error("producing charge states to the route changelog: {0}")]
    Changelog(rdkafka::error::KafkaError),
}

/// A batch across the seam: stored in the outbox, its jobs sent to the dispatcher.
#[derive(Debug, Default)]
pub struct Accepted {
    /// Its records, in the order read: every effect is durably accepted, their offsets
    /// may be stored.
    pub records: Vec<RecordRef>,
    /// The device of each planned job the dedupe window left out (not queued).
    pub left_out: Vec<String>,
    /// Dead letters were parked (the dead-letter publisher has work).
    pub parked: bool,
    /// For each record that queued or produced jobs, planned to accepted: the `accept`
    /// stage ([`crate::telemetry::latency::Stage::Accept`]).
    pub accept_times: Vec<Duration>,
}

impl InFlight {
    /// Waits for the write to return. Cancel-safe: dropped unfinished, it can be awaited
    /// again.
    ///
    /// # Panics
    /// The outbox writer panicked.
    pub async fn attempt(&mut self) -> Attempt {
        (&mut self.handle).await.expect("the outbox writer panicked")
    }
}

impl Handoff {
    /// A hand-off into `outbox` (writes stamped by `clock`), then to the dispatcher's
    /// `commands`; outbox failures are reported to `health`, and retried until `shutdown`
    /// is requested.
    pub fn new(
        outbox: Arc<Outbox>,
        clock: Clock,
        commands: mpsc::Sender<Command>,
        health: Arc<Monitor>,
        shutdown: Shutdown,
    ) -> Handoff {
        Handoff {
            outbox,
            jobs_out: None,
            changelog: None,
            clock,
            commands,
            health,
            shutdown,
            gave_up: false,
            sending: true,
            log: None,
            held_removals: Arc::default(),
        }
    }

    /// The central shape's form of the seam: the jobs planned from change events are
    /// produced to `producer`'s topic (all of a batch, waiting for Kafka's acks), then the
    /// rest of their records (charge state, registry, dead letters, counts) is written to
    /// the outbox; jobs read back from that topic are written to the outbox and go to the
    /// dispatcher as on the edge box.
    pub fn routed(mut self, producer: Arc<JobProducer>) -> Handoff {
        self.jobs_out = Some(producer);
        self
    }

    /// With [`Handoff::routed`]: the charge state each record of `charge_topic` applied
    /// goes to `changelog` on the record's partition number once its jobs are on the
    /// device-jobs topic, before the outbox write (so before its offset is stored).
    pub fn changelog(mut self, changelog: Arc<RouteChangelog>, charge_topic: &str) -> Handoff {
        self.changelog = Some((changelog, charge_topic.to_string()));
        self
    }

    /// The states the records of a batch applied, for the changelog.
    fn states_of(&self, records: &[RecordRef], accepts: &[Accept]) -> Vec<StateRecord> {
        let Some((_, topic)) = &self.changelog else { return Vec::new() };
        records
            .iter()
            .zip(accepts)
            .filter(|(rec, _)| rec.part.0 == *topic)
            .filter_map(|(rec, a)| a.charge.as_ref().map(|(id, st)| (rec.part.1, id.clone(), *st)))
            .collect()
    }

    /// The deliver stage's durable acceptance (`docs/cluster.md` "Accepting a job"): a job
    /// read back from `device_jobs_topic` goes to the dispatcher only once `log` has it,
    /// with its partition's read position; a job of a partition no longer owned
    /// ([`Handoff::owned`]) is forgotten instead, its partition's new owner reads it.
    pub fn logged(mut self, log: Arc<DeliveryLog>, device_jobs_topic: &str) -> Handoff {
        self.log = Some(Logged {
            log,
            device_jobs_topic: device_jobs_topic.to_string(),
            owned: BTreeSet::new(),
            pos: BTreeMap::new(),
        });
        self
    }

    /// The device-jobs partitions this replica owns now (after a rebalance).
    pub fn owned(&mut self, partitions: BTreeSet<i32>) {
        if let Some(l) = &mut self.log {
            l.pos.retain(|p, _| partitions.contains(p));
            l.owned = partitions;
        }
    }

    /// Partition `p` was restored from its log, whose `pos` is `pos` (`None`: none yet).
    pub fn restored(&mut self, p: i32, pos: Option<i64>) {
        if let Some(l) = &mut self.log {
            match pos {
                Some(pos) => l.pos.insert(p, pos),
                None => l.pos.remove(&p),
            };
        }
    }

    /// The central shape's shutdown, once the dispatcher has forgotten this replica's
    /// devices (`Command::Forget`, then a barrier): batches landed from now on are still
    /// written and logged, but their jobs do not go to the dispatcher. Its queues no
    /// longer hold those devices' earlier jobs, so a later job sent now would overtake
    /// them; the partition's next owner restores them all, in `seq` order, from the
    /// delivery log.
    pub fn stop_sending(&mut self) {
        self.sending = false;
    }

    /// A finished job's removal: kept to be written apart while a batch's write is held
    /// (`None`, [`HeldRemovals`]), or given back for the next batch.
    pub fn offer_removal(&self, removal: Removal) -> Option<Removal> {
        self.held_removals.offer(removal)
    }

    /// Whether a batch's write is held (the outbox refused it) or was, and no batch has
    /// started since.
    pub fn write_held(&self) -> bool {
        self.held_removals.is_held()
    }

    /// Whether a batch was given up at shutdown (nothing more is written).
    pub fn gave_up(&self) -> bool {
        self.gave_up
    }

    /// Takes `batch` and starts writing it in a task of its own, which retries a refused
    /// write until it is stored or shutdown is requested ([`until_written`],
    /// [`until_routed`]); `None` when there is nothing to write, or a batch was given up.
    /// The caller keeps at most one in flight, goes on reading meanwhile, and hands its
    /// [`Attempt`] to [`Handoff::land`] before starting the next.
    pub fn start(&mut self, batch: &mut Batch) -> Option<InFlight> {
        for removal in self.held_removals.release() {
            batch.remove(removal);
        }
        if self.gave_up {
            batch.stop_timer();
            return None;
        }
        let Sealed { records, mut accepts, removals } = batch.take()?;
        let (outbox, now_ms) = (self.outbox.clone(), self.clock.now_ms());
        let states = self.states_of(&records, &accepts);
        let changelog = self.changelog.as_ref().map(|(c, _)| c.clone());
        let retry = Retry {
            health: self.health.clone(),
            shutdown: self.shutdown.clone(),
            clock: self.clock.clone(),
            held_removals: self.held_removals.clone(),
        };
        let handle = match self.jobs_out.clone() {
            None => tokio::spawn(async move {
                let first = outbox.clone();
                let (accepts, removals, result) = blocking(move || {
                    let result = first.write(&mut accepts, &removals, now_ms).map_err(HandoffError::from);
                    (accepts, removals, result)
                })
                .await;
                let (accepts, result) = until_written(&retry, outbox, accepts, removals, result).await;
                Attempt { records, accepts, result }
            }),
            Some(producer) => tokio::spawn(async move {
                let changelog = changelog.map(|c| (c, states));
                let on_changelog = changelog.as_ref().map(|(c, s)| (&**c, s.as_slice()));
                let (accepts, removals, result) =
                    route_then_write(&producer, on_changelog, outbox.clone(), accepts, removals, now_ms).await;
                let (accepts, result) =
                    until_routed(&retry, &producer, on_changelog, outbox, accepts, removals, result).await;
                Attempt { records, accepts, result }
            }),
        };
        Some(InFlight { handle })
    }

    /// Completes a batch's write: each job stored goes to the dispatcher, in order.
    /// `None` when the write was refused until shutdown: the batch is given up, its
    /// records stay pending (no offset is stored past them) and nothing more is written.
    pub async fn land(&mut self, attempt: Attempt) -> Option<Accepted> {
        let Attempt { records, accepts, result } = attempt;
        let Ok(stored) = result else {
            self.gave_up = true;
            return None;
        };
        let mut accepted = Accepted::default();
        let (stored, unowned) = match self.log_accepted(&records, &accepts, stored).await {
            Some(s) => s,
            None => {
                self.gave_up = true;
                return None;
            }
        };
        let accepted_at = Instant::now();
        for ((accept, (queued, dls)), rec) in accepts.iter().zip(stored).zip(&records) {
            accepted.parked |= !dls.is_empty();
            if !queued.is_empty() || !accept.produced.is_empty() {
                accepted.accept_times.push(accepted_at.saturating_duration_since(rec.planned_at));
            }
            // A traced record's line: what its producer's trace led to.
            if let Some(trace_id) = &rec.trace {
                tracing::info!(trace_id = %trace_id, topic = %rec.part.0, partition = rec.part.1, offset = rec.offset, jobs = queued.len() + accept.produced.len(), deadletters = dls.len(), "record's effects accepted");
            }
            for (device, job) in &accept.jobs {
                if !queued.iter().any(|q| q.stored.job.message_id == job.message_id) {
                    accepted.left_out.push(device.clone());
                }
            }
            for mut q in queued {
                q.accepted_at = Some(accepted_at);
                let (device, job) = (&q.stored.device, &q.stored.job);
                tracing::debug!(event_id = %job.event_id, message_id = %job.message_id, device = %device, charge = %job.charge_id, kind = job.kind.as_str(), seq = job.seq, "job queued");
                if self.sending {
                    self.enqueue(q).await;
                }
            }
        }
        // A record of a partition given up meanwhile is not accepted here: its offset is
        // not stored, so its partition's owner reads it.
        accepted.records =
            records.into_iter().enumerate().filter(|(i, _)| !unowned.contains(i)).map(|(_, r)| r).collect();
        Some(accepted)
    }

    /// With the deliver stage's log: logs each owned device-jobs partition's queued jobs
    /// and its next read position, retrying (backing off from 100 ms to 10 s) until Kafka
    /// has them or shutdown is requested (`None`: the batch's offsets are not stored, its
    /// records are read again). The records of partitions no longer owned are returned by
    /// index (their offsets must not be stored) and their jobs forgotten, dedupe window
    /// included, and taken out of `stored`: the partition's owner reads them.
    async fn log_accepted(
        &mut self,
        records: &[RecordRef],
        accepts: &[Accept],
        mut stored: Written,
    ) -> Option<(Written, BTreeSet<usize>)> {
        let Some(l) = &mut self.log else { return Some((stored, BTreeSet::new())) };
        let mut by_partition: BTreeMap<i32, PartitionBatch> = BTreeMap::new();
        for (i, ((rec, (queued, _)), accept)) in records.iter().zip(stored.iter()).zip(accepts).enumerate() {
            if rec.part.0 != l.device_jobs_topic {
                continue;
            }
            let entry = by_partition.entry(rec.part.1).or_default();
            entry.queued.extend(queued.iter().cloned());
            entry.pos = entry.pos.max(rec.offset + 1);
            entry.records.push(i);
            entry.forget.extend(queued.iter().map(|q| {
                (q.stored.device.clone(), q.stored.job.seq, accept.event_time, q.stored.job.message_id.clone())
            }));
        }
        let (mut backoff, mut failed) = (Backoff::default(), false);
        let (mut unowned, mut forget) = (BTreeSet::new(), Vec::new());
        for (p, PartitionBatch { queued, pos, records: indices, forget: forgettable }) in by_partition {
            // Given up meanwhile, or its claim overtaken by another replica's (claimed again
            // a session timeout later if still assigned): whoever owns it reads them again.
            let mut ours = l.owned.contains(&p) && l.log.epoch(p).is_some();
            let logged = l.pos.get(&p).copied().unwrap_or(0);
            if ours && queued.is_empty() && pos <= logged {
                continue;
            }
            let pos = pos.max(logged);
            while ours {
                // The log's producer retries until Kafka has the records: with Kafka away
                // that is forever, so shutdown does not wait for it. The batch is then not
                // accepted, and its offsets not stored: it is read again at the next start.
                let logged = tokio::select! {
                    r = l.log.accepted(p, &queued, pos) => r,
                    () = self.shutdown.requested() => return None,
                };
                match logged {
                    Ok(()) => {
                        l.pos.insert(p, pos);
                        break;
                    }
                    Err(LogError::NotClaimed(_)) => ours = false,
                    Err(e) => {
                        failed = true;
                        tracing::error!(error = %e, partition = p, retry_ms = backoff.next_ms(), "the accepted jobs did not reach the delivery log; retrying (reading is held)");
                        self.health.outbox_failing(Some(format!("delivery log: {e}")));
                        if backoff.wait(&self.shutdown).await {
                            return None;
                        }
                    }
                }
            }
            if !ours {
                unowned.extend(indices.iter().copied());
                forget.extend(forgettable);
                for i in indices {
                    stored[i].0.clear();
                }
            }
        }
        if failed {
            self.health.outbox_failing(None);
        }
        if !forget.is_empty() {
            tracing::info!(
                jobs = forget.len(),
                "jobs read from a device-jobs partition no longer this replica's: forgotten, its owner delivers them"
            );
            let outbox = self.outbox.clone();
            if let Err(e) = blocking(move || outbox.forget_jobs(&forget)).await {
                tracing::warn!(error = %e, "cannot forget the jobs of a partition given up; forgotten at the next start");
            }
        }
        Some((stored, unowned))
    }

    /// Queues dead letter `id`'s job again at the end of its device's queue in the outbox
    /// (its next `seq`; `expires_at` now plus its kind's time to live in `ttl`, a
    /// `display_qr`'s stays its charge's expiry) and returns it as queued. No batch write
    /// may be in flight: the replayed job's `seq` then falls between two batches'. Send
    /// it to the dispatcher with [`Handoff::enqueue`] before the next batch is written.
    ///
    /// # Errors
    /// No such dead letter, one without a job, or the outbox refused ([`ReplayError`]).
    pub async fn replay(&self, id: u64, ttl: &TtlConfig) -> Result<StoredJob, ReplayError> {
        let (outbox, ttl, now_ms) = (self.outbox.clone(), ttl.clone(), self.clock.now_ms());
        blocking(move || outbox.replay(id, now_ms, |k| jobs::ttl_of(k, &ttl))).await
    }

    /// Writes the record of record-level dead letter `id`, planned again (`accept`): its
    /// jobs (their original message ids), its charge state and any effect's dead letter, in
    /// the transaction that marks the dead letter replayed ([`Outbox::replay_record`]).
    /// Like [`Handoff::replay`], between two batch writes; a write the disk refuses is
    /// retried as a batch's is. Returns the jobs queued (send each with
    /// [`Handoff::enqueue`]) and the ids of the dead letters parked.
    ///
    /// # Errors
    /// Already replayed, not a record's dead letter, or the outbox kept refusing until
    /// shutdown ([`ReplayError`]).
    pub async fn replay_record(&self, id: u64, accept: &mut Accept) -> Result<(Vec<Queued>, Vec<u64>), ReplayError> {
        let state = (self.outbox.clone(), self.clock.clone(), std::mem::take(accept));
        let ((_, _, written), outcome) = until_stored_or(
            &self.health,
            "a replayed record",
            &self.shutdown,
            state,
            move |(outbox, clock, accept)| outbox.replay_record(id, accept, clock.now_ms()),
        )
        .await;
        *accept = written;
        outcome
    }

    /// Sends `cmd` to the dispatcher (waits while its channel is full).
    pub async fn command(&self, cmd: Command) {
        if self.commands.send(cmd).await.is_err() {
            tracing::error!("dispatcher is gone");
        }
    }

    /// Sends a job the outbox holds to the dispatcher (waits while its channel is full).
    pub async fn enqueue(&self, q: Queued) {
        if self.commands.send(Command::Enqueue(q)).await.is_err() {
            tracing::error!("dispatcher is gone; the job stays in the outbox for the next start");
        }
    }
}

/// What a batch's task needs to retry its write: where to report the failure, when to
/// give up, the clock that stamps each try, and the removals written apart meanwhile.
#[derive(Clone)]
struct Retry {
    health: Arc<Monitor>,
    shutdown: Shutdown,
    clock: Clock,
    held_removals: Arc<HeldRemovals>,
}

impl Retry {
    /// [`HeldRemovals::write_apart`] before a retry of the held batch, logged; refused,
    /// the removals stay in `own` and go with the batch.
    fn removals_apart(&self, outbox: &Outbox, own: &mut Vec<Removal>) {
        match self.held_removals.write_apart(outbox, own) {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                removed = n,
                "finished jobs removed from the outbox apart from the held batch, freeing their pages for it"
            ),
            Err(e) => {
                tracing::warn!(error = %e, removals = own.len(), "the finished jobs' removals were refused too; they go with the held batch")
            }
        }
    }
}

/// The outbox write of an edge box's batch after a first try that gave `result`: a
/// refused one is written again ([`until_stored`], backing off from 100 ms to 10 s) until
/// the disk takes it, reported to health meanwhile. Returns the accepts (their `produced`
/// lists kept) and what was stored, or the last error once shutdown is requested.
async fn until_written(
    retry: &Retry,
    outbox: Arc<Outbox>,
    accepts: Vec<Accept>,
    removals: Vec<Removal>,
    result: Result<Written, HandoffError>,
) -> (Vec<Accept>, Result<Written, HandoffError>) {
    let error = match result {
        Ok(written) => return (accepts, Ok(written)),
        Err(e) => e,
    };
    tracing::error!(error = %error, "cannot store the batch in the outbox; retrying (nothing is read past it)");
    retry.health.outbox_failing(Some(error.to_string()));
    // A first pause before the retries (`until_stored` then sees a shutdown at once).
    retry.shutdown.sleep(Duration::from_millis(100)).await;
    retry.held_removals.hold();
    let state = (outbox, retry.clone(), accepts, removals);
    let ((_, _, accepts, _), stored) =
        until_stored(&retry.health, "the batch", &retry.shutdown, state, |(outbox, retry, accepts, removals)| {
            retry.removals_apart(outbox, removals);
            outbox.write(accepts, removals, retry.clock.now_ms())
        })
        .await;
    (accepts, stored.ok_or(error))
}

/// A routed batch after a first try that gave `result`: a failed one is tried again whole
/// (its jobs produced again, then the write), backing off ([`Backoff`]), until it
/// crosses or shutdown is requested (then the last error). Reports the failure to health
/// meanwhile.
async fn until_routed(
    retry: &Retry,
    producer: &JobProducer,
    changelog: Option<(&RouteChangelog, &[StateRecord])>,
    outbox: Arc<Outbox>,
    mut accepts: Vec<Accept>,
    mut removals: Vec<Removal>,
    result: Result<Written, HandoffError>,
) -> (Vec<Accept>, Result<Written, HandoffError>) {
    let mut error = match result {
        Ok(written) => return (accepts, Ok(written)),
        Err(e) => e,
    };
    let mut backoff = Backoff::default();
    retry.held_removals.hold();
    loop {
        tracing::error!(error = %error, retry_ms = backoff.next_ms(), "the batch did not cross to the device-jobs topic and the outbox; retrying (nothing is read past it)");
        retry.health.outbox_failing(Some(error.to_string()));
        if backoff.wait(&retry.shutdown).await {
            return (accepts, Err(error));
        }
        let (apart, outbox_apart) = (retry.clone(), outbox.clone());
        removals = blocking(move || {
            let mut own = removals;
            apart.removals_apart(&outbox_apart, &mut own);
            own
        })
        .await;
        let (a, r, result) =
            route_then_write(producer, changelog, outbox.clone(), accepts, removals, retry.clock.now_ms()).await;
        (accepts, removals) = (a, r);
        match result {
            Ok(written) => {
                retry.health.outbox_failing(None);
                return (accepts, Ok(written));
            }
            Err(e) => error = e,
        }
    }
}

/// The routed batch's crossing: the jobs of every change event of `accepts` are produced
/// (each accept's jobs move to its `produced` list once Kafka has them all), then the
/// charge states to `changelog` (after the jobs: a state on the changelog means its jobs
/// are on the topic), then the batch is written to the outbox with `removals`. Jobs read
/// back from the device-jobs topic stay in their accepts and are queued by the write.
/// Returns the batch for a retry.
async fn route_then_write(
    producer: &JobProducer,
    changelog: Option<(&RouteChangelog, &[StateRecord])>,
    outbox: Arc<Outbox>,
    mut accepts: Vec<Accept>,
    removals: Vec<Removal>,
    now_ms: u64,
) -> (Vec<Accept>, Vec<Removal>, Result<Written, HandoffError>) {
    let is_route = |a: &Accept| a.routed_from.is_none() && !a.jobs.is_empty();
    let records: Vec<(String, Vec<u8>)> = accepts
        .iter()
        .filter(|a| is_route(a))
        .flat_map(|a| a.jobs.iter().map(move |(device, job)| device_jobs::record_of(device, job, a)))
        .collect();
    if !records.is_empty() {
        if let Err(e) = producer.produce(&records).await {
            return (accepts, removals, Err(e.into()));
        }
        for a in accepts.iter_mut().filter(|a| is_route(a)) {
            a.produced = a.jobs.drain(..).map(|(device, job)| (device, job.kind)).collect();
        }
    }
    if let Some((changelog, states)) = changelog.filter(|(_, s)| !s.is_empty()) {
        if let Err(e) = changelog.produce(states).await {
            return (accepts, removals, Err(HandoffError::Changelog(e)));
        }
    }
    blocking(move || {
        let mut accepts = accepts;
        let result = outbox.write(&mut accepts, &removals, now_ms).map_err(HandoffError::from);
        (accepts, removals, result)
    })
    .await
}

/// One device-jobs partition's share of a batch being logged.
#[derive(Default)]
struct PartitionBatch {
    /// Its jobs.
    queued: Vec<Queued>,
    /// The offset after its last record.
    pos: i64,
    /// Its records' indexes in the batch.
    records: Vec<usize>,
    /// What forgetting its jobs takes (device, seq, event time, message id), should the
    /// partition not be this replica's.
    forget: Vec<(String, u64, u64, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::temp_outbox;
    use device_protocol::EffectKind;

    fn offsets(records: &[RecordRef]) -> Vec<i64> {
        records.iter().map(|r| r.offset).collect()
    }

    fn rec(offset: i64) -> RecordRef {
        RecordRef { part: ("charge.upserted".to_string(), 0), offset, trace: None, planned_at: Instant::now() }
    }

    /// A record's plan: one job per `(device, message id)`.
    fn accept(jobs: &[(&str, &str)]) -> Accept {
        let job = |id: &str| crate::test_fixtures::job(id, EffectKind::PrintReceipt, "c");
        Accept {
            jobs: jobs.iter().map(|(d, id)| (d.to_string(), job(id))).collect(),
            event_time: 1,
            ..Accept::default()
        }
    }

    /// The jobs sent to the dispatcher so far: (device, seq, message id).
    fn sent(rx: &mut mpsc::Receiver<Command>) -> Vec<(String, u64, String)> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|c| match c {
                Command::Enqueue(q) => (q.stored.device, q.stored.job.seq, q.stored.job.message_id),
                Command::Device(_) | Command::Forget(_) | Command::Restore(_) | Command::Barrier(_) => {
                    panic!("not a job")
                }
            })
            .collect()
    }

    #[tokio::test]
    async fn a_batch_is_stored_then_its_jobs_go_to_the_dispatcher_in_order_and_once() {
        let (_dir, outbox) = temp_outbox("handoff-order");
        let (tx, mut rx) = mpsc::channel(16);
        let shutdown = Shutdown::new();
        let mut h = Handoff::new(outbox, Clock::with_offset(0), tx, Arc::default(), shutdown);
        let mut batch = Batch::new(10, Duration::from_secs(1));
        assert!(h.start(&mut batch).is_none(), "nothing to write");

        batch.push(rec(1), accept(&[("p", "a"), ("t", "x")]));
        batch.push(rec(2), accept(&[("p", "b")]));
        let attempt = h.start(&mut batch).expect("a batch").attempt().await;
        let accepted = h.land(attempt).await.expect("stored");
        assert_eq!(offsets(&accepted.records), [1, 2]);
        assert_eq!(accepted.accept_times.len(), 2, "both records queued jobs: each timed");
        assert!(accepted.left_out.is_empty() && !accepted.parked);
        let expect = |v: &[(&str, u64, &str)]| {
            v.iter().map(|(d, s, id)| (d.to_string(), *s, id.to_string())).collect::<Vec<_>>()
        };
        assert_eq!(sent(&mut rx), expect(&[("p", 1, "a"), ("t", 1, "x"), ("p", 2, "b")]));

        // Record 1 read again (a restart, a rebalance): its jobs are in the dedupe window,
        // left out and reported so; the new record's job is queued after the others.
        batch.push(rec(1), accept(&[("p", "a"), ("t", "x")]));
        batch.push(rec(3), accept(&[("p", "c")]));
        let attempt = h.start(&mut batch).expect("a batch").attempt().await;
        let accepted = h.land(attempt).await.expect("stored");
        assert_eq!(offsets(&accepted.records), [1, 3]);
        assert_eq!(accepted.left_out, vec!["p".to_string(), "t".to_string()]);
        assert_eq!(sent(&mut rx), expect(&[("p", 3, "c")]));
        assert!(!h.gave_up());
    }

    /// After the dispatcher forgot the devices at shutdown, a batch still lands (stored,
    /// its records accepted) but none of its jobs is sent: they would overtake the
    /// forgotten ones.
    #[tokio::test]
    async fn a_batch_landed_after_sending_stopped_is_stored_and_not_sent() {
        let (_dir, outbox) = temp_outbox("handoff-stopped");
        let (tx, mut rx) = mpsc::channel(16);
        let mut h = Handoff::new(outbox.clone(), Clock::with_offset(0), tx, Arc::default(), Shutdown::new());
        let mut batch = Batch::new(10, Duration::from_secs(1));
        batch.push(rec(1), accept(&[("p", "a")]));
        let attempt = h.start(&mut batch).expect("a batch").attempt().await;
        h.land(attempt).await.expect("stored");
        assert_eq!(sent(&mut rx), vec![("p".to_string(), 1, "a".to_string())]);

        h.stop_sending();
        batch.push(rec(2), accept(&[("p", "b"), ("t", "x")]));
        let attempt = h.start(&mut batch).expect("a batch").attempt().await;
        let accepted = h.land(attempt).await.expect("stored");
        assert_eq!(offsets(&accepted.records), [2], "the record is accepted: its jobs are stored");
        assert_eq!(sent(&mut rx), Vec::new(), "nothing sent after sending stopped");
        let ids: Vec<String> = outbox.pending_headers().unwrap().into_iter().map(|q| q.job.message_id).collect();
        assert_eq!(ids, ["a", "b", "x"], "the outbox holds every job");
    }

    /// A write the disk refused is written again (in the batch's task) before any of its
    /// jobs goes on; refused until shutdown, the batch is given up and nothing of it sent.
    #[tokio::test(start_paused = true)]
    async fn a_refused_batch_is_written_again_before_its_jobs_go_on() {
        let (_dir, outbox) = temp_outbox("handoff-refused");
        let (tx, mut rx) = mpsc::channel(16);
        let shutdown = Shutdown::new();
        let health = Arc::new(Monitor::default());
        let mut h = Handoff::new(outbox.clone(), Clock::with_offset(0), tx, health.clone(), shutdown.clone());
        let refused = || {
            Outbox::open(std::path::Path::new("/proc/pixgate-no-such-folder/outbox.redb"))
                .err()
                .expect("no folder under /proc")
        };
        let retry =
            Retry { health, shutdown: shutdown.clone(), clock: Clock::with_offset(0), held_removals: Arc::default() };
        let (accepts, result) =
            until_written(&retry, outbox.clone(), vec![accept(&[("p", "a")])], Vec::new(), Err(refused().into())).await;
        let accepted =
            h.land(Attempt { records: vec![rec(1)], accepts, result }).await.expect("stored on the second try");
        assert_eq!(offsets(&accepted.records), [1]);
        assert_eq!(sent(&mut rx), vec![("p".to_string(), 1, "a".to_string())]);
        assert!(!h.gave_up());

        // Refused until shutdown: given up, nothing more is written.
        let attempt =
            Attempt { records: vec![rec(2)], accepts: vec![accept(&[("p", "b")])], result: Err(refused().into()) };
        assert!(h.land(attempt).await.is_none());
        assert!(h.gave_up());
        assert_eq!(sent(&mut rx), Vec::new());
        let mut batch = Batch::new(10, Duration::from_secs(1));
        batch.push(rec(3), accept(&[("p", "c")]));
        assert!(h.start(&mut batch).is_none(), "nothing more written after a batch was given up");
    }
}
