//! The durable outbox: every device's job queue on local disk (redb), written before the
//! Kafka offset of the record that caused the jobs is stored.
//!
//! An effect is *accepted* when its job is in its device's queue in a committed redb
//! transaction (`Durability::Immediate`: on disk when `commit` returns). From then on a
//! crash cannot lose it: at start-up the dispatcher reloads every queued job, in order.
//! In the same transaction the outbox records:
//! - the job's message id (the dedupe window: accepting an id already seen is a no-op, so a
//!   record read again after a crash does not queue its effects twice);
//! - the device's sequence counter (per-device `seq` survives restarts);
//! - the charge's last applied `__v` and status (a stale event stays stale after a restart).
//!
//! - the dead letters of the record or of its effects, *parked* until Kafka has them
//!   (`deliver::deadletter::Publisher` drains them): a dead letter is accepted like a job,
//!   so an unreachable Kafka never holds back, loses or forgets one.
//!
//! Writes are batched: [`Outbox::write`] takes many records, and the removals of many
//! finished jobs, in one transaction, one fsync. Removing a finished job is not synced on
//! its own ([`Durability::None`]; it becomes durable with the next synced write): a removal
//! lost in a crash only means the job is sent again, and the device dedupes it by message id.
//!
//! Tables: `jobs` (device, seq) → a job row ([`encode_row`]: its source, then the job's JSON
//! exactly as the device receives it, so it is serialized once and published as stored);
//! `seq` device → last seq; `seen_by_event_time` (event `clusterTime`, message id) →
//! accepted-at (Unix ms), the dedupe window; `charges` charge id → (`__v`, status code);
//! `devices` device id → (oplog position, `fullDocument` JSON or empty for a delete): the
//! registry, so that a restart does not forget devices whose events are already committed;
//! `deadletters` id → JSON [`ParkedDeadLetter`]; `parked` the ids not yet published;
//! `deadletters_by_source` (source topic, partition, offset, which) → id, so a record read
//! again parks none of its dead letters twice; `meta` name → counter (the last
//! dead-letter id); `direct_writing` device → a direct printer's last job and whether it
//! was written whole ([`Outbox::mark_direct`]).

use crate::model::{DeadLetter, DeadLetterReason, Queued, SourceRef, StoredJob};
use crate::store::reconcile::{Counting, RecordTally};
use bytes::Bytes;
use cdc::ChargeStatus;
use device_protocol::Job;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::Path;

