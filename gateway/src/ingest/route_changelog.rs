//! The route stage's changelog on Kafka (`cluster.route_changelog_topic`, compacted, as
//! many partitions as the charge topic): each charge's last applied state (`__v` and
//! status), key = charge id, on the partition number of the charge record that applied
//! it. A replica taking a charge partition reads the changelog's partition to its end
//! before it routes a record of it ([`RouteChangelog::read_blocking`]), so a redelivered
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
use crate::kafka_client;
use crate::store::ChargeState;
use anyhow::{bail, Context};
use cdc::ChargeStatus;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::time::{Duration, Instant};

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

    /// Reads `partition` from its start to its end now (blocking) and returns each
    /// charge's last state there; waits at most `timeout` for each record. Values that do
    /// not read are skipped and counted (second of the pair).
    ///
    /// # Errors
    /// Kafka cannot be read within `timeout`.
    pub fn read_blocking(
        &self,
        partition: i32,
        timeout: Duration,
    ) -> anyhow::Result<(HashMap<String, ChargeState>, usize)> {
        let topic = &self.topic;
        let consumer: BaseConsumer = kafka_client::client(&self.brokers)
            .set("group.id", &self.reader_group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .create()
            .context("creating the route changelog's reader")?;
        let (low, end) = consumer
            .fetch_watermarks(topic, partition, timeout)
            .with_context(|| format!("the ends of {topic}/{partition}"))?;
        let (mut states, mut unreadable) = (HashMap::new(), 0);
        if low >= end {
            return Ok((states, unreadable));
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(low)).context("an assignment")?;
        consumer.assign(&tpl).with_context(|| format!("reading {topic}/{partition}"))?;
        let (mut next, mut last) = (low, Instant::now());
        while next < end {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    next = m.offset() + 1;
                    last = Instant::now();
                    let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                        unreadable += 1;
                        continue;
                    };
                    match m.payload().map(decode) {
                        None => {
                            states.remove(key);
                        }
                        Some(Some(state)) => {
                            states.insert(key.to_string(), state);
                        }
                        Some(None) => unreadable += 1,
                    }
                }
                Some(Err(e)) => return Err(e).with_context(|| format!("reading {topic}/{partition}")),
                None if last.elapsed() > timeout => {
                    bail!("{topic}/{partition}: no record for {timeout:?} at offset {next}, end {end}")
                }
                None => {}
            }
        }
        Ok((states, unreadable))
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
