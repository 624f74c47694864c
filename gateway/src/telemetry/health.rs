//! What readiness is judged on: observations of the consumer, Kafka and delivery, turned
//! into [`Facts`]. The rules that judge them are `ops::readiness`.
//!
//! Where the facts come from, at no extra cost to the consumer:
//! - librdkafka statistics (`statistics.interval.ms`, [`Monitor::kafka_statistics`], see
//!   librdkafka's STATISTICS.md): `brokers[].state`, and per partition `ls_offset`
//!   (`hi_offset` when unset), `stored_offset`, `committed_offset`, `lo_offset`. librdkafka
//!   learns the watermarks from its fetch responses only, and a paused partition is not
//!   fetched (`rdkafka_fetcher.c`, "paused"), so for paused partitions `ops::probe` asks
//!   Kafka for the end offset (ListOffsets) every `health.paused_probe_interval_ms`;
//! - the consumer's own view: assignment, pause causes, outbox write failures (hooks in
//!   the consumer loop), records read per topic (the stats counters), jobs in flight and
//!   acknowledgements (the dispatcher).
//!
//! The [`Tracker`] turns timestamped observations into facts; the [`Monitor`] is the
//! tracker behind a lock with a monotonic clock. Times are milliseconds on the monitor's
//! monotonic clock (0 = when it was created).

use crate::config::{Config, HealthConfig};
use crate::model::Partition;
use rdkafka::statistics::Statistics;
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

/// Device ids named in a readiness reason at most (the count is always given).
pub const DEVICES_NAMED: usize = 5;

/// Why the consumer has paused a partition ([`crate::ingest::consumer`], backpressure). All false
/// and empty: not paused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PauseCause {
    /// It has `kafka.max_pending_per_partition` records read and not yet written.
    pub pending_bound: bool,
    /// The outbox holds `outbox.max_jobs` jobs (all partitions pause).
    pub outbox_full: bool,
    /// Devices it fed whose queue is at `outbox.max_jobs_per_device`, sorted.
    pub devices_at_bound: Vec<String>,
    /// Its records wait for the device registry (`ingest::registry_wait`).
    pub registry_wait: bool,
    /// Taken in the central shape, it waits for its state to be read back from its log
    /// (the delivery log or the route changelog, `ingest::restores`).
    pub restoring: bool,
    /// The outbox's file system has less than `outbox.min_free_bytes` free (all partitions
    /// pause).
    pub low_space: bool,
    /// The outbox write in flight is held (retried), and the next batch is full (all
    /// partitions pause, and the consumer goes on polling Kafka).
    pub write_held: bool,
}

impl PauseCause {
    /// The cause from the consumer's pause reasons for one partition.
    pub fn new(pending_bound: bool, outbox_full: bool, devices_at_bound: Option<&HashSet<String>>) -> PauseCause {
        let mut devices: Vec<String> = devices_at_bound.map(|d| d.iter().cloned().collect()).unwrap_or_default();
        devices.sort();
        PauseCause {
            pending_bound,
            outbox_full,
            devices_at_bound: devices,
            registry_wait: false,
            restoring: false,
            low_space: false,
            write_held: false,
        }
    }

    /// Whether any cause holds (the partition is paused).
    pub fn is_paused(&self) -> bool {
        self.pending_bound
            || self.outbox_full
            || !self.devices_at_bound.is_empty()
            || self.registry_wait
            || self.restoring
            || self.low_space
            || self.write_held
    }

    /// Merges `other` into `self` (the causes of several partitions of one topic).
    fn merge(&mut self, other: &PauseCause) {
        self.pending_bound |= other.pending_bound;
        self.outbox_full |= other.outbox_full;
        self.registry_wait |= other.registry_wait;
        self.restoring |= other.restoring;
        self.low_space |= other.low_space;
        self.write_held |= other.write_held;
        for d in &other.devices_at_bound {
            if let Err(i) = self.devices_at_bound.binary_search(d) {
                self.devices_at_bound.insert(i, d.clone());
            }
        }
    }
}

