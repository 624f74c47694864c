//! The central shape's reader (`cluster.enabled`): three Kafka consumers the consumer loop
//! sees as one [`GroupReader`] (`docs/cluster.md`):
//!
//! - the **route** member, in group `{kafka.group_id}-route`, reading `charge.upserted`;
//! - the **deliver** member, in group `{kafka.group_id}-deliver`, reading
//!   `cluster.device_jobs_topic`;
//! - the **registry reader**: `device.upserted` read in full, every partition, outside any
//!   group (assign), so that every replica has the whole device registry whatever
//!   partitions the groups give it.
//!
//! Each has its own fetches and its own queue in librdkafka, so a backlog of charge events
//! does not hold back the jobs already routed; the loop takes whichever record comes first.
//! Each group rebalances on its own: a replica joining moves charge partitions and
//! device-jobs partitions independently.
//!
//! - **Where the registry starts.** Each device partition is read from the position the
//!   outbox saved ([`Outbox::read_positions`]), or from its start on a fresh outbox. Kafka
//!   keeps no position for a reader outside a group; the outbox keeps it next to the
//!   registry entries those records wrote, and saves it once a second and at shutdown, only
//!   past records whose batch is written ([`GroupReader::store_offset`] is called after the
//!   write).
//! - **The gate.** At start the reader asks Kafka for each device partition's end, and the
//!   two members join their groups only once it has read to those ends: a replica takes no
//!   charge partition (and routes no charge) with a registry older than what was produced
//!   before it started. Until then `/readyz` says the charge topic has no partition.
//! - **After the gate.** Device records keep coming as they are produced, interleaved with
//!   the groups' records. A charge whose terminal the registry does not know yet is held as
//!   on the edge box ([`crate::ingest::registry_wait`]), against this reader's positions.
//!
//! The device partitions are part of the loop's assignment and can be paused like any
//! other; their stored offsets go to the outbox instead of Kafka.

use crate::config::Config;
use crate::ingest::backpressure::Action;
use crate::ingest::group_reader::GroupReader;
use crate::ingest::group_watch::{Members, Watched};
use crate::ingest::kafka_metadata::topic_partitions;
use crate::ingest::member::create;
use crate::ingest::rebalance::{GatewayConsumer, Rebalances};
use crate::kafka_client;
use crate::model::Partition;
use crate::shutdown::Shutdown;
use crate::store::Outbox;
use crate::telemetry::Monitor;
use anyhow::Context;
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
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

