//! Readiness that tells the truth, and throughput per topic against what is expected.
//!
//! `/readyz` fails (503, one [`Reason`] per line) when any of these holds:
//! - the consumer loop is not running, or has not run for [`MAX_CONSUMER_IDLE_MS`];
//! - Kafka is unreachable: librdkafka's statistics have shown no broker connection in state
//!   `UP` for `health.kafka_down_after_ms`;
//! - this consumer has held no partition of a subscribed topic for
//!   `health.unassigned_after_ms` (a rebalance takes less);
//! - a topic is stalled: it has lag (records on its assigned partitions beyond the stored
//!   or committed offset) and the consumer made no progress on it (no record read, no
//!   offset stored) for `health.stall_after_ms`; the reason says why when it is known
//!   (partitions paused for backpressure and which devices hold them, outbox writes
//!   failing, Kafka unreachable);
//! - a topic reads slower than `health.topics.<topic>.min_rate_per_s` while it has had lag
//!   for a whole `health.rate_window_ms`;
//! - no record arrived on a topic for `health.topics.<topic>.max_quiet_ms`;
//! - delivery stalled: jobs are in flight to devices believed reachable and no device has
//!   acknowledged anything for `health.delivery_stall_after_ms` (a broken link from the
//!   MQTT broker to the gateway, or a fleet that stopped answering, is otherwise silent:
//!   the consumer keeps reading and the outbox fills).
//!
//! Where the facts come from, at no extra cost to the consumer:
//! - librdkafka statistics (`statistics.interval.ms`, [`Monitor::kafka_statistics`], see
//!   librdkafka's STATISTICS.md): `brokers[].state`, and per partition `ls_offset`
//!   (`hi_offset` when unset), `stored_offset`, `committed_offset`, `lo_offset`. librdkafka
//!   learns the watermarks from its fetch responses only, and a paused partition is not
//!   fetched (`rdkafka_fetcher.c`, "paused"), so for paused partitions [`watch`] asks Kafka
//!   for the end offset (ListOffsets) every `health.paused_probe_interval_ms`;
//! - the consumer's own view: assignment, pause causes, outbox write failures (hooks in
//!   [`crate::consumer`]) and records read per topic ([`crate::stats`]).
//!
//! The rules are one pure function, [`evaluate`], over [`Facts`]; the [`Tracker`] turns
//! timestamped observations into those facts; the [`Monitor`] is the tracker behind a lock
//! with a monotonic clock; [`watch`] samples every second, logs each alarm once when it
//! starts (`warn`) and when it clears (`info`), and probes paused partitions.
//! Times are milliseconds on the monitor's monotonic clock (0 = when it was created).

use crate::config::{Config, HealthConfig};
use crate::offsets::Partition;
use crate::stats::Stats;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::statistics::Statistics;
use rdkafka::ClientConfig;
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest gap between consumer loop runs that still counts as ready, ms.
pub const MAX_CONSUMER_IDLE_MS: u64 = 10_000;

/// Device ids named in a readiness reason at most (the count is always given).
const DEVICES_NAMED: usize = 5;

/// Why the consumer has paused a partition ([`crate::consumer`], backpressure). All false
/// and empty: not paused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PauseCause {
    /// It has `kafka.max_pending_per_partition` records read and not yet written.
    pub pending_bound: bool,
    /// The outbox holds `outbox.max_jobs` jobs (all partitions pause).
    pub outbox_full: bool,
    /// Devices it fed whose queue is at `outbox.max_jobs_per_device`, sorted.
    pub devices_at_bound: Vec<String>,
}

impl PauseCause {
    /// The cause from the consumer's pause reasons for one partition.
    pub fn new(pending_bound: bool, outbox_full: bool, devices_at_bound: Option<&HashSet<String>>) -> PauseCause {
        let mut devices: Vec<String> = devices_at_bound.map(|d| d.iter().cloned().collect()).unwrap_or_default();
        devices.sort();
        PauseCause { pending_bound, outbox_full, devices_at_bound: devices }
    }

    /// Whether any cause holds (the partition is paused).
    pub fn is_paused(&self) -> bool {
        self.pending_bound || self.outbox_full || !self.devices_at_bound.is_empty()
    }

    /// Merges `other` into `self` (the causes of several partitions of one topic).
    fn merge(&mut self, other: &PauseCause) {
        self.pending_bound |= other.pending_bound;
        self.outbox_full |= other.outbox_full;
        for d in &other.devices_at_bound {
            if let Err(i) = self.devices_at_bound.binary_search(d) {
                self.devices_at_bound.insert(i, d.clone());
            }
        }
    }
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

/// The consumer's broker connections in one statistics sample.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerSample {
    /// Connections in state `UP`.
    pub up: usize,
    /// The others, as `name STATE` (e.g. `127.0.0.1:9092/1 CONNECT`), sorted.
    pub down: Vec<String>,
}