/// Charge records held until the device registry catches up (`ingest::registry_wait`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryWaitFact {
    /// Held records per charge partition, sorted.
    pub held: Vec<(Partition, usize)>,
    /// The device topic (`kafka.device_topic`).
    pub device_topic: String,
    /// Device records below the ends Kafka last gave that the registry has not applied;
    /// `None` before Kafka answered.
    pub behind: Option<u64>,
    /// Device partitions still behind that this consumer does not hold.
    pub unassigned: Vec<i32>,
    /// Why the last question to Kafka failed, while it fails.
    pub error: Option<String>,
}

/// Partitions of a group's topic that this member does not hold and that make no
/// progress: records beyond the group's committed offset, and that offset unchanged for
/// `health.stall_after_ms` (`ingest::group_watch`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrphanFact {
    /// The consumer group.
    pub group: String,
    /// Each such partition with its lag (records beyond the committed offset), sorted.
    pub partitions: Vec<(i32, u64)>,
    /// Since the oldest of them last moved, ms.
    pub for_ms: u64,
}

/// A Kafka consume error that keeps coming back: records that cannot be read (a codec
/// librdkafka lacks, a corrupt batch, a record over the fetch limit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumeErrorFact {
    /// librdkafka's error text (as rust-rdkafka hands it over).
    pub error: String,
    /// Errors since the first of this streak.
    pub count: u64,
    /// Where: topic, partition, and the offset that cannot be read, once found (the consume
    /// error itself does not say: see `ingest::consume_error`).
    pub at: Option<(String, i32, i64)>,
}

/// One partition's offsets as librdkafka's statistics (or a probe) report them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartitionOffsets {
    /// The end of what the consumer can read: the last stable offset (`ls_offset`,
    /// `isolation.level=read_committed`, librdkafka's default), else the high watermark
    /// (`hi_offset`), as of librdkafka's last fetch response.
    pub end: Option<i64>,
    /// The consumer's position: the higher of the stored offset (what the consumer has
    /// durably accepted) and the committed offset; the log start (`lo_offset`) when neither
    /// is known yet (`auto.offset.reset=earliest`).
    pub position: Option<i64>,
}

impl PartitionOffsets {
    /// From librdkafka's per-partition statistics (negative offsets mean "unknown").
    pub fn from_statistics(p: &rdkafka::statistics::Partition) -> PartitionOffsets {
        let valid = |o: i64| (o >= 0).then_some(o);
        PartitionOffsets {
            end: valid(p.ls_offset).or(valid(p.hi_offset)),
            position: valid(p.stored_offset).max(valid(p.committed_offset)).or(valid(p.lo_offset)),
        }
    }

    /// Records beyond the position, when both ends are known.
    pub fn lag(&self) -> Option<u64> {
        Some(self.end?.saturating_sub(self.position?).max(0) as u64)
    }
}

/// One assigned partition as the dashboard shows it ([`Tracker::partitions`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionView {
    /// Topic.
    pub topic: String,
    /// Partition number.
    pub partition: i32,
    /// The consumer's position ([`PartitionOffsets::position`]), an offset.
    pub position: Option<i64>,
    /// The end the consumer can read to ([`PartitionOffsets::end`]), an offset.
    pub end: Option<i64>,
    /// Records beyond the position.
    pub lag: Option<u64>,
    /// Paused for backpressure.
    pub paused: bool,
}

/// The consumer's broker connections in one statistics sample.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerSample {
    /// Connections in state `UP`.
    pub up: usize,
    /// The others, as `name STATE` (e.g. `127.0.0.1:9092/1 CONNECT`), sorted.
    pub down: Vec<String>,
    /// Connections `UP` with requests waiting for an answer, and how long nothing has been
    /// received on them: a broker that stops answering (frozen, its disk or network
    /// stuck) keeps its connections open, so only this tells it apart from a live one.
    pub waiting: Vec<WaitingBroker>,
}

