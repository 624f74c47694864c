//! Queues that move between replicas (the central shape, `docs/cluster.md` "Hand-over"):
//! there the outbox's queues are a cache of the delivery log. A replica forgets the queues
//! of the devices it no longer owns, and takes those of a partition it is given as the log
//! has them, `seq`s included.

use super::error::{err, OutboxError};
use super::job_rows::JobTables;
use super::schema::{encode_row, NO_LINK, SEEN, SEQ};
use super::Outbox;
use crate::model::StoredJob;
use redb::{Durability, ReadableTable};
use std::collections::{BTreeSet, HashMap};

impl Outbox {
    /// Removes every queued job of `devices` from the queues (with their reconciliation
    /// links; their rows go with the finished ones, [`super::job_rows`]),
    /// counting none of them as delivered: another replica delivers them. Returns how
    /// many were removed. Not synced: jobs that come back after a crash are forgotten again
    /// at the next start (a replica of the central shape starts with no queue).
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn forget_devices<'a>(&self, devices: impl IntoIterator<Item = &'a str>) -> Result<usize, OutboxError> {
        let mut tx = self.db.begin_write().map_err(err)?;
        tx.set_durability(Durability::None).map_err(err)?;
        let n = forget_in(&tx, devices)?;
        tx.commit().map_err(err)?;
        Ok(n)
    }

    /// Removes every queued job, as [`Outbox::forget_devices`] does for all devices, and
    /// empties the dedupe window: a job this replica wrote before but never got into the
    /// delivery log (a crash between the two) must be queued when it is read again, and
    /// what the log has is skipped by its position instead.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn forget_all(&self) -> Result<usize, OutboxError> {
        let devices: BTreeSet<String> = self.queue_depths()?.into_keys().collect();
        let n = self.forget_devices(devices.iter().map(String::as_str))?;
        let tx = self.db.begin_write().map_err(err)?;
        tx.open_table(SEEN).map_err(err)?.retain(|_, _| false).map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(n)
    }

    /// Removes the jobs `(device, seq, event time, message id)` just queued from a
    /// partition given up meanwhile, and their dedupe entries, counting none of them: the
    /// partition's owner reads them, and if the partition comes back here they must not be
    /// taken for copies.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn forget_jobs(&self, jobs: &[(String, u64, u64, String)]) -> Result<(), OutboxError> {
        let tx = self.db.begin_write().map_err(err)?;
        {
            let mut table = JobTables::open(&tx)?;
            let mut seen = tx.open_table(SEEN).map_err(err)?;
            for (device, seq, event_time, message_id) in jobs {
                table.remove(device, *seq)?;
                seen.remove((*event_time, message_id.as_str())).map_err(err)?;
            }
            table.sweep()?;
        }
        tx.commit().map_err(err)?;
        Ok(())
    }

    /// Takes a partition's queues from its delivery log: removes what the outbox still has
    /// of `seqs`' devices, queues `jobs` (whole, `seq` given) and moves each device's
    /// sequence counter up to its last `seq` in `seqs`, in one synced transaction. Returns
    /// the jobs' headers ([`StoredJob::without_payload`]), in order, for the dispatcher.
    ///
    /// # Errors
    /// Disk or database failure; then nothing was written.
    pub fn restore(&self, jobs: Vec<StoredJob>, seqs: &HashMap<String, u64>) -> Result<Vec<StoredJob>, OutboxError> {
        let mut tx = self.db.begin_write().map_err(err)?;
        tx.set_durability(Durability::Immediate).map_err(err)?;
        let devices: BTreeSet<&str> =
            seqs.keys().map(String::as_str).chain(jobs.iter().map(|j| j.device.as_str())).collect();
        forget_in(&tx, devices.iter().copied())?;
        {
            let mut seq = tx.open_table(SEQ).map_err(err)?;
            for (device, last) in seqs {
                let before = seq.get(device.as_str()).map_err(err)?.map_or(0, |v| v.value());
                if *last > before {
                    seq.insert(device.as_str(), *last).map_err(err)?;
                }
            }
            let mut table = JobTables::open(&tx)?;
            for j in &jobs {
                let (row, _) = encode_row(&j.source, &j.job)?;
                table.insert(&j.device, j.job.seq, &row, NO_LINK)?;
            }
        }
        tx.commit().map_err(err)?;
        Ok(jobs.into_iter().map(StoredJob::without_payload).collect())
    }
}

