//! Dead letters in the outbox: parked (accepted like a job) until Kafka has them, listed
//! until their retention ends, and replayed on an operator's request.

use super::error::{err, OutboxError};
use super::job_rows::JobTables;
use super::schema::{
    decode_row, encode_row, DEADLETTERS, DL_BY_SOURCE, LAST_DEADLETTER_ID, META, NO_LINK, PARKED, SEQ,
};
use super::Outbox;
use crate::model::{DeadLetter, DeadLetterReason, StoredJob};
use crate::store::reconcile::Counting;
use redb::{Durability, ReadableTable};
use serde::{Deserialize, Serialize};

/// The `which` of [`DL_BY_SOURCE`]: the `index`-th dead letter of its record.
pub(super) fn which_of(index: usize, dl: &DeadLetter) -> String {
    format!("{index}|{}|{}|{}", dl.reason, dl.effect.as_deref().unwrap_or(""), dl.device.as_deref().unwrap_or(""))
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
    /// The central shape (`cluster.enabled`): a replayed job would be queued in this
    /// replica's outbox only, outside the delivery log, so it would be lost when its
    /// partition moves and could take a `seq` the partition's next owner gives too.
    #[error("dead letter {0}: replays are not supported with cluster.enabled yet (the job would bypass the delivery log); nothing was replayed")]
    CentralShape(u64),
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

pub(super) fn park(
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

impl Outbox {
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
        let id = {
            let mut jobs = JobTables::open(&tx)?;
            // The job as stored, payload included: the dispatcher's copy may have shed its
            // payload while queued ([`StoredJob::without_payload`]).
            let taken = jobs.take(&stored.device, stored.job.seq)?;
            // No rows moved here: this may be retried on a full disk.
            jobs.drop_finished()?;
            drop(jobs);
            let removed: Option<StoredJob> = match taken {
                Some((row, link)) => {
                    let mut counting = Counting::open(&tx)?;
                    counting.failed(link, &dl.reason)?;
                    counting.finish(&tx)?;
                    match row {
                        Some(row) => Some(decode_row(&stored.device, &row)?),
                        None => None,
                    }
                }
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
                return Err(if reason.routes_again() {
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
            // Not linked: a replayed job counted once already when it left.
            JobTables::open(&tx)?.insert(&stored.device, next, &row, NO_LINK)?;
            parked.replayed_at_ms = Some(now_ms);
            let bytes = serde_json::to_vec(&parked).map_err(|e| ReplayError::Outbox(err(e)))?;
            dls.insert(id, bytes.as_slice()).map_err(|e| ReplayError::Outbox(err(e)))?;
            stored
        };
        tx.commit().map_err(|e| ReplayError::Outbox(err(e)))?;
        Ok(queued)
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
}
