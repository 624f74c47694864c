//! The outbox file's tables, every one of them (the effect flags' and the reconciliation
//! counts' too, so that [`Outbox::open_with_cache`](super::Outbox::open_with_cache) creates
//! them all without reaching into the modules that use them), and the layout of a `jobs`
//! row.

use super::error::{err, OutboxError};
use crate::model::{SourceRef, StoredJob};
use device_protocol::Job;
use redb::TableDefinition;

/// The queued jobs' rows in acceptance order ([`super::job_rows`]): key → row ([`encode_row`]).
pub(super) const JOB_ROWS: TableDefinition<u64, &[u8]> = TableDefinition::new("job_rows");
/// The queues' index: (device, seq) → `job_rows` key. Named as the earlier layout's table
/// of rows, (device, seq) → row, so that an earlier pixgate refuses a file of this layout
/// (redb's `TableTypeMismatch`) instead of finding its queues empty.
pub(super) const JOB_INDEX: TableDefinition<(&str, u64), u64> = TableDefinition::new("jobs");
/// The rows still queued: `job_rows` key → (device, seq, [`Link`]). Named as the earlier
/// layout's (key → (device, seq), with the links in a table of their own), so that an
/// earlier pixgate refuses a file of this layout (redb's `TableTypeMismatch`) instead of
/// finding no queued row and removing them all.
pub(super) const JOB_LIVE: TableDefinition<u64, (&str, u64, Link)> = TableDefinition::new("job_live");
/// The earlier layout's `job_live`: read once to move it ([`super::job_rows::migrate`]).
pub(super) const LEGACY_JOB_LIVE: TableDefinition<u64, (&str, u64)> = TableDefinition::new("job_live");
/// The earlier layout's `job_live` while [`super::job_rows::migrate`] moves it.
pub(super) const LEGACY_JOB_LIVE_MOVING: TableDefinition<u64, (&str, u64)> =
    TableDefinition::new("job_live_being_moved");
