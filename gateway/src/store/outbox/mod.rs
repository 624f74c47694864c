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
//! A superseded job's removal is synced, and so is a done job's on a device that may not
//! dedupe ([`Removal::durable`]).
//!
//! Tables: `job_rows` acceptance key → a job row ([`encode_row`]: its source, then the
//! job's JSON exactly as the device receives it, so it is serialized once and published as
//! stored), `jobs` (device, seq) → row key and `job_live` row key → (device, seq, the
//! job's reconciliation link), the queues (`job_rows.rs` says why rows are kept in
//! acceptance order); `reconcile_names` id → the topic or effect kind a link names;
//! `seq` device → last seq; `seen_by_event_time` (event `clusterTime`, message id) →
//! accepted-at (Unix ms), the dedupe window; `charges` charge id → (`__v`, status code);
//! `devices` device id → (oplog position, `fullDocument` JSON or empty for a delete): the
//! registry, so that a restart does not forget devices whose events are already committed;
//! `deadletters` id → JSON [`ParkedDeadLetter`]; `parked` the ids not yet published;
//! `deadletters_by_source` (source topic, partition, offset, which) → id, so a record read
//! again parks none of its dead letters twice; `meta` name → counter (the last
//! dead-letter id); `direct_writing` device → a direct printer's last job and whether it
//! was written whole ([`Outbox::mark_direct`]); `read_positions` (topic, partition) → the
//! next offset of a topic read outside any consumer group ([`Outbox::read_positions`]).
//!
//! One file per concept: the tables and the row layout (`schema.rs`), where the queued
//! rows live (`job_rows.rs`), the names a job's reconciliation link refers to
//! (`link_names.rs`), the queues (`queue.rs`), dead letters (`dead_letters.rs`), charge states and the registry
//! (`snapshots.rs`), the dedupe window's end (`dedupe.rs`), direct printers' marks
//! (`direct_marks.rs`), read positions (`read_positions.rs`), queues moving between the
//! central shape's replicas (`moves.rs`), what a damaged file still holds copied into a new
//! one (`salvage.rs`), the redb handle opened again after an I/O error
//! (`handle.rs`).

mod dead_letters;
mod dedupe;
mod direct_marks;
mod error;
mod handle;
mod job_rows;
pub(crate) mod link_names;
mod moves;
mod queue;
mod read_positions;
mod salvage;
pub(crate) mod schema;
mod snapshots;
#[cfg(test)]
mod tests;

pub use dead_letters::{ParkedDeadLetter, ReplayError};
pub use direct_marks::DirectMark;
pub use error::OutboxError;
pub use job_rows::downgrade;
pub use queue::{Accept, Removal, Written};
pub use salvage::{salvage, LostJob, Salvaged, TableReport};
pub use snapshots::{ChargeState, DeviceEntry};

use error::err;
use redb::Durability;
use std::path::Path;

/// The outbox database.
pub struct Outbox {
    /// Also used by the other tables' files of [`crate::store`] (effect flags, reconciliation).
    pub(in crate::store) db: handle::Handle,
}

impl Outbox {
    /// [`Outbox::open_with_cache`] with [`crate::config::DEFAULT_CACHE_BYTES`].
    ///
    /// # Errors
    /// As [`Outbox::open_with_cache`].
    pub fn open(path: &Path) -> Result<Outbox, OutboxError> {
        Outbox::open_with_cache(path, crate::config::DEFAULT_CACHE_BYTES, false)
    }

    /// Opens (or creates) the outbox at `path`, creating its folder, with a page cache of
    /// `cache_bytes` (`outbox.cache_bytes`); with `check` (`outbox.check_on_open`), every
    /// page's checksum is verified first (redb's `Builder::set_check_integrity_on_open`,
    /// which reads the whole file).
    ///
    /// # Errors
    /// The file cannot be created or is not a redb database, or is locked by another
    /// process (one gateway per outbox); with `check`, [`OutboxError::Damaged`] when a page
    /// fails its checksum.
    pub fn open_with_cache(path: &Path, cache_bytes: usize, check: bool) -> Result<Outbox, OutboxError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let db =
            redb::Builder::new().set_cache_size(cache_bytes).set_check_integrity_on_open(check).create(path).map_err(
                |e| match e {
                    redb::DatabaseError::Storage(redb::StorageError::Corrupted(detail)) => {
                        OutboxError::Damaged { path: path.to_path_buf(), detail }
                    }
                    other => err(other),
                },
            )?;
        let tx = db.begin_write().map_err(err)?;
        schema::create_all(&tx)?;
        tx.commit().map_err(err)?;
        Ok(Outbox { db: handle::Handle::new(db, path.to_path_buf(), cache_bytes) })
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
