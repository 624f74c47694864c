//! Where the queued jobs' rows live: in acceptance order, apart from the per-device index
//! that gives the delivery order.
//!
//! redb rewrites every B-tree page a transaction changes (copy on write, 4 KiB pages). A
//! table keyed by (device, seq) takes each batch's jobs to as many leaves as devices, and
//! each job's removal rewrites its leaf again: 4.6 × the job bytes written to disk
//! (`outbox_drain` bench). Here a row is appended under the next acceptance key, so a
//! batch's rows fill new leaves whole; a finished job leaves the small index at once, and
//! its row stays until every older row is finished too, when the whole run of rows goes
//! in one range removal that frees leaves without rewriting them.
//!
//! Tables ([`super::schema`]): `job_rows` key → row ([`super::schema::encode_row`]);
//! `jobs` (device, seq) → key, the queues' index; `job_live` key → (device, seq, link), the
//! rows still queued, so that the oldest is found at once, with each one's reconciliation
//! link ([`Link`]). A row older than every key in `job_live` is finished and removed at the
//! next [`JobTables::sweep`].
//!
//! A job that stays queued (a printer offline for days) would hold back the removal of
//! every row after it; when the finished rows from the oldest queued row on outnumber the
//! queued ones by more than [`RELOCATE_SLACK`], the queued rows that far behind move to
//! the end under new keys ([`RELOCATE_MAX`] a sweep). Their (device, seq), so their
//! delivery order, is unchanged.

use super::error::{err, OutboxError};
use super::link_names::LinkNames;
use super::schema::{
    Link, JOB_INDEX, JOB_INDEX_MOVING, JOB_LIVE, JOB_ROWS, LEGACY_JOBS, LEGACY_JOBS_MOVING, LEGACY_JOB_LIVE,
    LEGACY_JOB_LIVE_MOVING, LEGACY_RECONCILE_JOBS, NO_LINK, RECONCILE_NAMES,
};
use redb::{ReadableTable, ReadableTableMetadata, Table};

/// How many more finished rows than queued ones may lie from the oldest queued row to the
/// newest row before the queued rows far behind move to the end (about 30 MiB of 2 KiB
/// rows).
pub const RELOCATE_SLACK: u64 = 16_384;
/// At most how many queued rows one [`JobTables::sweep`] moves: a bound on the writes it
/// adds to one transaction.
pub const RELOCATE_MAX: usize = 256;

/// The queued jobs' tables, open in a write transaction.
pub(super) struct JobTables<'t> {
    rows: Table<'t, u64, &'static [u8]>,
    index: Table<'t, (&'static str, u64), u64>,
    live: Table<'t, u64, (&'static str, u64, Link)>,
    /// The key the next row takes: one past the newest row's, read once at open.
    next: u64,
}

/// A job taken out of its queue ([`JobTables::take`]): its row (`None` when the file lost
/// it) and its link.
pub(super) type Taken = (Option<Vec<u8>>, Link);

/// A queue entry whose row the file does not have.
const MISSING_ROW: OutboxError = OutboxError::Format("a queued job's row is missing");