/// A queued job's reconciliation link ([`crate::store::reconcile`]): (topic id, minute of
/// its record's event time (Unix seconds / 60), kind id), the ids from
/// `reconcile_names`. Topic id 0: no link (a replayed job, not counted when it leaves).
/// Eight bytes in each `job_live` entry rather than a table of its own keyed by
/// (device, seq), whose leaves every batch would rewrite.
pub(crate) type Link = (u16, u32, u16);
/// No reconciliation link.
pub(crate) const NO_LINK: Link = (0, 0, 0);
/// The earlier layout's queues, (device, seq) → row: read once to move them
/// ([`super::job_rows::migrate`]).
pub(super) const LEGACY_JOBS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("jobs");
/// The earlier layout's queues while [`super::job_rows::migrate`] moves them.
pub(super) const LEGACY_JOBS_MOVING: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("jobs_being_moved");
/// The index while [`super::job_rows::downgrade`] writes the earlier layout.
pub(super) const JOB_INDEX_MOVING: TableDefinition<(&str, u64), u64> = TableDefinition::new("jobs_index_being_moved");
pub(super) const SEQ: TableDefinition<&str, u64> = TableDefinition::new("seq");
/// The dedupe window, keyed by (the event's `clusterTime`, message id) rather than by the
/// id alone: message ids are hashes, so an id-keyed window takes each insert to a random
/// B-tree leaf and rewrites about one leaf per job at every commit (22 µs a job, measured
/// against 1.3 µs for time-ordered keys); events come in time order, so these inserts
/// land together at the end. A redelivered event has the same `clusterTime` as before
/// (its id contains it), so the lookup finds it.
pub(super) const SEEN: TableDefinition<(u64, &str), u64> = TableDefinition::new("seen_by_event_time");
pub(super) const CHARGES: TableDefinition<&str, (i64, u8)> = TableDefinition::new("charges");
pub(super) const DEVICES: TableDefinition<&str, (u64, &[u8])> = TableDefinition::new("devices");
pub(super) const DEADLETTERS: TableDefinition<u64, &[u8]> = TableDefinition::new("deadletters");
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Ids of the dead letters Kafka does not have yet (an index, so the publisher does not
/// read the whole retained history every time it looks).
pub(super) const PARKED: TableDefinition<u64, ()> = TableDefinition::new("parked");
/// A record's dead letters by their source: (topic, partition, offset, which) → id, where
/// `which` is the dead letter's place among the record's and its reason, effect and device
/// ([`which_of`]). A record read again before its offset was committed (a crash, a
/// rebalance) yields the same dead letters in the same order; they keep their first id
/// instead of being parked and published again under new ones. Removed with the dead
/// letter at its retention ([`Outbox::prune_deadletters`]).
pub(super) const DL_BY_SOURCE: TableDefinition<(&str, i32, i64, &str), u64> =
    TableDefinition::new("deadletters_by_source");
pub(super) const LAST_DEADLETTER_ID: &str = "last_deadletter_id";
/// Direct printers' last job: device → (seq, message id, done). Written, synced, before a
/// job's bytes go to the printer (`done` false) and once they are all written (`done`
/// true): a raw printer cannot dedupe, so this is what tells, after a crash, a job that
/// may have printed (interrupted) from one that did (never printed again).
pub(super) const DIRECT_WRITING: TableDefinition<&str, (u64, &str, bool)> = TableDefinition::new("direct_writing");

/// Read positions kept outside any consumer group: (topic, partition) → the next offset to
/// read ([`Outbox::read_positions`]).
pub(super) const READ_POSITIONS: TableDefinition<(&str, i32), i64> = TableDefinition::new("read_positions");

/// The effect flags: kind name → on ([`crate::store::flags`]).
pub(crate) const FLAGS: TableDefinition<&str, bool> = TableDefinition::new("effect_flags");
/// The reconciliation counts ([`crate::store::reconcile`]): (bucket start in Unix seconds,
/// topic, counter) → count.
pub(crate) const RECONCILE_COUNTS: TableDefinition<(u64, &str, &str), u64> = TableDefinition::new("reconcile_counts");
/// Each partition's counting mark ([`crate::store::reconcile`]).
pub(crate) const RECONCILE_MARKS: TableDefinition<(&'static str, i32), i64> = TableDefinition::new("reconcile_marks");
/// The names a [`Link`] refers to by id, topics and effect kinds alike: id (from 1) → name.
pub(crate) const RECONCILE_NAMES: TableDefinition<u16, &str> = TableDefinition::new("reconcile_names");
/// The earlier layout's links: (device, seq) → (topic, bucket start in Unix seconds, kind)
/// of each queued job; moved into `job_live` ([`super::job_rows::migrate`]), and written
/// back by [`super::job_rows::downgrade`].
pub(crate) const LEGACY_RECONCILE_JOBS: TableDefinition<(&'static str, u64), (&'static str, u64, &'static str)> =
    TableDefinition::new("reconcile_jobs");

/// Creates every table in `tx` (a new file) or finds it (an existing one).
pub(super) fn create_all(tx: &redb::WriteTransaction) -> Result<(), OutboxError> {
    super::job_rows::migrate(tx)?;
    super::job_rows::JobTables::open(tx)?;
    tx.open_table(SEQ).map_err(err)?;
    tx.open_table(SEEN).map_err(err)?;
    tx.open_table(CHARGES).map_err(err)?;
    tx.open_table(DEVICES).map_err(err)?;
    tx.open_table(DEADLETTERS).map_err(err)?;
    tx.open_table(META).map_err(err)?;
    tx.open_table(PARKED).map_err(err)?;
    tx.open_table(DL_BY_SOURCE).map_err(err)?;
    tx.open_table(DIRECT_WRITING).map_err(err)?;
    tx.open_table(READ_POSITIONS).map_err(err)?;
    tx.open_table(FLAGS).map_err(err)?;
    tx.open_table(RECONCILE_COUNTS).map_err(err)?;
    tx.open_table(RECONCILE_MARKS).map_err(err)?;
    tx.open_table(RECONCILE_NAMES).map_err(err)?;
    Ok(())
}

/// A job row (`job_rows`): the length of the source's JSON (`u32`, little-endian), the source
/// ([`SourceRef`], JSON), then `job`'s JSON: the wire bytes, which start at the returned
/// offset. The device is the row's key.
pub(super) fn encode_row(source: &SourceRef, job: &Job) -> Result<(Vec<u8>, usize), OutboxError> {
    let mut row = vec![0u8; 4];
    serde_json::to_writer(&mut row, source).map_err(err)?;
    let at = row.len();
    row[..4].copy_from_slice(
        &u32::try_from(at - 4).map_err(|_| OutboxError::Format("a job's source over 4 GiB"))?.to_le_bytes(),
    );
    job.write_json(&mut row);
    Ok((row, at))
}

/// The source's JSON and the job's wire bytes of a job row ([`encode_row`]).
pub(super) fn split_row(row: &[u8]) -> Result<(&[u8], &[u8]), OutboxError> {
    // A row of the earlier format (the whole stored job as JSON) lands here too.
    let bad = || {
        OutboxError::Format("a job row is not in this version's format (length, source, job); was the outbox written by an earlier pixgate?")
    };
    let len = u32::from_le_bytes(row.get(..4).ok_or_else(bad)?.try_into().expect("4 bytes")) as usize;
    let source = row.get(4..4 + len).ok_or_else(bad)?;
    Ok((source, &row[4 + len..]))
}

/// The [`StoredJob`] of a job row of `device`'s.
pub(super) fn decode_row(device: &str, row: &[u8]) -> Result<StoredJob, OutboxError> {
    let (source, wire) = split_row(row)?;
    Ok(StoredJob {
        device: device.to_string(),
        source: serde_json::from_slice(source).map_err(err)?,
        job: serde_json::from_slice(wire).map_err(err)?,
    })
}
