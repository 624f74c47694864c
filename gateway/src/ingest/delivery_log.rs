//! The deliver stage's log on Kafka (`cluster.delivery_log_topic`, records in
//! [`crate::model::delivery_log`]): the owner of a device-jobs partition writes each job it
//! accepts there before the job goes to the dispatcher and before its offset is stored,
//! and each job's end once it leaves its queue; the partition's next owner (a rebalance, a
//! replica's death) claims it and reads it to its end ([`DeliveryLog::claim`]) and
//! delivers what is left, with the `seq`s it had.
//!
//! One producer writes both (idempotent, `acks=all`, `message.timeout.ms` = 0: librdkafka
//! retries until Kafka has the record), so a partition's records land in the order they
//! were produced: a job's end is never before the job, and a superseded QR's end is before
//! the end of the screen that superseded it.
//!
//! A replica takes a partition by claiming it ([`DeliveryLog::claim`]: an owner record of
//! the next epoch, the first claim of an epoch wins) and writes every record with its
//! epoch, so the records of a replica that lost the partition without knowing are left out
//! by the next reader; before a partition connection to the devices' broker reconnects,
//! [`DeliveryLog::still_owner_blocking`] asks whether a newer claim exists (`docs/cluster.md`,
//! "Fencing").

use crate::deliver::broker::OwnerCheck;
use crate::ingest::device_jobs::{delivered, send_waiting};
use crate::ingest::partition_reader::PartitionReader;
use crate::kafka_client;
use crate::model::delivery_log::{
    job_key, legacy_job_key, numbered, owner_key, seq_key, Folder, LoggedJob, Restored, EPOCH_HEADER,
    LOGGED_JOB_VERSION, POS_KEY,
};
use crate::model::{Queued, StoredJob};
use anyhow::Context;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Claims of one partition tried before [`DeliveryLog::claim`] gives up (each lost to a
/// claim of another replica appended at the same moment).
const CLAIM_ATTEMPTS: u32 = 5;

/// Why the log did not take a record.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Kafka (or librdkafka) refused or failed it.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// This replica has no claim on the partition (never taken, or given up).
    #[error("partition {0} of the delivery log is not claimed by this replica")]
    NotClaimed(i32),
}

/// This replica's claim on a partition: its epoch, and where its owner record is.
#[derive(Debug, Clone, Copy)]
struct Take {
    epoch: u64,
    offset: i64,
}

/// The delivery log of one replica: its producer, and how to read a partition back.
pub struct DeliveryLog {
    producer: FutureProducer,
    topic: String,
    brokers: String,
    /// The group id the restore's reader gives librdkafka (it never joins nor commits).
    reader_group: String,
    /// This replica's name in its owner records.
    replica: String,
    /// The start of this replica's take ids: its name, process id and start time (ns), so
    /// that a replacement with the same name and process id (pid 1 in a container) never
    /// writes another's take id.
    take_prefix: String,
    /// Claims made, for unique take ids.
    claims: AtomicU64,
    /// The partitions this replica holds a claim on.
    takes: Mutex<HashMap<i32, Take>>,
    /// Claims another replica's overtook, and since when.
    overtaken: Mutex<HashMap<i32, Instant>>,
    /// The epoch in the key of each job of a claimed partition not yet ended, by
    /// (partition, device, `seq`): its tombstone needs the same key. A job restored from a
    /// legacy key (no epoch) has none. Bounded by the jobs queued here.
    key_epochs: Mutex<HashMap<(i32, String, u64), u64>>,
}

impl DeliveryLog {
    /// The log `topic` on `brokers`; `reader_group` names the restore's reader to Kafka;
    /// `replica` names this replica in its owner records.
    ///
    /// # Errors
    /// librdkafka refuses the configuration.
    pub fn new(brokers: &str, topic: &str, reader_group: &str, replica: &str) -> anyhow::Result<DeliveryLog> {
        let producer =
            kafka_client::ordered_producer(brokers).create().context("creating the delivery log's producer")?;
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        Ok(DeliveryLog {
            producer,
            topic: topic.to_string(),
            brokers: brokers.to_string(),
            reader_group: reader_group.to_string(),
            replica: replica.to_string(),
            take_prefix: format!("{replica}.{}.{started}", std::process::id()),
            claims: AtomicU64::new(0),
            takes: Mutex::default(),
            overtaken: Mutex::default(),
            key_epochs: Mutex::default(),
        })
    }

    fn take(&self, partition: i32) -> Option<Take> {
        self.takes.lock().unwrap_or_else(PoisonError::into_inner).get(&partition).copied()
    }