impl BrokerSample {
    /// From librdkafka's statistics; its internal and logical brokers (e.g. the group
    /// coordinator alias) are not connections and are skipped.
    pub fn from_statistics(s: &Statistics) -> BrokerSample {
        let mut sample = BrokerSample::default();
        for b in s.brokers.values().filter(|b| b.source != "internal" && b.source != "logical") {
            if b.state == "UP" {
                sample.up += 1;
            } else {
                sample.down.push(format!("{} {}", b.name, b.state));
            }
        }
        sample.down.sort();
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
}

/// Why the gateway is not ready. `Display` gives the line `/readyz` answers; its wording
/// is stable (alerting and tests match on it).
#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// The consumer loop has ended.
    ConsumerNotRunning,
    /// The consumer loop has not run for `idle_ms`; `outbox` = failing for ms, last error.
    ConsumerIdle { idle_ms: u64, outbox: Option<(u64, String)> },
    /// No broker connection `UP` for `down_ms`; `brokers` = the connections' states.
    KafkaUnreachable { down_ms: u64, brokers: Vec<String> },
    /// No partition of `topic` held for `for_ms`.
    Unassigned { topic: String, for_ms: u64 },
    /// `lag` records and no progress for `for_ms`; `why` = known causes.
    Stalled { topic: String, lag: u64, for_ms: u64, why: Vec<String> },
    /// Read rate below the expected minimum over a whole window while lagging.
    Slow { topic: String, lag: u64, rate_per_s: f64, window_s: u64, min_per_s: f64 },
    /// No record for `for_ms`, more than the expected `max_ms`.
    Quiet { topic: String, for_ms: u64, max_ms: u64 },
    /// `in_flight` jobs sent to reachable devices and no device ack for `for_ms`.
    DeliveryStalled { in_flight: usize, for_ms: u64 },
}

impl Reason {
    /// The kind of alarm: `consumer_not_running`, `consumer_idle`, `kafka_unreachable`,
    /// `unassigned`, `stalled`, `slow`, `quiet`, `delivery_stalled` (the `alarm` label on
    /// `/metrics`).
    pub fn kind(&self) -> &'static str {
        match self {
            Reason::ConsumerNotRunning => "consumer_not_running",
            Reason::ConsumerIdle { .. } => "consumer_idle",
            Reason::KafkaUnreachable { .. } => "kafka_unreachable",
            Reason::Unassigned { .. } => "unassigned",
            Reason::Stalled { .. } => "stalled",
            Reason::Slow { .. } => "slow",
            Reason::Quiet { .. } => "quiet",
            Reason::DeliveryStalled { .. } => "delivery_stalled",
        }
    }

    /// The topic it is about, if any.
    pub fn topic(&self) -> Option<&str> {
        match self {
            Reason::Unassigned { topic, .. } | Reason::Stalled { topic, .. } | Reason::Slow { topic, .. } | Reason::Quiet { topic, .. } => Some(topic),
            _ => None,
        }
    }

    /// Identity of the alarm across evaluations (durations and counts change, this does
    /// not): kind and topic.
    pub fn key(&self) -> (&'static str, String) {
        (self.kind(), self.topic().unwrap_or_default().to_string())
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::ConsumerNotRunning => write!(f, "consumer not running"),
            Reason::ConsumerIdle { idle_ms, outbox } => {
                write!(f, "consumer idle for {idle_ms} ms")?;
                if let Some((ms, e)) = outbox {
                    write!(f, "; why: outbox writes failing for {ms} ms: {e}")?;
                }
                Ok(())
            }
            Reason::KafkaUnreachable { down_ms, brokers } => {
                write!(f, "kafka unreachable: no broker up for {down_ms} ms")?;
                if !brokers.is_empty() {
                    write!(f, " ({})", brokers.join(", "))?;
                }
                Ok(())
            }
            Reason::Unassigned { topic, for_ms } => write!(f, "topic {topic} unassigned: no partition held for {for_ms} ms"),
            Reason::Stalled { topic, lag, for_ms, why } => {
                write!(f, "topic {topic} stalled: lag {lag} records, no progress for {for_ms} ms")?;
                if !why.is_empty() {
                    write!(f, "; why: {}", why.join("; "))?;
                }
                Ok(())
            }
            Reason::Slow { topic, lag, rate_per_s, window_s, min_per_s } => {
                write!(f, "topic {topic} slow: lag {lag} records, {rate_per_s:.2} records/s over the last {window_s} s, expected at least {min_per_s}/s")
            }
            Reason::Quiet { topic, for_ms, max_ms } => write!(f, "topic {topic} quiet: no record for {for_ms} ms, expected one within {max_ms} ms"),
            Reason::DeliveryStalled { in_flight, for_ms } => write!(f, "delivery stalled: {in_flight} jobs in flight to reachable devices, no device ack for {for_ms} ms"),
        }
    }
}

