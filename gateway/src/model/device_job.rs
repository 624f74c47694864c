//! A job between the central shape's two stages: one record of `cluster.device_jobs_topic`
//! (`pixgate.device-jobs`), key = device id, value = [`DeviceJobRecord`] as JSON
//! (`docs/cluster.md`, "The route stage").

use crate::model::SourceRef;
use device_protocol::Job;
use serde::{Deserialize, Serialize};

/// The version of [`DeviceJobRecord`] this build writes and reads.
pub const DEVICE_JOB_VERSION: u32 = 1;

/// A job as the route stage produced it: everything the deliver stage needs to queue it,
/// in the value (not in headers: tansu 0.6.0 can return wrong headers after compaction).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceJobRecord {
    /// [`DEVICE_JOB_VERSION`].
    pub v: u32,
    /// The device the job is for (also the record key).
    pub device: String,
    /// The job as its device will receive it, but `seq` 0: the deliver stage gives it the
    /// device's next `seq` when it queues it.
    pub job: Job,
    /// The change event the job was planned from (dead letters and `pixgate outbox` name
    /// it; its value is read back from there).
    pub source: SourceRef,
    /// The change event's `clusterTime` packed as `t << 32 | i` (0 when unknown): with the
    /// message id, the job's key in the deliver stage's dedupe window.
    pub event_time: u64,
    /// The change event's event time, Unix seconds: the reconciliation window its job
    /// counts in when it leaves its queue.
    pub event_time_s: u64,
}

impl DeviceJobRecord {
    /// The record's value: JSON.
    ///
    /// # Panics
    /// Never: every field serialises.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a device job record serialises")
    }

    /// Reads a record's value.
    ///
    /// # Errors
    /// Not JSON, a field missing or of the wrong type (`serde_json`'s message says which),
    /// or another version than [`DEVICE_JOB_VERSION`].
    pub fn decode(value: &[u8]) -> Result<DeviceJobRecord, String> {
        let r: DeviceJobRecord = serde_json::from_slice(value).map_err(|e| e.to_string())?;
        if r.v != DEVICE_JOB_VERSION {
            return Err(format!("version {} (this pixgate reads {DEVICE_JOB_VERSION})", r.v));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use device_protocol::EffectKind;

    #[test]
    fn a_record_reads_back_as_written_and_another_version_is_refused() {
        let r = DeviceJobRecord {
            v: DEVICE_JOB_VERSION,
            device: "p1".into(),
            job: crate::test_fixtures::job("m1", EffectKind::PrintReceipt, "c1"),
            source: SourceRef { topic: "charge.upserted".into(), partition: 2, offset: 7, key: Some("c1".into()) },
            event_time: 5 << 32 | 1,
            event_time_s: 5,
        };
        assert_eq!(DeviceJobRecord::decode(&r.encode()), Ok(r.clone()));
        let mut v2 = serde_json::to_value(&r).unwrap();
        v2["v"] = 2.into();
        let err = DeviceJobRecord::decode(v2.to_string().as_bytes()).unwrap_err();
        assert!(err.contains("version 2"), "{err}");
        assert!(DeviceJobRecord::decode(b"{\"v\":1}").unwrap_err().contains("missing field"));
        assert!(DeviceJobRecord::decode(b"not json").is_err());
    }
}