    /// The partitions whose claim another replica's overtook, each with when this replica
    /// found out (a partition claimed again leaves the list).
    pub fn overtaken(&self) -> Vec<(i32, Instant)> {
        self.overtaken.lock().unwrap_or_else(PoisonError::into_inner).iter().map(|(p, t)| (*p, *t)).collect()
    }

    /// The epoch this replica writes `partition`'s records under, when it holds a claim.
    pub fn epoch(&self, partition: i32) -> Option<u64> {
        self.take(partition).map(|t| t.epoch)
    }

    /// A take of `partition` about to begin: pass it to [`DeliveryLog::claim`] until a
    /// claim wins. It keeps what was read of the log across tries.
    pub fn take_of(&self, partition: i32) -> TakeProgress {
        TakeProgress { partition, reader: Some(self.reader(partition)), folder: Folder::default() }
    }

    /// Takes `progress`'s partition: reads its log to the end, appends an owner record of
    /// the next epoch and reads on to it; returns what the log holds when the claim won. A
    /// claim that lost (another of the same epoch came first) is made again at the epoch
    /// after, up to [`CLAIM_ATTEMPTS`] times. Each read waits at most `timeout` for a
    /// record. Called again after an error with the same `progress`, it reads on from the
    /// last record it read.
    ///
    /// # Errors
    /// Kafka cannot be read or written, or every claim lost, or the log's epoch is at its
    /// maximum.
    pub async fn claim(&self, progress: &mut TakeProgress, timeout: Duration) -> anyhow::Result<Restored> {
        let partition = progress.partition;
        let TakeProgress { reader, folder, .. } = progress;
        read_blocking(reader, folder, timeout, None).await?;
        for _ in 0..CLAIM_ATTEMPTS {
            let epoch = folder
                .owner()
                .map_or(0, |o| o.epoch)
                .checked_add(1)
                .with_context(|| format!("{}/{partition}: the owner epoch is at its maximum", self.topic))?;
            let n = self.claims.fetch_add(1, Ordering::Relaxed);
            let take = format!("{}.{n}", self.take_prefix);
            let key = owner_key(epoch, &take);
            let offset = self.produce_one(partition, &key, self.replica.as_bytes()).await?;
            read_blocking(reader, folder, timeout, Some(offset + 1)).await?;
            match folder.owner() {
                Some(o) if o.take == take => {
                    self.takes.lock().unwrap_or_else(PoisonError::into_inner).insert(partition, Take { epoch, offset });
                    self.overtaken.lock().unwrap_or_else(PoisonError::into_inner).remove(&partition);
                    let restored = std::mem::take(folder).finish();
                    let mut keys = self.key_epochs.lock().unwrap_or_else(PoisonError::into_inner);
                    keys.retain(|(p, _, _), _| *p != partition);
                    keys.extend(restored.key_epochs.iter().map(|((d, seq), e)| ((partition, d.clone(), *seq), *e)));
                    return Ok(restored);
                }
                o => {
                    let winner = o.map(|o| o.replica.clone()).unwrap_or_default();
                    tracing::warn!(
                        partition,
                        epoch,
                        winner,
                        "a claim of a delivery log partition lost to another replica's; claiming again"
                    );
                }
            }
        }
        anyhow::bail!("{CLAIM_ATTEMPTS} claims of {}/{partition} lost to other replicas' claims", self.topic)
    }

    /// Blocking: once `partition` is claimed and its previous owner fenced off (the broker
    /// closed its connection for this one's), reads the log on from this replica's owner
    /// record to the end and applies to `restored` what the previous owner logged after
    /// the claim, while it still delivered ([`Restored::late_record`]): the jobs it ended
    /// are not sent again. Returns how many restored jobs it ended.
    ///
    /// # Errors
    /// No claim on `partition`, or Kafka cannot be read within `timeout`.
    pub fn late_ends_blocking(
        &self,
        partition: i32,
        restored: &mut Restored,
        timeout: Duration,
    ) -> anyhow::Result<usize> {
        let take = self.take(partition).with_context(|| format!("{}/{partition}: not claimed", self.topic))?;
        let mut ended = Vec::new();
        self.scan_after(partition, take, timeout, |m| {
            ended.extend(restored.late_record(m.key().unwrap_or_default(), m.payload()));
        })?;
        let mut keys = self.key_epochs.lock().unwrap_or_else(PoisonError::into_inner);
        for (device, seq) in &ended {
            keys.remove(&(partition, device.clone(), *seq));
        }
        Ok(ended.len())
    }

