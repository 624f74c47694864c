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
//! Tables: `jobs` (device, seq) → JSON [`StoredJob`]; `seq` device → last seq; `seen`
//! message id → accepted-at (Unix ms); `charges` charge id → (`__v`, status code);
//! `devices` device id → (oplog position, `fullDocument` JSON or empty for a delete): the
//! registry, so that a restart does not forget devices whose events are already committed.

use crate::cdc::ChargeStatus;
use device_protocol::Job;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::Path;

const JOBS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("jobs");
const SEQ: TableDefinition<&str, u64> = TableDefinition::new("seq");
const SEEN: TableDefinition<&str, u64> = TableDefinition::new("seen");
const CHARGES: TableDefinition<&str, (i64, u8)> = TableDefinition::new("charges");
const DEVICES: TableDefinition<&str, (u64, &[u8])> = TableDefinition::new("devices");

/// Outbox failure: the disk or the database file. pixgate cannot accept effects without
/// it, so the consumer stops reading (and retries) rather than commit past them.
#[derive(Debug, thiserror::Error)]
#[error("outbox: {0}")]
pub struct OutboxError(String);

fn err(e: impl std::fmt::Display) -> OutboxError {
    OutboxError(e.to_string())
}

/// Where the record that caused a job came from (for dead letters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRef {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Record key, as text.
    pub key: Option<String>,
}

/// A queued job with its device and source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredJob {
    /// Device id.
    pub device: String,
    /// The job, `seq` assigned.
    pub job: Job,
    /// The record it came from.
    pub source: SourceRef,
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

/// The outbox database.
pub struct Outbox {
    db: Database,
}

