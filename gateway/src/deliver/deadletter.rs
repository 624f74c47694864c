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

use crate::clock::Clock;
use crate::ingest::retry::blocking;
use crate::ingest::source_reader::{SourceReader, SourceRecord};
use crate::kafka_client;
use crate::model::DeadLetter;
use crate::shutdown::Shutdown;
use crate::store::Outbox;
use crate::telemetry::Stats;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

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

impl Publisher {
    /// A publisher of `outbox`'s parked dead letters to `topic` on `brokers`.
    ///
    /// # Errors
    /// Invalid producer configuration.
    pub fn new(
        brokers: &str,
        topic: &str,
        outbox: Arc<Outbox>,
        clock: Clock,
        stats: Arc<Stats>,
    ) -> anyhow::Result<Self> {
        let producer = kafka_client::client(brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "30000")
            .create()?;
        let sources = Arc::new(SourceReader::new(brokers)?);
        Ok(Publisher {
            producer,
            topic: topic.to_string(),
            outbox,
            clock,
            stats,
            wake: Arc::new(Notify::new()),
            sources,
        })
    }

    /// Notify this after parking dead letters so they go out now rather than at the next
    /// periodic check (1 s).
    pub fn notifier(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Publishes until `shutdown` is requested (then returns at once: what is still parked
    /// stays in the outbox for the next start).
    pub async fn run(self, shutdown: Shutdown) {
        let mut delay = Duration::from_secs(1);
        loop {
            if shutdown.is_requested() {
                return;
            }
            let outbox = self.outbox.clone();
            let parked = match blocking(move || outbox.parked_deadletters(256)).await {
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
                        let (topic, partition, offset) =
                            (dl.source_topic.clone(), dl.source_partition, dl.source_offset);
                        let read = tokio::task::spawn_blocking(move || {
                            sources.read(&topic, partition, offset, Duration::from_secs(10))
                        })
                        .await;
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
                    let (outbox, ids) = (self.outbox.clone(), ok.clone());
                    if let Err(e) = blocking(move || outbox.mark_published(&ids, now)).await {
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
                () = shutdown.requested() => {}
                _ = self.wake.notified(), if !failed => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Writes `dl`; one too large for the topic goes without its bulk ([`trimmed`]): refused
    /// for its size it would be refused for ever, and stay parked.
    async fn send(&self, dl: &DeadLetter) -> Result<(), rdkafka::error::KafkaError> {
        let whole = serde_json::to_vec(dl).expect("dead letter serialises");
        if whole.len() > MAX_DEAD_LETTER_BYTES {
            return self.write(dl, &trimmed(dl, whole.len())).await;
        }
        match self.write(dl, &whole).await {
            Err(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)) => {
                // The topic's own limit (`max.message.bytes`) is below ours.
                self.write(dl, &trimmed(dl, whole.len())).await
            }
            other => other,
        }
    }

    async fn write(&self, dl: &DeadLetter, value: &[u8]) -> Result<(), KafkaError> {
        let key = dl.key.clone().unwrap_or_default();
        let record = FutureRecord::to(&self.topic).key(&key).payload(value);
        self.producer.send(record, Duration::from_secs(30)).await.map(|_| ()).map_err(|(e, _)| e)
    }
}

/// Most bytes of a dead letter's JSON written whole: under librdkafka's default
/// `message.max.bytes` (1,000,000) with room for the record's key and headers. A record
/// near that size dead-lettered carries its value twice (text and base64).
pub const MAX_DEAD_LETTER_BYTES: usize = 900_000;

/// `dl`'s JSON without its bulk (the source value, and the job), saying so and where the
/// record is: it is `bytes` long whole, and the outbox keeps it whole (`pixgate deadletter
/// show`).
fn trimmed(dl: &DeadLetter, bytes: usize) -> Vec<u8> {
    tracing::warn!(id = dl.id, reason = %dl.reason, bytes, "a dead letter too large for the dead-letter topic goes without its source value and job");
    let mut small = dl.clone();
    small.value = None;
    small.value_base64 = String::new();
    small.value_unavailable = Some(format!(
        "{bytes} bytes of dead letter, over what the dead-letter topic takes: the source value is at {}/{}/{} and in the outbox",
        dl.source_topic, dl.source_partition, dl.source_offset
    ));
    small.job = None;
    small.detail = small.detail.chars().take(1_000).collect();
    small.key = small.key.map(|k| k.chars().take(1_000).collect());
    serde_json::to_vec(&small).expect("dead letter serialises")
}
