//! The records of the central shape's delivery log (`cluster.delivery_log_topic`,
//! `pixgate.delivery-log`, `docs/cluster.md` "Accepting a job"): one partition per
//! device-jobs partition, written by the partition's owner, read in full by the next owner
//! so that it rebuilds the queues of the partition's devices.
//!
//! | key | value |
//! |---|---|
//! | `job/{device}/{seq}@{epoch}` | a job accepted into its device's queue under owner epoch `epoch` ([`LoggedJob`], JSON, with that epoch); a null value (tombstone) once it ended: done, superseded, expired or dead-lettered |
//! | `seq/{device}` | the last `seq` given to a job of the device: `{seq}@{epoch}` |
//! | `pos` | the next device-jobs offset of the partition whose jobs are not yet in the log: `{offset}@{epoch}` |
//! | `owner/{epoch}/{take}` | a replica's claim of the partition (its name); never deleted |
//!
//! Keys are compacted: only a key's last record matters, so [`fold`] reads the log as a
//! map. Every record is produced to an explicit partition number, never hashed by key.
//!
//! **Owners.** A replica that takes the partition reads the log to its end, appends an
//! owner record of the next epoch and reads on to it: the first claim of an epoch wins, a
//! later one of the same epoch lost. Every other value carries its writer's epoch; one
//! whose epoch is below the owner's when it is read was written by a replica that had lost
//! the partition without knowing (frozen while the group gave the partition away) and is
//! left out (`docs/cluster.md`, "Fencing").
//!
//! A job's key carries the epoch it was accepted under, so a job a stale replica accepted
//! and the one the owner accepted with the same `seq` are two keys, and a stale replica's
//! tombstone can only end a job of its own epoch or an earlier one: a job it was given too,
//! whose end it saw (its device acknowledged it, or it was superseded or expired), so the
//! tombstone is applied whoever wrote it. Tombstones need no header: a broker that charges
//! for headers (tansu 0.6.0 scans its whole header table for every record it serves) is
//! spared one per job. Logs written before keys carried the epoch (`job/{device}/{seq}`)
//! are still read: their tombstones carry the writer's epoch in the [`EPOCH_HEADER`]
//! header, a stale one is left out, one without a readable header is applied.

use crate::model::{SourceRef, StoredJob};
use device_protocol::Job;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The version of [`LoggedJob`] this build writes and reads.
pub const LOGGED_JOB_VERSION: u32 = 1;

/// A job accepted by the deliver stage, as the log keeps it: the job whole (payload and
/// `seq` included) and the change event it was planned from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoggedJob {
    /// [`LOGGED_JOB_VERSION`].
    pub v: u32,
    /// The device.
    pub device: String,
    /// The job, `seq` given, payload included.
    pub job: Job,
    /// The change event it was planned from.
    pub source: SourceRef,
    /// The owner epoch it was written under.
    #[serde(default)]
    pub epoch: u64,
}

/// A `seq/` or `pos` value: `number@epoch`.
pub fn numbered(number: impl std::fmt::Display, epoch: u64) -> String {
    format!("{number}@{epoch}")
}

/// The key of `device`'s job `seq`, accepted under owner epoch `epoch`.
pub fn job_key(device: &str, seq: u64, epoch: u64) -> String {
    format!("job/{device}/{seq}@{epoch}")
}

/// The key of `device`'s job `seq` in a log written before keys carried the epoch (its
/// tombstone carries the [`EPOCH_HEADER`] header).
pub fn legacy_job_key(device: &str, seq: u64) -> String {
    format!("job/{device}/{seq}")
}

/// The key of `device`'s last `seq`.
pub fn seq_key(device: &str) -> String {
    format!("seq/{device}")
}

/// The key of the partition's read position on the device-jobs topic.
pub const POS_KEY: &str = "pos";

/// The Kafka header carrying the owner epoch a tombstone of a [`legacy_job_key`] was
/// written under (decimal).
pub const EPOCH_HEADER: &str = "pixgate-owner-epoch";