const JOBS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("jobs");
const SEQ: TableDefinition<&str, u64> = TableDefinition::new("seq");
/// The dedupe window, keyed by (the event's `clusterTime`, message id) rather than by the
/// id alone: message ids are hashes, so an id-keyed window takes each insert to a random
/// B-tree leaf and rewrites about one leaf per job at every commit (22 µs a job, measured
/// against 1.3 µs for time-ordered keys); events come in time order, so these inserts
/// land together at the end. A redelivered event has the same `clusterTime` as before
/// (its id contains it), so the lookup finds it.
const SEEN: TableDefinition<(u64, &str), u64> = TableDefinition::new("seen_by_event_time");
const CHARGES: TableDefinition<&str, (i64, u8)> = TableDefinition::new("charges");
const DEVICES: TableDefinition<&str, (u64, &[u8])> = TableDefinition::new("devices");
const DEADLETTERS: TableDefinition<u64, &[u8]> = TableDefinition::new("deadletters");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Ids of the dead letters Kafka does not have yet (an index, so the publisher does not
/// read the whole retained history every time it looks).
const PARKED: TableDefinition<u64, ()> = TableDefinition::new("parked");
/// A record's dead letters by their source: (topic, partition, offset, which) → id, where
/// `which` is the dead letter's place among the record's and its reason, effect and device
/// ([`which_of`]). A record read again before its offset was committed (a crash, a
/// rebalance) yields the same dead letters in the same order; they keep their first id
/// instead of being parked and published again under new ones. Removed with the dead
/// letter at its retention ([`Outbox::prune_deadletters`]).
const DL_BY_SOURCE: TableDefinition<(&str, i32, i64, &str), u64> = TableDefinition::new("deadletters_by_source");
const LAST_DEADLETTER_ID: &str = "last_deadletter_id";
/// Direct printers' last job: device → (seq, message id, done). Written, synced, before a
/// job's bytes go to the printer (`done` false) and once they are all written (`done`
/// true): a raw printer cannot dedupe, so this is what tells, after a crash, a job that
/// may have printed (interrupted) from one that did (never printed again).
const DIRECT_WRITING: TableDefinition<&str, (u64, &str, bool)> = TableDefinition::new("direct_writing");

/// The `which` of [`DL_BY_SOURCE`]: the `index`-th dead letter of its record.
fn which_of(index: usize, dl: &DeadLetter) -> String {
    format!("{index}|{}|{}|{}", dl.reason, dl.effect.as_deref().unwrap_or(""), dl.device.as_deref().unwrap_or(""))
}

/// Outbox failure: the disk or the database file. pixgate cannot accept effects without
/// it, so the consumer stops reading (and retries) rather than commit past them.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The database (redb): opening the file, a transaction, a table, storage, a commit.
    #[error("outbox: {0}")]
    Database(#[from] redb::Error),
    /// A stored row or dead letter that cannot be written or read back as JSON.
    #[error("outbox row: {0}")]
    Row(#[from] serde_json::Error),
    /// A `jobs` row that is not in this version's format.
    #[error("outbox: {0}")]
    Format(&'static str),
    /// The folder for the outbox file cannot be made.
    #[error("outbox folder: {0}")]
    Folder(#[from] std::io::Error),
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for OutboxError {
            fn from(e: $t) -> Self {
                OutboxError::Database(e.into())
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

/// `?` with any of the errors an [`OutboxError`] keeps as its source.
fn err(e: impl Into<OutboxError>) -> OutboxError {
    e.into()
}

/// What [`Outbox::write`] returns, per record of the batch and in its order: the jobs it
/// queued (a job the dedupe window already holds is not among them) and the ids of the
/// dead letters it parked.
pub type Written = Vec<(Vec<Queued>, Vec<u64>)>;

/// A `jobs` row: the length of the source's JSON (`u32`, little-endian), the source
/// ([`SourceRef`], JSON), then `job`'s JSON: the wire bytes, which start at the returned
/// offset. The device is the row's key.
fn encode_row(source: &SourceRef, job: &Job) -> Result<(Vec<u8>, usize), OutboxError> {
    let mut row = vec![0u8; 4];
    serde_json::to_writer(&mut row, source).map_err(err)?;
    let at = row.len();
    row[..4].copy_from_slice(
        &u32::try_from(at - 4).map_err(|_| OutboxError::Format("a job's source over 4 GiB"))?.to_le_bytes(),
    );
    job.write_json(&mut row);
    Ok((row, at))
}

/// The source's JSON and the job's wire bytes of a `jobs` row ([`encode_row`]).
fn split_row(row: &[u8]) -> Result<(&[u8], &[u8]), OutboxError> {
    // A row of the earlier format (the whole stored job as JSON) lands here too.
    let bad = || {
        OutboxError::Format("a jobs row is not in this version's format (length, source, job); was the outbox written by an earlier pixgate?")
    };
    let len = u32::from_le_bytes(row.get(..4).ok_or_else(bad)?.try_into().expect("4 bytes")) as usize;
    let source = row.get(4..4 + len).ok_or_else(bad)?;
    Ok((source, &row[4 + len..]))
}

/// The [`StoredJob`] of `device`'s `jobs` row.
fn decode_row(device: &str, row: &[u8]) -> Result<StoredJob, OutboxError> {
    let (source, wire) = split_row(row)?;
    Ok(StoredJob {
        device: device.to_string(),
        source: serde_json::from_slice(source).map_err(err)?,
        job: serde_json::from_slice(wire).map_err(err)?,
    })
}

/// A dead letter kept in the outbox: parked until Kafka has it, then listed (for
/// `pixgate deadletter list|replay`) until the retention ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParkedDeadLetter {
    /// Outbox-wide id, increasing (also sent as `id` in the Kafka record).
    pub id: u64,
    /// When it was parked, Unix ms.
    pub parked_at_ms: u64,
    /// When Kafka acknowledged it, Unix ms; `None` while parked.
    pub published_at_ms: Option<u64>,
    /// When `pixgate deadletter replay` put its job back into the device's queue, Unix ms.
    pub replayed_at_ms: Option<u64>,
    /// The dead letter as written to Kafka.
    pub dead_letter: DeadLetter,
    /// The job, for an effect that was rendered (delivery failed, expired): what a replay
    /// queues again.
    pub job: Option<StoredJob>,
    /// A record's dead letter: its `which` in [`DL_BY_SOURCE`] (absent in outboxes written
    /// before that table, and for a job's dead letter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub which: Option<String>,
}

/// A device registry change to store ([`Outbox::write`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceEntry {
    /// Device id.
    pub id: String,
    /// Oplog position of the change.
    pub cluster_time: u64,
    /// `fullDocument`; `None` for a delete.
    pub document: Option<serde_json::Value>,
}

/// Everything one Kafka record leads to, written in one transaction by
/// [`Outbox::write`].
#[derive(Debug, Clone, Default)]
pub struct Accept {
    /// The charge state the router applied (charge id, state).
    pub charge: Option<(String, ChargeState)>,
    /// A registry change.
    pub device: Option<DeviceEntry>,
    /// Jobs by device id; `seq` is assigned here.
    pub jobs: Vec<(String, Job)>,
    /// Dead letters of the record or of some of its effects, to park.
    pub deadletters: Vec<DeadLetter>,
    /// The record.
    pub source: Option<SourceRef>,
    /// The change event's `clusterTime` packed as `t << 32 | i` ([`cdc::Envelope`]);
    /// with the message id, the key of its jobs in the dedupe window. 0 when unknown.
    pub event_time: u64,
    /// What the record adds to the reconciliation counts ([`crate::store::reconcile`]);
    /// `None`: not counted.
    pub tally: Option<RecordTally>,
}

/// A finished job (done or superseded) to remove from its device's queue; its message id
/// stays in the dedupe window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// Device id.
    pub device: String,
    /// The job's `seq`.
    pub seq: u64,
    /// Superseded (never delivered) rather than done. A superseded job's removal must
    /// reach the disk: sent after a restart it would be *new* to the device (a QR shown
    /// after "paid"). A done job's removal need not: lost in a crash, the job is sent again
    /// and the device dedupes it by message id.
    pub superseded: bool,
}

/// Why `pixgate deadletter replay` refused.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// No dead letter with this id (never, or pruned after its retention).
    #[error("no dead letter {0} in the outbox")]
    NotFound(u64),
    /// A record-level dead letter whose cause does not go away by itself (or an effect
    /// that could not be rendered): there is no job to queue again.
    #[error("dead letter {id} ({reason}) has no job to replay: fix the source record and produce it again")]
    NoJob {
        /// Its id.
        id: u64,
        /// Its reason.
        reason: DeadLetterReason,
    },
    /// Replayed before; a second replay would queue the effect twice.
    #[error("dead letter {0} was already replayed")]
    AlreadyReplayed(u64),
    /// A record-level dead letter whose cause can go away (`unknown_terminal`,
    /// `terminal_of_another_company`) is replayed by routing its record again with the
    /// running gateway's registry: the outbox file alone cannot.
    #[error("dead letter {0} is a record routed again by the running gateway (with its device registry): start pixgate, then replay it")]
    NeedsGateway(u64),
    /// Routed again with the current registry, the record is still dead-lettered: nothing
    /// was replayed (it can be tried again later).
    #[error("dead letter {id}: routed again with the current device registry, the record is still {reason}: {detail}; nothing was replayed")]
    StillDeadLetter {
        /// Its id.
        id: u64,
        /// The reason it would be dead-lettered for now.
        reason: DeadLetterReason,
        /// The router's detail.
        detail: String,
    },
    /// The record's value is neither in the dead letter nor readable from Kafka.
    #[error("dead letter {id}: its source record cannot be had: {why}")]
    SourceUnavailable {
        /// Its id.
        id: u64,
        /// Why.
        why: String,
    },
    /// The disk.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
}

fn park(
    dls: &mut redb::Table<u64, &[u8]>,
    parked_ids: &mut redb::Table<u64, ()>,
    meta: &mut redb::Table<&str, u64>,
    mut dl: DeadLetter,
    job: Option<StoredJob>,
    which: Option<String>,
    now_ms: u64,
) -> Result<u64, OutboxError> {
    let id = meta.get(LAST_DEADLETTER_ID).map_err(err)?.map_or(0, |v| v.value()) + 1;
    meta.insert(LAST_DEADLETTER_ID, id).map_err(err)?;
    dl.id = Some(id);
    let parked = ParkedDeadLetter {
        id,
        parked_at_ms: now_ms,
        published_at_ms: None,
        replayed_at_ms: None,
        dead_letter: dl,
        job,
        which,
    };
    let bytes = serde_json::to_vec(&parked).map_err(err)?;
    dls.insert(id, bytes.as_slice()).map_err(err)?;
    parked_ids.insert(id, ()).map_err(err)?;
    Ok(id)
}

/// The charge state the router applied, to persist with the jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChargeState {
    /// `__v`.
    pub version: i64,
    /// Status.
    pub status: ChargeStatus,
}

fn status_code(s: ChargeStatus) -> u8 {
    match s {
        ChargeStatus::Active => 0,
        ChargeStatus::Completed => 1,
        ChargeStatus::Expired => 2,
    }
}

fn status_from(c: u8) -> ChargeStatus {
    match c {
        1 => ChargeStatus::Completed,
        2 => ChargeStatus::Expired,
        _ => ChargeStatus::Active,
    }
}

/// The records of an [`Outbox::write`] (or a replayed record, [`Outbox::replay_record`]) in
/// the transaction `tx`: what [`Outbox::write`] documents, per record.
fn write_records(tx: &redb::WriteTransaction, batch: &mut [Accept], now_ms: u64) -> Result<Written, OutboxError> {
    let mut out = Vec::with_capacity(batch.len());
    let mut seen = tx.open_table(SEEN).map_err(err)?;
    let mut seq = tx.open_table(SEQ).map_err(err)?;
    let mut table = tx.open_table(JOBS).map_err(err)?;
    let mut charges = tx.open_table(CHARGES).map_err(err)?;
    let mut devices = tx.open_table(DEVICES).map_err(err)?;
    let mut dls = tx.open_table(DEADLETTERS).map_err(err)?;
    let mut meta = tx.open_table(META).map_err(err)?;
    let mut parked_ids = tx.open_table(PARKED).map_err(err)?;
    let mut counting = Counting::open(tx)?;
    for a in batch {
        if let Some((id, st)) = &a.charge {
            charges.insert(id.as_str(), (st.version, status_code(st.status))).map_err(err)?;
        }
        if let Some(d) = &a.device {
            let bytes = match &d.document {
                Some(doc) => serde_json::to_vec(doc).map_err(err)?,
                None => Vec::new(),
            };
            devices.insert(d.id.as_str(), (d.cluster_time, bytes.as_slice())).map_err(err)?;
        }
        let source = a.source.clone().unwrap_or_else(|| SourceRef {
            topic: String::new(),
            partition: -1,
            offset: -1,
            key: None,
        });
        let mut queued = Vec::new();
        for (device, job) in &mut a.jobs {
            if seen.get((a.event_time, job.message_id.as_str())).map_err(err)?.is_some() {
                continue;
            }
            let next = seq.get(device.as_str()).map_err(err)?.map_or(0, |v| v.value()) + 1;
            seq.insert(device.as_str(), next).map_err(err)?;
            seen.insert((a.event_time, job.message_id.as_str()), now_ms).map_err(err)?;
            job.seq = next;
            let (row, at) = encode_row(&source, job)?;
            table.insert((device.as_str(), next), row.as_slice()).map_err(err)?;
            // The header without cloning the payload (kilobytes) only to drop it.
            let payload = std::mem::take(&mut job.payload);
            let header = job.clone();
            job.payload = payload;
            let stored = StoredJob { device: device.clone(), job: header, source: source.clone() };
            queued.push(Queued { stored, wire: Bytes::from(row).slice(at..) });
        }
        let mut parked = Vec::new();
        if !a.deadletters.is_empty() {
            let mut by_source = tx.open_table(DL_BY_SOURCE).map_err(err)?;
            for (i, dl) in a.deadletters.iter().enumerate() {
                let which = which_of(i, dl);
                let key = (dl.source_topic.as_str(), dl.source_partition, dl.source_offset, which.as_str());
                if by_source.get(key).map_err(err)?.is_some() {
                    continue; // parked when this record was read before
                }
                let id = park(&mut dls, &mut parked_ids, &mut meta, dl.clone(), None, Some(which.clone()), now_ms)?;
                by_source.insert(key, id).map_err(err)?;
                parked.push(id);
            }
        }
        if let (Some(tally), Some(src)) = (&a.tally, &a.source) {
            let jobs: Vec<(&str, u64, &str)> = queued
                .iter()
                .map(|q| (q.stored.device.as_str(), q.stored.job.seq, q.stored.job.kind.as_str()))
                .collect();
            counting.record(&src.topic, src.partition, src.offset, tally, &jobs)?;
        }
        out.push((queued, parked));
    }
    counting.finish(tx)?;
    Ok(out)
}

/// A direct printer's last job as the outbox recorded it ([`Outbox::mark_direct`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectMark {
    /// The job's seq.
    pub seq: u64,
    /// The job's message id.
    pub message_id: String,
    /// Written whole (`true`), or being written (`false`: cut short if found at start-up).
    pub done: bool,
}

/// The outbox database.
pub struct Outbox {
    /// Also used by the other tables' files of [`crate::store`] (effect flags).
    pub(super) db: Database,
}

impl Outbox {
    /// [`Outbox::open_with_cache`] with [`crate::config::DEFAULT_CACHE_BYTES`].
    ///
    /// # Errors
    /// As [`Outbox::open_with_cache`].
    pub fn open(path: &Path) -> Result<Outbox, OutboxError> {
        Outbox::open_with_cache(path, crate::config::DEFAULT_CACHE_BYTES)
    }

    /// Opens (or creates) the outbox at `path`, creating its folder, with a page cache of
    /// `cache_bytes` (`outbox.cache_bytes`).
    ///
    /// # Errors
    /// The file cannot be created or is not a redb database, or is locked by another
    /// process (one gateway per outbox).
    pub fn open_with_cache(path: &Path, cache_bytes: usize) -> Result<Outbox, OutboxError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let db = redb::Builder::new().set_cache_size(cache_bytes).create(path).map_err(err)?;
        let tx = db.begin_write().map_err(err)?;
        {
            tx.open_table(JOBS).map_err(err)?;
            tx.open_table(SEQ).map_err(err)?;
            tx.open_table(SEEN).map_err(err)?;
            tx.open_table(CHARGES).map_err(err)?;
            tx.open_table(DEVICES).map_err(err)?;
            tx.open_table(DEADLETTERS).map_err(err)?;
            tx.open_table(META).map_err(err)?;
            tx.open_table(PARKED).map_err(err)?;
            tx.open_table(DL_BY_SOURCE).map_err(err)?;
            tx.open_table(DIRECT_WRITING).map_err(err)?;
            tx.open_table(crate::store::flags::FLAGS).map_err(err)?;
            tx.open_table(crate::store::reconcile::COUNTS).map_err(err)?;
            tx.open_table(crate::store::reconcile::MARKS).map_err(err)?;
            tx.open_table(crate::store::reconcile::JOBS).map_err(err)?;
        }
        tx.commit().map_err(err)?;
        Ok(Outbox { db })
    }

    /// Atomically, in one transaction: for every record of `batch`, records its charge
    /// state and registry change, queues each job whose message id is not in the dedupe
    /// window (assigning its device's next `seq`, also written into the job in `batch`),
    /// and parks its dead letters; and removes the finished jobs of `removals`. Returns,
    /// per record, the jobs queued (a job already seen is left out) and the ids of the
    /// dead letters parked.
    ///
    /// Durable when it returns (`Durability::Immediate`, one fsync) if `batch` is not empty
    /// or a removal is superseded; otherwise (only done jobs removed) not synced: see
    /// [`Removal::superseded`]. One transaction for many records and removals is what
    /// makes the outbox fast: redb's cost is per commit far more than per row.
    ///
    /// # Errors
    /// Disk or database failure; then nothing of this call was written.
    pub fn write(&self, batch: &mut [Accept], removals: &[Removal], now_ms: u64) -> Result<Written, OutboxError> {
        let mut tx = self.db.begin_write().map_err(err)?;
        let durable = !batch.is_empty() || removals.iter().any(|r| r.superseded);
        tx.set_durability(if durable { Durability::Immediate } else { Durability::None }).map_err(err)?;
        if !removals.is_empty() {
            let mut table = tx.open_table(JOBS).map_err(err)?;
            for r in removals {
                table.remove((r.device.as_str(), r.seq)).map_err(err)?;
            }
            drop(table);
            let mut counting = Counting::open(&tx)?;
            for r in removals {
                counting.removed(&r.device, r.seq, r.superseded)?;
            }
            counting.finish(&tx)?;
        }
        let out = if batch.is_empty() { Vec::new() } else { write_records(&tx, batch, now_ms)? };
        tx.commit().map_err(err)?;
        Ok(out)
    }

    /// [`Outbox::write`] for one record's charge state and jobs (no dead letters).
    /// Returns the jobs queued.
    ///
    /// # Errors
    /// Disk or database failure; then nothing of this call was written.
    #[cfg(test)]
    pub(crate) fn accept(
        &self,
        charge: Option<(&str, ChargeState)>,
        jobs: Vec<(String, Job)>,
        source: &SourceRef,
        now_ms: u64,
    ) -> Result<Vec<Queued>, OutboxError> {
        let a = Accept {
            charge: charge.map(|(id, st)| (id.to_string(), st)),
            jobs,
            source: Some(source.clone()),
            ..Accept::default()
        };
        Ok(self.write(&mut [a], &[], now_ms)?.pop().map(|(q, _)| q).unwrap_or_default())
    }

    /// Durably, in one transaction: removes a job that cannot be carried out (delivery
    /// failed, expired) from its device's queue and parks its dead letter, keeping the job
    /// for a replay. Returns the dead letter's id.
    ///
    /// # Errors
    /// Disk or database failure; then the job is still queued.
    pub fn fail_job(&self, stored: &StoredJob, dl: DeadLetter, now_ms: u64) -> Result<u64, OutboxError> {
        let mut tx = self.db.begin_write().map_err(err)?;
        tx.set_durability(Durability::Immediate).map_err(err)?;
        let mut dl = dl;
        {
            let mut counting = Counting::open(&tx)?;
            counting.failed(&stored.device, stored.job.seq, &dl.reason)?;
            counting.finish(&tx)?;
        }
        let id = {
            let mut jobs = tx.open_table(JOBS).map_err(err)?;
            // The job as stored, payload included: the dispatcher's copy may have shed its
            // payload while queued ([`StoredJob::without_payload`]).
            let removed: Option<StoredJob> = match jobs.remove((stored.device.as_str(), stored.job.seq)).map_err(err)? {
                Some(v) => Some(decode_row(&stored.device, v.value())?),
                None => None,
            };
            let job = match removed {
                Some(full) => {
                    dl.job = serde_json::to_string(&full.job).ok();
                    full
                }
                None => stored.clone(),
            };
            let mut dls = tx.open_table(DEADLETTERS).map_err(err)?;
            let mut meta = tx.open_table(META).map_err(err)?;
            let mut parked_ids = tx.open_table(PARKED).map_err(err)?;
            park(&mut dls, &mut parked_ids, &mut meta, dl, Some(job), None, now_ms)?
        };
        tx.commit().map_err(err)?;
        Ok(id)
    }

    /// Dead letters not yet acknowledged by Kafka, oldest first, at most `limit`.
    ///
    /// # Errors
    /// Disk or database failure, or a stored dead letter that no longer parses.
    pub fn parked_deadletters(&self, limit: usize) -> Result<Vec<ParkedDeadLetter>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let parked = tx.open_table(PARKED).map_err(err)?;
        let table = tx.open_table(DEADLETTERS).map_err(err)?;
        let mut out = Vec::new();
        for item in parked.iter().map_err(err)?.take(limit) {
            let (id, _) = item.map_err(err)?;
            if let Some(v) = table.get(id.value()).map_err(err)? {
                out.push(serde_json::from_slice(v.value()).map_err(err)?);
            }
        }
        Ok(out)
    }

    /// Every dead letter the outbox holds (parked, or published within the retention),
    /// oldest first.
    ///
    /// # Errors
    /// Disk or database failure, or a stored dead letter that no longer parses.
    pub fn deadletters(&self) -> Result<Vec<ParkedDeadLetter>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(DEADLETTERS).map_err(err)?;
        let mut out = Vec::new();
        for item in table.iter().map_err(err)? {
            let (_, v) = item.map_err(err)?;
            out.push(serde_json::from_slice(v.value()).map_err(err)?);
        }
        Ok(out)
    }

    /// The newest `limit` dead letters the outbox holds, newest first.
    ///
    /// # Errors
    /// Disk or database failure, or a stored dead letter that no longer parses.
    pub fn latest_deadletters(&self, limit: usize) -> Result<Vec<ParkedDeadLetter>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(DEADLETTERS).map_err(err)?;
        let mut out = Vec::new();
        for item in table.iter().map_err(err)?.rev().take(limit) {
            let (_, v) = item.map_err(err)?;
            out.push(serde_json::from_slice(v.value()).map_err(err)?);
        }
        Ok(out)
    }

    /// The dead letter `id`, if the outbox still holds it.
    ///
    /// # Errors
    /// Disk or database failure, or a stored dead letter that no longer parses.
    pub fn deadletter(&self, id: u64) -> Result<Option<ParkedDeadLetter>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(DEADLETTERS).map_err(err)?;
        let v = table.get(id).map_err(err)?;
        v.map(|v| serde_json::from_slice(v.value()).map_err(err)).transpose()
    }

    /// Records that Kafka has the dead letters `ids` (not synced on its own: if lost in a
    /// crash they are published again, and a dead-letter consumer sees the same `id`).
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn mark_published(&self, ids: &[u64], now_ms: u64) -> Result<(), OutboxError> {
        let mut tx = self.db.begin_write().map_err(err)?;
        tx.set_durability(Durability::None).map_err(err)?;
        {
            let mut dls = tx.open_table(DEADLETTERS).map_err(err)?;
            let mut parked = tx.open_table(PARKED).map_err(err)?;
            for &id in ids {
                parked.remove(id).map_err(err)?;
                let Some(bytes) = dls.get(id).map_err(err)?.map(|v| v.value().to_vec()) else { continue };
                let mut d: ParkedDeadLetter = serde_json::from_slice(&bytes).map_err(err)?;
                d.published_at_ms = Some(now_ms);
                let bytes = serde_json::to_vec(&d).map_err(err)?;
                dls.insert(id, bytes.as_slice()).map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    /// Puts the job of dead letter `id` back at the end of its device's queue, with a new
    /// `seq` and its original message id (a device that did carry it out dedupes it), and
    /// marks the dead letter replayed. Its `expires_at` becomes `now_ms` + `ttl_of(kind)`,
    /// except a `display_qr`'s, which stays its charge's expiry. Returns the job as queued.
    ///
    /// # Errors
    /// [`ReplayError`]: unknown id, a record-level dead letter (no job: fix the source and
    /// produce it again), already replayed, or the disk.
    pub fn replay(
        &self,
        id: u64,
        now_ms: u64,
        ttl_of: impl Fn(device_protocol::EffectKind) -> chrono::Duration,
    ) -> Result<StoredJob, ReplayError> {
        let mut tx = self.db.begin_write().map_err(|e| ReplayError::Outbox(err(e)))?;
        tx.set_durability(Durability::Immediate).map_err(|e| ReplayError::Outbox(err(e)))?;
        let queued = {
            let mut dls = tx.open_table(DEADLETTERS).map_err(|e| ReplayError::Outbox(err(e)))?;
            let bytes = dls
                .get(id)
                .map_err(|e| ReplayError::Outbox(err(e)))?
                .map(|v| v.value().to_vec())
                .ok_or(ReplayError::NotFound(id))?;
            let mut parked: ParkedDeadLetter =
                serde_json::from_slice(&bytes).map_err(|e| ReplayError::Outbox(err(e)))?;
            if parked.replayed_at_ms.is_some() {
                return Err(ReplayError::AlreadyReplayed(id));
            }
            let Some(mut stored) = parked.job.clone() else {
                let reason = parked.dead_letter.reason.clone();
                return Err(if reason.depends_on_registry() {
                    ReplayError::NeedsGateway(id)
                } else {
                    ReplayError::NoJob { id, reason }
                });
            };
            let mut seq = tx.open_table(SEQ).map_err(|e| ReplayError::Outbox(err(e)))?;
            let next =
                seq.get(stored.device.as_str()).map_err(|e| ReplayError::Outbox(err(e)))?.map_or(0, |v| v.value()) + 1;
            seq.insert(stored.device.as_str(), next).map_err(|e| ReplayError::Outbox(err(e)))?;
            stored.job.seq = next;
            // A QR stays bound to its charge's expiry (a replay never shows a QR that can no
            // longer be paid); other kinds live their time to live again from the replay.
            if stored.job.kind != device_protocol::EffectKind::DisplayQr {
                stored.job.expires_at =
                    chrono::DateTime::from_timestamp_millis(now_ms as i64).map(|t| t + ttl_of(stored.job.kind));
            }
            let (row, _) = encode_row(&stored.source, &stored.job)?;
            tx.open_table(JOBS)
                .map_err(|e| ReplayError::Outbox(err(e)))?
                .insert((stored.device.as_str(), next), row.as_slice())
                .map_err(|e| ReplayError::Outbox(err(e)))?;
            parked.replayed_at_ms = Some(now_ms);
            let bytes = serde_json::to_vec(&parked).map_err(|e| ReplayError::Outbox(err(e)))?;
            dls.insert(id, bytes.as_slice()).map_err(|e| ReplayError::Outbox(err(e)))?;
            stored
        };
        tx.commit().map_err(|e| ReplayError::Outbox(err(e)))?;
        Ok(queued)
    }

    /// Replays a record-level dead letter whose record was routed again
    /// (`ingest::record_replay`): in one transaction, writes `accept` (its jobs, charge state
    /// and effects' dead letters, as [`Outbox::write`] does for one record: the dedupe
    /// window keeps a job's message id from being queued twice) and marks the dead letter
    /// replayed. Returns the jobs queued and the dead letters parked.
    ///
    /// # Errors
    /// [`ReplayError`]: unknown id, a job's dead letter (see [`Outbox::replay`]), already
    /// replayed, or the disk; then nothing was written.
    pub fn replay_record(
        &self,
        id: u64,
        accept: &mut Accept,
        now_ms: u64,
    ) -> Result<(Vec<Queued>, Vec<u64>), ReplayError> {
        let mut tx = self.db.begin_write().map_err(|e| ReplayError::Outbox(err(e)))?;
        tx.set_durability(Durability::Immediate).map_err(|e| ReplayError::Outbox(err(e)))?;
        let mut parked: ParkedDeadLetter = {
            let dls = tx.open_table(DEADLETTERS).map_err(|e| ReplayError::Outbox(err(e)))?;
            let bytes = dls
                .get(id)
                .map_err(|e| ReplayError::Outbox(err(e)))?
                .map(|v| v.value().to_vec())
                .ok_or(ReplayError::NotFound(id))?;
            serde_json::from_slice(&bytes).map_err(|e| ReplayError::Outbox(err(e)))?
        };
        if parked.replayed_at_ms.is_some() {
            return Err(ReplayError::AlreadyReplayed(id));
        }
        if parked.job.is_some() {
            return Err(ReplayError::Outbox(OutboxError::Format(
                "a job's dead letter is replayed by Outbox::replay, not as a record",
            )));
        }
        let written = write_records(&tx, std::slice::from_mut(accept), now_ms)?.pop().unwrap_or_default();
        parked.replayed_at_ms = Some(now_ms);
        let bytes = serde_json::to_vec(&parked).map_err(|e| ReplayError::Outbox(err(e)))?;
        tx.open_table(DEADLETTERS)
            .map_err(|e| ReplayError::Outbox(err(e)))?
            .insert(id, bytes.as_slice())
            .map_err(|e| ReplayError::Outbox(err(e)))?;
        tx.commit().map_err(|e| ReplayError::Outbox(err(e)))?;
        Ok(written)
    }

    /// Forgets published dead letters parked before `cutoff_ms`. Returns how many.
    ///
    /// Found under a read transaction and removed [`PRUNE_CHUNK`] per write transaction,
    /// as in [`Outbox::prune_seen`]; a published dead letter never becomes unpublished, so
    /// what the scan found is still prunable when it is removed.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn prune_deadletters(&self, cutoff_ms: u64) -> Result<usize, OutboxError> {
        // (id, its DL_BY_SOURCE key if it has one)
        type Old = (u64, Option<(String, i32, i64, String)>);
        let old: Vec<Old> = {
            let tx = self.db.begin_read().map_err(err)?;
            let dls = tx.open_table(DEADLETTERS).map_err(err)?;
            let mut old = Vec::new();
            for entry in dls.iter().map_err(err)? {
                let (id, v) = entry.map_err(err)?;
                // One that no longer parses is kept, to be seen with `pixgate deadletter`.
                let Ok(d) = serde_json::from_slice::<ParkedDeadLetter>(v.value()) else { continue };
                if d.published_at_ms.is_some() && d.parked_at_ms < cutoff_ms {
                    let dl = d.dead_letter;
                    old.push((
                        id.value(),
                        d.which.map(|w| (dl.source_topic, dl.source_partition, dl.source_offset, w)),
                    ));
                }
            }
            old
        };
        self.remove_in_chunks(&old, Durability::Immediate, |tx, chunk| {
            let mut dls = tx.open_table(DEADLETTERS).map_err(err)?;
            let mut by_source = tx.open_table(DL_BY_SOURCE).map_err(err)?;
            for (id, key) in chunk {
                dls.remove(*id).map_err(err)?;
                if let Some((topic, partition, offset, which)) = key {
                    by_source.remove((topic.as_str(), *partition, *offset, which.as_str())).map_err(err)?;
                }
            }
            Ok(())
        })?;
        Ok(old.len())
    }

    /// The queued jobs of `device`, in delivery order.
    ///
    /// # Errors
    /// Disk or database failure, or a stored job that no longer parses.
    pub fn device_jobs(&self, device: &str) -> Result<Vec<StoredJob>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(JOBS).map_err(err)?;
        let mut out = Vec::new();
        for item in table.range((device, 0u64)..=(device, u64::MAX)).map_err(err)? {
            let (_, v) = item.map_err(err)?;
            out.push(decode_row(device, v.value())?);
        }
        Ok(out)
    }

    /// [`Outbox::write`] for one removal.
    ///
    /// # Errors
    /// Disk or database failure.
    #[cfg(test)]
    pub(crate) fn complete(&self, device: &str, seq: u64, superseded: bool) -> Result<(), OutboxError> {
        self.write(&mut [], &[Removal { device: device.to_string(), seq, superseded }], 0).map(|_| ())
    }

    /// How many jobs each device has queued (keys only: no job is decoded).
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn queue_depths(&self) -> Result<std::collections::BTreeMap<String, u64>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(JOBS).map_err(err)?;
        let mut out = std::collections::BTreeMap::<String, u64>::new();
        for item in table.iter().map_err(err)? {
            let (k, _) = item.map_err(err)?;
            let device = k.value().0;
            match out.get_mut(device) {
                Some(n) => *n += 1,
                None => {
                    out.insert(device.to_string(), 1);
                }
            }
        }
        Ok(out)
    }

    /// Every queued job, by device then seq (delivery order).
    ///
    /// # Errors
    /// Disk or database failure, or a stored job that no longer parses.
    pub fn pending(&self) -> Result<Vec<StoredJob>, OutboxError> {
        self.pending_with(|s| s)
    }

    /// [`Outbox::pending`] without the payloads ([`StoredJob::without_payload`]): what the
    /// dispatcher keeps in memory at start-up, whatever the outbox holds.
    ///
    /// # Errors
    /// Disk or database failure, or a stored job that no longer parses.
    pub fn pending_headers(&self) -> Result<Vec<StoredJob>, OutboxError> {
        self.pending_with(StoredJob::without_payload)
    }

    fn pending_with(&self, f: impl Fn(StoredJob) -> StoredJob) -> Result<Vec<StoredJob>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(JOBS).map_err(err)?;
        let mut out = Vec::new();
        for item in table.iter().map_err(err)? {
            let (k, v) = item.map_err(err)?;
            out.push(f(decode_row(k.value().0, v.value())?));
        }
        Ok(out)
    }

    /// Records, durably (synced when it returns), that `device`'s job `seq`
    /// (`message_id`) is being written to its direct printer (`done` false) or was written
    /// whole (`done` true). One row per device: its jobs are written one at a time, in
    /// `seq` order.
    ///
    /// # Errors
    /// Disk or database failure: the caller must not write the job.
    pub fn mark_direct(&self, device: &str, mark: &DirectMark) -> Result<(), OutboxError> {
        let mut tx = self.db.begin_write().map_err(err)?;
        tx.set_durability(Durability::Immediate).map_err(err)?;
        {
            let mut t = tx.open_table(DIRECT_WRITING).map_err(err)?;
            t.insert(device, (mark.seq, mark.message_id.as_str(), mark.done)).map_err(err)?;
        }
        tx.commit().map_err(err)
    }

    /// `device`'s last [`Outbox::mark_direct`], if any.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn direct_mark(&self, device: &str) -> Result<Option<DirectMark>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let t = tx.open_table(DIRECT_WRITING).map_err(err)?;
        Ok(t.get(device).map_err(err)?.map(|v| {
            let (seq, message_id, done) = v.value();
            DirectMark { seq, message_id: message_id.to_string(), done }
        }))
    }

    /// The wire bytes of one queued job (its JSON, payload included, as published);
    /// `None` if it is not queued (finished). Read without parsing.
    ///
    /// # Errors
    /// Disk or database failure, or a row not in this format (see [`split_row`]).
    pub fn wire(&self, device: &str, seq: u64) -> Result<Option<Bytes>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(JOBS).map_err(err)?;
        match table.get((device, seq)).map_err(err)? {
            Some(v) => Ok(Some(Bytes::copy_from_slice(split_row(v.value())?.1))),
            None => Ok(None),
        }
    }

    /// One charge's last applied state; `None` if none was ever stored.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn charge(&self, id: &str) -> Result<Option<ChargeState>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(CHARGES).map_err(err)?;
        Ok(table.get(id).map_err(err)?.map(|v| {
            let (version, code) = v.value();
            ChargeState { version, status: status_from(code) }
        }))
    }

    /// Every registry entry stored by [`Outbox::write`] ([`Accept::device`]): id, oplog
    /// position, document.
    ///
    /// # Errors
    /// Disk or database failure, or a stored document that no longer parses.
    pub fn devices(&self) -> Result<Vec<(String, u64, Option<serde_json::Value>)>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(DEVICES).map_err(err)?;
        let mut out = Vec::new();
        for item in table.iter().map_err(err)? {
            let (k, v) = item.map_err(err)?;
            let (at, bytes) = v.value();
            let doc = if bytes.is_empty() { None } else { Some(serde_json::from_slice(bytes).map_err(err)?) };
            out.push((k.value().to_string(), at, doc));
        }
        Ok(out)
    }

    /// The registry entry of device `id` stored by [`Outbox::write`]: its document, `None`
    /// when the registry has none (never seen, or removed).
    ///
    /// # Errors
    /// Disk or database failure, or a stored document that no longer parses.
    pub fn device(&self, id: &str) -> Result<Option<serde_json::Value>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(DEVICES).map_err(err)?;
        let Some(v) = table.get(id).map_err(err)? else { return Ok(None) };
        let (_, bytes) = v.value();
        if bytes.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(bytes).map(Some).map_err(err)
    }

    /// Forgets message ids accepted before `cutoff_ms` (the end of the dedupe window).
    /// Returns how many were forgotten.
    ///
    /// An event is accepted after it happened, so only ids of events older than the
    /// cutoff can be old: the scan reads the window from its oldest event up to the
    /// cutoff, not the whole window, and keeps an old event's ids that were accepted late
    /// (a backlog read after an outage: they stay a full window, and are looked at again
    /// at each prune until then). It reads under a read transaction, which does not hold
    /// redb's single writer; only the ids found old are removed, [`PRUNE_CHUNK`] per write
    /// transaction. An id found old stays old: its accepted-at is written once, and an id
    /// in the window is never accepted again.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn prune_seen(&self, cutoff_ms: u64) -> Result<usize, OutboxError> {
        // `clusterTime` seconds are the key's high 32 bits.
        let secs = cutoff_ms / 1000;
        let cutoff_event = if secs > u64::from(u32::MAX) { u64::MAX } else { secs << 32 };
        let old: Vec<(u64, String)> = {
            let tx = self.db.begin_read().map_err(err)?;
            let seen = tx.open_table(SEEN).map_err(err)?;
            let mut old = Vec::new();
            for entry in seen.range(..(cutoff_event, "")).map_err(err)? {
                let (key, at) = entry.map_err(err)?;
                if at.value() < cutoff_ms {
                    let (t, id) = key.value();
                    old.push((t, id.to_string()));
                }
            }
            old
        };
        // Not synced: a removal lost in a crash only keeps an id in the window a while longer.
        self.remove_in_chunks(&old, Durability::None, |tx, chunk| {
            let mut seen = tx.open_table(SEEN).map_err(err)?;
            for (t, id) in chunk {
                seen.remove((*t, id.as_str())).map_err(err)?;
            }
            Ok(())
        })?;
        Ok(old.len())
    }

    /// Runs `remove` on `keys`, [`PRUNE_CHUNK`] at a time, each chunk in its own write
    /// transaction committed with `durability`, pausing between them ([`let_writers_in`]):
    /// how the prunes remove what they found without holding the outbox writer.
    fn remove_in_chunks<K>(
        &self,
        keys: &[K],
        durability: Durability,
        remove: impl Fn(&redb::WriteTransaction, &[K]) -> Result<(), OutboxError>,
    ) -> Result<(), OutboxError> {
        for chunk in keys.chunks(PRUNE_CHUNK) {
            let mut tx = self.db.begin_write().map_err(err)?;
            tx.set_durability(durability).map_err(err)?;
            remove(&tx, chunk)?;
            tx.commit().map_err(err)?;
            let_writers_in();
        }
        Ok(())
    }
}

