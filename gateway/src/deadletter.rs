//! The dead-letter topic: where a record, or one effect of it, goes when pixgate cannot
//! carry it out, with the reason. Nothing is dropped: a dead letter is first *parked* in
//! the durable outbox (in the same transaction that accepts the record's other effects, or
//! that removes the failed job), which is what lets the record's offset be committed; the
//! [`Publisher`] then writes parked dead letters to Kafka, retrying with backoff for as
//! long as Kafka is unreachable, and marks them published. A crash between the write and
//! the mark publishes it again with the same `id`: a dead-letter consumer can dedupe.
//!
//! Record layout on `pixgate.deadletter`: key = the source record's key; value = a JSON
//! [`DeadLetter`], which carries the source value (as text when it is UTF-8, and always as
//! base64) so it can be inspected and replayed.

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use crate::clock::Clock;
use crate::outbox::{Outbox, StoredJob};
use crate::stats::Stats;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
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
    /// Source value as text, when it is valid UTF-8 (for a job's dead letter: the job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Source value, base64, always.
    pub value_base64: String,
}

impl DeadLetter {
    /// A dead letter for the record at `topic`/`partition`/`offset` with `key` and `value`.
    pub fn new(reason: &str, detail: String, topic: &str, partition: i32, offset: i64, key: Option<&[u8]>, value: &[u8]) -> Self {
        DeadLetter {
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
            value: std::str::from_utf8(value).ok().map(str::to_string),
            value_base64: B64.encode(value),
        }
    }
}

impl DeadLetter {
    /// A dead letter for a job that was accepted but cannot be carried out (delivery
    /// failed, expired): source position and key from the job's record, `value` = the job.
    pub fn for_job(reason: &str, detail: String, stored: &StoredJob) -> Self {
        let src = &stored.source;
        let mut dl = DeadLetter::new(reason, detail, &src.topic, src.partition, src.offset, src.key.as_deref().map(str::as_bytes), &[]);
        dl.value = serde_json::to_string(&stored.job).ok();
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
        Ok(Publisher { producer, topic: topic.to_string(), outbox, clock, stats, wake: Arc::new(Notify::new()) })
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
                let sends = parked.iter().map(|p| self.send(&p.dead_letter));
                let results = futures_util::future::join_all(sends).await;
                let mut ok = Vec::new();
                for (p, r) in parked.iter().zip(results) {
                    match r {
                        Ok(()) => ok.push(p.id),
                        Err(e) => {
                            failed = true;
                            tracing::error!(error = %e, id = p.id, reason = %p.dead_letter.reason, "dead letter not written yet; it stays parked in the outbox");
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