/// A broker connection with requests waiting for an answer (librdkafka's `waitresp_cnt`,
/// `rxidle`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingBroker {
    /// The connection, e.g. `127.0.0.1:9092/1`.
    pub name: String,
    /// Requests sent and not answered.
    pub requests: u64,
    /// Since anything was last received on the connection, ms.
    pub silent_ms: u64,
}

impl BrokerSample {
    /// From librdkafka's statistics; its internal and logical brokers (e.g. the group
    /// coordinator alias) are not connections and are skipped.
    pub fn from_statistics(s: &Statistics) -> BrokerSample {
        let mut sample = BrokerSample::default();
        for b in s.brokers.values().filter(|b| b.source != "internal" && b.source != "logical") {
            if b.state == "UP" {
                sample.up += 1;
                // `rxidle` is in µs, -1 before the connection's first answer.
                if let (Ok(requests @ 1..), Ok(idle_us)) = (u64::try_from(b.waitresp_cnt), u64::try_from(b.rxidle)) {
                    sample.waiting.push(WaitingBroker { name: b.name.clone(), requests, silent_ms: idle_us / 1_000 });
                }
            } else {
                sample.down.push(format!("{} {}", b.name, b.state));
            }
        }
        sample.down.sort();
        sample.waiting.sort_by(|a, b| a.name.cmp(&b.name));
        sample
    }
}

/// What is known about one subscribed topic at a moment: the input of [`evaluate`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopicFacts {
    /// Records read since the start, as of the last sample.
    pub records_read: u64,
    /// Partitions of the topic this consumer holds.
    pub assigned: usize,
    /// Since when it has held none (`None` while it holds some).
    pub unassigned_since: Option<u64>,
    /// Records beyond the consumer's position, summed over the assigned partitions whose
    /// offsets are known; `None` when none are.
    pub lag: Option<u64>,
    /// Since when the lag has been above zero.
    pub lag_since: Option<u64>,
    /// When a record was last read or an offset last stored.
    pub last_progress: Option<u64>,
    /// When a record was last seen arriving (read, or the end offset grew).
    pub last_record: Option<u64>,
    /// Records read per second over the rate window (or what of it has passed).
    pub rate_per_s: f64,
    /// How much time that rate covers, ms (less than the window just after the start).
    pub rate_span_ms: u64,
    /// Assigned partitions paused for backpressure, and why (merged).
    pub paused: usize,
    /// The merged pause causes of those partitions.
    pub pause: PauseCause,
}

/// Everything [`evaluate`] reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// The consumer loop runs.
    pub consumer_running: bool,
    /// Since the consumer loop last ran, ms.
    pub consumer_idle_ms: u64,
    /// The latest broker sample; `None` before the first statistics arrived.
    pub brokers: Option<BrokerSample>,
    /// When a broker was last seen `UP` (0, the start, if never).
    pub last_broker_up: u64,
    /// Since when writes to the outbox fail, and the last error.
    pub outbox_failing: Option<(u64, String)>,
    /// Per subscribed topic.
    pub topics: BTreeMap<String, TopicFacts>,
    /// Jobs in flight to devices the dispatcher believes reachable.
    pub in_flight: usize,
    /// Since when jobs have been in flight with no device ack (`None`: nothing in flight).
    pub unacked_since: Option<u64>,
    /// Since when charge records are held for the device registry, and what is held.
    pub registry_wait: Option<(u64, RegistryWaitFact)>,
    /// Since when Kafka consume errors keep coming, and the last one.
    pub consume_error: Option<(u64, ConsumeErrorFact)>,
    /// Since when the external MQTT broker is unreachable, and the last error (`None`: up,
    /// or no external broker).
    pub device_broker_down: Option<(u64, String)>,
    /// Since when the broker has not given back owner records this replica published
    /// (CloudPRNT in the central shape), and which (`None`: they come back, or none are
    /// published).
    pub owner_records_missing: Option<(u64, String)>,
    /// Since when the outbox's file system is low on space, with its free bytes when found
    /// so and `outbox.min_free_bytes` (`None`: room enough, or the watermark off).
    pub low_space: Option<(u64, u64, u64)>,
    /// Per topic: partitions held elsewhere in the group that make no progress.
    pub orphans: BTreeMap<String, OrphanFact>,
}