/// How many entries one prune transaction removes ([`Outbox::prune_seen`],
/// [`Outbox::prune_deadletters`]): a bound on how long a prune holds the outbox writer.
pub const PRUNE_CHUNK: usize = 2_000;

/// A pause between two prune transactions. redb's writer lock is not fair: a prune that
/// began its next transaction at once kept a waiting outbox write out until it was done
/// (1 s for half a million ids, measured).
fn let_writers_in() {
    std::thread::sleep(std::time::Duration::from_millis(2));
}

#[cfg(test)]
mod tests {
    use super::*;
    use device_protocol::EffectKind;

    fn job(id: &str) -> Job {
        crate::test_fixtures::job(id, EffectKind::PrintReceipt, "c")
    }

    fn src(offset: i64) -> SourceRef {
        SourceRef { topic: "charge.upserted".into(), partition: 0, offset, key: Some("c".into()) }
    }

    #[test]
    fn survives_reopen_with_order_dedupe_and_state() {
        let dir = crate::test_fixtures::TempDir::new("outbox-test");
        let path = dir.outbox_path();
        {
            let o = Outbox::open(&path).unwrap();
            let st = ChargeState { version: 3, status: ChargeStatus::Completed };
            let q = o
                .accept(
                    Some(("c", st)),
                    vec![("p".into(), job("a")), ("p".into(), job("b")), ("t".into(), job("x"))],
                    &src(1),
                    1000,
                )
                .unwrap();
            assert_eq!(
                q.iter().map(|q| (q.stored.device.as_str(), q.stored.job.seq)).collect::<Vec<_>>(),
                [("p", 1), ("p", 2), ("t", 1)]
            );
            // The same record read again after a crash: nothing new is queued.
            assert!(o.accept(None, vec![("p".into(), job("a"))], &src(1), 2000).unwrap().is_empty());
            o.complete("p", 1, true).unwrap();
        }
        let o = Outbox::open(&path).unwrap();
        let pending = o.pending().unwrap();
        assert_eq!(
            pending.iter().map(|s| (s.job.message_id.as_str(), s.job.seq)).collect::<Vec<_>>(),
            [("b", 2), ("x", 1)]
        );
        assert_eq!(pending[0].source, src(1));
        assert_eq!(o.charge("c").unwrap(), Some(ChargeState { version: 3, status: ChargeStatus::Completed }));
        assert_eq!(o.charge("other").unwrap(), None);
        // Sequence numbers continue after a restart; a completed id stays deduped.
        let q = o.accept(None, vec![("p".into(), job("a")), ("p".into(), job("c"))], &src(2), 3000).unwrap();
        assert_eq!(
            q.iter().map(|q| (q.stored.job.message_id.as_str(), q.stored.job.seq)).collect::<Vec<_>>(),
            [("c", 3)]
        );
        // After the dedupe window, the id is forgotten.
        assert_eq!(o.prune_seen(2500).unwrap(), 3);
        assert_eq!(o.accept(None, vec![("p".into(), job("a"))], &src(3), 4000).unwrap().len(), 1);
    }

