//! The central shape's hand-off over Kafka (`cluster.enabled`, `docs/cluster.md`): the jobs
//! planned from change events are produced to `cluster.device_jobs_topic`, keyed by device
//! id ([`JobProducer`]), and the consumer reads them back from it into the outbox and the
//! dispatcher ([`accept`]).
//!
//! A job's record is produced before its change event's offset is stored, and read back
//! into the outbox before its own offset is stored: the read position is part of the data
//! on both sides. A job produced twice (its change event read again after a crash before
//! the offset was committed) has the same message id and event time both times, and the
//! outbox's dedupe window queues it once.

use crate::ingest::kafka_metadata::group_positions;
use crate::ingest::plan::Source;
use crate::kafka_client;
use crate::model::{DeadLetter, DeadLetterReason, DeviceJobRecord, SourceRef};
use crate::store::Accept;
use crate::telemetry::Stats;
use anyhow::{bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::ToBytes;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use std::time::Duration;

/// How long librdkafka keeps trying to deliver a job record before the batch's hand-off
/// fails and is retried whole (`message.timeout.ms`), ms. Retrying the whole batch keeps
/// each device's order: with the idempotent producer the broker takes a partition's
/// records only in sequence, so a later job of a device is never written without the
/// earlier ones, and the copies the retry writes are dropped by the dedupe window.
const MESSAGE_TIMEOUT_MS: u32 = 30_000;
/// The pause before enqueueing again while librdkafka's queue is full.
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(10);

/// Produces job records to the device-jobs topic: idempotent (`enable.idempotence`,
/// `acks=all`), so a retry inside librdkafka neither duplicates nor reorders a partition's
/// records, and partitioned by `murmur2_random` (Kafka's Java default), so every producer
/// of the topic, pixgate's or not, puts a device on the same partition.
pub struct JobProducer {
    producer: FutureProducer,
    topic: String,
}

impl JobProducer {
    /// A producer of `topic` on `brokers`.
    ///
    /// # Errors
    /// librdkafka refuses the configuration.
    pub fn new(brokers: &str, topic: &str) -> anyhow::Result<JobProducer> {
        let producer = kafka_client::client(brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "1")
            .set("message.timeout.ms", MESSAGE_TIMEOUT_MS.to_string())
            .create()
            .context("creating the device-jobs producer")?;
        Ok(JobProducer { producer, topic: topic.to_string() })
    }

    /// The topic it produces to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Produces `records` (key = device id, value = an encoded [`DeviceJobRecord`]) in
    /// order and waits until Kafka has acknowledged every one (`acks=all`).
    ///
    /// # Errors
    /// The first record Kafka did not take (after librdkafka's own retries, within
    /// `message.timeout.ms`): some of the others may be written, so the caller produces
    /// them all again (the deliver side's dedupe window drops the copies).
    pub async fn produce(&self, records: &[(String, Vec<u8>)]) -> Result<(), KafkaError> {
        let mut deliveries = Vec::with_capacity(records.len());
        for (key, value) in records {
            deliveries.push(send_waiting(&self.producer, FutureRecord::to(&self.topic).key(key).payload(value)).await?);
        }
        delivered(deliveries).await
    }
}

/// Hands `record` to librdkafka, waiting while its queue is full (its own thread drains
/// it meanwhile); returns the delivery to await.
///
/// # Errors
/// librdkafka refused the record for another reason (its configuration, a fatal producer
/// error).
pub(crate) async fn send_waiting<K: ToBytes + ?Sized, P: ToBytes + ?Sized>(
    producer: &FutureProducer,
    mut record: FutureRecord<'_, K, P>,
) -> Result<DeliveryFuture, KafkaError> {
    loop {
        match producer.send_result(record) {
            Ok(delivery) => return Ok(delivery),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                tokio::time::sleep(QUEUE_FULL_PAUSE).await;
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Waits for every one of `deliveries`, in order.
///
/// # Errors
/// The first record Kafka did not take (or whose delivery librdkafka dropped).
pub(crate) async fn delivered(deliveries: Vec<DeliveryFuture>) -> Result<(), KafkaError> {
    for delivery in deliveries {
        match delivery.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => return Err(e),
            Err(_) => return Err(KafkaError::Canceled),
        }
    }
    Ok(())
}

/// Checks that `topic` (the device-jobs topic or the delivery log) exists on `brokers` with `partitions` partitions (blocking: a
/// metadata request, up to `timeout`).
///
/// # Errors
/// Kafka cannot be asked, the topic does not exist, or it has another partition count (a
/// device's partition is its owner: growing the count is a migration, `docs/cluster.md`).
pub fn check_partitions(brokers: &str, topic: &str, partitions: i32, timeout: Duration) -> anyhow::Result<()> {
    let client: BaseConsumer = kafka_client::client(brokers).create().context("creating a metadata client")?;
    let md = client.fetch_metadata(Some(topic), timeout).with_context(|| format!("metadata of {topic}"))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        bail!(
            "the topic {topic} does not exist: create it with {partitions} partitions (cluster.device_job_partitions)"
        );
    };
    if let Some(e) = t.error() {
        bail!(
            "the topic {topic}: {:?}; create it with {partitions} partitions (cluster.device_job_partitions)",
            RDKafkaErrorCode::from(e)
        );
    }
    let found = t.partitions().len() as i32;
    if found != partitions {
        bail!("the topic {topic} has {found} partitions, cluster.device_job_partitions says {partitions}: a device's partition is its owner, so the two must agree");
    }
    Ok(())
}

/// Blocking: the jobs on `topic` that consumer group `group` (the deliver stage's) has not
/// read, when `topic` exists: per partition, from the group's committed offset (from the
/// log start when it has none) to the end. `None` when the topic does not exist or nothing
/// is left. Asked when `cluster.enabled` is off, since nothing would then read them. Every
/// request waits at most `timeout`; the topic is looked up in the whole metadata, so that a
/// broker with `auto.create.topics.enable` does not create it.
///
/// # Errors
/// Kafka cannot be asked (the text of the failed request).
pub fn unread_jobs(brokers: &str, topic: &str, group: &str, timeout: Duration) -> anyhow::Result<Option<u64>> {
    let client: BaseConsumer = kafka_client::client(brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .context("creating a metadata client")?;
    let md = client.fetch_metadata(None, timeout).context("metadata")?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic && t.error().is_none()) else { return Ok(None) };
    let parts: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    if parts.is_empty() {
        return Ok(None);
    }
    let positions = group_positions(&client, topic, &parts, timeout).map_err(anyhow::Error::msg)?;
    let unread: u64 = positions
        .values()
        .map(|g| u64::try_from(g.end - g.committed.map_or(g.low, |c| c.max(g.low))).unwrap_or(0))
        .sum();
    Ok((unread > 0).then_some(unread))
}

/// The record that carries `job` of `accept` (planned from the change event
/// `accept.source`) to the device-jobs topic: (key, value).
pub fn record_of(device: &str, job: &device_protocol::Job, accept: &Accept) -> (String, Vec<u8>) {
    let record = DeviceJobRecord {
        v: crate::model::device_job::DEVICE_JOB_VERSION,
        device: device.to_string(),
        job: job.clone(),
        source: accept.source.clone().unwrap_or_else(SourceRef::unknown),
        event_time: accept.event_time,
        event_time_s: accept.tally.as_ref().map_or(0, |t| t.event_time_s),
    };
    (device.to_string(), record.encode())
}

/// A record read back from the device-jobs topic, as what the outbox must accept: its job
/// for its device, with the change event it came from as source (so the job's dead
/// letter names that event), in its dedupe window under the event's time. One that cannot
/// be read is a dead letter (`not_json` or `invalid_field:…`), counted in `stats`.
pub fn accept(src: &Source<'_>, stats: &Stats) -> Accept {
    let record = match DeviceJobRecord::decode(src.value) {
        Ok(r) if src.key.is_some_and(|k| k == r.device.as_bytes()) => r,
        Ok(r) => {
            let detail = format!("the record's key is not its device `{}`", r.device);
            return dead(src, DeadLetterReason::InvalidField("device".into()), detail, stats);
        }
        Err(e) => {
            let reason = if serde_json::from_slice::<serde_json::Value>(src.value).is_ok() {
                DeadLetterReason::InvalidField("job_record".into())
            } else {
                DeadLetterReason::NotJson
            };
            return dead(src, reason, format!("not a device-jobs record: {e}"), stats);
        }
    };
    let DeviceJobRecord { device, mut job, source, event_time, event_time_s, .. } = record;
    job.seq = 0;
    Accept {
        routed_from: Some((source.topic.clone(), event_time_s)),
        jobs: vec![(device, job)],
        source: Some(source),
        event_time,
        ..Accept::default()
    }
}

fn dead(src: &Source<'_>, reason: DeadLetterReason, detail: String, stats: &Stats) -> Accept {
    tracing::warn!(topic = src.topic, partition = src.partition, offset = src.offset, %reason, %detail, "dead letter");
    stats.dead_record(&reason);
    let dl = DeadLetter::new(reason, detail, src.topic, src.partition, src.offset, src.key, src.value);
    Accept { deadletters: vec![dl], ..Accept::default() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{reconcile::RecordTally, Removal};
    use crate::test_fixtures::{job, temp_outbox};
    use device_protocol::EffectKind;

    const JOBS_TOPIC: &str = "pixgate.device-jobs";

    fn charge_source() -> SourceRef {
        SourceRef { topic: "charge.upserted".into(), partition: 1, offset: 41, key: Some("c1".into()) }
    }

    /// A record of `JOBS_TOPIC` at offset `offset`.
    fn src<'a>(key: &'a [u8], value: &'a [u8], offset: i64) -> Source<'a> {
        Source { topic: JOBS_TOPIC, partition: 2, offset, key: Some(key), value, timestamp_ms: None }
    }

    /// The route side's accept of a charge event at event time 1,800,000,000 s with one
    /// job for printer `p1`, and its record on the device-jobs topic.
    fn routed() -> (Accept, Vec<u8>) {
        let a = Accept {
            jobs: vec![("p1".into(), job("m1", EffectKind::PrintReceipt, "c1"))],
            source: Some(charge_source()),
            event_time: 1_800_000_000 << 32 | 3,
            tally: Some(RecordTally { event_time_s: 1_800_000_000, counters: Vec::new() }),
            ..Accept::default()
        };
        let (key, value) = record_of("p1", &a.jobs[0].1, &a);
        assert_eq!(key, "p1", "keyed by device");
        (a, value)
    }

    #[test]
    fn a_job_record_becomes_its_job_for_its_device_from_its_change_event() {
        let (route, value) = routed();
        let a = accept(&src(b"p1", &value, 7), &Stats::default());
        assert!(a.deadletters.is_empty(), "{:?}", a.deadletters);
        assert_eq!(a.jobs, route.jobs, "the same job, seq still to be given");
        assert_eq!(a.source, Some(charge_source()), "its dead letter names the change event");
        assert_eq!(a.event_time, route.event_time, "deduplicated under the event's time");
        assert_eq!(a.routed_from, Some(("charge.upserted".into(), 1_800_000_000)));
        assert!(a.tally.is_none(), "a job record is not a change event: not counted as read");
    }

    #[test]
    fn a_record_that_cannot_be_read_is_a_dead_letter_with_the_reason() {
        let (_, value) = routed();
        let stats = Stats::default();
        let cases: [(&[u8], &[u8], &str); 3] = [
            (b"p2", &value, "invalid_field:device"),
            (b"p1", b"\x00not json", "not_json"),
            (b"p1", b"{\"v\":1,\"device\":\"p1\"}", "invalid_field:job_record"),
        ];
        for (i, (key, value, reason)) in cases.into_iter().enumerate() {
            let a = accept(&src(key, value, i as i64), &stats);
            assert!(a.jobs.is_empty());
            let [dl] = a.deadletters.as_slice() else { panic!("one dead letter: {:?}", a.deadletters) };
            assert_eq!(dl.reason.to_string(), reason);
            assert_eq!((dl.source_topic.as_str(), dl.source_offset), (JOBS_TOPIC, i as i64), "names the record");
        }
        assert_eq!(stats.snapshot().dead_lettered_records.values().sum::<u64>(), 3);
    }

    /// The reconciliation of a routed job: its change event counts it as queued when it is
    /// produced, and as delivered, in the event's window, when the job read back from the
    /// device-jobs topic leaves its queue; the record of the topic is not counted as read.
    #[test]
    fn a_routed_job_counts_once_queued_and_once_delivered_in_its_events_window() {
        let (_dir, outbox) = temp_outbox("device-jobs-reconcile");
        let (mut route, value) = routed();
        route.produced = route.jobs.drain(..).map(|(d, j)| (d, j.kind)).collect();
        let written = outbox.write(&mut [route], &[], 0).unwrap();
        assert!(written[0].0.is_empty(), "nothing queued on the route side");
        let mut deliver = accept(&src(b"p1", &value, 0), &Stats::default());
        let seq = {
            let written = outbox.write(std::slice::from_mut(&mut deliver), &[], 0).unwrap();
            let [q] = written[0].0.as_slice() else { panic!("one job queued") };
            q.stored.job.seq
        };
        // The same record read again (a restart before its offset was committed): left out.
        let mut again = accept(&src(b"p1", &value, 0), &Stats::default());
        assert!(outbox.write(std::slice::from_mut(&mut again), &[], 0).unwrap()[0].0.is_empty());
        outbox.write(&mut [], &[Removal::done("p1", seq)], 0).unwrap();

        let windows = outbox.reconcile_windows(1_799_999_000, 1_800_001_000, 600).unwrap();
        let [w] = windows.as_slice() else { panic!("one window: {windows:?}") };
        assert_eq!(w.topic, "charge.upserted");
        assert_eq!(w.read, 1);
        assert_eq!(w.queued.get("print_receipt"), Some(&1));
        assert_eq!(w.delivered.get("print_receipt"), Some(&1));
    }
}
