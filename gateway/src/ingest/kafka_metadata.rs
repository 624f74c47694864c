//! Questions to Kafka's metadata that several parts ask.

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;

/// Blocking: the partition numbers of `topic` in Kafka's metadata (empty when it has none
/// or does not exist), waiting at most `timeout`.
///
/// # Errors
/// Kafka did not answer the metadata request.
pub fn topic_partitions<C: ConsumerContext, K: Consumer<C>>(
    client: &K,
    topic: &str,
    timeout: Duration,
) -> KafkaResult<Vec<i32>> {
    let md = client.fetch_metadata(Some(topic), timeout)?;
    Ok(md.topics().iter().filter(|t| t.name() == topic).flat_map(|t| t.partitions().iter().map(|p| p.id())).collect())
}

/// One partition as a consumer group stands on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupPosition {
    /// The log start (low watermark).
    pub low: i64,
    /// The consumer group's committed offset, if any.
    pub committed: Option<i64>,
    /// The end (high watermark): one past the last record produced.
    pub end: i64,
}

/// Blocking: `parts` of `topic` as `client`'s consumer group (its `group.id`) stands on
/// them: the group's committed offsets (one OffsetFetch), then each partition's
/// watermarks (ListOffsets), each request waiting at most `timeout`.
///
/// # Errors
/// The request Kafka did not answer: `committed offsets of {topic}: …` or
/// `end offset of {topic}/{p}: …`.
pub fn group_positions<C: ConsumerContext, K: Consumer<C>>(
    client: &K,
    topic: &str,
    parts: &[i32],
    timeout: Duration,
) -> Result<BTreeMap<i32, GroupPosition>, String> {
    let mut tpl = TopicPartitionList::new();
    for p in parts {
        tpl.add_partition(topic, *p);
    }
    let committed = client.committed_offsets(tpl, timeout).map_err(|e| format!("committed offsets of {topic}: {e}"))?;
    let mut out = BTreeMap::new();
    for &p in parts {
        let (low, end) =
            client.fetch_watermarks(topic, p, timeout).map_err(|e| format!("end offset of {topic}/{p}: {e}"))?;
        let committed = match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        };
        out.insert(p, GroupPosition { low, committed, end });
    }
    Ok(out)
}