    /// A prune larger than one transaction ([`PRUNE_CHUNK`]) forgets exactly the ids older
    /// than the cutoff, in every chunk, and keeps the rest.
    #[test]
    fn prune_seen_forgets_only_old_ids_across_chunks() {
        let (_dir, o) = crate::test_fixtures::temp_outbox("outbox-prune");
        let old: Vec<(String, Job)> =
            (0..PRUNE_CHUNK * 2 + 7).map(|i| ("p".to_string(), job(&format!("old{i}")))).collect();
        let young: Vec<(String, Job)> = (0..10).map(|i| ("p".to_string(), job(&format!("young{i}")))).collect();
        assert_eq!(o.accept(None, old.clone(), &src(1), 1_000).unwrap().len(), old.len());
        assert_eq!(o.accept(None, young.clone(), &src(2), 5_000).unwrap().len(), young.len());
        assert_eq!(o.prune_seen(2_000).unwrap(), old.len());
        assert_eq!(o.prune_seen(2_000).unwrap(), 0, "nothing left to forget");
        assert_eq!(
            o.accept(None, old.clone(), &src(3), 6_000).unwrap().len(),
            old.len(),
            "forgotten ids are new again"
        );
        assert!(o.accept(None, young, &src(4), 6_000).unwrap().is_empty(), "ids inside the window stay deduped");
    }