/// The key of a claim of epoch `epoch` by the take `take` (unique per claim).
pub fn owner_key(epoch: u64, take: &str) -> String {
    format!("owner/{epoch}/{take}")
}

/// A partition's owner: the first claim of the highest epoch in its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Grows by one per claim that wins.
    pub epoch: u64,
    /// The claim's own id (`{replica}.{pid}.{n}`).
    pub take: String,
    /// The replica that claimed (the record's value).
    pub replica: String,
}

/// What a partition's log holds once read to its end.
#[derive(Debug, Default, PartialEq)]
pub struct Restored {
    /// The jobs not ended, by device then `seq` (each device's delivery order).
    pub jobs: Vec<StoredJob>,
    /// Each device's last `seq` (also of devices with no job left).
    pub seqs: HashMap<String, u64>,
    /// Where to read the device-jobs partition from: its records below are in the log.
    /// `None` when nothing was logged.
    pub pos: Option<i64>,
    /// The epoch in each restored job's key, by (device, `seq`); absent for a
    /// [`legacy_job_key`]. Its tombstone needs the same key.
    pub key_epochs: HashMap<(String, u64), u64>,
    /// Message ids of the jobs the previous owner accepted and ended after this claim, read
    /// by [`Restored::late_record`]: it delivered them while it had not yet heard of the
    /// claim, so when their device-jobs records are read again they are left out.
    pub done_late: HashSet<String>,
    /// Jobs the previous owner accepted after this claim, by (device, `seq`, epoch), with
    /// their message ids, until their ends are read.
    late_jobs: HashMap<(String, u64, u64), String>,
    /// Records that could not be read (key and why): logged by the reader, never fatal,
    /// since a job left out is sent again from the device-jobs topic or was ended.
    pub unreadable: Vec<(String, String)>,
    /// The owner when the log was read (`None`: never claimed).
    pub owner: Option<Owner>,
    /// Records left out because a replica wrote them after it had lost the partition.
    pub stale: u64,
}

/// Folds a partition's records (key, value, epoch header; `None` value = tombstone), in
/// log order, into what they leave: the last valid record of a key wins ([`Folder`]).
pub fn fold<'a>(records: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>, Option<u64>)>) -> Restored {
    let mut f = Folder::default();
    for (key, value, epoch) in records {
        f.push(key, value, epoch);
    }
    f.finish()
}

/// Reads a partition's records one at a time, in log order, so that a reader can read on
/// past where it stopped (to its own owner record, `docs/cluster.md` "Fencing").
#[derive(Debug, Default)]
pub struct Folder {
    out: Restored,
    /// The jobs not ended, each with the epoch in its key (`None`: a legacy key).
    jobs: BTreeMap<(String, u64), (StoredJob, Option<u64>)>,
}

impl Folder {
    /// The owner as of the records pushed so far.
    pub fn owner(&self) -> Option<&Owner> {
        self.out.owner.as_ref()
    }