/// The route and deliver members and the device topic's reader, as one [`GroupReader`].
pub struct ClusterReader {
    /// Group `{kafka.group_id}-route`, the charge topic.
    route: GatewayConsumer,
    route_group: String,
    charge_topic: String,
    /// Group `{kafka.group_id}-deliver`, the device-jobs topic.
    deliver: GatewayConsumer,
    deliver_group: String,
    device_jobs_topic: String,
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

/// The ends to read to before joining the groups.
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
    /// Blocking: the three consumers for `cfg`: the registry reader with each device
    /// partition assigned from the position `outbox` saved, and the ends to read to before
    /// the route and deliver members subscribe. Their static membership ids, with
    /// `kafka.instance_id` set, are it followed by `-route` and `-deliver`.
    ///
    /// # Errors
    /// librdkafka refuses the configuration, Kafka does not answer within 10 s, the device
    /// topic has no partitions, or the outbox cannot be read.
    pub fn open(cfg: &Config, health: Arc<Monitor>, outbox: Arc<Outbox>) -> anyhow::Result<ClusterReader> {
        let (charge_topic, device_jobs_topic) = (&cfg.kafka.charge_topic, &cfg.cluster.device_jobs_topic);
        let group = |topic: &str| cfg.group_of(topic).expect("the central shape's groups");
        let (route_group, deliver_group) = (group(charge_topic), group(device_jobs_topic));
        let route = create(cfg, &health, &route_group, "-route")?;
        let deliver = create(cfg, &health, &deliver_group, "-deliver")?;
        let topic = cfg.kafka.device_topic.clone();
        let feed = feed_consumer(cfg, health)?;
        let parts = topic_partitions(&feed, &topic, START_TIMEOUT)
            .with_context(|| format!("reading the metadata of {topic}"))?;
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
        tracing::info!(topic = %topic, partitions = parts.len(), records = behind, "reading the device registry in full (outside any consumer group) before joining the route and deliver groups");
        let reader = ClusterReader {
            route,
            route_group,
            charge_topic: charge_topic.clone(),
            deliver,
            deliver_group,
            device_jobs_topic: device_jobs_topic.clone(),
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

    /// The route and deliver members, once they have joined their groups.
    fn members(&self) -> Vec<Watched<'_>> {
        if !self.joined.load(Ordering::SeqCst) {
            return Vec::new();
        }
        vec![
            Watched { consumer: &self.route, group: self.route_group.clone(), topics: vec![self.charge_topic.clone()] },
            Watched {
                consumer: &self.deliver,
                group: self.deliver_group.clone(),
                topics: vec![self.device_jobs_topic.clone()],
            },
        ]
    }

    /// Sets what runs for each device-jobs partition revoked, inside the deliver member's
    /// rebalance hook ([`Rebalances::on_revoke`]).
    pub fn on_deliver_revoke(&self, hook: impl Fn(i32) + Send + Sync + 'static) {
        let topic = self.device_jobs_topic.clone();
        self.deliver.context().on_revoke(Box::new(move |t, p| {
            if t == topic {
                hook(p);
            }
        }));
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

    /// Joins the groups once the device partitions are read to the ends seen at start.
    fn open_gate(&self) -> KafkaResult<()> {
        let mut gate = self.gate.lock().expect("gate lock");
        let Some(g) = gate.as_ref() else { return Ok(()) };
        {
            let at = self.at.lock().expect("positions lock");
            if g.ends.iter().any(|(p, end)| at.get(p).copied().unwrap_or(0) < *end) {
                return Ok(());
            }
        }
        self.route.subscribe(&[&self.charge_topic])?;
        self.deliver.subscribe(&[&self.device_jobs_topic])?;
        tracing::info!(
            topic = %self.device_topic,
            ms = g.started.elapsed().as_millis() as u64,
            "the device registry has read to the ends seen at start: joining the route and deliver consumer groups"
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

    /// The group member reading `part`'s topic; `None` for the device topic.
    fn member(&self, part: &Partition) -> Option<&GatewayConsumer> {
        if part.0 == self.device_topic {
            None
        } else if part.0 == self.device_jobs_topic {
            Some(&self.deliver)
        } else {
            Some(&self.route)
        }
    }
}

/// The device topic's reader: assign only, never in a group and never committing
/// (`group.id` is set because librdkafka wants one, and names what reads).
fn feed_consumer(cfg: &Config, health: Arc<Monitor>) -> anyhow::Result<GatewayConsumer> {
    let k = &cfg.kafka;
    kafka_client::client(&k.brokers)
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
                // Whichever comes first (tokio picks a ready branch at random): no stage's
                // backlog holds the others back.
                return tokio::select! {
                    m = GroupReader::recv(&self.route) => m,
                    m = GroupReader::recv(&self.deliver) => m,
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
                    // The record is had: a failed subscribe is tried again at the next call.
                    if let Err(e) = self.open_gate() {
                        tracing::error!(error = %e, "cannot subscribe to the route and deliver topics; tried again");
                    }
                    return m;
                }
                () = tokio::time::sleep(GATE_CHECK) => self.advance(None),
            }
        }
    }

    fn store_offset(&self, part: &Partition, next: i64) -> KafkaResult<()> {
        if let Some(member) = self.member(part) {
            return GroupReader::store_offset(member, part, next);
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
        if let Some(member) = self.member(part) {
            return GroupReader::pause(member, part, action);
        }
        match action {
            Action::Pause => Consumer::pause(&self.feed, &one(part)),
            Action::Resume => Consumer::resume(&self.feed, &one(part)),
        }
    }

    fn seek(&self, part: &Partition, offset: i64) -> KafkaResult<()> {
        match self.member(part) {
            Some(member) => GroupReader::seek(member, part, offset),
            None => Consumer::seek(
                &self.feed,
                &part.0,
                part.1,
                Offset::Offset(offset),
                crate::ingest::group_reader::SEEK_TIMEOUT,
            ),
        }
    }

    fn assignment(&self) -> KafkaResult<Vec<Partition>> {
        let mut parts = Vec::new();
        if self.joined.load(Ordering::SeqCst) {
            parts.extend(GroupReader::assignment(&self.route)?);
            parts.extend(GroupReader::assignment(&self.deliver)?);
        }
        parts.extend(self.at.lock().expect("positions lock").keys().map(|p| (self.device_topic.clone(), *p)));
        Ok(parts)
    }

    fn rebalanced(&self) -> Option<Vec<Partition>> {
        let (route, deliver) = (self.route.context().take(), self.deliver.context().take());
        let announce = !self.announced.swap(true, Ordering::SeqCst);
        if route.is_none() && deliver.is_none() && !announce {
            return None;
        }
        // The device partitions, assigned at open, are a change the loop has not seen yet
        // at the first call.
        Some(route.into_iter().chain(deliver).flatten().collect())
    }

    fn positions(&self) -> KafkaResult<Vec<(Partition, Option<i64>)>> {
        let mut out = Vec::new();
        if self.joined.load(Ordering::SeqCst) {
            out.extend(GroupReader::positions(&self.route)?);
            out.extend(GroupReader::positions(&self.deliver)?);
        }
        self.advance(None);
        out.extend(
            self.at.lock().expect("positions lock").iter().map(|(p, at)| ((self.device_topic.clone(), *p), Some(*at))),
        );
        Ok(out)
    }

    fn commit(&self) -> KafkaResult<()> {
        self.saved.save();
        if !self.joined.load(Ordering::SeqCst) {
            return Ok(());
        }
        let nothing = |r: &KafkaResult<()>| matches!(r, Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)));
        let (route, deliver) = (GroupReader::commit(&self.route), GroupReader::commit(&self.deliver));
        match (route, deliver) {
            // Both had nothing left to commit: say so, as one member would.
            (r, d) if nothing(&r) && nothing(&d) => r,
            (r, d) if nothing(&r) => d,
            (r, d) if nothing(&d) => r,
            (Err(e), _) | (Ok(()), Err(e)) => Err(e),
            (Ok(()), Ok(())) => Ok(()),
        }
    }
}

impl Members for std::sync::Weak<ClusterReader> {
    fn each(&self, f: &mut dyn FnMut(Watched<'_>)) {
        if let Some(reader) = self.upgrade() {
            reader.members().into_iter().for_each(f);
        }
    }
}