    /// The prune reads only events older than the cutoff, and forgets an id by when it
    /// was accepted: an old event accepted late (a backlog) stays a full window.
    #[test]
    fn prune_seen_goes_by_event_time_then_acceptance() {
        let (_dir, o) = crate::test_fixtures::temp_outbox("outbox-prune-time");
        let accept = |id: &str, event_secs: u64, now_ms: u64| {
            let mut a = [Accept {
                jobs: vec![("p".into(), job(id))],
                source: Some(src(1)),
                event_time: (event_secs << 32) | 7,
                ..Accept::default()
            }];
            o.write(&mut a, &[], now_ms).unwrap().pop().unwrap().0.len()
        };
        assert_eq!(accept("old", 10, 20_000), 1);
        assert_eq!(accept("late", 10, 500_000), 1);
        // A gateway clock behind the database's: accepted "before" its event.
        assert_eq!(accept("skewed", 200, 50_000), 1);
        assert_eq!(accept("old", 10, 30_000), 0, "deduped within the window");
        assert_eq!(o.prune_seen(100_000).unwrap(), 1);
        assert_eq!(accept("old", 10, 600_000), 1, "forgotten: new again");
        assert_eq!(accept("late", 10, 600_000), 0, "accepted late: still in the window");
        assert_eq!(accept("skewed", 200, 600_000), 0, "an event after the cutoff is not pruned");
    }

