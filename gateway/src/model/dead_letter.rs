//! A dead letter: a record, or one effect of it, that pixgate cannot carry out, with the
//! reason. Parked in the outbox first, then published on the dead-letter topic
//! (`kafka.deadletter_topic`, default `pixgate.deadletter`) as this JSON.

use crate::model::{DeadLetterReason, StoredJob};
use base64::{engine::general_purpose::STANDARD as B64, Engine};
use serde::{Deserialize, Serialize};

/// One dead letter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The outbox's id for it (set when parked; the same on a republish after a crash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// Why (`not_json`, `invalid_brcode`, `unknown_terminal`, …; text on the wire).
    pub reason: DeadLetterReason,
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
    /// Why the dead letter has no source value: Kafka no longer has a job's record, or the
    /// dead letter was too large for the dead-letter topic whole (it then has no `job`
    /// either; the outbox keeps it whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_unavailable: Option<String>,
    /// For a job's dead letter (delivery failed, expired): the job as its device would
    /// have received it, JSON, payload included (what `pixgate deadletter replay` queues).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

impl DeadLetter {
    /// A dead letter for the record at `topic`/`partition`/`offset` with `key` and `value`.
    pub fn new(
        reason: DeadLetterReason,
        detail: String,
        topic: &str,
        partition: i32,
        offset: i64,
        key: Option<&[u8]>,
        value: &[u8],
    ) -> Self {
        let mut dl = DeadLetter {
            id: None,
            reason,
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

    /// Whether this is a job's dead letter still waiting for its source value (the
    /// dead-letter publisher reads it back from Kafka by position).
    pub fn needs_source_value(&self) -> bool {
        self.job.is_some()
            && self.value_base64.is_empty()
            && self.value_unavailable.is_none()
            && self.source_offset >= 0
    }

    /// Sets the source value (text when UTF-8, and base64).
    pub fn set_value(&mut self, value: &[u8]) {
        self.value = std::str::from_utf8(value).ok().map(str::to_string);
        self.value_base64 = B64.encode(value);
    }

    /// A dead letter for a job that was accepted but cannot be carried out (delivery
    /// failed, expired): source position and key from the job's record, `job` = the job;
    /// the source value is read back from Kafka when it is published.
    pub fn for_job(reason: DeadLetterReason, detail: String, stored: &StoredJob) -> Self {
        let src = &stored.source;
        let mut dl = DeadLetter::new(
            reason,
            detail,
            &src.topic,
            src.partition,
            src.offset,
            src.key.as_deref().map(str::as_bytes),
            &[],
        );
        dl.value = None;
        dl.job = serde_json::to_string(&stored.job).ok();
        dl.device = Some(stored.device.clone());
        dl.effect = Some(stored.job.kind.as_str().to_string());
        dl.message_id = Some(stored.job.message_id.clone());
        dl
    }
}