/// One subscribed topic's history.
#[derive(Debug, Default)]
struct TopicTrack {
    /// (time, records read) samples covering the rate window plus one older base sample.
    reads: VecDeque<(u64, u64)>,
    last_reads: u64,
    last_progress: Option<u64>,
    last_record: Option<u64>,
    lag_since: Option<u64>,
    unassigned_since: Option<u64>,
}

/// A Kafka client that sent no statistics for this long (ms) is taken as closed: its last
/// sample no longer counts in the merged brokers.
pub const CLIENT_GONE_MS: u64 = 60_000;

/// Turns timestamped observations into [`Facts`]. Deterministic: every method takes the
/// time; [`Tracker::sample`] advances the per-topic history (call it about every second).
#[derive(Debug)]
pub struct Tracker {
    window_ms: u64,
    assigned: BTreeSet<Partition>,
    pauses: BTreeMap<Partition, PauseCause>,
    offsets: BTreeMap<Partition, PartitionOffsets>,
    /// End offsets asked from Kafka for paused partitions.
    probed_end: BTreeMap<Partition, i64>,
    /// Offsets at the previous sample, to see progress and arrivals.
    seen: BTreeMap<Partition, PartitionOffsets>,
    /// Each Kafka client's latest sample, and when it came: the central shape reads with
    /// three clients, whose samples would otherwise overwrite one another.
    clients: BTreeMap<String, (u64, BrokerSample)>,
    last_broker_up: u64,
    outbox_failing: Option<(u64, String)>,
    topics: BTreeMap<String, TopicTrack>,
    in_flight: usize,
    unacked_since: Option<u64>,
    registry_wait: Option<(u64, RegistryWaitFact)>,
    consume_error: Option<(u64, ConsumeErrorFact)>,
    device_broker_down: Option<(u64, String)>,
    owner_records_missing: Option<(u64, String)>,
    low_space: Option<(u64, u64, u64)>,
    orphans: BTreeMap<String, OrphanFact>,
}

impl Tracker {
    /// A tracker at time 0 for the `subscribed` topics, measuring rates over `window_ms`.
    pub fn new(subscribed: &[String], window_ms: u64) -> Tracker {
        let topics = subscribed
            .iter()
            .map(|t| (t.clone(), TopicTrack { unassigned_since: Some(0), ..TopicTrack::default() }))
            .collect();
        Tracker {
            window_ms: window_ms.max(1),
            assigned: BTreeSet::new(),
            pauses: BTreeMap::new(),
            offsets: BTreeMap::new(),
            probed_end: BTreeMap::new(),
            seen: BTreeMap::new(),
            clients: BTreeMap::new(),
            last_broker_up: 0,
            outbox_failing: None,
            topics,
            in_flight: 0,
            unacked_since: None,
            registry_wait: None,
            consume_error: None,
            device_broker_down: None,
            owner_records_missing: None,
            low_space: None,
            orphans: BTreeMap::new(),
        }
    }

    /// `topic`'s partitions held elsewhere that make no progress now (`None`: none).
    pub fn orphans(&mut self, topic: &str, fact: Option<OrphanFact>) {
        match fact {
            Some(f) => self.orphans.insert(topic.to_string(), f),
            None => self.orphans.remove(topic),
        };
    }

    /// Charge records held for the device registry now (`None`: none).
    pub fn registry_wait(&mut self, now: u64, fact: Option<RegistryWaitFact>) {
        self.registry_wait = fact.map(|f| (self.registry_wait.as_ref().map_or(now, |(since, _)| *since), f));
    }

    /// A consume error streak now (`None`: cleared). A fact without `at` keeps the
    /// location already found.
    pub fn consume_error(&mut self, now: u64, fact: Option<ConsumeErrorFact>) {
        self.consume_error = fact.map(|mut f| {
            let since = self.consume_error.as_ref().map_or(now, |(since, _)| *since);
            if f.at.is_none() {
                f.at = self.consume_error.as_ref().and_then(|(_, old)| old.at.clone());
            }
            (since, f)
        });
    }