    /// Adds the next record: `header` is its [`EPOCH_HEADER`], read for a tombstone of a
    /// [`legacy_job_key`] only (`None`: absent or unreadable).
    pub fn push(&mut self, key: &[u8], value: Option<&[u8]>, header: Option<u64>) {
        let out = &mut self.out;
        let key = String::from_utf8_lossy(key);
        if let Some(rest) = key.strip_prefix("owner/") {
            let Some((epoch, take)) = rest.split_once('/').and_then(|(e, t)| Some((e.parse::<u64>().ok()?, t))) else {
                out.unreadable.push((key.to_string(), "not owner/{epoch}/{take}".into()));
                return;
            };
            // The first claim of a higher epoch wins; a later claim of the same epoch lost.
            if out.owner.as_ref().is_none_or(|o| epoch > o.epoch) {
                let replica = value.map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default();
                out.owner = Some(Owner { epoch, take: take.to_string(), replica });
            }
            return;
        }
        let current = out.owner.as_ref().map_or(0, |o| o.epoch);
        let stale = |epoch: u64| epoch < current;
        if key == POS_KEY {
            match value.and_then(parse_numbered) {
                Some((_, epoch)) if stale(epoch) => out.stale += 1,
                Some((pos, _)) => out.pos = Some(pos as i64),
                None => out.unreadable.push((key.to_string(), "not {offset}@{epoch}".into())),
            }
        } else if let Some(device) = key.strip_prefix("seq/") {
            match value.and_then(parse_numbered) {
                Some((_, epoch)) if stale(epoch) => out.stale += 1,
                Some((seq, _)) => {
                    out.seqs.insert(device.to_string(), seq);
                }
                None => out.unreadable.push((key.to_string(), "not {seq}@{epoch}".into())),
            }
        } else if key.starts_with("job/") {
            let Some((device, seq, key_epoch)) = parse_job_key(&key) else {
                out.unreadable.push((key.to_string(), "not job/{device}/{seq}@{epoch}".into()));
                return;
            };
            let id = (device.to_string(), seq);
            let Some(value) = value else {
                match key_epoch {
                    // Only the job of that key: another epoch's job of the same seq stays.
                    Some(_) => {
                        if self.jobs.get(&id).is_some_and(|(_, e)| *e == key_epoch) {
                            self.jobs.remove(&id);
                        }
                    }
                    None if header.is_some_and(stale) => out.stale += 1,
                    None => {
                        self.jobs.remove(&id);
                    }
                }
                return;
            };
            match serde_json::from_slice::<LoggedJob>(value) {
                Ok(l) if stale(l.epoch) => out.stale += 1,
                Ok(l)
                    if l.v == LOGGED_JOB_VERSION
                        && l.device == device
                        && l.job.seq == seq
                        && key_epoch.is_none_or(|e| e == l.epoch) =>
                {
                    self.jobs.insert(id, (StoredJob { device: l.device, job: l.job, source: l.source }, key_epoch));
                }
                Ok(l) => out.unreadable.push((key.to_string(), format!("version {} or key not its job", l.v))),
                Err(e) => out.unreadable.push((key.to_string(), e.to_string())),
            }
        } else {
            out.unreadable.push((key.to_string(), "unknown key".into()));
        }
    }

    /// What the records pushed leave.
    pub fn finish(self) -> Restored {
        let mut out = self.out;
        for ((device, seq), (_, key_epoch)) in &self.jobs {
            let last = out.seqs.entry(device.clone()).or_default();
            *last = (*last).max(*seq);
            if let Some(e) = key_epoch {
                out.key_epochs.insert((device.clone(), *seq), *e);
            }
        }
        out.jobs = self.jobs.into_values().map(|(job, _)| job).collect();
        out
    }
}

impl Restored {
    /// A record read after the claim that produced this, written by the previous owner
    /// before it heard of the claim (it delivered on meanwhile). A tombstone only ends a
    /// job of its writer's epoch or an earlier one, whose end it saw, so:
    /// - a tombstone of a job this holds under the same key (`job/{device}/{seq}@{epoch}`)
    ///   ends it here too: it is not sent again;
    /// - a job it accepted after the claim and then ended was delivered: its message id
    ///   goes to [`Restored::done_late`], so that its device-jobs record, read again, is
    ///   left out; and since the device may have carried out jobs with the `seq`s it gave
    ///   after the claim, the device's counter moves past them ([`Restored::seqs`]), so
    ///   that the jobs queued here again never go back in `seq`.
    ///
    /// Returns the restored job ended, by (device, `seq`); anything else changes no queue.
    pub fn late_record(&mut self, key: &[u8], value: Option<&[u8]>) -> Option<(String, u64)> {
        let (device, seq, Some(epoch)) = parse_job_key(std::str::from_utf8(key).ok()?)? else { return None };
        let Some(value) = value else {
            let id = (device.to_string(), seq);
            if self.key_epochs.get(&id) == Some(&epoch) {
                self.key_epochs.remove(&id);
                self.jobs.retain(|j| !(j.device == id.0 && j.job.seq == seq));
                return Some(id);
            }
            if let Some(message_id) = self.late_jobs.remove(&(device.to_string(), seq, epoch)) {
                self.done_late.insert(message_id);
            }
            return None;
        };
        let mine = self.owner.as_ref().map_or(0, |o| o.epoch);
        if let Ok(l) = serde_json::from_slice::<LoggedJob>(value) {
            if l.epoch == epoch && epoch < mine && l.device == device && l.job.seq == seq {
                self.late_jobs.insert((device.to_string(), seq, epoch), l.job.message_id);
                let last = self.seqs.entry(device.to_string()).or_default();
                *last = (*last).max(seq);
            }
        }
        None
    }
}