    /// Gives `partition` up: nothing more is written to it by this replica.
    pub fn release(&self, partition: i32) {
        self.takes.lock().unwrap_or_else(PoisonError::into_inner).remove(&partition);
        self.overtaken.lock().unwrap_or_else(PoisonError::into_inner).remove(&partition);
        self.key_epochs.lock().unwrap_or_else(PoisonError::into_inner).retain(|(p, _, _), _| *p != partition);
    }

    /// Whether this replica's claim on `partition` is still the last one (blocking): reads
    /// the log from its owner record to the end, looking for a claim of a higher epoch.
    /// `false` without a claim; a claim overtaken is released ([`DeliveryLog::epoch`] is
    /// `None` after).
    ///
    /// # Errors
    /// Kafka cannot be read within `timeout`.
    pub fn still_owner_blocking(&self, partition: i32, timeout: Duration) -> anyhow::Result<bool> {
        let Some(take) = self.take(partition) else { return Ok(false) };
        let mut newer = false;
        self.scan_after(partition, take, timeout, |m| {
            let epoch = m
                .key()
                .unwrap_or_default()
                .strip_prefix(b"owner/")
                .and_then(|rest| std::str::from_utf8(rest).ok()?.split('/').next()?.parse::<u64>().ok());
            newer |= epoch.is_some_and(|e| e > take.epoch);
        })?;
        if newer {
            let mut takes = self.takes.lock().unwrap_or_else(PoisonError::into_inner);
            // Only the claim read at the start: one made since (this replica took the
            // partition again meanwhile) is newer than what was found, and its own.
            if takes.get(&partition).is_some_and(|t| t.offset == take.offset) {
                // Nothing more is written under the old claim; the consumer drops the
                // partition's queues and claims it again if the group still gives it here
                // a session timeout later.
                takes.remove(&partition);
                self.overtaken.lock().unwrap_or_else(PoisonError::into_inner).insert(partition, Instant::now());
            }
        }
        Ok(!newer)
    }

    /// Reads `partition`'s log from just after the owner record of `take` to its end
    /// (blocking), handing each record to `each`.
    fn scan_after(
        &self,
        partition: i32,
        take: Take,
        timeout: Duration,
        each: impl FnMut(&rdkafka::message::BorrowedMessage<'_>),
    ) -> anyhow::Result<()> {
        let mut reader = self.reader(partition).starting_at(take.offset + 1);
        let end = reader.end(timeout)?;
        reader.scan_to(end, timeout, each)
    }

    fn reader(&self, partition: i32) -> PartitionReader {
        PartitionReader::new(&self.brokers, &self.reader_group, &self.topic, partition)
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
    /// ends the same); or this replica holds no claim on `partition`.
    pub async fn accepted(&self, partition: i32, queued: &[Queued], pos: i64) -> Result<(), LogError> {
        let epoch = self.epoch(partition).ok_or(LogError::NotClaimed(partition))?;
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
                epoch,
            };
            let value = serde_json::to_vec(&logged).expect("a logged job serialises");
            records.push((job_key(&q.stored.device, q.stored.job.seq, epoch), value));
            records.push((seq_key(&q.stored.device), numbered(q.stored.job.seq, epoch).into_bytes()));
        }
        records.push((POS_KEY.to_string(), numbered(pos, epoch).into_bytes()));
        self.key_epochs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(queued.iter().map(|q| ((partition, q.stored.device.clone(), q.stored.job.seq), epoch)));
        Ok(self.produce(partition, records).await?)
    }

    /// Logs that `stored` left its queue (a tombstone of its job's key, with the epoch it
    /// was accepted under; a job restored from a [`legacy_job_key`] gets a tombstone of
    /// that key with the [`EPOCH_HEADER`] header), on `partition`.
    /// Not waited for: librdkafka delivers it in order with the partition's other records.
    /// Nothing is written for a partition this replica holds no claim on: its owner ends
    /// the job.
    ///
    /// # Errors
    /// librdkafka refused to queue it (its configuration, or a fatal producer error).
    pub async fn ended(&self, partition: i32, stored: &StoredJob) -> Result<(), KafkaError> {
        let Some(epoch) = self.epoch(partition) else { return Ok(()) };
        let (device, seq) = (stored.device.clone(), stored.job.seq);
        let logged_under =
            self.key_epochs.lock().unwrap_or_else(PoisonError::into_inner).remove(&(partition, device.clone(), seq));
        let (key, header) = match logged_under {
            Some(e) => (job_key(&device, seq, e), None),
            None => (legacy_job_key(&device, seq), Some(epoch_header(&epoch.to_string()))),
        };
        let mut record: FutureRecord<'_, str, [u8]> =
            FutureRecord::to(&self.topic).partition(partition).key(key.as_str());
        if let Some(h) = header {
            record = record.headers(h);
        }
        let delivery = send_waiting(&self.producer, record).await?;
        tokio::spawn(async move {
            if let Ok(Err((e, _))) = delivery.await {
                tracing::error!(device, seq, error = %e, "a job's end did not reach the delivery log: its partition's next owner sends it again (the device dedupes it)");
            }
        });
        Ok(())
    }