    /// Where the consume errors of the current streak come from, once found.
    pub fn consume_error_at(&mut self, at: (String, i32, i64)) {
        if let Some((_, f)) = &mut self.consume_error {
            f.at = Some(at);
        }
    }

    /// The dispatcher has `in_flight` jobs sent to devices it believes reachable.
    pub fn in_flight(&mut self, now: u64, in_flight: usize) {
        self.in_flight = in_flight;
        if in_flight == 0 {
            self.unacked_since = None;
        } else if self.unacked_since.is_none() {
            self.unacked_since = Some(now);
        }
    }

    /// A device acknowledged a job (done or failed: either way the path from the devices
    /// works).
    pub fn acked(&mut self, now: u64) {
        self.unacked_since = (self.in_flight > 0).then_some(now);
    }

    /// The consumer's whole assignment now (after a rebalance). What is known of
    /// partitions no longer held is dropped.
    pub fn assigned(&mut self, parts: impl IntoIterator<Item = Partition>) {
        self.assigned = parts.into_iter().collect();
        let held = &self.assigned;
        self.pauses.retain(|p, _| held.contains(p));
        self.offsets.retain(|p, _| held.contains(p));
        self.probed_end.retain(|p, _| held.contains(p));
        self.seen.retain(|p, _| held.contains(p));
    }

    /// `part`'s pause causes now (empty: resumed).
    pub fn paused(&mut self, part: &Partition, cause: PauseCause) {
        if cause.is_paused() {
            self.pauses.insert(part.clone(), cause);
        } else {
            self.pauses.remove(part);
            // Fetching again: librdkafka's own watermarks are current from here on.
            self.probed_end.remove(part);
        }
    }

    /// A statistics sample from librdkafka at `now`: broker states and offsets, of the
    /// one Kafka client ([`Tracker::kafka_of`]).
    pub fn kafka(
        &mut self,
        now: u64,
        brokers: BrokerSample,
        parts: impl IntoIterator<Item = (Partition, PartitionOffsets)>,
    ) {
        self.kafka_of(now, "", brokers, parts);
    }

    /// A statistics sample from librdkafka at `now` of the Kafka client named `client`:
    /// broker states and offsets. With several clients, the brokers are merged: as many
    /// connections up as the client with fewest (none up in one client is none up: what it
    /// reads stops), every connection down or waiting of any. A client silent for
    /// [`CLIENT_GONE_MS`] no longer counts.
    pub fn kafka_of(
        &mut self,
        now: u64,
        client: &str,
        brokers: BrokerSample,
        parts: impl IntoIterator<Item = (Partition, PartitionOffsets)>,
    ) {
        self.clients.insert(client.to_string(), (now, brokers));
        self.clients.retain(|_, (at, _)| now.saturating_sub(*at) < CLIENT_GONE_MS);
        if self.clients.values().all(|(_, s)| s.up > 0) {
            self.last_broker_up = now;
        }
        for (part, o) in parts {
            if self.assigned.contains(&part) {
                self.offsets.insert(part, o);
            }
        }
    }

    /// The end offset of a paused partition, asked from Kafka.
    pub fn probed(&mut self, part: Partition, end: i64) {
        if self.pauses.contains_key(&part) {
            self.probed_end.insert(part, end);
        }
    }

    /// The external MQTT broker's connections are down now with `error`, or (`None`) up
    /// again. The first time of a streak is kept.
    pub fn device_broker_down(&mut self, now: u64, error: Option<String>) {
        self.device_broker_down = match (error, self.device_broker_down.take()) {
            (Some(e), Some((since, _))) => Some((since, e)),
            (Some(e), None) => Some((now, e)),
            (None, _) => None,
        };
    }

    /// Owner records this replica published do not come back from the broker (`what`
    /// says which), or (`None`) they do again. The first time of a streak is kept.
    pub fn owner_records_missing(&mut self, now: u64, what: Option<String>) {
        self.owner_records_missing = match (what, self.owner_records_missing.take()) {
            (Some(w), Some((since, _))) => Some((since, w)),
            (Some(w), None) => Some((now, w)),
            (None, _) => None,
        };
    }

