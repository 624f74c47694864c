//! `pixgate deadletter replay ID` of a record-level dead letter whose cause can go away
//! (`unknown_terminal`, `terminal_of_another_company`, `charge_state_unreadable`:
//! [`crate::model::DeadLetterReason::routes_again`]), carried out by the consumer loop
//! between two batch writes like a job's replay ([`crate::ingest::replay`]).
//!
//! The record is routed again with the registry as it is now, once:
//! - its value is the dead letter's copy (`value_base64`, the record's bytes as read), or,
//!   when the dead letter has none, the record read back from Kafka by its position
//!   ([`SourceReader`]);
//! - still dead-lettered (the terminal is still unknown, say): refused, nothing written, and
//!   it can be tried again later;
//! - otherwise its jobs (message ids from the event id, as when first read: a device that
//!   got them another way dedupes them, and so does the outbox's dedupe window), its
//!   charge state and any effect's dead letter are written in one transaction that also
//!   marks the dead letter replayed ([`Handoff::replay_record`]), so a second replay is
//!   refused;
//! - a charge that has moved on meanwhile (a newer version applied) gives no job: the
//!   replay is recorded and answers with none.
//!
//! The record is counted on `/stats` again by its new outcome (`records_with_effects` or
//! `ignored`).

use crate::ingest::handoff::Handoff;
use crate::ingest::plan::{Planner, Source};
use crate::ingest::retry::blocking;
use crate::ingest::source_reader::{SourceReader, SourceRecord};
use crate::model::Queued;
use crate::store::{Outbox, ReplayError};
use base64::{engine::general_purpose::STANDARD as B64, Engine};
use std::sync::Arc;
use std::time::Duration;

/// How long reading a record back from Kafka may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Record replays: which dead letters are records to route again, and the Kafka reader
/// for a record whose dead letter kept no copy.
pub struct RecordReplay {
    charge_topic: String,
    brokers: String,
    /// Created on first use.
    sources: Option<Arc<SourceReader>>,
}

/// A record replay carried out: what it queued and parked.
#[derive(Debug)]
pub struct RecordReplayed {
    /// The jobs written, to be sent to the dispatcher in this order.
    pub queued: Vec<Queued>,
    /// Ids of the dead letters parked for effects that cannot be carried out.
    pub parked: Vec<u64>,
}

impl RecordReplay {
    /// Replays of `charge_topic` records, read back from `brokers` when needed.
    pub fn new(charge_topic: &str, brokers: &str) -> RecordReplay {
        RecordReplay { charge_topic: charge_topic.to_string(), brokers: brokers.to_string(), sources: None }
    }

    /// Whether dead letter `id` is a record routed again by [`RecordReplay::replay`]
    /// (rather than a job's dead letter, or one [`Outbox::replay`] refuses).
    pub async fn is_record(&self, outbox: &Arc<Outbox>, id: u64) -> bool {
        let outbox = outbox.clone();
        let found = blocking(move || outbox.deadletter(id)).await;
        matches!(found, Ok(Some(p)) if p.job.is_none()
            && p.dead_letter.reason.routes_again()
            && p.dead_letter.source_topic == self.charge_topic)
    }

    /// Routes dead letter `id`'s record again with `planner`'s registry and writes what it
    /// plans through `handoff`, marking the dead letter replayed. No batch write may be in
    /// flight.
    ///
    /// # Errors
    /// No such dead letter, already replayed, its record still dead-lettered
    /// ([`ReplayError::StillDeadLetter`]: nothing written), its value cannot be had, or the
    /// outbox refused.
    pub async fn replay(
        &mut self,
        id: u64,
        outbox: &Arc<Outbox>,
        planner: &mut Planner,
        handoff: &Handoff,
    ) -> Result<RecordReplayed, ReplayError> {
        let reading = outbox.clone();
        let parked = blocking(move || reading.deadletter(id)).await?.ok_or(ReplayError::NotFound(id))?;
        if parked.replayed_at_ms.is_some() {
            return Err(ReplayError::AlreadyReplayed(id));
        }
        let dl = parked.dead_letter;
        let value = match B64.decode(&dl.value_base64) {
            Ok(v) if !dl.value_base64.is_empty() => v,
            _ => self.read_source(id, &dl.source_topic, dl.source_partition, dl.source_offset).await?,
        };
        let key = dl.key.as_ref().map(|k| k.as_bytes().to_vec());
        let src = Source {
            topic: &dl.source_topic,
            partition: dl.source_partition,
            offset: dl.source_offset,
            key: key.as_deref(),
            value: &value,
            timestamp_ms: None,
        };
        // Any whole-record dead letter refuses the replay: it is not parked a second time.
        let mut accept = planner.plan(&src, |_| true).map_err(|d| ReplayError::StillDeadLetter {
            id,
            reason: d.reason,
            detail: d.detail,
        })?;
        let (queued, parked) = handoff.replay_record(id, &mut accept).await?;
        Ok(RecordReplayed { queued, parked })
    }

    /// The record at `topic`/`partition`/`offset`, read back from Kafka.
    async fn read_source(&mut self, id: u64, topic: &str, partition: i32, offset: i64) -> Result<Vec<u8>, ReplayError> {
        let reader = match &self.sources {
            Some(r) => r.clone(),
            None => {
                let r = Arc::new(
                    SourceReader::new(&self.brokers)
                        .map_err(|e| ReplayError::SourceUnavailable { id, why: e.to_string() })?,
                );
                self.sources = Some(r.clone());
                r
            }
        };
        let topic = topic.to_string();
        let read = tokio::task::spawn_blocking(move || reader.read(&topic, partition, offset, READ_TIMEOUT)).await;
        match read {
            Ok(Ok(SourceRecord::Value(v))) => Ok(v),
            Ok(Ok(SourceRecord::Gone(why))) => Err(ReplayError::SourceUnavailable { id, why }),
            Ok(Err(e)) => Err(ReplayError::SourceUnavailable { id, why: format!("reading it back from Kafka: {e}") }),
            Err(e) => Err(ReplayError::SourceUnavailable { id, why: format!("the reader failed: {e}") }),
        }
    }
}
