//! What the consumer loop asks of its consumer-group member, behind [`GroupReader`]: the next
//! record, an offset stored, a partition paused or resumed or moved to another offset, the
//! assignment, the rebalances since it last looked, the positions, and the final commit. librdkafka's
//! `StreamConsumer` is the implementation that runs ([`GatewayConsumer`]); the loop's unit
//! tests drive it with a fake on paused time.

use crate::ingest::backpressure::Action;
use crate::ingest::rebalance::GatewayConsumer;
use crate::model::Partition;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::OwnedMessage;
use rdkafka::{Offset, TopicPartitionList};
use std::future::Future;
use std::time::Duration;

/// How long [`GroupReader::seek`] waits for librdkafka's fetcher to carry a seek out (a
/// local hand-over between librdkafka's threads, no request to Kafka).
pub const SEEK_TIMEOUT: Duration = Duration::from_secs(2);

/// A consumer-group member as the consumer loop uses it. Every call returns at once except
/// [`GroupReader::recv`], which waits for a record, [`GroupReader::seek`], which waits
/// for librdkafka's fetcher briefly, and [`GroupReader::commit`], which blocks (call it on
/// a blocking thread).
pub trait GroupReader: Send + Sync + 'static {
    /// The next record of the assigned, unpaused partitions, or a consume error. Cancel
    /// safe: the loop selects on it with its other events.
    fn recv(&self) -> impl Future<Output = KafkaResult<OwnedMessage>> + Send + '_;

    /// Stores `next` (the offset after the last record done) for `part`; committed by the
    /// periodic commit (`auto.commit.interval.ms`) or [`GroupReader::commit`].
    ///
    /// # Errors
    /// librdkafka's `__STATE` when `part` is no longer assigned; others as librdkafka says.
    fn store_offset(&self, part: &Partition, next: i64) -> KafkaResult<()>;

    /// Pauses or resumes fetching `part` (the member keeps polling while paused).
    ///
    /// # Errors
    /// As librdkafka says (a partition not assigned).
    fn pause(&self, part: &Partition, action: Action) -> KafkaResult<()>;

    /// Reads `part` on from `offset` (`rd_kafka_seek`, waited for up to [`SEEK_TIMEOUT`]):
    /// the records librdkafka had fetched before are dropped (its version barrier), so
    /// the next record of `part` read is the one at `offset`.
    ///
    /// # Errors
    /// As librdkafka says (a partition not assigned, or the seek not done in time).
    fn seek(&self, part: &Partition, offset: i64) -> KafkaResult<()>;

    /// The partitions assigned now.
    ///
    /// # Errors
    /// As librdkafka says.
    fn assignment(&self) -> KafkaResult<Vec<Partition>>;

    /// The partitions revoked since the last call, when a rebalance happened since (the
    /// list may be empty: only assigned); `None` when none did.
    fn rebalanced(&self) -> Option<Vec<Partition>>;

    /// Each assigned partition with the offset the member will read next (`None`: it has
    /// read nothing there yet).
    ///
    /// # Errors
    /// As librdkafka says.
    fn positions(&self) -> KafkaResult<Vec<(Partition, Option<i64>)>>;

    /// Blocking: commits the stored offsets now (the final commit at shutdown).
    ///
    /// # Errors
    /// `NoOffset` when every stored offset was committed already; others as librdkafka
    /// says (a lost assignment, Kafka out of reach).
    fn commit(&self) -> KafkaResult<()>;
}

fn one(part: &Partition) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&part.0, part.1);
    tpl
}

impl GroupReader for GatewayConsumer {
    async fn recv(&self) -> KafkaResult<OwnedMessage> {
        rdkafka::consumer::StreamConsumer::recv(self).await.map(|m| m.detach())
    }

    fn store_offset(&self, part: &Partition, next: i64) -> KafkaResult<()> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&part.0, part.1, Offset::Offset(next))?;
        self.store_offsets(&tpl)
    }

    fn pause(&self, part: &Partition, action: Action) -> KafkaResult<()> {
        match action {
            Action::Pause => Consumer::pause(self, &one(part)),
            Action::Resume => Consumer::resume(self, &one(part)),
        }
    }

    fn seek(&self, part: &Partition, offset: i64) -> KafkaResult<()> {
        Consumer::seek(self, &part.0, part.1, Offset::Offset(offset), SEEK_TIMEOUT)
    }

    fn assignment(&self) -> KafkaResult<Vec<Partition>> {
        Ok(Consumer::assignment(self)?.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect())
    }

    fn rebalanced(&self) -> Option<Vec<Partition>> {
        self.context().take()
    }

    fn positions(&self) -> KafkaResult<Vec<(Partition, Option<i64>)>> {
        Ok(Consumer::position(self)?
            .elements()
            .iter()
            .map(|e| {
                let at = match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                };
                ((e.topic().to_string(), e.partition()), at)
            })
            .collect())
    }

    fn commit(&self) -> KafkaResult<()> {
        self.commit_consumer_state(CommitMode::Sync)
    }
}
