//! The devices' job queues: a batch of records written in one transaction (jobs with their
//! `seq`, the dedupe window, charge states, registry changes, dead letters), finished jobs
//! removed, and the queues read back in delivery order.

use super::dead_letters::{park, which_of, ParkedDeadLetter, ReplayError};
use super::error::{err, OutboxError};
use super::job_rows::{self, JobTables};
use super::schema::{
    decode_row, encode_row, split_row, CHARGES, DEADLETTERS, DEVICES, DL_BY_SOURCE, META, NO_LINK, PARKED, SEEN, SEQ,
};
use super::snapshots::{status_code, ChargeState, DeviceEntry};
use super::Outbox;
use crate::model::{DeadLetter, Queued, SourceRef, StoredJob};
use crate::store::reconcile::{Counting, RecordTally};
use bytes::Bytes;
use device_protocol::{EffectKind, Job};
use redb::{Durability, ReadableTable};

/// What [`Outbox::write`] returns, per record of the batch and in its order: the jobs it
/// queued (a job the dedupe window already holds is not among them) and the ids of the
/// dead letters it parked.
pub type Written = Vec<(Vec<Queued>, Vec<u64>)>;

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
    /// Jobs of the record that went to the central shape's device-jobs topic instead
    /// (device id, kind): counted as queued in the record's reconciliation window, not
    /// queued here.
    pub produced: Vec<(String, EffectKind)>,
    /// For a job read back from the device-jobs topic: the topic and event time (Unix
    /// seconds) of the change event it was planned from, whose reconciliation window the
    /// job counts in when it leaves its queue.
    pub routed_from: Option<(String, u64)>,
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
    /// and the device dedupes it by message id (unless [`Removal::durable`]).
    pub superseded: bool,
    /// The device may not dedupe: a printer that fetches its jobs over its maker's cloud
    /// protocol (Star's HTTP method and Epson's Server Direct Print promise no memory of
    /// job tokens; printers on Star's MQTT method remember their last 10, and are synced
    /// alike). Its removal must reach the disk like a superseded one's, or after a crash
    /// the job is offered again and printed twice.
    pub durable: bool,
}

impl Removal {
    /// A done job's removal on a device that dedupes: not synced on its own.
    pub fn done(device: impl Into<String>, seq: u64) -> Removal {
        Removal { device: device.into(), seq, superseded: false, durable: false }
    }
}

/// The records of an [`Outbox::write`] (or a replayed record, [`Outbox::replay_record`]) in
/// the transaction `tx`: what [`Outbox::write`] documents, per record.
fn write_records(tx: &redb::WriteTransaction, batch: &mut [Accept], now_ms: u64) -> Result<Written, OutboxError> {
    let mut out = Vec::with_capacity(batch.len());
    let mut seen = tx.open_table(SEEN).map_err(err)?;
    let mut seq = tx.open_table(SEQ).map_err(err)?;
    let mut table = JobTables::open(tx)?;
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
        let source = a.source.clone().unwrap_or_else(SourceRef::unknown);
        let counted = match (&a.tally, &a.source) {
            (Some(tally), Some(src)) => {
                let produced: Vec<&str> = a.produced.iter().map(|(_, kind)| kind.as_str()).collect();
                counting
                    .record(&src.topic, src.partition, src.offset, tally, &produced)?
                    .map(|b| (src.topic.as_str(), b))
            }
            _ => None,
        };
        let mut queued = Vec::new();
        for (device, job) in &mut a.jobs {
            if seen.get((a.event_time, job.message_id.as_str())).map_err(err)?.is_some() {
                continue;
            }
            let next = seq.get(device.as_str()).map_err(err)?.map_or(0, |v| v.value()) + 1;
            seq.insert(device.as_str(), next).map_err(err)?;
            seen.insert((a.event_time, job.message_id.as_str()), now_ms).map_err(err)?;
            job.seq = next;
            let mut link = NO_LINK;
            if let Some((topic, bucket)) = counted {
                link = counting.queued(topic, bucket, job.kind.as_str())?;
            }
            if let Some((topic, event_time_s)) = &a.routed_from {
                link = counting.link(topic, *event_time_s, job.kind.as_str())?;
            }
            let (row, at) = encode_row(&source, job)?;
            table.insert(device, next, &row, link)?;
            // The header without cloning the payload (kilobytes) only to drop it.
            let payload = std::mem::take(&mut job.payload);
            let header = job.clone();
            job.payload = payload;
            let stored = StoredJob { device: device.clone(), job: header, source: source.clone() };
            queued.push(Queued { stored, wire: Bytes::from(row).slice(at..), accepted_at: None });
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
        out.push((queued, parked));
    }
    counting.finish(tx)?;
    Ok(out)
}

