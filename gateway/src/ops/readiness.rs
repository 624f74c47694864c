//! Readiness that tells the truth, and throughput per topic against what is expected.
//!
//! `/readyz` fails (503, one [`Reason`] per line) when any of these holds:
//! - the consumer loop is not running, or has not run for [`MAX_CONSUMER_IDLE_MS`];
//! - outbox writes have failed for [`MAX_CONSUMER_IDLE_MS`] (the loop runs on meanwhile,
//!   its partitions paused at their bounds);
//! - Kafka is unreachable: librdkafka's statistics have shown no broker connection in state
//!   `UP` for `health.kafka_down_after_ms`;
//! - this consumer has held no partition of a subscribed topic for
//!   `health.unassigned_after_ms` (a rebalance takes less);
//! - partitions of a group's topic that this consumer does not hold make no progress:
//!   records beyond the group's committed offset, unchanged for `health.stall_after_ms`
//!   (a member that holds them and does not read them: gone, or stuck;
//!   `ingest::group_watch`);
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
//!   the consumer keeps reading and the outbox fills);
//! - charge records are held until the device registry catches up
//!   (`ingest::registry_wait`): the reason names the partitions, how many records each
//!   holds, and how far behind the device topic is;
//! - Kafka consume errors keep coming (a batch that cannot be read: a codec, corruption, a
//!   record too large): the reason gives librdkafka's error text and, once found, the
//!   topic, partition and offset;
//! - the external MQTT broker the devices connect to (`broker`) has been unreachable for
//!   `health.device_broker_down_after_ms`: no job can reach any device;
//! - in the central shape with CloudPRNT served, the broker does not give back the owner
//!   records this replica published (an ACL without `pixgate/v1/partitions/+/owner`): no
//!   replica can pass a printer's request on to it.
//!
//! The rules are one pure function, [`evaluate`], over the [`Facts`] the health monitor
//! keeps (`telemetry::health`); [`report`] applies them to the monitor now; [`AlarmLog`]
//! logs each alarm once when it starts (`warn`) and when it clears (`info`).

use crate::config::HealthConfig;
use crate::telemetry::health::{
    ConsumeErrorFact, Facts, Monitor, OrphanFact, RegistryWaitFact, TopicFacts, WaitingBroker, DEVICES_NAMED,
};
use std::collections::BTreeMap;
use std::fmt;

/// Longest gap between consumer loop runs that still counts as ready, ms.
pub const MAX_CONSUMER_IDLE_MS: u64 = 10_000;