/// The readiness rules: every reason the gateway is not ready at `now` (empty: ready).
/// Pure: the same facts, time and rules give the same reasons.
pub fn evaluate(now: u64, facts: &Facts, rules: &HealthConfig) -> Vec<Reason> {
    let mut out = Vec::new();
    let since = |t: u64| now.saturating_sub(t);
    let on = |threshold: u64, elapsed: u64| threshold > 0 && elapsed >= threshold;
    let outbox = facts.outbox_failing.as_ref().map(|(t, e)| (since(*t), e.clone()));
    if !facts.consumer_running {
        out.push(Reason::ConsumerNotRunning);
    } else if facts.consumer_idle_ms > MAX_CONSUMER_IDLE_MS {
        out.push(Reason::ConsumerIdle { idle_ms: facts.consumer_idle_ms, outbox: outbox.clone() });
    }
    let kafka_down = facts.brokers.as_ref().is_some_and(|b| b.up == 0);
    if let Some(b) = facts.brokers.as_ref().filter(|_| kafka_down) {
        if on(rules.kafka_down_after_ms, since(facts.last_broker_up)) {
            out.push(Reason::KafkaUnreachable { down_ms: since(facts.last_broker_up), brokers: b.down.clone() });
        }
    }
    for (topic, t) in &facts.topics {
        if let Some(u) = t.unassigned_since.filter(|u| on(rules.unassigned_after_ms, since(*u))) {
            out.push(Reason::Unassigned { topic: topic.clone(), for_ms: since(u) });
        }
        let expect = rules.topics.get(topic);
        let lag = t.lag.unwrap_or(0);
        let stalled_for = t.lag_since.filter(|_| lag > 0).map(|l| since(l.max(t.last_progress.unwrap_or(0))));
        if let Some(for_ms) = stalled_for.filter(|ms| on(rules.stall_after_ms, *ms)) {
            out.push(Reason::Stalled { topic: topic.clone(), lag, for_ms, why: stall_causes(now, t, facts, kafka_down, outbox.as_ref()) });
        } else if let (Some(min), Some(lag_since)) = (expect.and_then(|e| e.min_rate_per_s), t.lag_since.filter(|_| lag > 0)) {
            let window = rules.rate_window_ms.max(1);
            if since(lag_since) >= window && t.rate_span_ms >= window && t.rate_per_s < min {
                out.push(Reason::Slow { topic: topic.clone(), lag, rate_per_s: t.rate_per_s, window_s: window / 1000, min_per_s: min });
            }
        }
        if let Some(max) = expect.and_then(|e| e.max_quiet_ms) {
            let quiet = since(t.last_record.unwrap_or(0));
            if on(max, quiet) {
                out.push(Reason::Quiet { topic: topic.clone(), for_ms: quiet, max_ms: max });
            }
        }
    }
    if let Some(since_ms) = facts.unacked_since.filter(|_| facts.in_flight > 0) {
        if on(rules.delivery_stall_after_ms, since(since_ms)) {
            out.push(Reason::DeliveryStalled { in_flight: facts.in_flight, for_ms: since(since_ms) });
        }
    }
    out
}

/// What is known about why a topic makes no progress.
fn stall_causes(now: u64, t: &TopicFacts, facts: &Facts, kafka_down: bool, outbox: Option<&(u64, String)>) -> Vec<String> {
    let mut why = Vec::new();
    if t.paused > 0 {
        let mut causes = Vec::new();
        let devices = &t.pause.devices_at_bound;
        if !devices.is_empty() {
            let mut named = devices.iter().take(DEVICES_NAMED).cloned().collect::<Vec<_>>().join(", ");
            if devices.len() > DEVICES_NAMED {
                named.push_str(", …");
            }
            let (n, s) = (devices.len(), if devices.len() == 1 { "" } else { "s" });
            causes.push(format!("{n} device{s} at the per-device outbox bound (outbox.max_jobs_per_device): {named}"));
        }
        if t.pause.outbox_full {
            causes.push("the outbox is full (outbox.max_jobs)".to_string());
        }
        if t.pause.pending_bound {
            causes.push("records read and not yet written are at kafka.max_pending_per_partition".to_string());
        }
        why.push(format!("{} of {} partitions paused for backpressure: {}", t.paused, t.assigned, causes.join(", ")));
    }
    if let Some((ms, e)) = outbox {
        why.push(format!("outbox writes failing for {ms} ms: {e}"));
    }
    if kafka_down {
        why.push(format!("no Kafka broker up for {} ms", now.saturating_sub(facts.last_broker_up)));
    }
    why
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
    brokers: Option<BrokerSample>,
    last_broker_up: u64,
    outbox_failing: Option<(u64, String)>,
    topics: BTreeMap<String, TopicTrack>,
    in_flight: usize,
    unacked_since: Option<u64>,
}

