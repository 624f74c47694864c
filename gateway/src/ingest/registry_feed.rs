//! The central shape's reader (`cluster.enabled`): the consumer-group member for the charge
//! and device-jobs topics ([`Config::group_topics`]), and `device.upserted` read in full,
//! every partition, outside the group (assign), so that every replica has the whole device
//! registry whatever partitions the group gives it (`docs/cluster.md`, "The registry").
//!
//! - **Where it starts.** Each device partition is read from the position the outbox saved
//!   ([`Outbox::read_positions`]), or from its start on a fresh outbox. Kafka keeps no
//!   position for a reader outside a group; the outbox keeps it next to the registry entries
//!   those records wrote, and saves it once a second and at shutdown, only past records
//!   whose batch is written ([`GroupReader::store_offset`] is called after the write).
//! - **The gate.** At start the reader asks Kafka for each device partition's end, and
//!   joins the consumer group only once it has read to those ends: a replica takes no
//!   charge partition (and routes no charge) with a registry older than what was produced
//!   before it started. Until then `/readyz` says the charge topic has no partition.
//! - **After the gate.** Device records keep coming as they are produced, interleaved with
//!   the group's records. A charge whose terminal the registry does not know yet is held as
//!   on the edge box ([`crate::ingest::registry_wait`]), against this reader's positions.
//!
//! The loop sees one [`GroupReader`]: the device partitions are part of its assignment, can
//! be paused like any other, and their stored offsets go to the outbox instead of Kafka.

use crate::config::Config;
use crate::ingest::backpressure::Action;
use crate::ingest::group_reader::GroupReader;
use crate::ingest::rebalance::{GatewayConsumer, Rebalances};
use crate::model::Partition;
use crate::shutdown::Shutdown;
use crate::store::Outbox;
use crate::telemetry::Monitor;
use anyhow::Context;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaResult;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long Kafka may take to answer each question at start (metadata, ends).
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the gate looks at the reader's positions while no device record comes (the
/// last offsets of a partition can be transaction markers, which are never delivered).
const GATE_CHECK: Duration = Duration::from_millis(500);
/// How often read positions are saved to the outbox.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// The group member and the device topic's reader, as one [`GroupReader`].
pub struct ClusterReader {
    group: GatewayConsumer,
    group_topics: Vec<String>,
    feed: GatewayConsumer,
    device_topic: String,
    /// Per device partition: the next offset the loop has been given (from the saved
    /// position, each record, and librdkafka's position past transaction markers).
    at: Mutex<BTreeMap<i32, i64>>,
    /// The ends seen at start, until the reader has read to them.
    gate: Mutex<Option<Gate>>,
    joined: AtomicBool,
    /// The device partitions were reported to the loop as a change.
    announced: AtomicBool,
    saved: Arc<Saved>,
}

/// The ends to read to before joining the group.
struct Gate {
    ends: BTreeMap<i32, i64>,
    started: Instant,
}

/// Positions stored by the loop, to save to the outbox.
struct Saved {
    topic: String,
    outbox: Arc<Outbox>,
    stored: Mutex<(BTreeMap<i32, i64>, bool)>,
}

impl Saved {
    /// Blocking: saves what changed since the last save. A failure keeps it for the next
    /// save (the records are read again after a restart meanwhile, harmlessly).
    fn save(&self) {
        let positions = {
            let mut s = self.stored.lock().expect("positions lock");
            if !s.1 {
                return;
            }
            s.1 = false;
            s.0.clone()
        };
        if let Err(e) = self.outbox.save_read_positions(&self.topic, &positions) {
            tracing::warn!(error = %e, topic = %self.topic, "cannot save the device topic's read positions; tried again in a second (a restart meanwhile reads a few device records again)");
            self.stored.lock().expect("positions lock").1 = true;
        }
    }
}