    /// The outbox's file system is low on space: `(free bytes, outbox.min_free_bytes)`, or
    /// (`None`) has room again.
    pub fn low_space(&mut self, now: u64, low: Option<(u64, u64)>) {
        self.low_space = low.map(|(free, min)| (self.low_space.map_or(now, |(since, _, _)| since), free, min));
    }

    /// Outbox writes fail now with `error`, or (`None`) succeed again.
    pub fn outbox_failing(&mut self, now: u64, error: Option<String>) {
        self.outbox_failing = match (error, self.outbox_failing.take()) {
            (Some(e), Some((since, _))) => Some((since, e)),
            (Some(e), None) => Some((now, e)),
            (None, _) => None,
        };
    }

    /// The clients' samples merged: as many connections up as the client with fewest,
    /// every connection down or waiting of any (a broker waited on by several clients
    /// named once, the longest silent); `None` before any sample.
    fn brokers(&self) -> Option<BrokerSample> {
        let mut samples = self.clients.values().map(|(_, s)| s);
        let mut merged = samples.next()?.clone();
        for s in samples {
            merged.up = merged.up.min(s.up);
            merged.down.extend(s.down.iter().cloned());
            merged.waiting.extend(s.waiting.iter().cloned());
        }
        merged.down.sort();
        merged.down.dedup();
        merged.waiting.sort_by(|a, b| a.name.cmp(&b.name).then(b.silent_ms.cmp(&a.silent_ms)));
        merged.waiting.dedup_by(|later, first| later.name == first.name);
        Some(merged)
    }

    /// Paused partitions worth probing for their end offset (none while Kafka is
    /// unreachable: the probe would only wait).
    pub fn probe_targets(&self) -> Vec<Partition> {
        if self.clients.values().any(|(_, s)| s.up == 0) {
            return Vec::new();
        }
        self.pauses.keys().filter(|p| self.assigned.contains(*p)).cloned().collect()
    }

    /// Offsets of `part` as known now: librdkafka's, with the probed end when higher.
    fn effective(&self, part: &Partition) -> PartitionOffsets {
        let mut o = self.offsets.get(part).copied().unwrap_or_default();
        o.end = o.end.max(self.probed_end.get(part).copied());
        o
    }

    /// Advances the history to `now` with the records read so far per topic: rate
    /// window, lag and since when, progress, arrivals, assignment.
    pub fn sample(&mut self, now: u64, reads: &BTreeMap<String, u64>) {
        let names: Vec<String> = self.topics.keys().cloned().collect();
        for topic in names {
            let parts: Vec<Partition> = self.assigned.iter().filter(|p| p.0 == topic).cloned().collect();
            let (mut lag, mut moved, mut arrived) = (None::<u64>, false, false);
            for part in &parts {
                let o = self.effective(part);
                if let Some(l) = o.lag() {
                    lag = Some(lag.unwrap_or(0) + l);
                }
                if let Some(before) = self.seen.get(part) {
                    moved |= o.position > before.position && before.position.is_some();
                    arrived |= o.end > before.end && before.end.is_some();
                }
                self.seen.insert(part.clone(), o);
            }
            let read = reads.get(&topic).copied().unwrap_or(0);
            let window = self.window_ms;
            let t = self.topics.get_mut(&topic).expect("subscribed topic");
            let read_more = read > t.last_reads;
            t.last_reads = read;
            if read_more || moved {
                t.last_progress = Some(now);
            }
            if read_more || arrived {
                t.last_record = Some(now);
            }
            match lag {
                Some(l) if l > 0 => {
                    t.lag_since.get_or_insert(now);
                }
                _ => t.lag_since = None,
            }
            if parts.is_empty() {
                t.unassigned_since.get_or_insert(now);
            } else {
                t.unassigned_since = None;
            }
            t.reads.push_back((now, read));
            while t.reads.len() > 1 && t.reads[1].0 + window <= now {
                t.reads.pop_front();
            }
        }
    }

