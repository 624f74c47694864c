//! The dead-letter topic: where a record, or one effect of it, goes when pixgate cannot
//! carry it out, with the reason. Nothing is dropped: a dead letter is first *parked* in
//! the durable outbox (in the same transaction that accepts the record's other effects, or
//! that removes the failed job), which is what lets the record's offset be committed; the
//! [`Publisher`] then writes parked dead letters to Kafka, retrying with backoff for as
//! long as Kafka is unreachable, and marks them published. A crash between the write and
//! the mark publishes it again with the same `id`, and so does a record read again before
//! its offset was committed (the outbox parks a record's dead letters once): a
//! dead-letter consumer can dedupe by `id`.
//!
//! Record layout on `pixgate.deadletter`: key = the source record's key; value = a JSON
//! [`DeadLetter`], which carries the source record's value (as text when it is UTF-8, and
//! always as base64) so it can be inspected and produced again; a job's dead letter
//! (delivery failed, expired) also carries the job. The outbox keeps a job's source
//! position, not the record's bytes (that would cost every accepted record for the rare
//! failed one), so the publisher reads the record back from Kafka by its position
//! ([`SourceReader`]); one that Kafka no longer has (retention) is published without it,
//! saying why (`value_unavailable`).

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use crate::clock::Clock;
use crate::outbox::{Outbox, StoredJob};
use crate::stats::Stats;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// One dead letter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The outbox's id for it (set when parked; the same on a republish after a crash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// Short stable reason (`not_json`, `invalid_brcode`, `unknown_terminal`, …).
    pub reason: String,
    /// Human-readable detail.
    pub detail: String,
    /// Source topic.
    pub source_topic: String,
    /// Source partition.
    pub source_partition: i32,
    /// Source offset.
    pub source_offset: i64,
    /// Device the failed effect was for, if the dead letter is one effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Effect kind, if the dead letter is one effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
    /// The job's message id, if one was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// Source key as text (keys are document ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Source value as text, when it is valid UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Source value, base64; empty only with `value_unavailable` (and, for a job's dead
    /// letter, while parked: the publisher fills it in from Kafka).
    pub value_base64: String,
    /// Why a job's dead letter has no source value: Kafka no longer has the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_unavailable: Option<String>,
    /// For a job's dead letter (delivery failed, expired): the job as its device would
    /// have received it, JSON, payload included (what `pixgate deadletter replay` queues).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

impl DeadLetter {
    /// A dead letter for the record at `topic`/`partition`/`offset` with `key` and `value`.
    pub fn new(reason: &str, detail: String, topic: &str, partition: i32, offset: i64, key: Option<&[u8]>, value: &[u8]) -> Self {
        let mut dl = DeadLetter {
            id: None,
            reason: reason.to_string(),
            detail,
            source_topic: topic.to_string(),
            source_partition: partition,
            source_offset: offset,
            device: None,
            effect: None,
            message_id: None,
            key: key.map(|k| String::from_utf8_lossy(k).into_owned()),
            value: None,
            value_base64: String::new(),
            value_unavailable: None,
            job: None,
        };
        dl.set_value(value);
        dl
    }

    /// Whether this is a job's dead letter still waiting for its source value
    /// ([`SourceReader`]).
    fn needs_source_value(&self) -> bool {
        self.job.is_some() && self.value_base64.is_empty() && self.value_unavailable.is_none() && self.source_offset >= 0
    }

    /// Sets the source value (text when UTF-8, and base64).
    fn set_value(&mut self, value: &[u8]) {
        self.value = std::str::from_utf8(value).ok().map(str::to_string);
        self.value_base64 = B64.encode(value);
    }
}

impl DeadLetter {
    /// A dead letter for a job that was accepted but cannot be carried out (delivery
    /// failed, expired): source position and key from the job's record, `job` = the job;
    /// the source value is read back from Kafka when it is published.
    pub fn for_job(reason: &str, detail: String, stored: &StoredJob) -> Self {
        let src = &stored.source;
        let mut dl = DeadLetter::new(reason, detail, &src.topic, src.partition, src.offset, src.key.as_deref().map(str::as_bytes), &[]);
        dl.value = None;
        dl.job = serde_json::to_string(&stored.job).ok();
        dl.device = Some(stored.device.clone());
        dl.effect = Some(stored.job.kind.as_str().to_string());
        dl.message_id = Some(stored.job.message_id.clone());
        dl
    }
}