impl<'t> JobTables<'t> {
    /// Opens (or creates) the tables in `tx`.
    ///
    /// # Errors
    /// Database failure.
    pub(super) fn open(tx: &'t redb::WriteTransaction) -> Result<JobTables<'t>, OutboxError> {
        let rows = tx.open_table(JOB_ROWS).map_err(err)?;
        let next = rows.last().map_err(err)?.map_or(0, |(k, _)| k.value()) + 1;
        Ok(JobTables {
            rows,
            index: tx.open_table(JOB_INDEX).map_err(err)?,
            live: tx.open_table(JOB_LIVE).map_err(err)?,
            next,
        })
    }

    /// Queues `row` as `device`'s job `seq`, linked to its record's reconciliation window
    /// by `link` ([`NO_LINK`]: not counted when it leaves), replacing a job of that
    /// (device, seq), whose row becomes finished.
    ///
    /// # Errors
    /// Database failure.
    pub(super) fn insert(&mut self, device: &str, seq: u64, row: &[u8], link: Link) -> Result<(), OutboxError> {
        let key = self.next;
        self.next += 1;
        self.rows.insert(key, row).map_err(err)?;
        let before = self.index.insert((device, seq), key).map_err(err)?.map(|v| v.value());
        if let Some(old) = before {
            self.live.remove(old).map_err(err)?;
        }
        self.live.insert(key, (device, seq, link)).map_err(err)?;
        Ok(())
    }

    /// Takes `device`'s job `seq` out of its queue; returns its row's key and its link if
    /// it was queued. The row goes at a later [`JobTables::sweep`].
    ///
    /// # Errors
    /// Database failure.
    pub(super) fn remove(&mut self, device: &str, seq: u64) -> Result<Option<(u64, Link)>, OutboxError> {
        let Some(key) = self.index.remove((device, seq)).map_err(err)?.map(|v| v.value()) else { return Ok(None) };
        let link = self.live.remove(key).map_err(err)?.map_or(NO_LINK, |v| v.value().2);
        Ok(Some((key, link)))
    }

    /// [`JobTables::remove`], returning the job's row (`None` when the file lost it) and
    /// its link.
    ///
    /// # Errors
    /// Database failure.
    pub(super) fn take(&mut self, device: &str, seq: u64) -> Result<Option<Taken>, OutboxError> {
        let Some((key, link)) = self.remove(device, seq)? else { return Ok(None) };
        Ok(Some((self.rows.get(key).map_err(err)?.map(|v| v.value().to_vec()), link)))
    }

    /// The seqs `device` has queued, in order.
    ///
    /// # Errors
    /// Database failure.
    pub(super) fn seqs(&self, device: &str) -> Result<Vec<u64>, OutboxError> {
        self.index
            .range((device, 0u64)..=(device, u64::MAX))
            .map_err(err)?
            .map(|item| item.map(|(k, _)| k.value().1).map_err(err))
            .collect()
    }

    /// Removes the finished rows older than the oldest queued one, first moving the oldest
    /// queued rows to the end when finished rows pile up behind them (module docs).
    ///
    /// # Errors
    /// Database failure.
    pub(super) fn sweep(&mut self) -> Result<(), OutboxError> {
        self.relocate_stuck()?;
        self.drop_finished()
    }

    /// Moves up to [`RELOCATE_MAX`] of the oldest queued rows to the end when the finished
    /// rows from the oldest queued one on outnumber the queued ones by more than
    /// [`RELOCATE_SLACK`]: those more than twice the queue's length behind the newest row.
    ///
    /// # Errors
    /// Database failure, or a queued job whose row is gone ([`OutboxError::Format`]).
    fn relocate_stuck(&mut self) -> Result<(), OutboxError> {
        let newest = self.next - 1;
        let queued = self.live.len().map_err(err)?;
        let Some(oldest) = self.live.first().map_err(err)?.map(|(k, _)| k.value()) else { return Ok(()) };
        // `newest - oldest + 1` rows, `queued` of them queued: finished ones beyond
        // `queued + RELOCATE_SLACK`.
        if newest - oldest < 2 * queued + RELOCATE_SLACK {
            return Ok(());
        }
        let behind = newest.saturating_sub(2 * queued);
        let moving: Vec<(u64, String, u64, Link)> = self
            .live
            .range(..behind)
            .map_err(err)?
            .take(RELOCATE_MAX)
            .map(|item| {
                item.map(|(k, v)| {
                    let (device, seq, link) = v.value();
                    (k.value(), device.to_string(), seq, link)
                })
                .map_err(err)
            })
            .collect::<Result<_, _>>()?;
        for (key, device, seq, link) in moving {
            let row = row_of(&self.rows, key)?;
            self.insert(&device, seq, &row, link)?;
        }
        Ok(())
    }

    /// Removes the rows older than the oldest queued one (all of them when none is
    /// queued): whole leaves freed, not rewritten. Writes nothing else, so it fits a
    /// transaction made to free room on a full disk.
    ///
    /// # Errors
    /// Database failure.
    pub(super) fn drop_finished(&mut self) -> Result<(), OutboxError> {
        match self.live.first().map_err(err)?.map(|(k, _)| k.value()) {
            Some(oldest) => self.rows.retain_in(..oldest, |_, _| false).map_err(err)?,
            None => self.rows.retain(|_, _| false).map_err(err)?,
        }
        Ok(())
    }

    /// Removes every finished row, also those between queued ones: each run of finished
    /// rows between two queued rows goes in one range removal. What makes room inside the
    /// file when the disk is full ([`super::Outbox::remove_synced`]); it reads every queued
    /// row's key.
    ///
    /// # Errors
    /// Database failure.
    pub(super) fn drop_every_finished(&mut self) -> Result<(), OutboxError> {
        let queued: Vec<u64> = self
            .live
            .iter()
            .map_err(err)?
            .map(|item| item.map(|(k, _)| k.value()).map_err(err))
            .collect::<Result<_, _>>()?;
        let mut from = 0u64;
        for key in queued {
            if key > from {
                self.rows.retain_in(from..key, |_, _| false).map_err(err)?;
            }
            from = key + 1;
        }
        self.rows.retain_in(from.., |_, _| false).map_err(err)?;
        Ok(())
    }
}

/// `device`'s queued rows in `tx`, in delivery order: (seq, row).
///
/// # Errors
/// Database failure, or an index entry whose row is gone ([`OutboxError::Format`]).
pub(super) fn device_rows(tx: &redb::ReadTransaction, device: &str) -> Result<Vec<(u64, Vec<u8>)>, OutboxError> {
    let index = tx.open_table(JOB_INDEX).map_err(err)?;
    let rows = tx.open_table(JOB_ROWS).map_err(err)?;
    let mut out = Vec::new();
    for item in index.range((device, 0u64)..=(device, u64::MAX)).map_err(err)? {
        let (k, key) = item.map_err(err)?;
        out.push((k.value().1, row_of(&rows, key.value())?));
    }
    Ok(out)
}

/// Every queued row in `tx`, by device then seq: `f(device, seq, row)` for each.
///
/// # Errors
/// Database failure, a missing row, or `f`'s error.
pub(super) fn each_row(
    tx: &redb::ReadTransaction,
    mut f: impl FnMut(&str, u64, &[u8]) -> Result<(), OutboxError>,
) -> Result<(), OutboxError> {
    let index = tx.open_table(JOB_INDEX).map_err(err)?;
    let rows = tx.open_table(JOB_ROWS).map_err(err)?;
    for item in index.iter().map_err(err)? {
        let (k, key) = item.map_err(err)?;
        let (device, seq) = k.value();
        let row = rows.get(key.value()).map_err(err)?.ok_or(MISSING_ROW)?;
        f(device, seq, row.value())?;
    }
    Ok(())
}

/// How many jobs each queued device has (the index alone: no row is read).
///
/// # Errors
/// Database failure.
pub(super) fn depths(tx: &redb::ReadTransaction) -> Result<std::collections::BTreeMap<String, u64>, OutboxError> {
    let index = tx.open_table(JOB_INDEX).map_err(err)?;
    let mut out = std::collections::BTreeMap::<String, u64>::new();
    for item in index.iter().map_err(err)? {
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

/// The row of `device`'s job `seq` in `tx`, if queued.
///
/// # Errors
/// Database failure or a missing row.
pub(super) fn row(tx: &redb::ReadTransaction, device: &str, seq: u64) -> Result<Option<Vec<u8>>, OutboxError> {
    let index = tx.open_table(JOB_INDEX).map_err(err)?;
    let Some(key) = index.get((device, seq)).map_err(err)?.map(|v| v.value()) else { return Ok(None) };
    let rows = tx.open_table(JOB_ROWS).map_err(err)?;
    row_of(&rows, key).map(Some)
}

fn row_of(rows: &impl ReadableTable<u64, &'static [u8]>, key: u64) -> Result<Vec<u8>, OutboxError> {
    Ok(rows.get(key).map_err(err)?.ok_or(MISSING_ROW)?.value().to_vec())
}

/// Moves the queues of a file written by an earlier pixgate into this layout, in `tx`: the
/// first layout's rows (`jobs`: (device, seq) → row), row by row (the queue is not held in
/// memory; the file needs room for one more copy of the queued rows until `tx` commits),
/// and both earlier layouts' reconciliation links (`reconcile_jobs`: (device, seq) →
/// (topic, bucket, kind)) into `job_live`. A no-op on a file of this layout.
///
/// # Errors
/// Database failure, the disk full among them.
pub(super) fn migrate(tx: &redb::WriteTransaction) -> Result<(), OutboxError> {
    migrate_live(tx)?;
    migrate_rows(tx)?;
    tx.delete_table(LEGACY_RECONCILE_JOBS).map_err(err)?;
    Ok(())
}

/// The link `reconcile_jobs` holds for (`device`, `seq`), named in `names`.
fn legacy_link(
    links: &impl ReadableTable<(&'static str, u64), (&'static str, u64, &'static str)>,
    names: &mut LinkNames<'_>,
    device: &str,
    seq: u64,
) -> Result<Link, OutboxError> {
    match links.get((device, seq)).map_err(err)? {
        Some(v) => {
            let (topic, bucket, kind) = v.value();
            names.link(topic, bucket, kind)
        }
        None => Ok(NO_LINK),
    }
}

/// The second layout's `job_live` (key → (device, seq)) into this one's, each entry under
/// its key with its link from `reconcile_jobs`; the rows stay as they are.
fn migrate_live(tx: &redb::WriteTransaction) -> Result<(), OutboxError> {
    match tx.open_table(JOB_LIVE) {
        Ok(_) => return Ok(()),
        Err(redb::TableError::TableTypeMismatch { .. }) => {}
        Err(e) => return Err(err(e)),
    }
    tx.rename_table(LEGACY_JOB_LIVE, LEGACY_JOB_LIVE_MOVING).map_err(err)?;
    {
        let legacy = tx.open_table(LEGACY_JOB_LIVE_MOVING).map_err(err)?;
        let links = tx.open_table(LEGACY_RECONCILE_JOBS).map_err(err)?;
        let mut names = LinkNames::open(tx)?;
        let mut live = tx.open_table(JOB_LIVE).map_err(err)?;
        for item in legacy.iter().map_err(err)? {
            let (key, v) = item.map_err(err)?;
            let (device, seq) = v.value();
            let link = legacy_link(&links, &mut names, device, seq)?;
            live.insert(key.value(), (device, seq, link)).map_err(err)?;
        }
    }
    tx.delete_table(LEGACY_JOB_LIVE_MOVING).map_err(err)?;
    Ok(())
}

/// The first layout's rows (`jobs`: (device, seq) → row) into `job_rows`.
fn migrate_rows(tx: &redb::WriteTransaction) -> Result<(), OutboxError> {
    match tx.open_table(LEGACY_JOBS) {
        Ok(t) => {
            if t.is_empty().map_err(err)? {
                drop(t);
                tx.delete_table(LEGACY_JOBS).map_err(err)?;
                return Ok(());
            }
        }
        // `jobs` is this layout's index already.
        Err(redb::TableError::TableTypeMismatch { .. }) => return Ok(()),
        Err(e) => return Err(err(e)),
    }
    // The index takes the name `jobs`: the rows move out of the way first.
    tx.rename_table(LEGACY_JOBS, LEGACY_JOBS_MOVING).map_err(err)?;
    {
        let legacy = tx.open_table(LEGACY_JOBS_MOVING).map_err(err)?;
        let links = tx.open_table(LEGACY_RECONCILE_JOBS).map_err(err)?;
        let mut names = LinkNames::open(tx)?;
        let mut jobs = JobTables::open(tx)?;
        for item in legacy.iter().map_err(err)? {
            let (k, row) = item.map_err(err)?;
            let (device, seq) = k.value();
            let link = legacy_link(&links, &mut names, device, seq)?;
            jobs.insert(device, seq, row.value(), link)?;
        }
    }
    tx.delete_table(LEGACY_JOBS_MOVING).map_err(err)?;
    Ok(())
}

/// Rewrites the outbox at `path` in the first layout (`jobs`: (device, seq) → row, and the
/// links in `reconcile_jobs`), so that an earlier pixgate can run on it (`pixgate outbox
/// downgrade`). Returns how many queued jobs were moved; `None`, nothing written, when the
/// file is in that layout already. A pixgate of this version moves them back when it next
/// opens the file.
///
/// # Errors
/// The file is held by a running gateway ([`OutboxError::InUse`]), or cannot be opened or
/// written.
pub fn downgrade(path: &std::path::Path) -> Result<Option<usize>, OutboxError> {
    let db = match redb::Database::open(path) {
        Ok(db) => db,
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Err(OutboxError::InUse(path.to_path_buf())),
        Err(e) => return Err(err(e)),
    };
    let tx = db.begin_write().map_err(err)?;
    match tx.open_table(JOB_INDEX) {
        Ok(_) => {}
        Err(redb::TableError::TableTypeMismatch { .. }) => return Ok(None),
        Err(e) => return Err(err(e)),
    }
    // A file of the second layout (the links in `reconcile_jobs` already) comes to this
    // one first, so that one path writes the first.
    migrate_live(&tx)?;
    // The earlier layout's rows take the name `jobs`: the index moves out of the way first.
    tx.rename_table(JOB_INDEX, JOB_INDEX_MOVING).map_err(err)?;
    let mut moved = 0;
    {
        let index = tx.open_table(JOB_INDEX_MOVING).map_err(err)?;
        let rows = tx.open_table(JOB_ROWS).map_err(err)?;
        let live = tx.open_table(JOB_LIVE).map_err(err)?;
        let names = LinkNames::open(&tx)?;
        let mut legacy = tx.open_table(LEGACY_JOBS).map_err(err)?;
        let mut links = tx.open_table(LEGACY_RECONCILE_JOBS).map_err(err)?;
        for item in index.iter().map_err(err)? {
            let (k, key) = item.map_err(err)?;
            let (device, seq) = k.value();
            let row = rows.get(key.value()).map_err(err)?.ok_or(MISSING_ROW)?;
            legacy.insert((device, seq), row.value()).map_err(err)?;
            moved += 1;
        }
        for item in live.iter().map_err(err)? {
            let (_, v) = item.map_err(err)?;
            let (device, seq, link) = v.value();
            if let Some(named) = names.resolve(link) {
                links.insert((device, seq), named).map_err(err)?;
            }
        }
    }
    tx.delete_table(JOB_INDEX_MOVING).map_err(err)?;
    tx.delete_table(JOB_ROWS).map_err(err)?;
    tx.delete_table(JOB_LIVE).map_err(err)?;
    tx.delete_table(RECONCILE_NAMES).map_err(err)?;
    tx.commit().map_err(err)?;
    Ok(Some(moved))
}

#[cfg(test)]
mod tests {
    use super::{RELOCATE_MAX, RELOCATE_SLACK};
    use crate::model::SourceRef;
    use crate::store::outbox::schema::{JOB_LIVE, JOB_ROWS};
    use crate::store::{Accept, Outbox, Removal};
    use crate::test_fixtures::{job, temp_outbox};
    use device_protocol::EffectKind;
    use redb::{ReadableTable, ReadableTableMetadata};

    /// (rows kept, rows queued, the oldest row's key).
    fn rows(o: &Outbox) -> (u64, u64, u64) {
        let tx = o.db.begin_read().unwrap();
        let rows = tx.open_table(JOB_ROWS).unwrap();
        let live = tx.open_table(JOB_LIVE).unwrap();
        (rows.len().unwrap(), live.len().unwrap(), rows.first().unwrap().map_or(0, |(k, _)| k.value()))
    }

    fn accept(o: &Outbox, jobs: &[(&str, &str)], removals: &[Removal]) -> Vec<u64> {
        let mut batch = vec![Accept {
            jobs: jobs.iter().map(|(d, id)| (d.to_string(), job(id, EffectKind::PrintReceipt, "c"))).collect(),
            source: Some(SourceRef::unknown()),
            ..Accept::default()
        }];
        let out = o.write(&mut batch, removals, 0).unwrap();
        out.into_iter().flat_map(|(q, _)| q).map(|q| q.stored.job.seq).collect()
    }

    #[test]
    fn a_finished_row_goes_once_every_older_row_is_finished() {
        let (_dir, o) = temp_outbox("job-rows-sweep");
        accept(&o, &[("a", "a1"), ("b", "b1"), ("c", "c1")], &[]);
        o.complete("b", 1, false).unwrap();
        assert_eq!(rows(&o), (3, 2, 1), "b's row waits behind a's");
        o.complete("a", 1, false).unwrap();
        assert_eq!(rows(&o), (1, 1, 3), "a's and b's rows gone; c's stays");
        let left: Vec<String> = o.pending().unwrap().into_iter().map(|s| s.job.message_id).collect();
        assert_eq!(left, ["c1"]);
        o.complete("c", 1, true).unwrap();
        assert_eq!(rows(&o).0, 0, "an empty queue keeps no row");
        // Keys go on after the last row, whatever was removed.
        accept(&o, &[("a", "a2")], &[]);
        assert_eq!(o.device_jobs("a").unwrap()[0].job.message_id, "a2");
    }

    #[test]
    fn a_removal_to_make_room_takes_every_finished_row() {
        let (_dir, o) = temp_outbox("job-rows-room");
        accept(&o, &[("a", "a1"), ("b", "b1"), ("c", "c1"), ("d", "d1"), ("e", "e1")], &[]);
        o.complete("b", 1, false).unwrap();
        assert_eq!(rows(&o), (5, 4, 1), "b's row waits behind a's");
        o.remove_synced(&[Removal::done("d", 1)]).unwrap();
        assert_eq!(rows(&o), (3, 3, 1), "b's and d's rows went, between queued ones");
        let left: Vec<String> = o.pending().unwrap().into_iter().map(|s| s.job.message_id).collect();
        assert_eq!(left, ["a1", "c1", "e1"]);
    }

    #[test]
    fn a_job_that_stays_queued_moves_to_the_end_and_keeps_its_place() {
        let (_dir, o) = temp_outbox("job-rows-relocate");
        accept(&o, &[("stuck", "s1"), ("stuck", "s2")], &[]);
        // Other devices' jobs come and go in batches, each finished at the next write.
        let mut finishing: Vec<Removal> = Vec::new();
        let mut most = 0;
        for b in 0..40 {
            let ids: Vec<String> = (0..1_000).map(|i| format!("m{b}-{i}")).collect();
            let jobs: Vec<(&str, &str)> = ids.iter().map(|id| ("busy", id.as_str())).collect();
            let seqs = accept(&o, &jobs, &finishing);
            finishing = seqs.into_iter().map(|s| Removal::done("busy", s)).collect();
            most = most.max(rows(&o).0);
        }
        let (kept, queued, oldest) = rows(&o);
        println!("job rows: at most {most} kept; now {kept} kept, {queued} queued, oldest key {oldest}");
        assert_eq!(queued, 1_002, "the stuck device's two and the last batch");
        assert!(oldest > 2, "the stuck rows moved to the end (oldest key {oldest})");
        assert!(
            most <= 2 * 1_002 + RELOCATE_SLACK + 2_000 + RELOCATE_MAX as u64,
            "finished rows do not pile up behind a stuck job: {most}"
        );
        let stuck: Vec<(u64, String)> =
            o.device_jobs("stuck").unwrap().into_iter().map(|s| (s.job.seq, s.job.message_id)).collect();
        assert_eq!(stuck, [(1, "s1".to_string()), (2, "s2".to_string())], "same seqs, same order");
    }
}
