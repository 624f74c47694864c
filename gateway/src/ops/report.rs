//! What `/stats` serves: the counters, the health monitor's per-topic view, the effect
//! flags and every reason the gateway is not ready, taken together so they agree.

use crate::model::EffectFlags;
use crate::ops::readiness::{self, Reason};
use crate::store::reconcile::Window;
use crate::telemetry::{Monitor, Snapshot, Stats};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `/stats` as JSON: the counters ([`Snapshot`], flattened) with the per-topic view and
/// the readiness reasons.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsReport {
    /// The counters.
    #[serde(flatten)]
    pub counters: Snapshot,
    /// Throughput, lag and alarms per subscribed topic.
    pub topics: BTreeMap<String, TopicStats>,
    /// Broker connections `UP` in librdkafka's latest statistics (`null` before the first).
    pub kafka_brokers_up: Option<u64>,
    /// Every reason `/readyz` fails now, as it words them (empty: ready).
    pub not_ready: Vec<String>,
    /// The effect flags by kind (`false`: switched off, its effects skipped;
    /// [`crate::model::flags`]).
    #[serde(default)]
    pub effect_flags: BTreeMap<String, bool>,
    /// The latest reconciliation windows per topic (`reconcile.stats_windows` of
    /// `reconcile.window_minutes`; [`crate::store::reconcile`]).
    #[serde(default)]
    pub reconciliation: Vec<Window>,
}

/// One topic on `/stats` (and `/metrics`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopicStats {
    /// Records read since the start.
    pub records_read: u64,
    /// Records read per second over the rate window (`health.rate_window_ms`, or what of it
    /// has passed since the start: `rate_window_covered_ms`).
    pub rate_per_s: f64,
    /// How much time `rate_per_s` covers, ms.
    pub rate_window_covered_ms: u64,
    /// Records on the assigned partitions beyond the consumer's position (stored or
    /// committed offset); `null` while unknown.
    pub lag: Option<u64>,
    /// Since the last progress (record read or offset stored), ms; `null` if none yet.
    pub ms_since_progress: Option<u64>,
    /// Partitions of the topic this consumer holds.
    pub assigned_partitions: u64,
    /// Of those, paused for backpressure.
    pub paused_partitions: u64,
    /// Whether the topic is stalled (lag and no progress for `health.stall_after_ms`).
    pub stalled: bool,
    /// The alarms on this topic: `unassigned`, `orphaned`, `stalled`, `slow`, `quiet`.
    pub alarms: Vec<String>,
}

/// Advances the health history with the records read per topic (about every second,
/// `ops::probe::watch`).
pub fn sample(stats: &Stats, monitor: &Monitor) {
    monitor.sample(&stats.events_read());
}

/// Every reason the gateway is not ready now (empty: ready).
pub fn not_ready(stats: &Stats, monitor: &Monitor) -> Vec<Reason> {
    let running = stats.snapshot().consumer_running;
    readiness::report(monitor, running, stats.idle_ms()).1
}

/// The counters, the per-topic health view, the effect flags and the readiness reasons it
/// was made with.
pub fn report(stats: &Stats, monitor: &Monitor, flags: &EffectFlags) -> (StatsReport, Vec<Reason>) {
    let s = stats.snapshot();
    let (facts, reasons) = readiness::report(monitor, s.consumer_running, s.consumer_idle_ms);
    let now = monitor.now_ms();
    let topics = facts
        .topics
        .iter()
        .map(|(name, t)| {
            let alarms: Vec<String> =
                reasons.iter().filter(|r| r.topic() == Some(name.as_str())).map(|r| r.kind().to_string()).collect();
            let topic = TopicStats {
                records_read: s.events_read.get(name).copied().unwrap_or(0),
                rate_per_s: t.rate_per_s,
                rate_window_covered_ms: t.rate_span_ms,
                lag: t.lag,
                ms_since_progress: t.last_progress.map(|p| now.saturating_sub(p)),
                assigned_partitions: t.assigned as u64,
                paused_partitions: t.paused as u64,
                stalled: alarms.iter().any(|a| a == "stalled"),
                alarms,
            };
            (name.clone(), topic)
        })
        .collect();
    let report = StatsReport {
        kafka_brokers_up: facts.brokers.map(|b| b.up as u64),
        not_ready: reasons.iter().map(ToString::to_string).collect(),
        counters: s,
        topics,
        effect_flags: flags.as_map(),
        reconciliation: Vec::new(),
    };
    (report, reasons)
}
