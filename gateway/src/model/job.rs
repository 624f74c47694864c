//! A job as the durable outbox holds it and as it travels from the outbox to the
//! dispatcher: its device, the record it came from, and its wire bytes.

use bytes::Bytes;
use device_protocol::Job;
use serde::{Deserialize, Serialize};

/// Where the record that caused a job came from (for dead letters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRef {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Record key, as text.
    pub key: Option<String>,
}

impl SourceRef {
    /// No known record (partition and offset -1): a job written without one, e.g. in tests.
    pub fn unknown() -> SourceRef {
        SourceRef { topic: String::new(), partition: -1, offset: -1, key: None }
    }
}

/// A queued job with its device and source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredJob {
    /// Device id.
    pub device: String,
    /// The job, `seq` assigned.
    pub job: Job,
    /// The record it came from.
    pub source: SourceRef,
}

impl StoredJob {
    /// The job with its payload dropped (an empty `job.payload`), as the dispatcher keeps
    /// the jobs waiting behind a device's head: a receipt's payload is kilobytes, the
    /// rest a few hundred bytes, so a full outbox does not fill memory. What is sent is
    /// read back from the outbox (`store::Outbox::wire`).
    pub fn without_payload(mut self) -> StoredJob {
        self.job.payload = String::new();
        self
    }
}

/// A job as the outbox queued it: its header for the dispatcher's queue and the bytes its
/// device receives.
#[derive(Debug, Clone, PartialEq)]
pub struct Queued {
    /// The stored job without its payload ([`StoredJob::without_payload`]).
    pub stored: StoredJob,
    /// The job's JSON ([`Job`], payload included) exactly as stored and as published on
    /// the device's jobs topic.
    pub wire: Bytes,
    /// When its record was durably accepted (set by the hand-off as it gives the job to
    /// the dispatcher); `None` for a job stored by an earlier run. The start of the
    /// `queue` stage ([`crate::telemetry::latency::Stage::Queue`]).
    pub accepted_at: Option<tokio::time::Instant>,
}

impl Queued {
    /// Serializes `stored`'s job (payload included) as its wire bytes: for a job that does
    /// not come from the outbox's batch write (a replayed job, tests').
    pub fn from_stored(stored: StoredJob) -> Queued {
        let wire = Bytes::from(stored.job.to_json());
        Queued { stored: stored.without_payload(), wire, accepted_at: None }
    }
}
