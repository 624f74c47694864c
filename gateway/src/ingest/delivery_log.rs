//! The deliver stage's log on Kafka (`cluster.delivery_log_topic`, records in
//! [`crate::model::delivery_log`]): the owner of a device-jobs partition writes each job it
//! accepts there before the job goes to the dispatcher and before its offset is stored,
//! and each job's end once it leaves its queue; the partition's next owner (a rebalance, a
//! replica's death) reads it to its end ([`DeliveryLog::restore`]) and delivers what is
//! left, with the `seq`s it had.
//!
//! One producer writes both (idempotent, `acks=all`, `message.timeout.ms` = 0: librdkafka
//! retries until Kafka has the record), so a partition's records land in the order they
//! were produced: a job's end is never before the job, and a superseded QR's end is before
//! the end of the screen that superseded it.

use crate::model::delivery_log::{fold, job_key, seq_key, LoggedJob, Restored, LOGGED_JOB_VERSION, POS_KEY};
use crate::model::{Queued, StoredJob};
use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// The pause before enqueueing again while librdkafka's queue is full.
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(10);

/// The delivery log of one replica: its producer, and how to read a partition back.
pub struct DeliveryLog {
    producer: FutureProducer,
    topic: String,
    brokers: String,
    /// The group id the restore's reader gives librdkafka (it never joins nor commits).
    reader_group: String,
}

impl DeliveryLog {
    /// The log `topic` on `brokers`; `reader_group` names the restore's reader to Kafka.
    ///
    /// # Errors
    /// librdkafka refuses the configuration.
    pub fn new(brokers: &str, topic: &str, reader_group: &str) -> anyhow::Result<DeliveryLog> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "1")
            .set("message.timeout.ms", "0")
            .create()
            .context("creating the delivery log's producer")?;
        Ok(DeliveryLog {
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

    /// Logs the jobs `queued` accepted from device-jobs partition `partition` (each job,
    /// then its device's last `seq`), then the partition's read position `pos` (the next
    /// offset whose jobs are not logged), and waits until Kafka has every record.
    ///
    /// # Errors
    /// Kafka did not take a record: the caller logs them again (the same keys, so the log
    /// ends the same).
    pub async fn accepted(&self, partition: i32, queued: &[Queued], pos: i64) -> Result<(), KafkaError> {
        let mut records = Vec::with_capacity(queued.len() * 2 + 1);
        for q in queued {
            let job = match serde_json::from_slice(&q.wire) {
                Ok(job) => job,
                Err(_) => {
                    // The wire bytes are this build's own serialisation of a job.
                    tracing::error!(device = %q.stored.device, seq = q.stored.job.seq, "a queued job's bytes do not read back as a job; logged without its payload");
                    q.stored.job.clone()
                }
            };
            let logged = LoggedJob {
                v: LOGGED_JOB_VERSION,
                device: q.stored.device.clone(),
                job,
                source: q.stored.source.clone(),
            };
            let value = serde_json::to_vec(&logged).expect("a logged job serialises");
            records.push((job_key(&q.stored.device, q.stored.job.seq), Some(value)));
            records.push((seq_key(&q.stored.device), Some(q.stored.job.seq.to_string().into_bytes())));
        }
        records.push((POS_KEY.to_string(), Some(pos.to_string().into_bytes())));
        self.produce(partition, records).await
    }

    /// Logs that `stored` left its queue (a tombstone of its job's key), on `partition`.
    /// Not waited for: librdkafka delivers it in order with the partition's other records.
    ///
    /// # Errors
    /// librdkafka refused to queue it (its configuration, or a fatal producer error).
    pub async fn ended(&self, partition: i32, stored: &StoredJob) -> Result<(), KafkaError> {
        let key = job_key(&stored.device, stored.job.seq);
        loop {
            let record: FutureRecord<'_, str, [u8]> = FutureRecord::to(&self.topic).partition(partition).key(&key);
            match self.producer.send_result(record) {
                Ok(delivery) => {
                    let (device, seq) = (stored.device.clone(), stored.job.seq);
                    tokio::spawn(async move {
                        if let Ok(Err((e, _))) = delivery.await {
                            tracing::error!(device, seq, error = %e, "a job's end did not reach the delivery log: its partition's next owner sends it again (the device dedupes it)");
                        }
                    });
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    tokio::time::sleep(QUEUE_FULL_PAUSE).await;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Waits up to `timeout` for every record produced to reach Kafka (at shutdown).
    ///
    /// # Errors
    /// Some were not delivered within `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        use rdkafka::producer::Producer;
        self.producer.flush(timeout)
    }

    async fn produce(&self, partition: i32, records: Vec<(String, Option<Vec<u8>>)>) -> Result<(), KafkaError> {
        let mut deliveries = Vec::with_capacity(records.len());
        for (key, value) in &records {
            loop {
                let mut record: FutureRecord<'_, str, [u8]> =
                    FutureRecord::to(&self.topic).partition(partition).key(key.as_str());
                if let Some(v) = value {
                    record = record.payload(v.as_slice());
                }
                match self.producer.send_result(record) {
                    Ok(delivery) => {
                        deliveries.push(delivery);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                        tokio::time::sleep(QUEUE_FULL_PAUSE).await;
                    }
                    Err((e, _)) => return Err(e),
                }
            }
        }
        for delivery in deliveries {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => return Err(e),
                Err(_) => return Err(KafkaError::Canceled),
            }
        }
        Ok(())
    }

    /// Blocking: reads partition `partition` of the log from its start to the end it has
    /// when asked, and folds it ([`fold`]). Each request waits at most `timeout`.
    ///
    /// # Errors
    /// Kafka cannot be asked, or the end is not reached within `timeout` of the last record
    /// read.
    pub fn restore(&self, partition: i32, timeout: Duration) -> anyhow::Result<Restored> {
        let reader: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.reader_group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .create()
            .context("creating the delivery log's reader")?;
        let topic = self.topic.as_str();
        let (low, end) = reader
            .fetch_watermarks(topic, partition, timeout)
            .with_context(|| format!("the ends of {topic}/{partition}"))?;
        if end <= low {
            return Ok(Restored::default());
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(low)).context("an assignment")?;
        reader.assign(&tpl).with_context(|| format!("reading {topic}/{partition}"))?;
        let mut records: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let mut last = Instant::now();
        let mut next = low;
        while next < end {
            match reader.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    next = m.offset() + 1;
                    last = Instant::now();
                    records.push((m.key().unwrap_or_default().to_vec(), m.payload().map(<[u8]>::to_vec)));
                }
                Some(Err(e)) => return Err(e).with_context(|| format!("reading {topic}/{partition}")),
                None if last.elapsed() > timeout => {
                    anyhow::bail!("{topic}/{partition}: no record for {timeout:?} at offset {next}, end {end}")
                }
                None => {}
            }
        }
        Ok(fold(records.iter().map(|(k, v)| (k.as_slice(), v.as_deref()))))
    }
}
