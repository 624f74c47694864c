//! A batch that cannot be read is never silent.
//!
//! librdkafka reports a batch it cannot read (a codec it lacks, a corrupt batch, a record
//! over `fetch.max.bytes`) as a consume error, and fetches the partition again and again,
//! so the same error comes back several times a second. Logged at each one, it would drown
//! the log; skipped, it would be swallowed. Here a *streak* of consume errors is:
//!
//! - logged once when it starts (`error`) and once when it clears (`info`, with how many
//!   errors it counted): it clears when no consume error came for [`QUIET`];
//! - reported to readiness while it lasts (`/readyz`, `/stats` `not_ready`, the
//!   `consume_error` alarm and `pixgate_kafka_consume_error` on `/metrics`) with
//!   librdkafka's error text;
//! - located: rust-rdkafka (0.39) hands a consume error over as its code alone, without
//!   the topic, partition, offset and text librdkafka attached to it, so when a streak
//!   starts each assigned partition is read once at the consumer's position by a separate
//!   assign-only reader ([`locate`]); the partition whose read fails is named, with the
//!   offset and that read's error, in the readiness reason and the log.

use crate::ingest::group_reader::GroupReader;
use crate::ingest::source_reader::{SourceReader, SourceRecord};
use crate::kafka_client;
use crate::model::Partition;
use crate::telemetry::health::ConsumeErrorFact;
use crate::telemetry::Monitor;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long without a consume error clears a streak.
pub const QUIET: Duration = Duration::from_secs(2);

/// The current streak of consume errors, if any.
#[derive(Debug, Default)]
pub struct ConsumeErrors {
    streak: Option<Streak>,
}

#[derive(Debug)]
struct Streak {
    since: Instant,
    last: Instant,
    count: u64,
    error: String,
}

impl ConsumeErrors {
    /// Records a consume error at `now`; reports it to `health`. Returns true when it
    /// starts a streak (logged here; the caller then locates it with [`locate`]).
    pub fn error(&mut self, e: &KafkaError, now: Instant, health: &Monitor) -> bool {
        let text = e.to_string();
        let started = self.streak.is_none();
        let s = self.streak.get_or_insert_with(|| Streak { since: now, last: now, count: 0, error: text.clone() });
        s.last = now;
        s.count += 1;
        s.error = text;
        if started {
            tracing::error!(error = %s.error, "Kafka consume error (logged once until it clears; /readyz names it)");
        }
        health.consume_error(Some(ConsumeErrorFact { error: s.error.clone(), count: s.count, at: None }));
        started
    }

    /// Clears the streak when no error came for [`QUIET`] before `now` (logged once).
    pub fn tick(&mut self, now: Instant, health: &Monitor) {
        if let Some(s) = self.streak.as_ref().filter(|s| now.duration_since(s.last) >= QUIET) {
            tracing::info!(errors = s.count, for_ms = now.duration_since(s.since).as_millis() as u64, last = %s.error, "Kafka consume errors cleared");
            self.streak = None;
            health.consume_error(None);
        }
    }

    /// Whether a streak is on.
    pub fn is_on(&self) -> bool {
        self.streak.is_some()
    }
}

/// Locates a consume error streak in the background ([`locate`]): the consumer's
/// positions on its assigned partitions now, read at on a blocking thread. `groups` names
/// the consumer group of each topic (`Config::group_of`).
pub fn spawn_locate(
    consumer: &impl GroupReader,
    brokers: &str,
    groups: impl Fn(&str) -> Option<String>,
    health: std::sync::Arc<Monitor>,
) {
    let positions = match consumer.positions() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the consumer's positions to locate the consume error; /readyz gives its text only");
            return;
        }
    };
    let mut by_group: BTreeMap<String, Vec<Partition>> = BTreeMap::new();
    for (part, _) in &positions {
        if let Some(g) = groups(&part.0) {
            by_group.entry(g).or_default().push(part.clone());
        }
    }
    let brokers = brokers.to_string();
    tokio::task::spawn_blocking(move || locate(&brokers, &by_group, positions, &health));
}