impl ClusterReader {
    /// Blocking: the reader of `cfg`'s device topic for `group` (created by the caller,
    /// not yet subscribed), each device partition assigned from the position `outbox`
    /// saved, and the ends to read to before `group` subscribes to
    /// [`Config::group_topics`].
    ///
    /// # Errors
    /// librdkafka refuses the configuration, Kafka does not answer within 10 s, the device
    /// topic has no partitions, or the outbox cannot be read.
    pub fn open(
        group: GatewayConsumer,
        cfg: &Config,
        health: Arc<Monitor>,
        outbox: Arc<Outbox>,
    ) -> anyhow::Result<ClusterReader> {
        let topic = cfg.kafka.device_topic.clone();
        let feed = feed_consumer(cfg, health)?;
        let md = feed
            .fetch_metadata(Some(&topic), START_TIMEOUT)
            .with_context(|| format!("reading the metadata of {topic}"))?;
        let parts: Vec<i32> = md
            .topics()
            .iter()
            .filter(|t| t.name() == topic)
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        anyhow::ensure!(!parts.is_empty(), "the device topic {topic} has no partitions in Kafka's metadata");
        let saved = outbox.read_positions(&topic).context("reading the device topic's saved positions")?;
        let (mut tpl, mut at, mut ends) = (TopicPartitionList::new(), BTreeMap::new(), BTreeMap::new());
        for p in &parts {
            let (low, end) = feed
                .fetch_watermarks(&topic, *p, START_TIMEOUT)
                .with_context(|| format!("reading the end offset of {topic}/{p}"))?;
            let start = saved.get(p).copied().filter(|s| *s >= low && *s <= end);
            tpl.add_partition_offset(&topic, *p, start.map_or(Offset::Beginning, Offset::Offset))?;
            at.insert(*p, start.unwrap_or(low));
            ends.insert(*p, end);
        }
        feed.assign(&tpl).with_context(|| format!("assigning every partition of {topic}"))?;
        // Stored in librdkafka too (never committed: `enable.auto.commit=false`) so that its
        // statistics, and readiness's lag, count from where the registry is.
        let mut stored = TopicPartitionList::new();
        for (p, next) in &at {
            stored.add_partition_offset(&topic, *p, Offset::Offset(*next))?;
        }
        feed.store_offsets(&stored).with_context(|| format!("storing the start positions of {topic}"))?;
        let behind: i64 = ends.iter().map(|(p, e)| e - at[p]).sum();
        tracing::info!(topic = %topic, partitions = parts.len(), records = behind, "reading the device registry in full (outside the consumer group) before joining it");
        let reader = ClusterReader {
            group,
            group_topics: cfg.group_topics(),
            feed,
            device_topic: topic.clone(),
            at: Mutex::new(at),
            gate: Mutex::new(Some(Gate { ends, started: Instant::now() })),
            joined: AtomicBool::new(false),
            announced: AtomicBool::new(false),
            saved: Arc::new(Saved { topic, outbox, stored: Mutex::new((BTreeMap::new(), false)) }),
        };
        Ok(reader)
    }

    /// Saves the stored device positions to the outbox once a second until `shutdown`
    /// (the last save is [`GroupReader::commit`]'s).
    pub fn save_positions(&self, shutdown: &Shutdown) {
        let (saved, stop) = (self.saved.clone(), shutdown.clone());
        shutdown.spawn(async move {
            let mut every = tokio::time::interval(SAVE_EVERY);
            loop {
                tokio::select! {
                    () = stop.requested() => return,
                    _ = every.tick() => {
                        let saved = saved.clone();
                        let _ = tokio::task::spawn_blocking(move || saved.save()).await;
                    }
                }
            }
        });
    }

    /// Joins the group once the device partitions are read to the ends seen at start.
    fn open_gate(&self) -> KafkaResult<()> {
        let mut gate = self.gate.lock().expect("gate lock");
        let Some(g) = gate.as_ref() else { return Ok(()) };
        {
            let at = self.at.lock().expect("positions lock");
            if g.ends.iter().any(|(p, end)| at.get(p).copied().unwrap_or(0) < *end) {
                return Ok(());
            }
        }
        self.group.subscribe(&self.group_topics.iter().map(String::as_str).collect::<Vec<_>>())?;
        tracing::info!(
            topic = %self.device_topic,
            ms = g.started.elapsed().as_millis() as u64,
            "the device registry has read to the ends seen at start: joining the consumer group"
        );
        *gate = None;
        self.joined.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Notes how far the device partitions are read: a record given to the loop, or
    /// librdkafka's positions (which pass transaction markers).
    fn advance(&self, record: Option<(i32, i64)>) {
        let mut at = self.at.lock().expect("positions lock");
        if let Some((p, offset)) = record {
            let next = at.entry(p).or_insert(offset + 1);
            *next = (*next).max(offset + 1);
            return;
        }
        if let Ok(tpl) = self.feed.position() {
            for e in tpl.elements() {
                if let Offset::Offset(o) = e.offset() {
                    let next = at.entry(e.partition()).or_insert(o);
                    *next = (*next).max(o);
                }
            }
        }
    }

    /// A record of the device topic, noted as read.
    fn device_record(&self, m: KafkaResult<rdkafka::message::BorrowedMessage<'_>>) -> KafkaResult<OwnedMessage> {
        let m = m?.detach();
        self.advance(Some((m.partition(), m.offset())));
        Ok(m)
    }
}

/// The device topic's reader: assign only, never in a group and never committing
/// (`group.id` is set because librdkafka wants one, and names what reads).
fn feed_consumer(cfg: &Config, health: Arc<Monitor>) -> anyhow::Result<GatewayConsumer> {
    let k = &cfg.kafka;
    ClientConfig::new()
        .set("bootstrap.servers", &k.brokers)
        .set("group.id", format!("{}-registry", k.group_id))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", k.fetch_wait_max_ms.to_string())
        .set("queued.max.messages.kbytes", "16384")
        .set("statistics.interval.ms", cfg.health.statistics_interval_ms.to_string())
        .create_with_context(Rebalances::new(health))
        .context("creating the device topic's reader")
}

fn one(part: &Partition) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&part.0, part.1);
    tpl
}

