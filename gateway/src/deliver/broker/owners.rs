//! Which replica owns each device-jobs partition, and where its CloudPRNT server is: what
//! a replica needs to pass a printer's request to the replica holding the printer's queue
//! (`docs/cluster.md`, "CloudPRNT and Server Direct Print printers").
//!
//! The owner of partition `p` publishes an [`OwnerRecord`], retained at QoS 1, to
//! `pixgate/v1/partitions/{p}/owner` on that partition's own connection, at each CONNACK:
//! a connection the broker took over (the fence) can no longer publish, so the retained
//! record is the last owner's to have connected. Every replica's acks connection subscribes
//! to `pixgate/v1/partitions/+/owner` and keeps the records here.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// The filter the acks connection subscribes to.
pub const OWNER_FILTER: &str = "pixgate/v1/partitions/+/owner";

/// The topic of `partition`'s owner record.
pub fn owner_topic(partition: i32) -> String {
    format!("pixgate/v1/partitions/{partition}/owner")
}

/// The partition an owner topic names; `None` for any other topic.
pub fn partition_of_topic(topic: &str) -> Option<i32> {
    topic.strip_prefix("pixgate/v1/partitions/")?.strip_suffix("/owner")?.parse().ok()
}

/// A partition owner's record (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRecord {
    /// The replica's name: its group instance id (`kafka.instance_id`), else its host name
    /// and process id.
    pub replica: String,
    /// Its CloudPRNT server's base URL as the other replicas reach it
    /// (`cloudprnt.advertise`, e.g. `https://10.0.0.5:8443`).
    pub cloudprnt: String,
}

/// The last owner record seen per partition.
#[derive(Debug, Default)]
pub struct Owners {
    by_partition: Mutex<HashMap<i32, OwnerRecord>>,
}

impl Owners {
    /// Records `payload`, published on `topic` (an empty payload clears the partition).
    ///
    /// # Errors
    /// The topic is not an owner topic, or the payload not an [`OwnerRecord`].
    pub fn record(&self, topic: &str, payload: &[u8]) -> Result<(), String> {
        let p = partition_of_topic(topic).ok_or_else(|| format!("{topic} is not an owner topic"))?;
        let mut map = self.by_partition.lock().unwrap_or_else(PoisonError::into_inner);
        if payload.is_empty() {
            map.remove(&p);
            return Ok(());
        }
        let record: OwnerRecord = serde_json::from_slice(payload).map_err(|e| format!("{topic}: {e}"))?;
        map.insert(p, record);
        Ok(())
    }

    /// `partition`'s owner, as last published.
    pub fn get(&self, partition: i32) -> Option<OwnerRecord> {
        self.by_partition.lock().unwrap_or_else(PoisonError::into_inner).get(&partition).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_record_of_a_partition_counts() {
        let owners = Owners::default();
        let r = |name: &str| OwnerRecord { replica: name.into(), cloudprnt: format!("https://{name}:8443") };
        let t = owner_topic(7);
        assert_eq!(partition_of_topic(&t), Some(7));
        assert_eq!(partition_of_topic("pixgate/v1/devices/x/acks"), None);
        owners.record(&t, &serde_json::to_vec(&r("a")).unwrap()).unwrap();
        owners.record(&t, &serde_json::to_vec(&r("b")).unwrap()).unwrap();
        assert_eq!(owners.get(7), Some(r("b")));
        assert_eq!(owners.get(6), None);
        assert!(owners.record(&t, b"{").is_err());
        assert_eq!(owners.get(7), Some(r("b")), "a malformed record changes nothing");
        owners.record(&t, b"").unwrap();
        assert_eq!(owners.get(7), None);
    }
}