impl Outbox {
    /// Opens (or creates) the outbox at `path`, creating its folder.
    ///
    /// # Errors
    /// The file cannot be created or is not a redb database, or is locked by another
    /// process (one gateway per outbox).
    pub fn open(path: &Path) -> Result<Outbox, OutboxError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let db = Database::create(path).map_err(err)?;
        let tx = db.begin_write().map_err(err)?;
        {
            tx.open_table(JOBS).map_err(err)?;
            tx.open_table(SEQ).map_err(err)?;
            tx.open_table(SEEN).map_err(err)?;
            tx.open_table(CHARGES).map_err(err)?;
            tx.open_table(DEVICES).map_err(err)?;
        }
        tx.commit().map_err(err)?;
        Ok(Outbox { db })
    }

    /// Atomically and durably: records `charge` (if given) as applied, and queues each job
    /// whose message id is not in the dedupe window, assigning its device's next `seq`.
    /// Returns the jobs queued (with their seq); a job already seen is left out.
    ///
    /// # Errors
    /// Disk or database failure; then nothing of this call was written.
    pub fn accept(
        &self,
        charge: Option<(&str, ChargeState)>,
        jobs: Vec<(String, Job)>,
        source: &SourceRef,
        now_ms: u64,
    ) -> Result<Vec<StoredJob>, OutboxError> {
        let mut tx = self.db.begin_write().map_err(err)?;
        tx.set_durability(Durability::Immediate).map_err(err)?;
        let mut queued = Vec::new();
        {
            let mut seen = tx.open_table(SEEN).map_err(err)?;
            let mut seq = tx.open_table(SEQ).map_err(err)?;
            let mut table = tx.open_table(JOBS).map_err(err)?;
            if let Some((id, st)) = charge {
                tx.open_table(CHARGES).map_err(err)?.insert(id, (st.version, status_code(st.status))).map_err(err)?;
            }
            for (device, mut job) in jobs {
                if seen.get(job.message_id.as_str()).map_err(err)?.is_some() {
                    continue;
                }
                let next = seq.get(device.as_str()).map_err(err)?.map_or(0, |v| v.value()) + 1;
                seq.insert(device.as_str(), next).map_err(err)?;
                seen.insert(job.message_id.as_str(), now_ms).map_err(err)?;
                job.seq = next;
                let stored = StoredJob { device: device.clone(), job, source: source.clone() };
                let bytes = serde_json::to_vec(&stored).map_err(err)?;
                table.insert((device.as_str(), next), bytes.as_slice()).map_err(err)?;
                queued.push(stored);
            }
        }
        tx.commit().map_err(err)?;
        Ok(queued)
    }

    /// Removes a finished job (done, superseded, or dead-lettered) from its device's queue.
    /// Its message id stays in the dedupe window.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn complete(&self, device: &str, seq: u64) -> Result<(), OutboxError> {
        let mut tx = self.db.begin_write().map_err(err)?;
        tx.set_durability(Durability::Immediate).map_err(err)?;
        tx.open_table(JOBS).map_err(err)?.remove((device, seq)).map_err(err)?;
        tx.commit().map_err(err)
    }

    /// Every queued job, by device then seq (delivery order).
    ///
    /// # Errors
    /// Disk or database failure, or a stored job that no longer parses.
    pub fn pending(&self) -> Result<Vec<StoredJob>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(JOBS).map_err(err)?;
        let mut out = Vec::new();
        for item in table.iter().map_err(err)? {
            let (_, v) = item.map_err(err)?;
            out.push(serde_json::from_slice(v.value()).map_err(err)?);
        }
        Ok(out)
    }

    /// Every charge's last applied state, for the router at start-up.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn charges(&self) -> Result<Vec<(String, ChargeState)>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(CHARGES).map_err(err)?;
        let mut out = Vec::new();
        for item in table.iter().map_err(err)? {
            let (k, v) = item.map_err(err)?;
            let (version, code) = v.value();
            out.push((k.value().to_string(), ChargeState { version, status: status_from(code) }));
        }
        Ok(out)
    }

    /// Records a device registry event durably: its `fullDocument` (`None` for a delete) at
    /// oplog position `cluster_time`.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn put_device(&self, id: &str, cluster_time: u64, document: Option<&serde_json::Value>) -> Result<(), OutboxError> {
        let bytes = match document {
            Some(d) => serde_json::to_vec(d).map_err(err)?,
            None => Vec::new(),
        };
        let mut tx = self.db.begin_write().map_err(err)?;
        tx.set_durability(Durability::Immediate).map_err(err)?;
        tx.open_table(DEVICES).map_err(err)?.insert(id, (cluster_time, bytes.as_slice())).map_err(err)?;
        tx.commit().map_err(err)
    }

    /// Every registry entry stored by [`Outbox::put_device`]: id, oplog position, document.
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

    /// Forgets message ids accepted before `cutoff_ms` (the end of the dedupe window).
    /// Returns how many were forgotten.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn prune_seen(&self, cutoff_ms: u64) -> Result<usize, OutboxError> {
        let tx = self.db.begin_write().map_err(err)?;
        let mut n = 0;
        {
            let mut seen = tx.open_table(SEEN).map_err(err)?;
            seen.retain(|_, at| {
                let keep = at >= cutoff_ms;
                n += usize::from(!keep);
                keep
            })
            .map_err(err)?;
        }
        tx.commit().map_err(err)?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use device_protocol::EffectKind;

    fn job(id: &str) -> Job {
        Job {
            v: 1,
            message_id: id.into(),
            seq: 0,
            kind: EffectKind::PrintReceipt,
            event_id: "e".into(),
            charge_id: "c".into(),
            content_type: "x".into(),
            payload: String::new(),
            expires_at: None,
        }
    }

    fn src(offset: i64) -> SourceRef {
        SourceRef { topic: "charge.upserted".into(), partition: 0, offset, key: Some("c".into()) }
    }

    #[test]
    fn survives_reopen_with_order_dedupe_and_state() {
        let dir = std::env::temp_dir().join(format!("pixgate-outbox-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("outbox.redb");
        {
            let o = Outbox::open(&path).unwrap();
            let st = ChargeState { version: 3, status: ChargeStatus::Completed };
            let q = o.accept(Some(("c", st)), vec![("p".into(), job("a")), ("p".into(), job("b")), ("t".into(), job("x"))], &src(1), 1000).unwrap();
            assert_eq!(q.iter().map(|s| (s.device.as_str(), s.job.seq)).collect::<Vec<_>>(), [("p", 1), ("p", 2), ("t", 1)]);
            // The same record read again after a crash: nothing new is queued.
            assert!(o.accept(None, vec![("p".into(), job("a"))], &src(1), 2000).unwrap().is_empty());
            o.complete("p", 1).unwrap();
        }
        let o = Outbox::open(&path).unwrap();
        let pending = o.pending().unwrap();
        assert_eq!(pending.iter().map(|s| (s.job.message_id.as_str(), s.job.seq)).collect::<Vec<_>>(), [("b", 2), ("x", 1)]);
        assert_eq!(pending[0].source, src(1));
        assert_eq!(o.charges().unwrap(), [("c".to_string(), ChargeState { version: 3, status: ChargeStatus::Completed })]);
        // Sequence numbers continue after a restart; a completed id stays deduped.
        let q = o.accept(None, vec![("p".into(), job("a")), ("p".into(), job("c"))], &src(2), 3000).unwrap();
        assert_eq!(q.iter().map(|s| (s.job.message_id.as_str(), s.job.seq)).collect::<Vec<_>>(), [("c", 3)]);
        // After the dedupe window, the id is forgotten.
        assert_eq!(o.prune_seen(2500).unwrap(), 3);
        assert_eq!(o.accept(None, vec![("p".into(), job("a"))], &src(3), 4000).unwrap().len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