impl GroupReader for ClusterReader {
    async fn recv(&self) -> KafkaResult<OwnedMessage> {
        loop {
            if self.joined.load(Ordering::SeqCst) {
                return tokio::select! {
                    m = GroupReader::recv(&self.group) => m,
                    m = rdkafka::consumer::StreamConsumer::recv(&self.feed) => self.device_record(m),
                };
            }
            self.open_gate()?;
            if self.joined.load(Ordering::SeqCst) {
                continue;
            }
            tokio::select! {
                m = rdkafka::consumer::StreamConsumer::recv(&self.feed) => {
                    let m = self.device_record(m);
                    // Cannot fail once the record is had: a failed subscribe is tried again
                    // at the next call.
                    if let Err(e) = self.open_gate() {
                        tracing::error!(error = %e, "cannot subscribe to the consumer group's topics; tried again");
                    }
                    return m;
                }
                () = tokio::time::sleep(GATE_CHECK) => self.advance(None),
            }
        }
    }

    fn store_offset(&self, part: &Partition, next: i64) -> KafkaResult<()> {
        if part.0 != self.device_topic {
            return GroupReader::store_offset(&self.group, part, next);
        }
        {
            let mut s = self.saved.stored.lock().expect("positions lock");
            let at = s.0.entry(part.1).or_insert(next);
            *at = (*at).max(next);
            s.1 = true;
        }
        // For librdkafka's statistics (readiness's lag); the outbox is what keeps it.
        GroupReader::store_offset(&self.feed, part, next)
    }

    fn pause(&self, part: &Partition, action: Action) -> KafkaResult<()> {
        if part.0 != self.device_topic {
            return GroupReader::pause(&self.group, part, action);
        }
        match action {
            Action::Pause => Consumer::pause(&self.feed, &one(part)),
            Action::Resume => Consumer::resume(&self.feed, &one(part)),
        }
    }

    fn assignment(&self) -> KafkaResult<Vec<Partition>> {
        let mut parts =
            if self.joined.load(Ordering::SeqCst) { GroupReader::assignment(&self.group)? } else { Vec::new() };
        parts.extend(self.at.lock().expect("positions lock").keys().map(|p| (self.device_topic.clone(), *p)));
        Ok(parts)
    }

    fn rebalanced(&self) -> Option<Vec<Partition>> {
        let revoked = self.group.context().take();
        if self.announced.swap(true, Ordering::SeqCst) {
            revoked
        } else {
            // The device partitions, assigned at open, are a change the loop has not seen.
            Some(revoked.unwrap_or_default())
        }
    }

    fn positions(&self) -> KafkaResult<Vec<(Partition, Option<i64>)>> {
        let mut out =
            if self.joined.load(Ordering::SeqCst) { GroupReader::positions(&self.group)? } else { Vec::new() };
        self.advance(None);
        out.extend(
            self.at.lock().expect("positions lock").iter().map(|(p, at)| ((self.device_topic.clone(), *p), Some(*at))),
        );
        Ok(out)
    }

    fn commit(&self) -> KafkaResult<()> {
        self.saved.save();
        if self.joined.load(Ordering::SeqCst) {
            GroupReader::commit(&self.group)
        } else {
            Ok(())
        }
    }
}
