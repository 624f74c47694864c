//! The route stage's changelog on Kafka (`cluster.route_changelog_topic`, compacted, as
//! many partitions as the charge topic): each charge's last applied state (`__v` and
//! status), key = charge id, on the partition number of the charge record that applied
//! it. A replica taking a charge partition reads the changelog's partition to its end
//! before it routes a record of it ([`RouteChangelog::states_of`]), so a redelivered
//! or late event older than one another replica applied is ignored as `stale_version`
//! instead of routed again (a QR after "paid"). Kafka Streams keeps a task's state the
//! same way (`docs/cluster.md`, "The route stage").
//!
//! A state is produced only once the jobs of its record are on the device-jobs topic, and
//! the record's offset is stored only once Kafka has the state: a replica that dies in
//! between leaves the record to be routed again (its jobs keep their message ids), never
//! a state whose jobs are missing.
//!
//! Record value: `{__v}@{status}` (`7@COMPLETED`); a null value removes the key.

use crate::ingest::device_jobs::{delivered, send_waiting};
use crate::ingest::partition_reader::PartitionReader;
use crate::kafka_client;
use crate::store::ChargeState;
use anyhow::{bail, Context};
use cdc::ChargeStatus;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;
use std::collections::HashMap;
use std::time::Duration;

/// One state to write: the charge record's partition, the charge id, its state.
pub type StateRecord = (i32, String, ChargeState);

/// The changelog of one replica: its producer, and how to read a partition back.
pub struct RouteChangelog {
    producer: FutureProducer,
    topic: String,
    brokers: String,
    /// The group id its reader gives librdkafka (it never joins nor commits).
    reader_group: String,
}

impl RouteChangelog {
    /// The changelog `topic` on `brokers`; `reader_group` names its reader to Kafka.
    ///
    /// # Errors
    /// librdkafka refuses the configuration.
    pub fn new(brokers: &str, topic: &str, reader_group: &str) -> anyhow::Result<RouteChangelog> {
        let producer =
            kafka_client::ordered_producer(brokers).create().context("creating the route changelog's producer")?;
        Ok(RouteChangelog {
            producer,
            topic: topic.to_string(),
            brokers: brokers.to_string(),
            reader_group: reader_group.to_string(),
        })
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Produces `states` and waits until Kafka has every one.
    ///
    /// # Errors
    /// The first state Kafka did not take: the caller produces them all again (the same
    /// keys and values, so the changelog ends the same).
    pub async fn produce(&self, states: &[StateRecord]) -> Result<(), KafkaError> {
        let mut deliveries = Vec::with_capacity(states.len());
        for (partition, charge, state) in states {
            let value = encode(state);
            let record: FutureRecord<'_, str, str> =
                FutureRecord::to(&self.topic).partition(*partition).key(charge.as_str()).payload(value.as_str());
            deliveries.push(send_waiting(&self.producer, record).await?);
        }
        delivered(deliveries).await
    }

    /// A read of `partition` from its start to its end ([`StatesRead::read_blocking`]).
    pub fn states_of(&self, partition: i32) -> StatesRead {
        StatesRead {
            reader: PartitionReader::new(&self.brokers, &self.reader_group, &self.topic, partition),
            states: HashMap::new(),
            unreadable: 0,
        }
    }
}

/// A read of one changelog partition's states, kept across tries: a try that fails goes
/// on from the last record read at the next.
pub struct StatesRead {
    reader: PartitionReader,
    /// Each charge's last state read so far.
    states: HashMap<String, ChargeState>,
    /// Values read so far that did not read as a state.
    unreadable: usize,
}

impl StatesRead {
    /// Reads on to the partition's end now (blocking), waiting at most `timeout` for each
    /// record.
    ///
    /// # Errors
    /// Kafka cannot be read within `timeout`: called again, it reads on from there.
    pub fn read_blocking(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let end = self.reader.end(timeout)?;
        let StatesRead { reader, states, unreadable } = self;
        reader.scan_to(end, timeout, |m| {
            let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                *unreadable += 1;
                return;
            };
            match m.payload().map(decode) {
                None => {
                    states.remove(key);
                }
                Some(Some(state)) => {
                    states.insert(key.to_string(), state);
                }
                Some(None) => *unreadable += 1,
            }
        })
    }

    /// Each charge's last state on the partition, and how many values did not read.
    pub fn finish(self) -> (HashMap<String, ChargeState>, usize) {
        (self.states, self.unreadable)
    }
}

/// Checks that `changelog` exists with as many partitions as `charge_topic` (blocking: a
/// metadata request, up to `timeout`).
///
/// # Errors
/// Kafka cannot be asked, either topic does not exist, or the counts differ (a charge's
/// state is on its record's partition number).
pub fn check_partitions(brokers: &str, charge_topic: &str, changelog: &str, timeout: Duration) -> anyhow::Result<()> {
    let client: BaseConsumer = kafka_client::client(brokers).create().context("creating a metadata client")?;
    let md = client.fetch_metadata(None, timeout).context("the topics' metadata")?;
    let count =
        |name: &str| md.topics().iter().find(|t| t.name() == name && t.error().is_none()).map(|t| t.partitions().len());
    let Some(charges) = count(charge_topic) else { bail!("the charge topic {charge_topic} does not exist") };
    match count(changelog) {
        None => bail!("the route changelog {changelog} does not exist: create it compacted, with {charges} partitions (as {charge_topic})"),
        Some(n) if n != charges => bail!("the route changelog {changelog} has {n} partitions, the charge topic {charge_topic} {charges}: a charge's state is on its record's partition number, so the two must agree"),
        Some(_) => Ok(()),
    }
}

/// A state's record value, `{__v}@{status}`.
fn encode(state: &ChargeState) -> String {
    let status = match state.status {
        ChargeStatus::Active => "ACTIVE",
        ChargeStatus::Completed => "COMPLETED",
        ChargeStatus::Expired => "EXPIRED",
    };
    format!("{}@{status}", state.version)
}

/// The state a record value holds, if it reads.
fn decode(value: &[u8]) -> Option<ChargeState> {
    let (version, status) = std::str::from_utf8(value).ok()?.split_once('@')?;
    let status = match status {
        "ACTIVE" => ChargeStatus::Active,
        "COMPLETED" => ChargeStatus::Completed,
        "EXPIRED" => ChargeStatus::Expired,
        _ => return None,
    };
    Some(ChargeState { version: version.parse().ok()?, status })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reads_back_and_a_malformed_value_does_not() {
        for status in [ChargeStatus::Active, ChargeStatus::Completed, ChargeStatus::Expired] {
            let state = ChargeState { version: 7, status };
            assert_eq!(decode(encode(&state).as_bytes()), Some(state));
        }
        assert_eq!(encode(&ChargeState { version: 12, status: ChargeStatus::Completed }), "12@COMPLETED");
        for bad in ["7", "x@ACTIVE", "7@PAID", "", "7@active"] {
            assert_eq!(decode(bad.as_bytes()), None, "{bad:?}");
        }
    }
}
