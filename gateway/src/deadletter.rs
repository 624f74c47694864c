//! The dead-letter topic: where a record, or one effect of it, goes when pixgate cannot
//! carry it out, with the reason. Nothing is dropped: a write that fails is retried with
//! backoff until it succeeds or the gateway stops (then the record is not committed and is
//! read again after the restart).
//!
//! Record layout on `pixgate.deadletter`: key = the source record's key; value = a JSON
//! [`DeadLetter`], which carries the source value (as text when it is UTF-8, and always as
//! base64) so it can be inspected and replayed.

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use serde::Serialize;
use std::time::Duration;

/// One dead letter.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Effect kind, if the dead letter is one effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
    /// The job's message id, if one was made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// Source key as text (keys are document ids).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Source value as text, when it is valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Source value, base64, always.
    pub value_base64: String,
}

impl DeadLetter {
    /// A dead letter for the record at `topic`/`partition`/`offset` with `key` and `value`.
    pub fn new(reason: &str, detail: String, topic: &str, partition: i32, offset: i64, key: Option<&[u8]>, value: &[u8]) -> Self {
        DeadLetter {
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

/// Writes dead letters to Kafka (idempotent producer, `acks=all`).
#[derive(Clone)]
pub struct DeadLetterWriter {
    producer: FutureProducer,
    topic: String,
}

impl DeadLetterWriter {
    /// A writer to `topic` on `brokers`.
    ///
    /// # Errors
    /// Invalid producer configuration.
    pub fn new(brokers: &str, topic: &str) -> anyhow::Result<Self> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "30000")
            .create()?;
        Ok(DeadLetterWriter { producer, topic: topic.to_string() })
    }

    /// Writes `dl` and returns once Kafka has it, retrying with backoff (1 s doubling to
    /// 30 s) for as long as it takes.
    pub async fn write(&self, dl: &DeadLetter) {
        let value = serde_json::to_vec(dl).expect("dead letter serialises");
        let key = dl.key.clone().unwrap_or_default();
        let mut delay = Duration::from_secs(1);
        loop {
            let record = FutureRecord::to(&self.topic).key(&key).payload(&value);
            match self.producer.send(record, Duration::from_secs(30)).await {
                Ok(_) => return,
                Err((e, _)) => {
                    tracing::error!(error = %e, reason = %dl.reason, "dead letter not written yet; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
        }
    }
}