impl Tracker {
    /// A tracker at time 0 for the `subscribed` topics, measuring rates over `window_ms`.
    pub fn new(subscribed: &[String], window_ms: u64) -> Tracker {
        let topics = subscribed.iter().map(|t| (t.clone(), TopicTrack { unassigned_since: Some(0), ..TopicTrack::default() })).collect();
        Tracker {
            window_ms: window_ms.max(1),
            assigned: BTreeSet::new(),
            pauses: BTreeMap::new(),
            offsets: BTreeMap::new(),
            probed_end: BTreeMap::new(),
            seen: BTreeMap::new(),
            brokers: None,
            last_broker_up: 0,
            outbox_failing: None,
            topics,
            in_flight: 0,
            unacked_since: None,
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

    /// A statistics sample from librdkafka at `now`: broker states and offsets.
    pub fn kafka(&mut self, now: u64, brokers: BrokerSample, parts: impl IntoIterator<Item = (Partition, PartitionOffsets)>) {
        if brokers.up > 0 {
            self.last_broker_up = now;
        }
        self.brokers = Some(brokers);
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

    /// Outbox writes fail now with `error`, or (`None`) succeed again.
    pub fn outbox_failing(&mut self, now: u64, error: Option<String>) {
        self.outbox_failing = match (error, self.outbox_failing.take()) {
            (Some(e), Some((since, _))) => Some((since, e)),
            (Some(e), None) => Some((now, e)),
            (None, _) => None,
        };
    }

    /// Paused partitions worth probing for their end offset (none while Kafka is
    /// unreachable: the probe would only wait).
    pub fn probe_targets(&self) -> Vec<Partition> {
        if self.brokers.as_ref().is_some_and(|b| b.up == 0) {
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

    /// The facts at `now` for [`evaluate`], with the consumer loop's state.
    pub fn facts(&self, consumer_running: bool, consumer_idle_ms: u64) -> Facts {
        let topics = self
            .topics
            .iter()
            .map(|(name, t)| {
                let (rate_per_s, rate_span_ms) = match (t.reads.front(), t.reads.back()) {
                    (Some(a), Some(b)) if b.0 > a.0 => ((b.1.saturating_sub(a.1)) as f64 * 1000.0 / (b.0 - a.0) as f64, b.0 - a.0),
                    _ => (0.0, 0),
                };
                // Lag as of now (librdkafka's latest statistics and probes), not the last sample.
                let lag = self.assigned.iter().filter(|p| &p.0 == name).filter_map(|p| self.effective(p).lag()).fold(None, |sum: Option<u64>, l| Some(sum.unwrap_or(0) + l));
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
            brokers: self.brokers.clone(),
            last_broker_up: self.last_broker_up,
            outbox_failing: self.outbox_failing.clone(),
            topics,
            in_flight: self.in_flight,
            unacked_since: self.unacked_since,
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
    /// A monitor for `cfg`'s subscribed topics (`kafka.device_topic`, `kafka.charge_topic`)
    /// and `cfg.health` rules.
    pub fn new(cfg: &Config) -> Monitor {
        let topics = [cfg.kafka.device_topic.clone(), cfg.kafka.charge_topic.clone()];
        Monitor { origin: Instant::now(), rules: cfg.health.clone(), tracker: Mutex::new(Tracker::new(&topics, cfg.health.rate_window_ms)) }
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
            t.partitions.values().filter(|p| p.partition >= 0).map(move |p| ((t.topic.clone(), p.partition), PartitionOffsets::from_statistics(p)))
        });
        let now = self.now_ms();
        self.with(|t| t.kafka(now, brokers, parts));
    }

    /// The consumer's whole assignment after a rebalance.
    pub fn assigned(&self, parts: impl IntoIterator<Item = Partition>) {
        self.with(|t| t.assigned(parts));
    }

    /// `part`'s pause causes now (the consumer reconciles pauses through this).
    pub fn paused(&self, part: &Partition, cause: PauseCause) {
        self.with(|t| t.paused(part, cause));
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

    /// The facts and every reason the gateway is not ready, now.
    pub fn report(&self, consumer_running: bool, consumer_idle_ms: u64) -> (Facts, Vec<Reason>) {
        let now = self.now_ms();
        let facts = self.with(|t| t.facts(consumer_running, consumer_idle_ms));
        let reasons = evaluate(now, &facts, &self.rules);
        (facts, reasons)
    }
}

/// Logs alarm transitions: `warn` once when an alarm starts, `info` when it clears.
#[derive(Debug, Default)]
pub struct AlarmLog {
    active: BTreeMap<(&'static str, String), Reason>,
}

impl AlarmLog {
    /// Takes the reasons of one evaluation; returns (started, cleared) for tests.
    pub fn update(&mut self, reasons: &[Reason]) -> (Vec<Reason>, Vec<Reason>) {
        let now: BTreeMap<_, _> = reasons.iter().map(|r| (r.key(), r.clone())).collect();
        let started: Vec<Reason> = now.iter().filter(|(k, _)| !self.active.contains_key(*k)).map(|(_, r)| r.clone()).collect();
        let cleared: Vec<Reason> = self.active.iter().filter(|(k, _)| !now.contains_key(*k)).map(|(_, r)| r.clone()).collect();
        for r in &started {
            tracing::warn!(alarm = r.kind(), topic = r.topic().unwrap_or(""), "not ready: {r}");
        }
        for r in &cleared {
            tracing::info!(alarm = r.kind(), topic = r.topic().unwrap_or(""), "alarm cleared (was: {r})");
        }
        self.active = now;
        (started, cleared)
    }
}

/// Asks Kafka for the end offsets of paused partitions (ListOffsets through a bare client
/// with no group, created on first use).
struct Prober {
    brokers: String,
    client: Option<Arc<BaseConsumer>>,
}

impl Prober {
    fn client(&mut self) -> Option<Arc<BaseConsumer>> {
        if self.client.is_none() {
            match ClientConfig::new().set("bootstrap.servers", &self.brokers).create::<BaseConsumer>() {
                Ok(c) => self.client = Some(Arc::new(c)),
                Err(e) => tracing::warn!(error = %e, "cannot create the Kafka client that probes paused partitions' end offsets"),
            }
        }
        self.client.clone()
    }
}

/// Blocking: the high watermark of each of `parts` (2 s per partition at most).
fn probe_ends(client: &BaseConsumer, parts: &[Partition]) -> Vec<(Partition, i64)> {
    let mut out = Vec::new();
    for part in parts {
        match client.fetch_watermarks(&part.0, part.1, Duration::from_secs(2)) {
            Ok((_, high)) => out.push((part.clone(), high)),
            Err(e) => tracing::debug!(error = %e, topic = %part.0, partition = part.1, "end offset probe failed"),
        }
    }
    // Serve the client's own events (errors, logs) so they do not pile up.
    let _ = client.poll(Duration::ZERO);
    out
}

/// Every second until `shutdown`: advances the health history, logs alarm transitions
/// (from when the consumer first runs), and every `health.paused_probe_interval_ms` probes the end offsets of paused
/// partitions (`brokers` = `kafka.brokers`).
pub async fn watch(stats: Arc<Stats>, brokers: String, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let probe_every = Duration::from_millis(stats.health.rules().paused_probe_interval_ms.max(100));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut alarms = AlarmLog::default();
    let mut prober = Prober { brokers, client: None };
    let mut probing: Option<tokio::task::JoinHandle<Vec<(Partition, i64)>>> = None;
    let mut next_probe = tokio::time::Instant::now();
    let mut started = false;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        if probing.as_ref().is_some_and(|p| p.is_finished()) {
            match probing.take().expect("probe task").await {
                Ok(ends) => {
                    for (part, end) in ends {
                        stats.health.with(|t| t.probed(part, end));
                    }
                }
                Err(e) => tracing::warn!(error = %e, "end offset probe task failed"),
            }
        }
        if probing.is_none() && tokio::time::Instant::now() >= next_probe {
            next_probe = tokio::time::Instant::now() + probe_every;
            let targets = stats.health.with(|t| t.probe_targets());
            if !targets.is_empty() {
                if let Some(client) = prober.client() {
                    probing = Some(tokio::task::spawn_blocking(move || probe_ends(&client, &targets)));
                }
            }
        }
        stats.sample_health();
        let reasons = stats.readiness();
        // Before the consumer first runs, "not running" is the start-up, not an alarm.
        started |= !reasons.contains(&Reason::ConsumerNotRunning);
        if started {
            alarms.update(&reasons);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TopicExpectation;

    const CH: &str = "charge.upserted";
    const DV: &str = "device.upserted";

    fn rules() -> HealthConfig {
        HealthConfig { kafka_down_after_ms: 10_000, unassigned_after_ms: 30_000, stall_after_ms: 60_000, rate_window_ms: 60_000, ..HealthConfig::default() }
    }

    fn part(t: &str, p: i32) -> Partition {
        (t.to_string(), p)
    }

    fn up() -> BrokerSample {
        BrokerSample { up: 1, down: vec![] }
    }

    fn offsets(end: i64, position: i64) -> PartitionOffsets {
        PartitionOffsets { end: Some(end), position: Some(position) }
    }

    fn reads(ch: u64, dv: u64) -> BTreeMap<String, u64> {
        [(CH.to_string(), ch), (DV.to_string(), dv)].into()
    }

    /// A tracker holding partition 0 of both topics, Kafka up, everything read.
    fn healthy() -> Tracker {
        let mut t = Tracker::new(&[DV.to_string(), CH.to_string()], 60_000);
        t.assigned([part(CH, 0), part(DV, 0)]);
        t.kafka(1_000, up(), [(part(CH, 0), offsets(10, 10)), (part(DV, 0), offsets(5, 5))]);
        t.sample(1_000, &reads(10, 5));
        t
    }

    fn kinds(now: u64, t: &Tracker, rules: &HealthConfig) -> Vec<(&'static str, String)> {
        evaluate(now, &t.facts(true, 0), rules).iter().map(Reason::key).collect()
    }

    #[test]
    fn a_healthy_consumer_is_ready() {
        let t = healthy();
        assert!(evaluate(100_000, &t.facts(true, 500), &rules()).is_empty());
    }

    #[test]
    fn consumer_not_running_or_idle() {
        let t = healthy();
        let r = evaluate(2_000, &t.facts(false, 0), &rules());
        assert_eq!(r, vec![Reason::ConsumerNotRunning]);
        assert_eq!(r[0].to_string(), "consumer not running");
        let r = evaluate(2_000, &t.facts(true, MAX_CONSUMER_IDLE_MS + 1), &rules());
        assert_eq!(r[0].to_string(), "consumer idle for 10001 ms");
        assert!(evaluate(2_000, &t.facts(true, MAX_CONSUMER_IDLE_MS), &rules()).is_empty(), "at the limit is still ready");
    }

    #[test]
    fn delivery_stalls_when_no_device_acks_while_jobs_are_in_flight() {
        let rules = HealthConfig { delivery_stall_after_ms: 120_000, ..rules() };
        let mut t = healthy();
        t.in_flight(1_000, 3);
        assert!(kinds(120_999, &t, &rules).is_empty(), "not yet");
        let r = evaluate(121_000, &t.facts(true, 0), &rules);
        assert_eq!(r, vec![Reason::DeliveryStalled { in_flight: 3, for_ms: 120_000 }]);
        assert_eq!(r[0].to_string(), "delivery stalled: 3 jobs in flight to reachable devices, no device ack for 120000 ms");
        // Any ack restarts the clock; more jobs in flight do not.
        t.acked(121_000);
        t.in_flight(122_000, 5);
        assert!(kinds(240_999, &t, &rules).is_empty());
        assert_eq!(kinds(241_000, &t, &rules), vec![("delivery_stalled", String::new())]);
        // Nothing in flight: nothing to wait for, whatever the time since the last ack.
        t.in_flight(241_000, 0);
        assert!(kinds(900_000, &t, &rules).is_empty());
        t.acked(900_000);
        t.in_flight(900_000, 1);
        assert!(kinds(1_019_999, &t, &rules).is_empty(), "counted from when jobs went in flight again");
        assert!(kinds(10_000_000, &t, &HealthConfig { delivery_stall_after_ms: 0, ..rules.clone() }).is_empty(), "0 turns the rule off");
    }

    #[test]
    fn consumer_idle_names_a_failing_outbox() {
        let mut t = healthy();
        t.outbox_failing(2_000, Some("disk full".into()));
        t.outbox_failing(3_000, Some("disk still full".into()));
        let r = evaluate(14_000, &t.facts(true, 12_000), &rules());
        assert_eq!(r[0].to_string(), "consumer idle for 12000 ms; why: outbox writes failing for 12000 ms: disk still full");
        t.outbox_failing(15_000, None);
        assert!(evaluate(16_000, &t.facts(true, 0), &rules()).is_empty());
    }

    #[test]
    fn kafka_unreachable_after_the_threshold_and_clears_when_a_broker_is_up() {
        let mut t = healthy();
        let down = BrokerSample { up: 0, down: vec!["127.0.0.1:9092/1 CONNECT".into()] };
        t.kafka(2_000, down.clone(), []);
        t.kafka(10_999, down.clone(), []);
        assert!(kinds(10_999, &t, &rules()).is_empty(), "up 9999 ms ago: not yet");
        t.kafka(11_000, down, []);
        let r = evaluate(11_000, &t.facts(true, 0), &rules());
        assert_eq!(r.iter().map(ToString::to_string).collect::<Vec<_>>(), ["kafka unreachable: no broker up for 10000 ms (127.0.0.1:9092/1 CONNECT)"]);
        t.kafka(12_000, up(), []);
        assert!(kinds(12_000, &t, &rules()).is_empty());
    }

    #[test]
    fn kafka_never_reached_counts_from_the_start_and_no_statistics_is_not_down() {
        let t = Tracker::new(&[CH.to_string()], 60_000);
        assert!(!kinds(20_000, &t, &HealthConfig { unassigned_after_ms: 0, ..rules() }).iter().any(|k| k.0 == "kafka_unreachable"));
        let mut t = t;
        t.kafka(10_000, BrokerSample { up: 0, down: vec!["b DOWN".into()] }, []);
        assert_eq!(kinds(10_000, &t, &HealthConfig { unassigned_after_ms: 0, ..rules() }), [("kafka_unreachable", String::new())]);
    }

    #[test]
    fn unassigned_topic_after_the_threshold_and_clears_on_assignment() {
        let mut t = Tracker::new(&[DV.to_string(), CH.to_string()], 60_000);
        t.kafka(1_000, up(), []);
        t.sample(1_000, &reads(0, 0));
        assert!(kinds(29_999, &t, &rules()).is_empty(), "a rebalance's grace from the start");
        assert_eq!(kinds(30_000, &t, &rules()), [("unassigned", CH.to_string()), ("unassigned", DV.to_string())]);
        t.assigned([part(CH, 0), part(CH, 1)]);
        t.sample(31_000, &reads(0, 0));
        assert_eq!(kinds(31_000, &t, &rules()), [("unassigned", DV.to_string())], "device.upserted still has none");
        // Lost again (a rebalance): the clock restarts from when it was lost.
        t.assigned([part(DV, 0)]);
        t.sample(40_000, &reads(0, 0));
        assert!(kinds(69_999, &t, &rules()).is_empty());
        let r = evaluate(70_000, &t.facts(true, 0), &rules());
        assert_eq!(r[0].to_string(), "topic charge.upserted unassigned: no partition held for 30000 ms");
        // Off with 0.
        assert!(kinds(1_000_000, &t, &HealthConfig { unassigned_after_ms: 0, ..rules() }).is_empty());
    }

    #[test]
    fn stalled_with_lag_and_no_progress_then_clears_on_progress() {
        let mut t = healthy();
        // 5 records arrive; none is read.
        t.kafka(2_000, up(), [(part(CH, 0), offsets(15, 10))]);
        t.sample(2_000, &reads(10, 5));
        assert!(kinds(61_999, &t, &rules()).is_empty(), "lag for 59999 ms");
        let r = evaluate(62_000, &t.facts(true, 0), &rules());
        assert_eq!(r.iter().map(ToString::to_string).collect::<Vec<_>>(), ["topic charge.upserted stalled: lag 5 records, no progress for 60000 ms"]);
        // One record read: progress, the clock restarts.
        t.kafka(63_000, up(), [(part(CH, 0), offsets(15, 11))]);
        t.sample(63_000, &reads(11, 5));
        assert!(kinds(63_000, &t, &rules()).is_empty());
        assert!(kinds(122_999, &t, &rules()).is_empty());
        assert_eq!(kinds(123_000, &t, &rules()), [("stalled", CH.to_string())]);
        // Caught up: no lag, no stall however long.
        t.kafka(124_000, up(), [(part(CH, 0), offsets(15, 15))]);
        t.sample(124_000, &reads(15, 5));
        assert!(kinds(1_000_000, &t, &rules()).is_empty());
        assert!(kinds(1_000_000, &t, &HealthConfig { stall_after_ms: 0, ..rules() }).is_empty());
    }

    #[test]
    fn lag_after_a_quiet_hour_is_not_a_stall_at_once() {
        let mut t = healthy();
        t.sample(3_600_000, &reads(10, 5));
        t.kafka(3_600_500, up(), [(part(CH, 0), offsets(11, 10))]);
        t.sample(3_601_000, &reads(10, 5));
        assert!(kinds(3_601_000, &t, &rules()).is_empty(), "the stall clock starts when the lag appears");
        assert_eq!(kinds(3_661_000, &t, &rules()), [("stalled", CH.to_string())]);
    }

    #[test]
    fn a_stall_says_why_paused_partitions_and_devices() {
        let mut t = healthy();
        t.assigned([part(CH, 0), part(CH, 1), part(CH, 2), part(DV, 0)]);
        let bound: HashSet<String> = ["T1".to_string()].into();
        t.paused(&part(CH, 0), PauseCause::new(false, false, Some(&bound)));
        t.paused(&part(CH, 1), PauseCause::new(false, false, Some(&bound)));
        // librdkafka's end is stale for a paused partition; the probe knows more.
        t.kafka(2_000, up(), [(part(CH, 0), offsets(4, 4)), (part(CH, 1), offsets(3, 2)), (part(CH, 2), offsets(6, 6)), (part(DV, 0), offsets(5, 5))]);
        t.probed(part(CH, 0), 9);
        t.probed(part(CH, 2), 100); // not paused: ignored
        t.sample(2_000, &reads(12, 5));
        let f = t.facts(true, 0);
        assert_eq!(f.topics[CH].lag, Some(5 + 1));
        let r = evaluate(62_000, &f, &rules());
        assert_eq!(
            r.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["topic charge.upserted stalled: lag 6 records, no progress for 60000 ms; why: 2 of 3 partitions paused for backpressure: 1 device at the per-device outbox bound (outbox.max_jobs_per_device): T1"]
        );
        // Resumed: the probed end is dropped, librdkafka's watermarks count again.
        t.paused(&part(CH, 0), PauseCause::default());
        t.paused(&part(CH, 1), PauseCause::default());
        t.kafka(63_000, up(), [(part(CH, 0), offsets(9, 9)), (part(CH, 1), offsets(3, 3))]);
        t.sample(63_000, &reads(18, 5));
        assert_eq!(t.facts(true, 0).topics[CH].lag, Some(0));
        assert!(kinds(63_000, &t, &rules()).is_empty());
    }

    #[test]
    fn a_stall_names_other_pause_causes_the_outbox_and_kafka() {
        let mut t = healthy();
        t.paused(&part(CH, 0), PauseCause::new(true, true, None));
        t.kafka(2_000, BrokerSample { up: 0, down: vec![] }, [(part(CH, 0), offsets(12, 10))]);
        t.outbox_failing(2_000, Some("No space left on device".into()));
        t.sample(2_000, &reads(10, 5));
        let r = evaluate(62_000, &t.facts(true, 0), &HealthConfig { kafka_down_after_ms: 0, ..rules() });
        assert_eq!(
            r.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["topic charge.upserted stalled: lag 2 records, no progress for 60000 ms; why: 1 of 1 partitions paused for backpressure: the outbox is full (outbox.max_jobs), records read and not yet written are at kafka.max_pending_per_partition; outbox writes failing for 60000 ms: No space left on device; no Kafka broker up for 61000 ms"]
        );
    }

    #[test]
    fn stored_offsets_moving_count_as_progress() {
        let mut t = healthy();
        t.kafka(2_000, up(), [(part(CH, 0), offsets(20, 10))]);
        t.sample(2_000, &reads(20, 5)); // all read at once, not yet stored
        t.kafka(50_000, up(), [(part(CH, 0), offsets(20, 15))]);
        t.sample(50_000, &reads(20, 5));
        assert!(kinds(100_000, &t, &rules()).is_empty(), "the stored offset moved at 50 s");
        assert_eq!(kinds(110_000, &t, &rules()), [("stalled", CH.to_string())]);
    }

    #[test]
    fn slow_when_lagging_a_whole_window_below_the_expected_rate() {
        let mut r = rules();
        r.stall_after_ms = 0;
        r.topics.insert(CH.into(), TopicExpectation { min_rate_per_s: Some(2.0), max_quiet_ms: None });
        let mut t = healthy();
        let mut read = 10;
        for s in 2..=62u64 {
            read += 1; // 1 record/s while 1000 wait
            t.kafka(s * 1_000, up(), [(part(CH, 0), offsets(1_010, read as i64))]);
            t.sample(s * 1_000, &reads(read, 5));
        }
        let f = t.facts(true, 0);
        assert_eq!(f.topics[CH].rate_span_ms, 60_000);
        assert!((f.topics[CH].rate_per_s - 1.0).abs() < 1e-9, "{}", f.topics[CH].rate_per_s);
        assert!(kinds(61_000, &t, &r).is_empty(), "lag for less than a window");
        let reasons = evaluate(62_000, &f, &r);
        assert_eq!(reasons.iter().map(ToString::to_string).collect::<Vec<_>>(), ["topic charge.upserted slow: lag 939 records, 1.00 records/s over the last 60 s, expected at least 2/s"]);
        // Faster: 3/s for a window clears it.
        for s in 63..=123u64 {
            read += 3;
            t.kafka(s * 1_000, up(), [(part(CH, 0), offsets(10_000, read as i64))]);
            t.sample(s * 1_000, &reads(read, 5));
        }
        assert!(kinds(123_000, &t, &r).is_empty());
        // No expectation configured: never slow.
        assert!(kinds(62_000, &t, &HealthConfig { stall_after_ms: 0, ..rules() }).is_empty());
    }

    #[test]
    fn a_stall_wins_over_slow() {
        let mut r = rules();
        r.topics.insert(CH.into(), TopicExpectation { min_rate_per_s: Some(2.0), max_quiet_ms: None });
        let mut t = healthy();
        for s in 2..=70u64 {
            t.kafka(s * 1_000, up(), [(part(CH, 0), offsets(20, 10))]);
            t.sample(s * 1_000, &reads(10, 5));
        }
        assert_eq!(kinds(70_000, &t, &r), [("stalled", CH.to_string())]);
    }

    #[test]
    fn quiet_topic_only_when_configured_and_clears_on_a_record() {
        let mut r = rules();
        r.topics.insert(DV.into(), TopicExpectation { max_quiet_ms: Some(30_000), min_rate_per_s: None });
        let mut t = healthy(); // device.upserted last read at 1 s
        assert!(kinds(30_999, &t, &r).is_empty());
        let reasons = evaluate(31_000, &t.facts(true, 0), &r);
        assert_eq!(reasons.iter().map(ToString::to_string).collect::<Vec<_>>(), ["topic device.upserted quiet: no record for 30000 ms, expected one within 30000 ms"]);
        assert!(kinds(1_000_000, &t, &rules()).is_empty(), "off by default");
        // A record arrives (its end offset grows) before it is read: no longer quiet.
        t.kafka(32_000, up(), [(part(DV, 0), offsets(6, 5))]);
        t.sample(32_000, &reads(10, 5));
        assert!(kinds(32_000, &t, &r).is_empty());
    }

    #[test]
    fn every_reason_at_once() {
        let mut r = rules();
        r.topics.insert(DV.into(), TopicExpectation { max_quiet_ms: Some(1_000), min_rate_per_s: None });
        let mut t = Tracker::new(&[DV.to_string(), CH.to_string()], 60_000);
        t.assigned([part(CH, 0)]);
        t.kafka(1_000, BrokerSample { up: 0, down: vec![] }, [(part(CH, 0), offsets(3, 0))]);
        t.sample(1_000, &reads(0, 0));
        let got: Vec<_> = evaluate(100_000, &t.facts(true, 20_000), &r).iter().map(Reason::kind).collect();
        assert_eq!(got, ["consumer_idle", "kafka_unreachable", "stalled", "unassigned", "quiet"]);
    }

    #[test]
    fn rate_window_slides() {
        let mut t = Tracker::new(&[CH.to_string()], 10_000);
        for s in 0..=30u64 {
            t.sample(s * 1_000, &[(CH.to_string(), if s <= 20 { s * 10 } else { 200 })].into());
        }
        let f = t.facts(true, 0);
        assert_eq!((f.topics[CH].rate_per_s, f.topics[CH].rate_span_ms), (0.0, 10_000), "nothing read in the last 10 s");
        let mut t = Tracker::new(&[CH.to_string()], 10_000);
        t.sample(0, &[(CH.to_string(), 0)].into());
        t.sample(4_000, &[(CH.to_string(), 20)].into());
        let f = t.facts(true, 0);
        assert_eq!((f.topics[CH].rate_per_s, f.topics[CH].rate_span_ms), (5.0, 4_000), "a partial window just after the start");
    }

    #[test]
    fn offsets_from_statistics() {
        let json = r#"{"partition":0,"broker":1,"leader":1,"desired":true,"unknown":false,"msgq_cnt":0,"msgq_bytes":0,"xmit_msgq_cnt":0,"xmit_msgq_bytes":0,"fetchq_cnt":0,"fetchq_size":0,"fetch_state":"active","query_offset":-1001,"next_offset":12,"app_offset":12,"stored_offset":-1001,"committed_offset":7,"eof_offset":12,"lo_offset":0,"hi_offset":20,"ls_offset":18,"consumer_lag":11,"consumer_lag_stored":-1,"txmsgs":0,"txbytes":0,"rxmsgs":12,"rxbytes":100,"msgs":12,"rx_ver_drops":0,"msgs_inflight":0,"next_ack_seq":0,"next_err_seq":0,"acked_msgid":0}"#;
        let p: rdkafka::statistics::Partition = serde_json::from_str(json).unwrap();
        let o = PartitionOffsets::from_statistics(&p);
        assert_eq!((o.end, o.position, o.lag()), (Some(18), Some(7), Some(11)));
        let fresh = rdkafka::statistics::Partition { stored_offset: -1001, committed_offset: -1001, lo_offset: 3, ls_offset: -1001, hi_offset: 9, ..p.clone() };
        let o = PartitionOffsets::from_statistics(&fresh);
        assert_eq!((o.end, o.position, o.lag()), (Some(9), Some(3), Some(6)), "never committed: from the log start");
        let unknown = rdkafka::statistics::Partition { hi_offset: -1001, ls_offset: -1001, ..p };
        assert_eq!(PartitionOffsets::from_statistics(&unknown).lag(), None);
    }

    #[test]
    fn alarm_log_reports_starts_and_clears_once() {
        let mut log = AlarmLog::default();
        let stalled = |ms| Reason::Stalled { topic: CH.into(), lag: 3, for_ms: ms, why: vec![] };
        let (s, c) = log.update(&[stalled(60_000)]);
        assert_eq!((s.len(), c.len()), (1, 0));
        let (s, c) = log.update(&[stalled(61_000)]);
        assert_eq!((s.len(), c.len()), (0, 0), "the same alarm a second later is not new");
        let (s, c) = log.update(&[Reason::ConsumerNotRunning]);
        assert_eq!((s, c), (vec![Reason::ConsumerNotRunning], vec![stalled(61_000)]));
        let (s, c) = log.update(&[]);
        assert_eq!((s.len(), c.len()), (0, 1));
    }
}