    /// Every assigned partition's offsets as known now (librdkafka's, with a probed end
    /// when higher) and whether it is paused, by topic then partition.
    pub fn partitions(&self) -> Vec<PartitionView> {
        self.assigned
            .iter()
            .map(|p| {
                let o = self.effective(p);
                PartitionView {
                    topic: p.0.clone(),
                    partition: p.1,
                    position: o.position,
                    end: o.end,
                    lag: o.lag(),
                    paused: self.pauses.contains_key(p),
                }
            })
            .collect()
    }

    /// The facts at `now` for [`evaluate`], with the consumer loop's state.
    pub fn facts(&self, consumer_running: bool, consumer_idle_ms: u64) -> Facts {
        let topics = self
            .topics
            .iter()
            .map(|(name, t)| {
                let (rate_per_s, rate_span_ms) = match (t.reads.front(), t.reads.back()) {
                    (Some(a), Some(b)) if b.0 > a.0 => {
                        ((b.1.saturating_sub(a.1)) as f64 * 1000.0 / (b.0 - a.0) as f64, b.0 - a.0)
                    }
                    _ => (0.0, 0),
                };
                // Lag as of now (librdkafka's latest statistics and probes), not the last sample.
                let lag = self
                    .assigned
                    .iter()
                    .filter(|p| &p.0 == name)
                    .filter_map(|p| self.effective(p).lag())
                    .fold(None, |sum: Option<u64>, l| Some(sum.unwrap_or(0) + l));
                let mut pause = PauseCause::default();
                let mut paused = 0;
                for (_, c) in self.pauses.iter().filter(|(p, _)| &p.0 == name && self.assigned.contains(*p)) {
                    paused += 1;
                    pause.merge(c);
                }
                let fact = TopicFacts {
                    records_read: t.last_reads,
                    assigned: self.assigned.iter().filter(|p| &p.0 == name).count(),
                    unassigned_since: t.unassigned_since,
                    lag,
                    lag_since: t.lag_since,
                    last_progress: t.last_progress,
                    last_record: t.last_record,
                    rate_per_s,
                    rate_span_ms,
                    paused,
                    pause,
                };
                (name.clone(), fact)
            })
            .collect();
        Facts {
            consumer_running,
            consumer_idle_ms,
            brokers: self.brokers(),
            last_broker_up: self.last_broker_up,
            outbox_failing: self.outbox_failing.clone(),
            topics,
            in_flight: self.in_flight,
            unacked_since: self.unacked_since,
            registry_wait: self.registry_wait.clone(),
            consume_error: self.consume_error.clone(),
            device_broker_down: self.device_broker_down.clone(),
            owner_records_missing: self.owner_records_missing.clone(),
            low_space: self.low_space,
            orphans: self.orphans.clone(),
        }
    }
}

/// The [`Tracker`] shared by the consumer (hooks), the statistics callback, `/readyz`,
/// `/stats`, `/metrics` and [`watch`], on a monotonic clock started at creation.
#[derive(Debug)]
pub struct Monitor {
    origin: Instant,
    rules: HealthConfig,
    tracker: Mutex<Tracker>,
}

impl Default for Monitor {
    fn default() -> Self {
        Monitor::new(&Config::default())
    }
}

impl Monitor {
    /// A monitor for `cfg`'s subscribed topics ([`Config::subscribed_topics`]) and
    /// `cfg.health` rules.
    pub fn new(cfg: &Config) -> Monitor {
        let topics = cfg.subscribed_topics();
        Monitor {
            origin: Instant::now(),
            rules: cfg.health.clone(),
            tracker: Mutex::new(Tracker::new(&topics, cfg.health.rate_window_ms)),
        }
    }

    /// Milliseconds since the monitor was created.
    pub fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// The rules it evaluates.
    pub fn rules(&self) -> &HealthConfig {
        &self.rules
    }

    fn with<T>(&self, f: impl FnOnce(&mut Tracker) -> T) -> T {
        f(&mut self.tracker.lock().expect("health lock"))
    }