/// Why the gateway is not ready. `Display` gives the line `/readyz` answers; its wording
/// is stable (alerting and tests match on it).
#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// The consumer loop has ended.
    ConsumerNotRunning,
    /// The consumer loop has not run for a while.
    ConsumerIdle {
        /// Since it last ran, ms.
        idle_ms: u64,
        /// Outbox writes failing: for how long (ms) and the last error.
        outbox: Option<(u64, String)>,
    },
    /// No broker connection `UP`.
    KafkaUnreachable {
        /// For how long, ms.
        down_ms: u64,
        /// The connections' states, e.g. `127.0.0.1:9092/1 CONNECT`.
        brokers: Vec<String>,
    },
    /// Broker connections `UP` with requests waiting and nothing received for
    /// `health.kafka_down_after_ms` (a broker frozen with its connections open).
    KafkaSilent {
        /// Those connections.
        brokers: Vec<WaitingBroker>,
    },
    /// No partition of a subscribed topic held.
    Unassigned {
        /// The topic.
        topic: String,
        /// For how long, ms.
        for_ms: u64,
    },
    /// Partitions held elsewhere in the group that make no progress.
    Orphaned {
        /// The topic.
        topic: String,
        /// The group, the partitions and their lag, and for how long.
        orphans: OrphanFact,
    },
    /// Lag and no progress.
    Stalled {
        /// The topic.
        topic: String,
        /// Records beyond the consumer's position.
        lag: u64,
        /// Without progress, ms.
        for_ms: u64,
        /// The known causes (paused partitions and the devices holding them, outbox
        /// writes failing, Kafka unreachable).
        why: Vec<String>,
    },
    /// Read rate below the expected minimum over a whole window while lagging.
    Slow {
        /// The topic.
        topic: String,
        /// Records beyond the consumer's position.
        lag: u64,
        /// Records read per second over the window.
        rate_per_s: f64,
        /// The window, s.
        window_s: u64,
        /// The expected minimum, records per second.
        min_per_s: f64,
    },
    /// No record for longer than expected.
    Quiet {
        /// The topic.
        topic: String,
        /// Without a record, ms.
        for_ms: u64,
        /// The expected maximum, ms.
        max_ms: u64,
    },
    /// Jobs sent to reachable devices and no device acknowledged anything.
    DeliveryStalled {
        /// Jobs in flight.
        in_flight: usize,
        /// Without an ack, ms.
        for_ms: u64,
    },
    /// Charge records held until the device registry catches up.
    RegistryBehind {
        /// For how long, ms.
        for_ms: u64,
        /// What is held and what it waits for.
        wait: RegistryWaitFact,
    },
    /// Kafka consume errors keep coming.
    ConsumeError {
        /// Since the first of the streak, ms.
        for_ms: u64,
        /// The last error, and where once found.
        error: ConsumeErrorFact,
    },
    /// Outbox writes have failed for a while (the consumer loop runs; it reads no further
    /// than its bounds).
    OutboxFailing {
        /// For how long, ms.
        for_ms: u64,
        /// The last error.
        error: String,
    },
    /// The external MQTT broker cannot be reached.
    DeviceBrokerUnreachable {
        /// For how long, ms.
        for_ms: u64,
        /// The last connection error.
        error: String,
    },
    /// The broker does not give back the owner records of partitions this replica holds
    /// (`deliver::broker::owners`): other replicas cannot pass printers' requests on to it.
    OwnerRecordsMissing {
        /// For how long, ms.
        for_ms: u64,
        /// Which records, and what to check.
        what: String,
    },
    /// The outbox's file system has less than `outbox.min_free_bytes` free: reading is
    /// paused.
    LowSpace {
        /// For how long, ms.
        for_ms: u64,
        /// Bytes free when it was found low.
        free: u64,
        /// `outbox.min_free_bytes`.
        min: u64,
    },
}