/// `number@epoch` (see [`numbered`]).
/// A job's key: `job/{device}/{seq}@{epoch}` ([`job_key`]) as (device, seq, epoch), or
/// [`legacy_job_key`]'s `job/{device}/{seq}` with no epoch; `None` for anything else.
fn parse_job_key(key: &str) -> Option<(&str, u64, Option<u64>)> {
    let (device, rest) = key.strip_prefix("job/")?.rsplit_once('/')?;
    Some(match rest.split_once('@') {
        Some((seq, epoch)) => (device, seq.parse().ok()?, Some(epoch.parse().ok()?)),
        None => (device, rest.parse().ok()?, None),
    })
}

fn parse_numbered(v: &[u8]) -> Option<(u64, u64)> {
    let (n, e) = std::str::from_utf8(v).ok()?.split_once('@')?;
    Some((n.parse().ok()?, e.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use device_protocol::EffectKind;

    fn logged(device: &str, seq: u64, id: &str) -> Vec<u8> {
        logged_in(device, seq, id, 0)
    }

    fn logged_in(device: &str, seq: u64, id: &str, epoch: u64) -> Vec<u8> {
        let mut job = crate::test_fixtures::job(id, EffectKind::PrintReceipt, "c1");
        job.seq = seq;
        let source = SourceRef { topic: "charge.upserted".into(), partition: 0, offset: 3, key: None };
        serde_json::to_vec(&LoggedJob { v: LOGGED_JOB_VERSION, device: device.into(), job, source, epoch }).unwrap()
    }

    fn n(number: u64, epoch: u64) -> Option<Vec<u8>> {
        Some(numbered(number, epoch).into_bytes())
    }

    #[test]
    fn the_last_record_of_a_key_wins_and_an_ended_job_is_gone() {
        let (a1, a2, b7) = (logged("a", 1, "m1"), logged("a", 2, "m2"), logged("b/x", 7, "m7"));
        let records: Vec<(String, Option<Vec<u8>>)> = vec![
            (legacy_job_key("a", 1), Some(a1)),
            (seq_key("a"), n(1, 0)),
            (legacy_job_key("b/x", 7), Some(b7)),
            (seq_key("b/x"), n(7, 0)),
            (POS_KEY.into(), n(10, 0)),
            (legacy_job_key("a", 2), Some(a2)),
            (seq_key("a"), n(2, 0)),
            (POS_KEY.into(), n(12, 0)),
            (legacy_job_key("a", 1), None),
            (legacy_job_key("b/x", 7), None),
            (legacy_job_key("a", 5), Some(b"{".to_vec())),
            ("what".into(), Some(b"1".to_vec())),
            (seq_key("c"), Some(b"3".to_vec())),
        ];
        let r = fold(records.iter().map(|(k, v)| (k.as_bytes(), v.as_deref(), None)));
        let left: Vec<(&str, u64, &str)> =
            r.jobs.iter().map(|s| (s.device.as_str(), s.job.seq, s.job.message_id.as_str())).collect();
        assert_eq!(left, [("a", 2, "m2")], "a job ended is not restored; the one left keeps its seq");
        assert_eq!(r.jobs[0].job.payload, crate::test_fixtures::job("m2", EffectKind::PrintReceipt, "c1").payload);
        assert_eq!(r.seqs.get("a"), Some(&2));
        assert_eq!(r.seqs.get("b/x"), Some(&7), "a device with no job left keeps its last seq");
        assert_eq!(r.pos, Some(12));
        let bad: Vec<&str> = r.unreadable.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(bad, ["job/a/5", "what", "seq/c"], "a number without its epoch is not read");
    }

    #[test]
    fn the_first_claim_of_an_epoch_wins_and_a_stale_owners_writes_are_left_out() {
        let (a1, a2, a3) = (logged_in("a", 1, "m1", 1), logged_in("a", 2, "m2", 1), logged_in("a", 3, "m3", 1));
        let records: Vec<(String, Option<Vec<u8>>, Option<u64>)> = vec![
            (owner_key(1, "r1.1.0"), Some(b"r1".to_vec()), None),
            (legacy_job_key("a", 1), Some(a1), None),
            (legacy_job_key("a", 2), Some(a2), None),
            (legacy_job_key("b", 1), Some(logged_in("b", 1, "mb1", 1)), None),
            (legacy_job_key("c", 1), Some(logged_in("c", 1, "mc1", 1)), None),
            (seq_key("a"), n(2, 1), None),
            (POS_KEY.into(), n(5, 1), None),
            // r2 claims epoch 2 first; r3's claim of epoch 2 comes later and loses.
            (owner_key(2, "r2.1.0"), Some(b"r2".to_vec()), None),
            (owner_key(2, "r3.1.0"), Some(b"r3".to_vec()), None),
            // r1 wakes: its end of job a/1, its new job a/3, seq and pos are all stale.
            (legacy_job_key("a", 1), None, Some(1)),
            (legacy_job_key("a", 3), Some(a3), None),
            (seq_key("a"), n(3, 1), None),
            (POS_KEY.into(), n(9, 1), None),
            // The owner's own writes count; so does an end whose header cannot be read.
            (legacy_job_key("a", 2), None, Some(2)),
            (legacy_job_key("b", 1), None, None),
            (POS_KEY.into(), n(6, 2), None),
        ];
        let r = fold(records.iter().map(|(k, v, e)| (k.as_bytes(), v.as_deref(), *e)));
        let owner = r.owner.clone().unwrap();
        assert_eq!((owner.epoch, owner.take.as_str(), owner.replica.as_str()), (2, "r2.1.0", "r2"));
        let left: Vec<(&str, u64)> = r.jobs.iter().map(|s| (s.device.as_str(), s.job.seq)).collect();
        assert_eq!(
            left,
            [("a", 1), ("c", 1)],
            "the stale end of a/1 and the stale job a/3 are left out; a/2 and b/1 ended"
        );
        assert_eq!(r.seqs.get("a"), Some(&2));
        assert_eq!(r.pos, Some(6));
        assert_eq!(r.stale, 4);
        assert!(r.unreadable.is_empty(), "{:?}", r.unreadable);
    }

    #[test]
    fn a_job_key_carries_its_epoch_so_a_stale_end_only_ends_a_job_of_its_epoch() {
        let job = |seq, id, epoch| Some(logged_in("a", seq, id, epoch));
        let records: Vec<(String, Option<Vec<u8>>)> = vec![
            (owner_key(1, "r1.1.0"), Some(b"r1".to_vec())),
            (job_key("a", 1, 1), job(1, "m1", 1)),
            (job_key("a", 2, 1), job(2, "m2", 1)),
            (seq_key("a"), n(2, 1)),
            (owner_key(2, "r2.1.0"), Some(b"r2".to_vec())),
            // The owner accepts m3 as a/3; r1, frozen through the claim, accepted m9 as
            // a/3 too and ends it, and ends a/1, which it had been given and saw done.
            (job_key("a", 3, 2), job(3, "m3", 2)),
            (seq_key("a"), n(3, 2)),
            (job_key("a", 3, 1), job(3, "m9", 1)),
            (job_key("a", 3, 1), None),
            (job_key("a", 1, 1), None),
            // The owner ends a/2 under the key it was accepted with; an end of a job never
            // logged changes nothing.
            (job_key("a", 2, 1), None),
            (job_key("a", 4, 2), None),
            // A value whose epoch is not its key's is not read.
            (job_key("a", 5, 2), job(5, "m5", 3)),
        ];
        let r = fold(records.iter().map(|(k, v)| (k.as_bytes(), v.as_deref(), None)));
        let left: Vec<(&str, u64, &str)> =
            r.jobs.iter().map(|s| (s.device.as_str(), s.job.seq, s.job.message_id.as_str())).collect();
        assert_eq!(left, [("a", 3, "m3")], "the stale end of a/3@1 leaves the owner's a/3@2");
        assert_eq!(r.key_epochs, HashMap::from([(("a".to_string(), 3), 2)]));
        assert_eq!(r.seqs.get("a"), Some(&3));
        assert_eq!(r.stale, 1, "r1's job m9");
        let bad: Vec<&str> = r.unreadable.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(bad, ["job/a/5@2"]);
    }

    #[test]
    fn what_the_previous_owner_ended_after_the_claim_is_not_sent_again() {
        let job = |seq, id, epoch| Some(logged_in("a", seq, id, epoch));
        let records: Vec<(String, Option<Vec<u8>>)> = vec![
            (owner_key(1, "r1.1.0"), Some(b"r1".to_vec())),
            (job_key("a", 1, 1), job(1, "m1", 1)),
            (job_key("a", 2, 1), job(2, "m2", 1)),
            (owner_key(2, "r2.1.0"), Some(b"r2".to_vec())),
        ];
        let mut r = fold(records.iter().map(|(k, v)| (k.as_bytes(), v.as_deref(), None)));
        assert_eq!(r.jobs.len(), 2);
        // r1 saw a/1 done after r2's claim.
        assert_eq!(r.late_record(job_key("a", 1, 1).as_bytes(), None), Some(("a".to_string(), 1)));
        // Not a tombstone, another epoch's key, a legacy key, another record: no queue changes.
        assert_eq!(r.late_record(job_key("a", 2, 1).as_bytes(), job(2, "m2", 1).as_deref()), None);
        assert_eq!(r.late_record(job_key("a", 2, 2).as_bytes(), None), None);
        assert_eq!(r.late_record(legacy_job_key("a", 2).as_bytes(), None), None);
        assert_eq!(r.late_record(seq_key("a").as_bytes(), None), None);
        // r1 accepted m3 and m4 after the claim; it ended m3.
        assert_eq!(r.late_record(job_key("a", 3, 1).as_bytes(), job(3, "m3", 1).as_deref()), None);
        assert_eq!(r.late_record(job_key("a", 4, 1).as_bytes(), job(4, "m4", 1).as_deref()), None);
        assert_eq!(r.late_record(job_key("a", 3, 1).as_bytes(), None), None);
        let left: Vec<u64> = r.jobs.iter().map(|j| j.job.seq).collect();
        assert_eq!(left, [2]);
        assert_eq!(r.key_epochs, HashMap::from([(("a".to_string(), 2), 1)]));
        assert_eq!(r.done_late, HashSet::from(["m3".to_string()]), "m4 is not done: its record is queued again");
        assert_eq!(r.seqs.get("a"), Some(&4), "the counter past what r1 gave after the claim");
    }

    #[test]
    fn an_empty_log_restores_nothing() {
        assert_eq!(fold(std::iter::empty()), Restored::default());
    }
}