fn forget_in<'a>(
    tx: &redb::WriteTransaction,
    devices: impl IntoIterator<Item = &'a str>,
) -> Result<usize, OutboxError> {
    let mut table = JobTables::open(tx)?;
    let mut n = 0;
    for device in devices {
        for s in table.seqs(device)? {
            table.remove(device, s)?;
            n += 1;
        }
    }
    table.sweep()?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use crate::model::{SourceRef, StoredJob};
    use crate::test_fixtures::{job, temp_outbox};
    use device_protocol::EffectKind;
    use std::collections::HashMap;

    #[test]
    fn a_restored_queue_replaces_the_local_one_and_keeps_its_seqs() {
        let (_dir, outbox) = temp_outbox("moves");
        let src = SourceRef::unknown();
        // A queue left from an earlier ownership, and another device's.
        outbox.accept(None, vec![("a".into(), job("old", EffectKind::PrintReceipt, "c0"))], &src, 0).unwrap();
        outbox.accept(None, vec![("b".into(), job("b1", EffectKind::PrintReceipt, "c9"))], &src, 0).unwrap();
        let mut logged = job("m7", EffectKind::PrintReceipt, "c1");
        logged.seq = 7;
        let restored = vec![StoredJob { device: "a".into(), job: logged.clone(), source: src.clone() }];
        let seqs = HashMap::from([("a".to_string(), 9u64)]);
        let headers = outbox.restore(restored, &seqs).unwrap();
        assert_eq!(headers.len(), 1);
        assert!(headers[0].job.payload.is_empty(), "headers for the dispatcher");
        let a: Vec<(u64, String)> =
            outbox.device_jobs("a").unwrap().into_iter().map(|s| (s.job.seq, s.job.message_id)).collect();
        assert_eq!(a, [(7, "m7".to_string())], "the log's queue, not the local one");
        assert_eq!(outbox.device_jobs("a").unwrap()[0].job.payload, logged.payload, "whole, payload included");
        // The device's next job follows the log's last seq.
        let next =
            outbox.accept(None, vec![("a".into(), job("m10", EffectKind::PrintReceipt, "c2"))], &src, 0).unwrap();
        assert_eq!(next[0].stored.job.seq, 10);
        assert_eq!(outbox.forget_devices(["a"]).unwrap(), 2);
        assert!(outbox.device_jobs("a").unwrap().is_empty());
        assert_eq!(outbox.forget_all().unwrap(), 1, "b's job");
        assert!(outbox.pending().unwrap().is_empty());
        // The dedupe window went with the queues: b's job, read again, is queued again.
        let again =
            outbox.accept(None, vec![("b".into(), job("b1", EffectKind::PrintReceipt, "c9"))], &src, 0).unwrap();
        assert_eq!(again.len(), 1, "queued again after forget_all");
    }

    #[test]
    fn a_job_forgotten_is_no_copy_when_read_again() {
        let (_dir, outbox) = temp_outbox("moves-forget-jobs");
        let src = SourceRef::unknown();
        let q = outbox.accept(None, vec![("a".into(), job("m1", EffectKind::PrintReceipt, "c1"))], &src, 0).unwrap();
        let seq = q[0].stored.job.seq;
        assert!(
            outbox
                .accept(None, vec![("a".into(), job("m1", EffectKind::PrintReceipt, "c1"))], &src, 0)
                .unwrap()
                .is_empty(),
            "a copy"
        );
        outbox.forget_jobs(&[("a".into(), seq, 0, "m1".into())]).unwrap();
        assert!(outbox.device_jobs("a").unwrap().is_empty());
        let again =
            outbox.accept(None, vec![("a".into(), job("m1", EffectKind::PrintReceipt, "c1"))], &src, 0).unwrap();
        assert_eq!(again.len(), 1, "read again after being forgotten: queued");
    }
}