impl Reason {
    /// The kind of alarm: `consumer_not_running`, `consumer_idle`, `outbox_failing`, `kafka_unreachable`,
    /// `kafka_silent`, `unassigned`, `orphaned`, `stalled`, `slow`, `quiet`, `delivery_stalled`, `registry_behind`,
    /// `consume_error`, `device_broker_unreachable`, `owner_records_missing`, `low_space` (the
    /// `alarm` label on `/metrics`).
    pub fn kind(&self) -> &'static str {
        match self {
            Reason::ConsumerNotRunning => "consumer_not_running",
            Reason::ConsumerIdle { .. } => "consumer_idle",
            Reason::OutboxFailing { .. } => "outbox_failing",
            Reason::KafkaUnreachable { .. } => "kafka_unreachable",
            Reason::KafkaSilent { .. } => "kafka_silent",
            Reason::Unassigned { .. } => "unassigned",
            Reason::Orphaned { .. } => "orphaned",
            Reason::Stalled { .. } => "stalled",
            Reason::Slow { .. } => "slow",
            Reason::Quiet { .. } => "quiet",
            Reason::DeliveryStalled { .. } => "delivery_stalled",
            Reason::RegistryBehind { .. } => "registry_behind",
            Reason::ConsumeError { .. } => "consume_error",
            Reason::DeviceBrokerUnreachable { .. } => "device_broker_unreachable",
            Reason::OwnerRecordsMissing { .. } => "owner_records_missing",
            Reason::LowSpace { .. } => "low_space",
        }
    }

    /// The topic it is about, if any.
    pub fn topic(&self) -> Option<&str> {
        match self {
            Reason::Unassigned { topic, .. }
            | Reason::Orphaned { topic, .. }
            | Reason::Stalled { topic, .. }
            | Reason::Slow { topic, .. }
            | Reason::Quiet { topic, .. } => Some(topic),
            Reason::ConsumeError { error, .. } => error.at.as_ref().map(|(t, _, _)| t.as_str()),
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
            Reason::OutboxFailing { for_ms, error } => write!(f, "outbox writes failing for {for_ms} ms: {error}"),
            Reason::KafkaUnreachable { down_ms, brokers } => {
                write!(f, "kafka unreachable: no broker up for {down_ms} ms")?;
                if !brokers.is_empty() {
                    write!(f, " ({})", brokers.join(", "))?;
                }
                Ok(())
            }
            Reason::KafkaSilent { brokers } => {
                let each: Vec<String> = brokers
                    .iter()
                    .map(|b| {
                        format!("{} ({} requests waiting, nothing received for {} ms)", b.name, b.requests, b.silent_ms)
                    })
                    .collect();
                write!(f, "kafka broker not answering: {}", each.join(", "))
            }
            Reason::Unassigned { topic, for_ms } => {
                write!(f, "topic {topic} unassigned: no partition held for {for_ms} ms")
            }
            Reason::Orphaned { topic, orphans } => {
                let parts: Vec<String> =
                    orphans.partitions.iter().map(|(p, lag)| format!("{topic}/{p} (lag {lag})")).collect();
                write!(
                    f,
                    "topic {topic} orphaned: {} make no progress in group {} for {} ms; another member holds them and does not move them on (gone, stuck, or holding them back: see its /readyz)",
                    parts.join(", "),
                    orphans.group,
                    orphans.for_ms
                )
            }
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
            Reason::Quiet { topic, for_ms, max_ms } => {
                write!(f, "topic {topic} quiet: no record for {for_ms} ms, expected one within {max_ms} ms")
            }
            Reason::DeliveryStalled { in_flight, for_ms } => write!(
                f,
                "delivery stalled: {in_flight} jobs in flight to reachable devices, no device ack for {for_ms} ms"
            ),
            Reason::RegistryBehind { for_ms, wait } => {
                let held: Vec<String> = wait
                    .held
                    .iter()
                    .map(|((t, p), n)| format!("{n} record{} on {t}/{p}", if *n == 1 { "" } else { "s" }))
                    .collect();
                write!(f, "charges waiting for the device registry: {} for {for_ms} ms", held.join(", "))?;
                match wait.behind {
                    Some(m) => {
                        write!(f, ", {} behind by {m} record{}", wait.device_topic, if m == 1 { "" } else { "s" })?
                    }
                    None => write!(f, ", asking Kafka for the end offsets of {}", wait.device_topic)?,
                }
                if !wait.unassigned.is_empty() {
                    let parts: Vec<String> =
                        wait.unassigned.iter().map(|p| format!("{}/{p}", wait.device_topic)).collect();
                    write!(f, " ({} not assigned to this consumer)", parts.join(", "))?;
                }
                if let Some(e) = &wait.error {
                    write!(f, "; asking Kafka fails: {e}")?;
                }
                Ok(())
            }
            Reason::ConsumeError { for_ms, error } => {
                write!(f, "kafka consume error for {for_ms} ms ({} errors): {}", error.count, error.error)?;
                if let Some((t, p, o)) = &error.at {
                    write!(f, "; at {t}/{p} offset {o}")?;
                }
                Ok(())
            }
            Reason::DeviceBrokerUnreachable { for_ms, error } => {
                write!(f, "the devices' MQTT broker unreachable for {for_ms} ms: {error}")
            }
            Reason::OwnerRecordsMissing { for_ms, what } => {
                write!(f, "the devices' MQTT broker has not given back this replica's owner records for {for_ms} ms: {what}")
            }
            Reason::LowSpace { for_ms, free, min } => write!(
                f,
                "the outbox's file system is low on space: {free} bytes free, below outbox.min_free_bytes ({min}); reading paused for {for_ms} ms"
            ),
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
    } else if let Some((for_ms, error)) = outbox.clone().filter(|(ms, _)| *ms > MAX_CONSUMER_IDLE_MS) {
        out.push(Reason::OutboxFailing { for_ms, error });
    }
    let kafka_down = facts.brokers.as_ref().is_some_and(|b| b.up == 0);
    if let Some(b) = facts.brokers.as_ref().filter(|_| kafka_down) {
        if on(rules.kafka_down_after_ms, since(facts.last_broker_up)) {
            out.push(Reason::KafkaUnreachable { down_ms: since(facts.last_broker_up), brokers: b.down.clone() });
        }
    }
    if let Some(b) = &facts.brokers {
        let silent: Vec<WaitingBroker> =
            b.waiting.iter().filter(|w| on(rules.kafka_down_after_ms, w.silent_ms)).cloned().collect();
        if !silent.is_empty() {
            out.push(Reason::KafkaSilent { brokers: silent });
        }
    }
    for (topic, t) in &facts.topics {
        if let Some(u) = t.unassigned_since.filter(|u| on(rules.unassigned_after_ms, since(*u))) {
            out.push(Reason::Unassigned { topic: topic.clone(), for_ms: since(u) });
        }
        if let Some(o) = facts.orphans.get(topic).filter(|_| rules.stall_after_ms > 0) {
            out.push(Reason::Orphaned { topic: topic.clone(), orphans: o.clone() });
        }
        let expect = rules.topics.get(topic);
        let lag = t.lag.unwrap_or(0);
        let stalled_for = t.lag_since.filter(|_| lag > 0).map(|l| since(l.max(t.last_progress.unwrap_or(0))));
        if let Some(for_ms) = stalled_for.filter(|ms| on(rules.stall_after_ms, *ms)) {
            out.push(Reason::Stalled {
                topic: topic.clone(),
                lag,
                for_ms,
                why: stall_causes(now, t, facts, kafka_down, outbox.as_ref()),
            });
        } else if let (Some(min), Some(lag_since)) =
            (expect.and_then(|e| e.min_rate_per_s), t.lag_since.filter(|_| lag > 0))
        {
            let window = rules.rate_window_ms.max(1);
            if since(lag_since) >= window && t.rate_span_ms >= window && t.rate_per_s < min {
                out.push(Reason::Slow {
                    topic: topic.clone(),
                    lag,
                    rate_per_s: t.rate_per_s,
                    window_s: window / 1000,
                    min_per_s: min,
                });
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
    if let Some((t, wait)) = &facts.registry_wait {
        out.push(Reason::RegistryBehind { for_ms: since(*t), wait: wait.clone() });
    }
    if let Some((t, error)) = &facts.consume_error {
        out.push(Reason::ConsumeError { for_ms: since(*t), error: error.clone() });
    }
    if let Some((t, error)) = &facts.device_broker_down {
        if on(rules.device_broker_down_after_ms, since(*t)) {
            out.push(Reason::DeviceBrokerUnreachable { for_ms: since(*t), error: error.clone() });
        }
    }
    if let Some((t, what)) = &facts.owner_records_missing {
        out.push(Reason::OwnerRecordsMissing { for_ms: since(*t), what: what.clone() });
    }
    if let Some((t, free, min)) = facts.low_space {
        out.push(Reason::LowSpace { for_ms: since(t), free, min });
    }
    out
}

/// What is known about why a topic makes no progress.
fn stall_causes(
    now: u64,
    t: &TopicFacts,
    facts: &Facts,
    kafka_down: bool,
    outbox: Option<&(u64, String)>,
) -> Vec<String> {
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
        if t.pause.low_space {
            causes.push("the outbox's file system is low on space (outbox.min_free_bytes)".to_string());
        }
        if t.pause.write_held {
            causes.push("the outbox write in flight is held and the next batch is full".to_string());
        }
        if t.pause.pending_bound {
            causes.push("records read and not yet written are at kafka.max_pending_per_partition".to_string());
        }
        if t.pause.registry_wait {
            causes.push("charges waiting for the device registry".to_string());
        }
        if t.pause.restoring {
            causes.push("taken partitions restoring their state from the delivery log or route changelog".to_string());
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

/// Logs alarm transitions: `warn` once when an alarm starts, `info` when it clears.
#[derive(Debug, Default)]
pub struct AlarmLog {
    active: BTreeMap<(&'static str, String), Reason>,
}

impl AlarmLog {
    /// Takes the reasons of one evaluation; returns (started, cleared) for tests.
    pub fn update(&mut self, reasons: &[Reason]) -> (Vec<Reason>, Vec<Reason>) {
        let now: BTreeMap<_, _> = reasons.iter().map(|r| (r.key(), r.clone())).collect();
        let started: Vec<Reason> =
            now.iter().filter(|(k, _)| !self.active.contains_key(*k)).map(|(_, r)| r.clone()).collect();
        let cleared: Vec<Reason> =
            self.active.iter().filter(|(k, _)| !now.contains_key(*k)).map(|(_, r)| r.clone()).collect();
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

/// The facts and every reason the gateway is not ready, now.
pub fn report(monitor: &Monitor, consumer_running: bool, consumer_idle_ms: u64) -> (Facts, Vec<Reason>) {
    let (now, facts) = monitor.facts(consumer_running, consumer_idle_ms);
    let reasons = evaluate(now, &facts, monitor.rules());
    (facts, reasons)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TopicExpectation;
    use crate::model::Partition;
    use crate::telemetry::health::{BrokerSample, PartitionOffsets, PauseCause, Tracker, WaitingBroker};
    use std::collections::HashSet;

    const CH: &str = "charge.upserted";
    const DV: &str = "device.upserted";

    fn rules() -> HealthConfig {
        HealthConfig {
            kafka_down_after_ms: 10_000,
            unassigned_after_ms: 30_000,
            stall_after_ms: 60_000,
            rate_window_ms: 60_000,
            ..HealthConfig::default()
        }
    }

    fn part(t: &str, p: i32) -> Partition {
        (t.to_string(), p)
    }

    fn up() -> BrokerSample {
        BrokerSample { up: 1, ..BrokerSample::default() }
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
        assert!(
            evaluate(2_000, &t.facts(true, MAX_CONSUMER_IDLE_MS), &rules()).is_empty(),
            "at the limit is still ready"
        );
    }

    #[test]
    fn delivery_stalls_when_no_device_acks_while_jobs_are_in_flight() {
        let rules = HealthConfig { delivery_stall_after_ms: 120_000, ..rules() };
        let mut t = healthy();
        t.in_flight(1_000, 3);
        assert!(kinds(120_999, &t, &rules).is_empty(), "not yet");
        let r = evaluate(121_000, &t.facts(true, 0), &rules);
        assert_eq!(r, vec![Reason::DeliveryStalled { in_flight: 3, for_ms: 120_000 }]);
        assert_eq!(
            r[0].to_string(),
            "delivery stalled: 3 jobs in flight to reachable devices, no device ack for 120000 ms"
        );
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
        assert!(
            kinds(10_000_000, &t, &HealthConfig { delivery_stall_after_ms: 0, ..rules.clone() }).is_empty(),
            "0 turns the rule off"
        );
    }

    #[test]
    fn consumer_idle_names_a_failing_outbox() {
        let mut t = healthy();
        t.outbox_failing(2_000, Some("disk full".into()));
        t.outbox_failing(3_000, Some("disk still full".into()));
        let r = evaluate(14_000, &t.facts(true, 12_000), &rules());
        assert_eq!(
            r[0].to_string(),
            "consumer idle for 12000 ms; why: outbox writes failing for 12000 ms: disk still full"
        );
        t.outbox_failing(15_000, None);
        assert!(evaluate(16_000, &t.facts(true, 0), &rules()).is_empty());
    }

    #[test]
    fn failing_outbox_writes_are_named_while_the_loop_runs() {
        let mut t = healthy();
        t.outbox_failing(2_000, Some("No space left on device".into()));
        assert!(evaluate(12_000, &t.facts(true, 0), &rules()).is_empty(), "a retry may still take it");
        let r = evaluate(12_001, &t.facts(true, 0), &rules());
        assert_eq!(
            r.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["outbox writes failing for 10001 ms: No space left on device"]
        );
        assert_eq!(r[0].kind(), "outbox_failing");
        t.outbox_failing(13_000, None);
        assert!(evaluate(14_000, &t.facts(true, 0), &rules()).is_empty());
    }

    #[test]
    fn kafka_unreachable_after_the_threshold_and_clears_when_a_broker_is_up() {
        let mut t = healthy();
        let down = BrokerSample { up: 0, down: vec!["127.0.0.1:9092/1 CONNECT".into()], ..BrokerSample::default() };
        t.kafka(2_000, down.clone(), []);
        t.kafka(10_999, down.clone(), []);
        assert!(kinds(10_999, &t, &rules()).is_empty(), "up 9999 ms ago: not yet");
        t.kafka(11_000, down, []);
        let r = evaluate(11_000, &t.facts(true, 0), &rules());
        assert_eq!(
            r.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["kafka unreachable: no broker up for 10000 ms (127.0.0.1:9092/1 CONNECT)"]
        );
        t.kafka(12_000, up(), []);
        assert!(kinds(12_000, &t, &rules()).is_empty());
    }

    #[test]
    fn a_broker_up_that_stops_answering_is_named_after_the_threshold() {
        // librdkafka's view of a broker frozen with its connection open: UP, a fetch and a
        // heartbeat waiting, nothing received for a while (`rxidle`, µs).
        let frozen = |idle_ms: i64, waiting: i64| {
            let broker = |name: &str, source: &str, waitresp_cnt: i64, rxidle: i64| rdkafka::statistics::Broker {
                name: name.into(),
                source: source.into(),
                state: "UP".into(),
                waitresp_cnt,
                rxidle,
                ..Default::default()
            };
            let stats = rdkafka::statistics::Statistics {
                brokers: [
                    ("1".to_string(), broker("127.0.0.1:9092/1", "learned", waiting, idle_ms * 1_000)),
                    // An alias, and a connection that has nothing to wait for: not counted.
                    ("c".to_string(), broker("GroupCoordinator", "logical", 3, 60_000_000)),
                    ("b".to_string(), broker("127.0.0.1:9092/bootstrap", "configured", 0, 60_000_000)),
                ]
                .into_iter()
                .collect(),
                ..Default::default()
            };
            BrokerSample::from_statistics(&stats)
        };
        let mut t = healthy();
        t.kafka(2_000, frozen(9_999, 2), []);
        assert!(kinds(2_000, &t, &rules()).is_empty(), "silent for less than kafka_down_after_ms");
        t.kafka(3_000, frozen(12_000, 2), []);
        let r = evaluate(3_000, &t.facts(true, 0), &rules());
        assert_eq!(
            r.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["kafka broker not answering: 127.0.0.1:9092/1 (2 requests waiting, nothing received for 12000 ms)"]
        );
        assert_eq!(r[0].kind(), "kafka_silent");
        t.kafka(4_000, frozen(60_000, 0), []);
        assert!(kinds(4_000, &t, &rules()).is_empty(), "nothing waiting: an idle connection, not a silent broker");
        t.kafka(5_000, frozen(100, 1), []);
        assert!(kinds(5_000, &t, &rules()).is_empty(), "answering again");
    }

    /// The central shape's three Kafka clients report apart: one client's sample does not
    /// hide another's. A broker one client waits on stays named while the others' samples
    /// come; a client with no connection up makes Kafka unreachable; a client gone quiet
    /// for a minute no longer counts.
    #[test]
    fn several_clients_samples_are_merged_not_overwritten() {
        let waiting = |silent_ms| BrokerSample {
            up: 1,
            waiting: vec![WaitingBroker { name: "b/1".into(), requests: 1, silent_ms }],
            ..BrokerSample::default()
        };
        let mut t = healthy();
        t.kafka_of(2_000, "route", waiting(12_000), []);
        for at in [2_100, 2_500, 2_900] {
            t.kafka_of(at, "feed", up(), []);
            assert_eq!(kinds(at, &t, &rules()), [("kafka_silent", String::new())], "at {at}");
        }
        t.kafka_of(3_000, "route", up(), []);
        assert!(kinds(3_000, &t, &rules()).is_empty(), "answering again");

        let down = BrokerSample { up: 0, down: vec!["b/1 CONNECT".into()], ..BrokerSample::default() };
        t.kafka_of(4_000, "deliver", down, []);
        for at in [4_500, 14_000] {
            t.kafka_of(at, "route", up(), []);
            t.kafka_of(at, "feed", up(), []);
        }
        assert_eq!(kinds(14_000, &t, &rules()), [("kafka_unreachable", String::new())], "deliver has none up");
        t.kafka_of(64_000, "route", up(), []);
        assert!(kinds(64_000, &t, &rules()).is_empty(), "deliver silent for a minute: gone");
    }

    #[test]
    fn kafka_never_reached_counts_from_the_start_and_no_statistics_is_not_down() {
        let t = Tracker::new(&[CH.to_string()], 60_000);
        assert!(!kinds(20_000, &t, &HealthConfig { unassigned_after_ms: 0, ..rules() })
            .iter()
            .any(|k| k.0 == "kafka_unreachable"));
        let mut t = t;
        t.kafka(10_000, BrokerSample { up: 0, down: vec!["b DOWN".into()], ..BrokerSample::default() }, []);
        assert_eq!(
            kinds(10_000, &t, &HealthConfig { unassigned_after_ms: 0, ..rules() }),
            [("kafka_unreachable", String::new())]
        );
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
    fn partitions_held_elsewhere_without_progress_are_named_until_they_move() {
        let mut t = healthy();
        let orphans = OrphanFact { group: "g-deliver".into(), partitions: vec![(2, 40), (5, 7)], for_ms: 61_000 };
        t.orphans(CH, Some(orphans));
        let r = evaluate(2_000, &t.facts(true, 0), &rules());
        assert_eq!(r.iter().map(Reason::key).collect::<Vec<_>>(), [("orphaned", CH.to_string())]);
        assert_eq!(
            r[0].to_string(),
            "topic charge.upserted orphaned: charge.upserted/2 (lag 40), charge.upserted/5 (lag 7) make no progress in group g-deliver for 61000 ms; another member holds them and does not move them on (gone, stuck, or holding them back: see its /readyz)"
        );
        assert!(kinds(2_000, &t, &HealthConfig { stall_after_ms: 0, ..rules() }).is_empty(), "off with the stall rule");
        t.orphans(CH, None);
        assert!(kinds(3_000, &t, &rules()).is_empty());
    }

    #[test]
    fn stalled_with_lag_and_no_progress_then_clears_on_progress() {
        let mut t = healthy();
        // 5 records arrive; none is read.
        t.kafka(2_000, up(), [(part(CH, 0), offsets(15, 10))]);
        t.sample(2_000, &reads(10, 5));
        assert!(kinds(61_999, &t, &rules()).is_empty(), "lag for 59999 ms");
        let r = evaluate(62_000, &t.facts(true, 0), &rules());
        assert_eq!(
            r.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["topic charge.upserted stalled: lag 5 records, no progress for 60000 ms"]
        );
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
        t.kafka(
            2_000,
            up(),
            [
                (part(CH, 0), offsets(4, 4)),
                (part(CH, 1), offsets(3, 2)),
                (part(CH, 2), offsets(6, 6)),
                (part(DV, 0), offsets(5, 5)),
            ],
        );
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
    fn low_space_is_named_at_once_and_in_a_stall() {
        let mut t = healthy();
        assert!(kinds(1_000, &t, &rules()).is_empty());
        t.low_space(1_000, Some((4_000_000, 67_108_864)));
        t.low_space(5_000, Some((3_000_000, 67_108_864)));
        let r = evaluate(6_000, &t.facts(true, 0), &rules());
        assert_eq!(
            r.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["the outbox's file system is low on space: 3000000 bytes free, below outbox.min_free_bytes (67108864); reading paused for 5000 ms"],
            "at once, timed from when it was first found"
        );
        assert_eq!(r[0].kind(), "low_space");
        t.paused(&part(CH, 0), PauseCause { low_space: true, ..PauseCause::default() });
        t.kafka(2_000, BrokerSample::default(), [(part(CH, 0), offsets(12, 10))]);
        t.sample(2_000, &reads(10, 5));
        let r = evaluate(62_000, &t.facts(true, 0), &HealthConfig { kafka_down_after_ms: 0, ..rules() });
        assert!(
            r.iter().any(|r| r.to_string().contains("why: 1 of 1 partitions paused for backpressure: the outbox's file system is low on space (outbox.min_free_bytes)")),
            "{r:?}"
        );
        t.low_space(63_000, None);
        assert!(kinds(63_000, &t, &rules()).iter().all(|(k, _)| *k != "low_space"));
    }

    #[test]
    fn a_stall_names_other_pause_causes_the_outbox_and_kafka() {
        let mut t = healthy();
        t.paused(&part(CH, 0), PauseCause::new(true, true, None));
        t.kafka(2_000, BrokerSample::default(), [(part(CH, 0), offsets(12, 10))]);
        t.outbox_failing(2_000, Some("No space left on device".into()));
        t.sample(2_000, &reads(10, 5));
        let r = evaluate(62_000, &t.facts(true, 0), &HealthConfig { kafka_down_after_ms: 0, ..rules() });
        assert_eq!(
            r.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "outbox writes failing for 60000 ms: No space left on device",
                "topic charge.upserted stalled: lag 2 records, no progress for 60000 ms; why: 1 of 1 partitions paused for backpressure: the outbox is full (outbox.max_jobs), records read and not yet written are at kafka.max_pending_per_partition; outbox writes failing for 60000 ms: No space left on device; no Kafka broker up for 61000 ms"
            ]
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
        assert_eq!(
            reasons.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["topic charge.upserted slow: lag 939 records, 1.00 records/s over the last 60 s, expected at least 2/s"]
        );
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
        assert_eq!(
            reasons.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["topic device.upserted quiet: no record for 30000 ms, expected one within 30000 ms"]
        );
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
        t.kafka(1_000, BrokerSample::default(), [(part(CH, 0), offsets(3, 0))]);
        t.sample(1_000, &reads(0, 0));
        let got: Vec<_> = evaluate(100_000, &t.facts(true, 20_000), &r).iter().map(Reason::kind).collect();
        assert_eq!(got, ["consumer_idle", "kafka_unreachable", "stalled", "unassigned", "quiet"]);
    }

    #[test]
    fn device_broker_unreachable_after_the_threshold_and_clears_when_up() {
        let rules = HealthConfig { device_broker_down_after_ms: 10_000, ..rules() };
        let mut t = healthy();
        t.device_broker_down(1_000, Some("connection refused".into()));
        t.device_broker_down(5_000, Some("tls handshake eof".into()));
        assert!(kinds(10_999, &t, &rules).is_empty(), "not before the threshold, counted from the first error");
        let reasons = evaluate(11_000, &t.facts(true, 0), &rules);
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert_eq!(
            reasons[0].to_string(),
            "the devices' MQTT broker unreachable for 10000 ms: tls handshake eof",
            "the latest error"
        );
        assert!(kinds(60_000, &t, &HealthConfig { device_broker_down_after_ms: 0, ..rules.clone() }).is_empty());
        t.device_broker_down(12_000, None);
        assert!(kinds(60_000, &t, &rules).is_empty(), "cleared once connected");
    }

    #[test]
    fn owner_records_not_given_back_fail_readiness_until_they_come() {
        let rules = rules();
        let mut t = healthy();
        t.owner_records_missing(1_000, Some("partitions [3]".into()));
        t.owner_records_missing(6_000, Some("partitions [3, 5]".into()));
        let reasons = evaluate(7_000, &t.facts(true, 0), &rules);
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert_eq!(reasons[0].kind(), "owner_records_missing");
        assert_eq!(
            reasons[0].to_string(),
            "the devices' MQTT broker has not given back this replica's owner records for 6000 ms: partitions [3, 5]",
            "counted from the first, naming the latest"
        );
        t.owner_records_missing(8_000, None);
        assert!(kinds(9_000, &t, &rules).is_empty(), "cleared once they come back");
    }

    #[test]
    fn rate_window_slides() {
        let mut t = Tracker::new(&[CH.to_string()], 10_000);
        for s in 0..=30u64 {
            t.sample(s * 1_000, &[(CH.to_string(), if s <= 20 { s * 10 } else { 200 })].into());
        }
        let f = t.facts(true, 0);
        assert_eq!(
            (f.topics[CH].rate_per_s, f.topics[CH].rate_span_ms),
            (0.0, 10_000),
            "nothing read in the last 10 s"
        );
        let mut t = Tracker::new(&[CH.to_string()], 10_000);
        t.sample(0, &[(CH.to_string(), 0)].into());
        t.sample(4_000, &[(CH.to_string(), 20)].into());
        let f = t.facts(true, 0);
        assert_eq!(
            (f.topics[CH].rate_per_s, f.topics[CH].rate_span_ms),
            (5.0, 4_000),
            "a partial window just after the start"
        );
    }

    #[test]
    fn offsets_from_statistics() {
        let json = r#"{"partition":0,"broker":1,"leader":1,"desired":true,"unknown":false,"msgq_cnt":0,"msgq_bytes":0,"xmit_msgq_cnt":0,"xmit_msgq_bytes":0,"fetchq_cnt":0,"fetchq_size":0,"fetch_state":"active","query_offset":-1001,"next_offset":12,"app_offset":12,"stored_offset":-1001,"committed_offset":7,"eof_offset":12,"lo_offset":0,"hi_offset":20,"ls_offset":18,"consumer_lag":11,"consumer_lag_stored":-1,"txmsgs":0,"txbytes":0,"rxmsgs":12,"rxbytes":100,"msgs":12,"rx_ver_drops":0,"msgs_inflight":0,"next_ack_seq":0,"next_err_seq":0,"acked_msgid":0}"#;
        let p: rdkafka::statistics::Partition = serde_json::from_str(json).unwrap();
        let o = PartitionOffsets::from_statistics(&p);
        assert_eq!((o.end, o.position, o.lag()), (Some(18), Some(7), Some(11)));
        let fresh = rdkafka::statistics::Partition {
            stored_offset: -1001,
            committed_offset: -1001,
            lo_offset: 3,
            ls_offset: -1001,
            hi_offset: 9,
            ..p.clone()
        };
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