    /// Waits up to `timeout` for every record produced to reach Kafka (at shutdown).
    ///
    /// # Errors
    /// Some were not delivered within `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        use rdkafka::producer::Producer;
        self.producer.flush(timeout)
    }

    /// Produces one record without an epoch header (an owner record) and waits for Kafka to
    /// have it; returns its offset.
    async fn produce_one(&self, partition: i32, key: &str, value: &[u8]) -> Result<i64, KafkaError> {
        let record: FutureRecord<'_, str, [u8]> =
            FutureRecord::to(&self.topic).partition(partition).key(key).payload(value);
        match send_waiting(&self.producer, record).await?.await {
            Ok(Ok(d)) => Ok(d.offset),
            Ok(Err((e, _))) => Err(e),
            Err(_) => Err(KafkaError::Canceled),
        }
    }

    /// Produces `records` (each carrying its epoch in its value) to `partition` and waits
    /// until Kafka has every one.
    async fn produce(&self, partition: i32, records: Vec<(String, Vec<u8>)>) -> Result<(), KafkaError> {
        let mut deliveries = Vec::with_capacity(records.len());
        for (key, value) in &records {
            // No header: the epoch is in the value, and a header costs some brokers more
            // than its bytes (tansu 0.6.0 scans its whole header table for every record it
            // serves, of any topic).
            let record: FutureRecord<'_, str, [u8]> =
                FutureRecord::to(&self.topic).partition(partition).key(key.as_str()).payload(value.as_slice());
            deliveries.push(send_waiting(&self.producer, record).await?);
        }
        delivered(deliveries).await
    }
}

/// Reads `reader`'s partition on a blocking thread, into `folder`, up to `end` (exclusive;
/// `None`: the partition's end now). The reader is handed back unless its thread panicked;
/// after an error it is where it got to, and `folder` holds what it read.
async fn read_blocking(
    reader: &mut Option<PartitionReader>,
    folder: &mut Folder,
    timeout: Duration,
    end: Option<i64>,
) -> anyhow::Result<()> {
    let mut r = reader.take().context("the delivery log's reader was lost with a failed thread")?;
    let mut f = std::mem::take(folder);
    let (r, f, read) = tokio::task::spawn_blocking(move || {
        let read = match end {
            Some(end) => read_to(&mut r, end, &mut f, timeout),
            None => r.end(timeout).and_then(|end| read_to(&mut r, end, &mut f, timeout)),
        };
        (r, f, read)
    })
    .await
    .context("the delivery log reader's thread")?;
    *reader = Some(r);
    *folder = f;
    read
}

/// Pushes every record of `reader` up to `end` (exclusive) into `folder`.
fn read_to(reader: &mut PartitionReader, end: i64, folder: &mut Folder, timeout: Duration) -> anyhow::Result<()> {
    reader.scan_to(end, timeout, |m| {
        let epoch = m.headers().and_then(|h| {
            let v = crate::ingest::record_headers::find(h, |k| k == EPOCH_HEADER.as_bytes())??;
            std::str::from_utf8(v).ok()?.parse::<u64>().ok()
        });
        folder.push(m.key().unwrap_or_default(), m.payload(), epoch);
    })
}

/// The [`EPOCH_HEADER`] header with `epoch` (decimal).
fn epoch_header(epoch: &str) -> OwnedHeaders {
    OwnedHeaders::new().insert(Header { key: EPOCH_HEADER, value: Some(epoch) })
}

/// A take of one partition in progress ([`DeliveryLog::take_of`]): the log read so far.
pub struct TakeProgress {
    partition: i32,
    /// `None` only after its reading thread panicked.
    reader: Option<PartitionReader>,
    folder: Folder,
}

/// A partition connection to the devices' broker asks before it reconnects.
impl OwnerCheck for DeliveryLog {
    fn still_owner(
        self: std::sync::Arc<Self>,
        partition: i32,
    ) -> Pin<Box<dyn Future<Output = anyhow::Result<bool>> + Send>> {
        Box::pin(async move {
            tokio::task::spawn_blocking(move || self.still_owner_blocking(partition, Duration::from_secs(10)))
                .await
                .context("the owner check's thread")?
        })
    }
}
