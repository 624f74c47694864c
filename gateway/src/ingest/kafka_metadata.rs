//! Questions to Kafka's metadata that several parts ask.

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
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
