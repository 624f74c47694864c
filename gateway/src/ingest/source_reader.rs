//! Single records read back from Kafka by their position: a dead letter's source record
//! (for the dead-letter publisher, which keeps positions rather than bytes), a record-level
//! dead letter routed again, a partition whose consume errors must be located.

use crate::kafka_client;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;

/// What [`SourceReader::read`] found at a position.
#[derive(Debug, PartialEq, Eq)]
pub enum SourceRecord {
    /// The record's value.
    Value(Vec<u8>),
    /// Kafka no longer has it (retention, compaction), or never had it: why.
    Gone(String),
}

/// Reads single records back from Kafka by topic, partition and offset: an assign-only
/// consumer (no group join, nothing committed) with `auto.offset.reset=error`, so a
/// position Kafka no longer holds is an answer, not a jump to another record.
pub struct SourceReader {
    consumer: BaseConsumer,
}

impl SourceReader {
    /// A reader on `brokers`.
    ///
    /// # Errors
    /// Invalid consumer configuration.
    pub fn new(brokers: &str) -> anyhow::Result<Self> {
        let consumer = kafka_client::client(brokers)
            // Required by librdkafka; this consumer never joins the group nor commits.
            .set("group.id", "pixgate-deadletter-source")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "true")
            .create()?;
        Ok(SourceReader { consumer })
    }

    /// The record at `topic`/`partition`/`offset`, waiting at most `timeout` (blocking).
    ///
    /// # Errors
    /// Kafka did not answer within `timeout`, or answered with another error: try again.
    pub fn read(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        timeout: Duration,
    ) -> Result<SourceRecord, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
        self.consumer.assign(&tpl)?;
        let deadline = std::time::Instant::now() + timeout;
        let found = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break Err(KafkaError::MessageConsumption(RDKafkaErrorCode::RequestTimedOut));
            }
            match self.consumer.poll(left.min(Duration::from_millis(200))) {
                None => {}
                Some(Ok(m)) if m.topic() == topic && m.partition() == partition && m.offset() == offset => {
                    break Ok(SourceRecord::Value(m.payload().unwrap_or_default().to_vec()));
                }
                Some(Ok(m)) if m.topic() == topic && m.partition() == partition && m.offset() > offset => {
                    break Ok(SourceRecord::Gone(format!(
                        "Kafka has no record at offset {offset} any more (the next is {})",
                        m.offset()
                    )));
                }
                Some(Ok(_)) => {}
                Some(Err(KafkaError::PartitionEOF(_))) => {
                    break Ok(SourceRecord::Gone(format!("offset {offset} is past the end of {topic}/{partition}")))
                }
                Some(Err(e))
                    if matches!(
                        e.rdkafka_error_code(),
                        Some(RDKafkaErrorCode::OffsetOutOfRange | RDKafkaErrorCode::AutoOffsetReset)
                    ) =>
                {
                    break Ok(SourceRecord::Gone(format!(
                        "Kafka no longer has offset {offset} of {topic}/{partition} (retention): {e}"
                    )));
                }
                Some(Err(e)) => break Err(e),
            }
        };
        let _ = self.consumer.unassign();
        found
    }
}