    /// librdkafka's statistics of the consumer ([`rdkafka::ClientContext::stats`]).
    pub fn kafka_statistics(&self, s: &Statistics) {
        let brokers = BrokerSample::from_statistics(s);
        let parts = s.topics.values().flat_map(|t| {
            t.partitions
                .values()
                .filter(|p| p.partition >= 0)
                .map(move |p| ((t.topic.clone(), p.partition), PartitionOffsets::from_statistics(p)))
        });
        let now = self.now_ms();
        self.with(|t| t.kafka_of(now, &s.name, brokers, parts));
    }

    /// The consumer's whole assignment after a rebalance.
    pub fn assigned(&self, parts: impl IntoIterator<Item = Partition>) {
        self.with(|t| t.assigned(parts));
    }

    /// `part`'s pause causes now (the consumer reconciles pauses through this).
    pub fn paused(&self, part: &Partition, cause: PauseCause) {
        self.with(|t| t.paused(part, cause));
    }

    /// See [`Tracker::low_space`].
    pub fn low_space(&self, low: Option<(u64, u64)>) {
        let now = self.now_ms();
        self.with(|t| t.low_space(now, low));
    }

    /// See [`Tracker::device_broker_down`].
    pub fn device_broker_down(&self, error: Option<String>) {
        let now = self.now_ms();
        self.with(|t| t.device_broker_down(now, error));
    }

    /// See [`Tracker::owner_records_missing`].
    pub fn owner_records_missing(&self, what: Option<String>) {
        let now = self.now_ms();
        self.with(|t| t.owner_records_missing(now, what));
    }

    /// Outbox writes fail with `error`, or (`None`) succeed again.
    pub fn outbox_failing(&self, error: Option<String>) {
        let now = self.now_ms();
        self.with(|t| t.outbox_failing(now, error));
    }

    /// See [`Tracker::in_flight`].
    pub fn in_flight(&self, in_flight: usize) {
        let now = self.now_ms();
        self.with(|t| t.in_flight(now, in_flight));
    }

    /// See [`Tracker::acked`].
    pub fn acked(&self) {
        let now = self.now_ms();
        self.with(|t| t.acked(now));
    }

    /// Advances the per-topic history with the records read so far per topic.
    pub fn sample(&self, reads: &BTreeMap<String, u64>) {
        let now = self.now_ms();
        self.with(|t| t.sample(now, reads));
    }

    /// The facts now ([`Tracker::facts`]), and the monitor's time they were taken at.
    pub fn facts(&self, consumer_running: bool, consumer_idle_ms: u64) -> (u64, Facts) {
        let now = self.now_ms();
        (now, self.with(|t| t.facts(consumer_running, consumer_idle_ms)))
    }

    /// See [`Tracker::partitions`].
    pub fn partitions(&self) -> Vec<PartitionView> {
        self.with(|t| t.partitions())
    }

    /// The partitions whose end offset must be probed ([`Tracker::probe_targets`]).
    pub fn probe_targets(&self) -> Vec<Partition> {
        self.with(|t| t.probe_targets())
    }

    /// See [`Tracker::registry_wait`].
    pub fn registry_wait(&self, fact: Option<RegistryWaitFact>) {
        let now = self.now_ms();
        self.with(|t| t.registry_wait(now, fact));
    }

    /// See [`Tracker::orphans`].
    pub fn orphans(&self, topic: &str, fact: Option<OrphanFact>) {
        self.with(|t| t.orphans(topic, fact));
    }

    /// See [`Tracker::consume_error`].
    pub fn consume_error(&self, fact: Option<ConsumeErrorFact>) {
        let now = self.now_ms();
        self.with(|t| t.consume_error(now, fact));
    }

    /// See [`Tracker::consume_error_at`].
    pub fn consume_error_at(&self, at: (String, i32, i64)) {
        self.with(|t| t.consume_error_at(at));
    }

    /// A probe found `part`'s end offset at `end` ([`Tracker::probed`]).
    pub fn probed(&self, part: Partition, end: i64) {
        self.with(|t| t.probed(part, end));
    }
}