/// Writes the outbox's parked dead letters to Kafka (idempotent producer, `acks=all`) and
/// marks them published. One task; wake it with [`Publisher::notifier`] after parking.
pub struct Publisher {
    producer: FutureProducer,
    topic: String,
    outbox: Arc<Outbox>,
    clock: Clock,
    stats: Arc<Stats>,
    wake: Arc<Notify>,
    sources: Arc<SourceReader>,
}

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
        let consumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
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
    pub fn read(&self, topic: &str, partition: i32, offset: i64, timeout: Duration) -> Result<SourceRecord, KafkaError> {
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
                    break Ok(SourceRecord::Gone(format!("Kafka has no record at offset {offset} any more (the next is {})", m.offset())));
                }
                Some(Ok(_)) => {}
                Some(Err(KafkaError::PartitionEOF(_))) => break Ok(SourceRecord::Gone(format!("offset {offset} is past the end of {topic}/{partition}"))),
                Some(Err(e)) if matches!(e.rdkafka_error_code(), Some(RDKafkaErrorCode::OffsetOutOfRange | RDKafkaErrorCode::AutoOffsetReset)) => {
                    break Ok(SourceRecord::Gone(format!("Kafka no longer has offset {offset} of {topic}/{partition} (retention): {e}")));
                }
                Some(Err(e)) => break Err(e),
            }
        };
        let _ = self.consumer.unassign();
        found
    }
}

impl Publisher {
    /// A publisher of `outbox`'s parked dead letters to `topic` on `brokers`.
    ///
    /// # Errors
    /// Invalid producer configuration.
    pub fn new(brokers: &str, topic: &str, outbox: Arc<Outbox>, clock: Clock, stats: Arc<Stats>) -> anyhow::Result<Self> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "30000")
            .create()?;
        let sources = Arc::new(SourceReader::new(brokers)?);
        Ok(Publisher { producer, topic: topic.to_string(), outbox, clock, stats, wake: Arc::new(Notify::new()), sources })
    }

    /// Notify this after parking dead letters so they go out now rather than at the next
    /// periodic check (1 s).
    pub fn notifier(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Publishes until `shutdown` turns true (then returns at once: what is still parked
    /// stays in the outbox for the next start).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut delay = Duration::from_secs(1);
        loop {
            if *shutdown.borrow() {
                return;
            }
            let parked = match tokio::task::block_in_place(|| self.outbox.parked_deadletters(256)) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read parked dead letters; retrying");
                    Vec::new()
                }
            };
            self.stats.update(|s| s.deadletters_parked = parked.len() as u64);
            let mut failed = false;
            if !parked.is_empty() {
                // A job's dead letter gets its source record's value first; one whose
                // record cannot be read now stays parked (Kafka is likely down for the
                // send too) and is tried again with the rest.
                let mut ready = Vec::with_capacity(parked.len());
                for p in &parked {
                    let mut dl = p.dead_letter.clone();
                    if dl.needs_source_value() {
                        let sources = self.sources.clone();
                        let (topic, partition, offset) = (dl.source_topic.clone(), dl.source_partition, dl.source_offset);
                        let read = tokio::task::spawn_blocking(move || sources.read(&topic, partition, offset, Duration::from_secs(10))).await;
                        match read {
                            Ok(Ok(SourceRecord::Value(v))) => dl.set_value(&v),
                            Ok(Ok(SourceRecord::Gone(why))) => {
                                tracing::warn!(id = p.id, %why, "a job's dead letter goes out without its source record");
                                dl.value_unavailable = Some(why);
                            }
                            Ok(Err(e)) => {
                                failed = true;
                                tracing::error!(error = %e, id = p.id, "cannot read a job's source record back from Kafka; its dead letter stays parked");
                                continue;
                            }
                            Err(e) => {
                                failed = true;
                                tracing::error!(error = %e, id = p.id, "the source reader failed; the dead letter stays parked");
                                continue;
                            }
                        }
                    }
                    ready.push((p.id, dl));
                }
                let sends = ready.iter().map(|(_, dl)| self.send(dl));
                let results = futures_util::future::join_all(sends).await;
                let mut ok = Vec::new();
                for ((id, dl), r) in ready.iter().zip(results) {
                    match r {
                        Ok(()) => ok.push(*id),
                        Err(e) => {
                            failed = true;
                            tracing::error!(error = %e, id, reason = %dl.reason, "dead letter not written yet; it stays parked in the outbox");
                        }
                    }
                }
                if !ok.is_empty() {
                    let now = self.clock.now_ms();
                    if let Err(e) = tokio::task::block_in_place(|| self.outbox.mark_published(&ok, now)) {
                        tracing::error!(error = %e, "cannot mark dead letters published; they will be written again");
                    }
                    self.stats.update(|s| s.deadletters_published += ok.len() as u64);
                }
                if !failed && ok.len() == parked.len() && parked.len() == 256 {
                    continue; // more parked: go on at once
                }
            }
            let wait = if failed {
                let d = delay;
                delay = (delay * 2).min(Duration::from_secs(30));
                d
            } else {
                delay = Duration::from_secs(1);
                Duration::from_secs(1)
            };
            tokio::select! {
                _ = shutdown.changed() => {}
                _ = self.wake.notified(), if !failed => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    async fn send(&self, dl: &DeadLetter) -> Result<(), rdkafka::error::KafkaError> {
        let value = serde_json::to_vec(dl).expect("dead letter serialises");
        let key = dl.key.clone().unwrap_or_default();
        let record = FutureRecord::to(&self.topic).key(&key).payload(&value);
        self.producer.send(record, Duration::from_secs(30)).await.map(|_| ()).map_err(|(e, _)| e)
    }
}
