//! One partition of one of pixgate's own log topics (the delivery log, the route
//! changelog) read outside any consumer group (assign), from a position to an end, in
//! reads that resume.
//!
//! A read that times out keeps its consumer, its assignment and its position, so the next
//! try goes on from the record after the last one read, with the fetch librdkafka has in
//! flight, rather than from the start with a new client. A broker slow enough to time one
//! read out then costs a take more tries, not every try: assigning again throws away the
//! fetch in flight, and on a broker that answers each fetch in more than the timeout a
//! take read from the start at every try never ends.

use crate::kafka_client;
use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// A reader of `topic`/`partition` (blocking calls: run it on a blocking thread).
pub(crate) struct PartitionReader {
    brokers: String,
    group: String,
    topic: String,
    partition: i32,
    /// Created at the first read.
    consumer: Option<BaseConsumer>,
    /// The next offset to read.
    next: i64,
    /// Whether the consumer is assigned and its records come in order from `next`.
    positioned: bool,
}

impl PartitionReader {
    /// A reader of `topic`/`partition` on `brokers` from offset 0 (or the log start, if
    /// later); `group` is the `group.id` librdkafka is given (it never joins nor commits).
    pub(crate) fn new(brokers: &str, group: &str, topic: &str, partition: i32) -> PartitionReader {
        PartitionReader {
            brokers: brokers.to_string(),
            group: group.to_string(),
            topic: topic.to_string(),
            partition,
            consumer: None,
            next: 0,
            positioned: false,
        }
    }

    /// The reader from `offset` on.
    pub(crate) fn starting_at(mut self, offset: i64) -> PartitionReader {
        self.next = offset;
        self.positioned = false;
        self
    }

    fn consumer(&mut self) -> anyhow::Result<&BaseConsumer> {
        if self.consumer.is_none() {
            let c: BaseConsumer = kafka_client::client(&self.brokers)
                .set("group.id", &self.group)
                .set("enable.auto.commit", "false")
                .set("enable.auto.offset.store", "false")
                .set("enable.partition.eof", "false")
                .create()
                .with_context(|| format!("creating a reader of {}", self.topic))?;
            self.consumer = Some(c);
        }
        Ok(self.consumer.as_ref().expect("just created"))
    }

    /// The partition's end offset now (exclusive); moves the reader past what retention
    /// or compaction removed from the log's start.
    ///
    /// # Errors
    /// Kafka did not answer within `timeout`.
    pub(crate) fn end(&mut self, timeout: Duration) -> anyhow::Result<i64> {
        let (topic, partition) = (self.topic.clone(), self.partition);
        let (low, end) = self
            .consumer()?
            .fetch_watermarks(&topic, partition, timeout)
            .with_context(|| format!("the ends of {topic}/{partition}"))?;
        if low > self.next {
            self.next = low;
            self.positioned = false;
        }
        Ok(end)
    }

    /// Calls `each` with every record from the reader's position up to `end` (exclusive),
    /// in offset order; waits at most `timeout` for each record. A read that fails leaves
    /// the reader where it got to: called again, it goes on from there.
    ///
    /// # Errors
    /// No record came within `timeout` (the reader stays assigned: its fetch goes on), or
    /// librdkafka reported an error (the next read assigns again).
    pub(crate) fn scan_to(
        &mut self,
        end: i64,
        timeout: Duration,
        mut each: impl FnMut(&BorrowedMessage<'_>),
    ) -> anyhow::Result<()> {
        if self.next >= end {
            return Ok(());
        }
        self.consumer()?;
        let PartitionReader { topic, partition, consumer, next, positioned, .. } = self;
        let consumer = consumer.as_ref().expect("created above");
        if !*positioned {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, *partition, Offset::Offset(*next)).context("an assignment")?;
            consumer.assign(&tpl).with_context(|| format!("reading {topic}/{partition}"))?;
            *positioned = true;
        }
        let mut last = Instant::now();
        while *next < end {
            match consumer.poll(Duration::from_millis(200)) {
                // Below the position only if librdkafka fetched again from before it.
                Some(Ok(m)) if m.offset() < *next => {}
                Some(Ok(m)) => {
                    *next = m.offset() + 1;
                    last = Instant::now();
                    each(&m);
                }
                Some(Err(e)) => {
                    *positioned = false;
                    return Err(e).with_context(|| format!("reading {topic}/{partition} at offset {next}"));
                }
                None if last.elapsed() > timeout => {
                    anyhow::bail!("{topic}/{partition}: no record for {timeout:?} at offset {next}, end {end}")
                }
                None => {}
            }
        }
        Ok(())
    }
}

impl Drop for PartitionReader {
    /// Closing a librdkafka client can block (while Kafka is unreachable): off the async
    /// threads when there are some.
    fn drop(&mut self) {
        if let (Some(c), Ok(rt)) = (self.consumer.take(), tokio::runtime::Handle::try_current()) {
            drop(rt.spawn_blocking(move || drop(c)));
        }
    }
}