/// Blocking: finds which of `positions` (partition, the consumer's position or `None` when
/// it has read nothing there yet) cannot be read, by reading one record at each position
/// with an assign-only reader (a partition without a position is read at its consumer
/// group's committed offset, `groups` naming each group's partitions, else from its start). Returns the partition, the offset and
/// the first failed read's error, reports it to `health` and logs it; `None` when every
/// read worked (the error was transient) or every read failed (Kafka is out of reach).
pub fn locate(
    brokers: &str,
    groups: &BTreeMap<String, Vec<Partition>>,
    positions: Vec<(Partition, Option<i64>)>,
    health: &Monitor,
) -> Option<(Partition, i64, String)> {
    let reader = SourceReader::new(brokers)
        .map_err(|e| tracing::warn!(error = %e, "cannot create the reader that locates a consume error"))
        .ok()?;
    let committed: Vec<(Partition, i64)> =
        groups.iter().flat_map(|(group, parts)| committed(brokers, group, parts)).collect();
    let (mut failed, mut read) = (Vec::new(), 0);
    for (part, position) in positions {
        let offset = position.or_else(|| committed.iter().find(|(p, _)| *p == part).map(|(_, o)| *o)).unwrap_or(0);
        match reader.read(&part.0, part.1, offset, Duration::from_secs(5)) {
            Ok(SourceRecord::Value(_) | SourceRecord::Gone(_)) => read += 1,
            Err(e) => failed.push((part, offset, e.to_string())),
        }
    }
    // A broker that drops the connection on a batch it cannot serve fails that one read;
    // when every read fails, Kafka itself is out of reach and nothing is located.
    if read == 0 {
        return None;
    }
    let (part, offset, text) = failed.into_iter().next()?;
    tracing::error!(topic = %part.0, partition = part.1, offset, error = %text, "Kafka consume error located: this record cannot be read");
    health.consume_error_at((part.0.clone(), part.1, offset));
    Some((part, offset, text))
}

/// `group`'s committed offsets of `parts` (empty if Kafka does not say).
fn committed(brokers: &str, group: &str, parts: &[Partition]) -> Vec<(Partition, i64)> {
    let Ok(c) = kafka_client::client(brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create::<BaseConsumer>()
    else {
        return Vec::new();
    };
    let mut tpl = TopicPartitionList::new();
    for p in parts {
        tpl.add_partition(&p.0, p.1);
    }
    let Ok(got) = c.committed_offsets(tpl, Duration::from_secs(5)) else { return Vec::new() };
    got.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::readiness;
    use rdkafka::error::RDKafkaErrorCode;

    #[test]
    fn a_streak_is_reported_once_located_and_cleared_after_a_quiet_spell() {
        let health = Monitor::default();
        let mut errors = ConsumeErrors::default();
        let t0 = Instant::now();
        let e = KafkaError::MessageConsumption(RDKafkaErrorCode::NotImplemented);
        assert!(errors.error(&e, t0, &health), "the first starts a streak");
        assert!(!errors.error(&e, t0 + Duration::from_millis(200), &health), "the next ones do not");
        health.consume_error_at(("device.upserted".into(), 0, 17));
        assert!(!errors.error(&e, t0 + Duration::from_millis(400), &health));
        let reasons = readiness::report(&health, true, 0).1;
        let line = reasons.iter().find(|r| r.kind() == "consume_error").expect("reported").to_string();
        assert!(
            line.contains("(3 errors)")
                && line.contains("Local: Not implemented")
                && line.ends_with("at device.upserted/0 offset 17"),
            "{line}"
        );
        errors.tick(t0 + Duration::from_millis(1_000), &health);
        assert!(errors.is_on(), "not quiet long enough");
        errors.tick(t0 + Duration::from_millis(400) + QUIET, &health);
        assert!(!errors.is_on());
        assert!(!readiness::report(&health, true, 0).1.iter().any(|r| r.kind() == "consume_error"));
    }
}
