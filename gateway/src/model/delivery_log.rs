//! The records of the central shape's delivery log (`cluster.delivery_log_topic`,
//! `pixgate.delivery-log`, `docs/cluster.md` "Accepting a job"): one partition per
//! device-jobs partition, written by the partition's owner, read in full by the next owner
//! so that it rebuilds the queues of the partition's devices.
//!
//! | key | value |
//! |---|---|
//! | `job/{device}/{seq}` | a job accepted into its device's queue ([`LoggedJob`], JSON); a null value (tombstone) once it ended: done, superseded, expired or dead-lettered |
//! | `seq/{device}` | the last `seq` given to a job of the device (decimal) |
//! | `pos` | the next device-jobs offset of the partition whose jobs are not yet in the log (decimal) |
//!
//! Keys are compacted: only a key's last record matters, so [`fold`] reads the log as a
//! map. Every record is produced to an explicit partition number, never hashed by key.

use crate::model::{SourceRef, StoredJob};
use device_protocol::Job;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

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
}

/// The key of `device`'s job `seq`.
pub fn job_key(device: &str, seq: u64) -> String {
    format!("job/{device}/{seq}")
}

/// The key of `device`'s last `seq`.
pub fn seq_key(device: &str) -> String {
    format!("seq/{device}")
}

/// The key of the partition's read position on the device-jobs topic.
pub const POS_KEY: &str = "pos";

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
    /// Records that could not be read (key and why): logged by the reader, never fatal,
    /// since a job left out is sent again from the device-jobs topic or was ended.
    pub unreadable: Vec<(String, String)>,
}

/// Folds a partition's records (key, value; `None` = tombstone), in log order, into what
/// they leave: the last record of a key wins.
pub fn fold<'a>(records: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>) -> Restored {
    let mut out = Restored::default();
    let mut jobs: BTreeMap<(String, u64), StoredJob> = BTreeMap::new();
    for (key, value) in records {
        let key = String::from_utf8_lossy(key);
        if key == POS_KEY {
            match value.map(parse_number) {
                Some(Some(pos)) => out.pos = Some(pos as i64),
                _ => out.unreadable.push((key.to_string(), "not a number".into())),
            }
        } else if let Some(device) = key.strip_prefix("seq/") {
            match value.map(parse_number) {
                Some(Some(seq)) => {
                    out.seqs.insert(device.to_string(), seq);
                }
                _ => out.unreadable.push((key.to_string(), "not a number".into())),
            }
        } else if let Some(rest) = key.strip_prefix("job/") {
            let Some((device, seq)) = rest.rsplit_once('/').and_then(|(d, s)| Some((d, s.parse::<u64>().ok()?))) else {
                out.unreadable.push((key.to_string(), "not job/{device}/{seq}".into()));
                continue;
            };
            let Some(value) = value else {
                jobs.remove(&(device.to_string(), seq));
                continue;
            };
            match serde_json::from_slice::<LoggedJob>(value) {
                Ok(l) if l.v == LOGGED_JOB_VERSION && l.device == device && l.job.seq == seq => {
                    jobs.insert(
                        (device.to_string(), seq),
                        StoredJob { device: l.device, job: l.job, source: l.source },
                    );
                }
                Ok(l) => out.unreadable.push((key.to_string(), format!("version {} or key not its job", l.v))),
                Err(e) => out.unreadable.push((key.to_string(), e.to_string())),
            }
        } else {
            out.unreadable.push((key.to_string(), "unknown key".into()));
        }
    }
    for (device, seq) in jobs.keys() {
        let last = out.seqs.entry(device.clone()).or_default();
        *last = (*last).max(*seq);
    }
    out.jobs = jobs.into_values().collect();
    out
}

fn parse_number(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use device_protocol::EffectKind;

    fn logged(device: &str, seq: u64, id: &str) -> Vec<u8> {
        let mut job = crate::test_fixtures::job(id, EffectKind::PrintReceipt, "c1");
        job.seq = seq;
        let source = SourceRef { topic: "charge.upserted".into(), partition: 0, offset: 3, key: None };
        serde_json::to_vec(&LoggedJob { v: LOGGED_JOB_VERSION, device: device.into(), job, source }).unwrap()
    }

    #[test]
    fn the_last_record_of_a_key_wins_and_an_ended_job_is_gone() {
        let (a1, a2, b7) = (logged("a", 1, "m1"), logged("a", 2, "m2"), logged("b/x", 7, "m7"));
        let records: Vec<(String, Option<Vec<u8>>)> = vec![
            (job_key("a", 1), Some(a1)),
            (seq_key("a"), Some(b"1".to_vec())),
            (job_key("b/x", 7), Some(b7)),
            (seq_key("b/x"), Some(b"7".to_vec())),
            (POS_KEY.into(), Some(b"10".to_vec())),
            (job_key("a", 2), Some(a2)),
            (seq_key("a"), Some(b"2".to_vec())),
            (POS_KEY.into(), Some(b"12".to_vec())),
            (job_key("a", 1), None),
            (job_key("b/x", 7), None),
            (job_key("a", 5), Some(b"{".to_vec())),
            ("what".into(), Some(b"1".to_vec())),
        ];
        let r = fold(records.iter().map(|(k, v)| (k.as_bytes(), v.as_deref())));
        let left: Vec<(&str, u64, &str)> =
            r.jobs.iter().map(|s| (s.device.as_str(), s.job.seq, s.job.message_id.as_str())).collect();
        assert_eq!(left, [("a", 2, "m2")], "a job ended is not restored; the one left keeps its seq");
        assert_eq!(r.jobs[0].job.payload, crate::test_fixtures::job("m2", EffectKind::PrintReceipt, "c1").payload);
        assert_eq!(r.seqs.get("a"), Some(&2));
        assert_eq!(r.seqs.get("b/x"), Some(&7), "a device with no job left keeps its last seq");
        assert_eq!(r.pos, Some(12));
        let bad: Vec<&str> = r.unreadable.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(bad, ["job/a/5", "what"]);
    }

    #[test]
    fn an_empty_log_restores_nothing() {
        assert_eq!(fold(std::iter::empty()), Restored::default());
    }
}