    /// What the outbox hands the dispatcher is what it stored: the wire bytes are the job's
    /// JSON with its `seq` and payload, read back the same by [`Outbox::wire`], and the
    /// header is the same job without its payload.
    #[test]
    fn queued_wire_bytes_are_the_stored_job() {
        let (_dir, o) = crate::test_fixtures::temp_outbox("outbox-wire");
        let mut j = job("w");
        j.payload = Job::encode_payload(b"\x1b@receipt");
        let q = o.accept(None, vec![("p".into(), j.clone()), ("p".into(), job("v"))], &src(7), 1).unwrap();
        let sent: Job = serde_json::from_slice(&q[0].wire).unwrap();
        assert_eq!(sent, Job { seq: 1, ..j.clone() });
        assert_eq!(q[0].stored.job, Job { seq: 1, payload: String::new(), ..j });
        assert_eq!((q[0].stored.device.as_str(), &q[0].stored.source), ("p", &src(7)));
        assert_eq!(o.wire("p", 1).unwrap().as_ref(), Some(&q[0].wire));
        assert_eq!(o.wire("p", 2).unwrap().as_ref(), Some(&q[1].wire));
        assert_eq!(o.wire("p", 3).unwrap(), None);
        assert_eq!(o.device_jobs("p").unwrap()[0], StoredJob { device: "p".into(), job: sent, source: src(7) });
    }