impl Outbox {
    /// Atomically, in one transaction: for every record of `batch`, records its charge
    /// state and registry change, queues each job whose message id is not in the dedupe
    /// window (assigning its device's next `seq`, also written into the job in `batch`),
    /// and parks its dead letters; and removes the finished jobs of `removals`. Returns,
    /// per record, the jobs queued (a job already seen is left out) and the ids of the
    /// dead letters parked.
    ///
    /// Durable when it returns (`Durability::Immediate`, one fsync) if `batch` is not empty
    /// or a removal is superseded or [`Removal::durable`]; otherwise (only done jobs of
    /// devices that dedupe removed) not synced: see [`Removal::superseded`]. One
    /// transaction for many records and removals is what makes the outbox fast: redb's cost
    /// is per commit far more than per row.
    ///
    /// # Errors
    /// Disk or database failure; then nothing of this call was written.
    pub fn write(&self, batch: &mut [Accept], removals: &[Removal], now_ms: u64) -> Result<Written, OutboxError> {
        let durable = !batch.is_empty() || removals.iter().any(|r| r.superseded || r.durable);
        self.commit(batch, removals, now_ms, durable, false)
    }

    /// Removes the finished jobs of `removals` in one synced transaction (`Durability::Immediate`,
    /// whatever they are), with every finished row still in the file
    /// ([`JobTables::drop_every_finished`]): redb reuses the pages a transaction freed only
    /// once a durable commit has them, and these are written to make room for a write the
    /// disk refused (`crate::ingest::held_removals`).
    ///
    /// # Errors
    /// Disk or database failure; then none was removed.
    pub fn remove_synced(&self, removals: &[Removal]) -> Result<(), OutboxError> {
        self.commit(&mut [], removals, 0, true, true).map(|_| ())
    }

    fn commit(
        &self,
        batch: &mut [Accept],
        removals: &[Removal],
        now_ms: u64,
        durable: bool,
        rows_now: bool,
    ) -> Result<Written, OutboxError> {
        let mut tx = self.db.begin_write().map_err(err)?;
        tx.set_durability(if durable { Durability::Immediate } else { Durability::None }).map_err(err)?;
        if !removals.is_empty() {
            let mut table = JobTables::open(&tx)?;
            let mut left = Vec::with_capacity(removals.len());
            for r in removals {
                if let Some((_, link)) = table.remove(&r.device, r.seq)? {
                    left.push((link, r.superseded));
                }
            }
            if rows_now {
                table.drop_every_finished()?;
            } else {
                table.sweep()?;
            }
            drop(table);
            let mut counting = Counting::open(&tx)?;
            for (link, superseded) in left {
                counting.removed(link, superseded)?;
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

    /// The queued jobs of `device`, in delivery order.
    ///
    /// # Errors
    /// Disk or database failure, or a stored job that no longer parses.
    pub fn device_jobs(&self, device: &str) -> Result<Vec<StoredJob>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        job_rows::device_rows(&tx, device)?.iter().map(|(_, row)| decode_row(device, row)).collect()
    }

    /// [`Outbox::write`] for one removal.
    ///
    /// # Errors
    /// Disk or database failure.
    #[cfg(test)]
    pub(crate) fn complete(&self, device: &str, seq: u64, superseded: bool) -> Result<(), OutboxError> {
        self.write(&mut [], &[Removal { device: device.to_string(), seq, superseded, durable: false }], 0).map(|_| ())
    }

    /// How many jobs each device has queued (keys only: no job is decoded).
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn queue_depths(&self) -> Result<std::collections::BTreeMap<String, u64>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        job_rows::depths(&tx)
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
        let mut out = Vec::new();
        job_rows::each_row(&tx, |device, _, row| {
            out.push(f(decode_row(device, row)?));
            Ok(())
        })?;
        Ok(out)
    }

    /// The wire bytes of one queued job (its JSON, payload included, as published);
    /// `None` if it is not queued (finished). Read without parsing.
    ///
    /// # Errors
    /// Disk or database failure, or a row not in this format (see [`split_row`]).
    pub fn wire(&self, device: &str, seq: u64) -> Result<Option<Bytes>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        match job_rows::row(&tx, device, seq)? {
            Some(row) => Ok(Some(Bytes::copy_from_slice(split_row(&row)?.1))),
            None => Ok(None),
        }
    }
}