    /// A record read again (its offset not committed before a crash) parks none of its
    /// dead letters twice: they keep the ids of its first read, and Kafka gets each once.
    /// Two dead letters of one record that look alike are both kept. Once pruned at its
    /// retention, the record's dead letter is forgotten like a job's id.
    #[test]
    fn a_record_read_again_parks_its_dead_letters_once() {
        let (_dir, o) = crate::test_fixtures::temp_outbox("outbox-dl-once");
        let record = |offset: i64| {
            let dl = |device: &str| {
                let mut d = DeadLetter::new(
                    crate::model::DeadLetterReason::InvalidBrcode,
                    "x".into(),
                    "charge.upserted",
                    0,
                    offset,
                    Some(b"c"),
                    b"{}",
                );
                d.device = Some(device.into());
                d.effect = Some("display_qr".into());
                d
            };
            Accept { deadletters: vec![dl("t1"), dl("t2"), dl("t2")], source: Some(src(offset)), ..Accept::default() }
        };
        let parked = |o: &Outbox| o.parked_deadletters(100).unwrap().into_iter().map(|d| d.id).collect::<Vec<_>>();
        let (_, first) = o.write(&mut [record(5)], &[], 1_000).unwrap().pop().unwrap();
        assert_eq!(first, [1, 2, 3], "alike dead letters of one record are all kept");
        let (_, again) = o.write(&mut [record(5)], &[], 2_000).unwrap().pop().unwrap();
        assert!(again.is_empty(), "read again: nothing parked twice");
        assert_eq!(parked(&o), [1, 2, 3]);
        let (_, next) = o.write(&mut [record(6)], &[], 3_000).unwrap().pop().unwrap();
        assert_eq!(next, [4, 5, 6], "another record's are new");
        o.mark_published(&[1, 2, 3, 4, 5, 6], 4_000).unwrap();
        assert_eq!(o.prune_deadletters(2_500).unwrap(), 3);
        let (_, after) = o.write(&mut [record(5)], &[], 5_000).unwrap().pop().unwrap();
        assert_eq!(after, [7, 8, 9], "pruned: the record's dead letters are new again");
        let (_, kept) = o.write(&mut [record(6)], &[], 5_000).unwrap().pop().unwrap();
        assert!(kept.is_empty(), "not pruned: still known");
    }

    /// An outbox whose job rows are in the earlier format (the whole stored job as JSON) is
    /// refused with a reason that says so, not read as garbage.
    #[test]
    fn rows_of_the_earlier_format_are_refused_by_name() {
        let (_dir, o) = crate::test_fixtures::temp_outbox("outbox-old-row");
        let old = serde_json::to_vec(&StoredJob { device: "p".into(), job: job("a"), source: src(1) }).unwrap();
        let tx = o.db.begin_write().unwrap();
        tx.open_table(JOBS).unwrap().insert(("p", 1), old.as_slice()).unwrap();
        tx.commit().unwrap();
        let e = o.pending_headers().unwrap_err().to_string();
        assert!(e.contains("earlier pixgate"), "{e}");
        assert!(o.wire("p", 1).unwrap_err().to_string().contains("earlier pixgate"));
    }
}
