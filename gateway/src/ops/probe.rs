//! The health watch: every second it advances the per-topic history, logs readiness alarm
//! transitions, and probes the end offsets of paused partitions (librdkafka does not fetch
//! a paused partition, so its statistics stop showing the partition's end).

use crate::kafka_client;
use crate::model::Partition;
use crate::ops::readiness::{AlarmLog, Reason};
use crate::ops::report as snapshot;
use crate::shutdown::Shutdown;
use crate::telemetry::{Monitor, Stats};
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::sync::Arc;
use std::time::Duration;

/// Asks Kafka for the end offsets of paused partitions (ListOffsets through a bare client
/// with no group, created on first use).
struct Prober {
    brokers: String,
    client: Option<Arc<BaseConsumer>>,
}

impl Prober {
    fn client(&mut self) -> Option<Arc<BaseConsumer>> {
        if self.client.is_none() {
            match kafka_client::client(&self.brokers).create::<BaseConsumer>() {
                Ok(c) => self.client = Some(Arc::new(c)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot create the Kafka client that probes paused partitions' end offsets")
                }
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

/// Every second until `shutdown` is requested: advances the health history, logs alarm transitions
/// (from when the consumer first runs), and every `health.paused_probe_interval_ms` probes the end offsets of paused
/// partitions (`brokers` = `kafka.brokers`).
pub async fn watch(stats: Arc<Stats>, health: Arc<Monitor>, brokers: String, shutdown: Shutdown) {
    let probe_every = Duration::from_millis(health.rules().paused_probe_interval_ms.max(100));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut alarms = AlarmLog::default();
    let mut prober = Prober { brokers, client: None };
    let mut probing: Option<tokio::task::JoinHandle<Vec<(Partition, i64)>>> = None;
    let mut next_probe = tokio::time::Instant::now();
    let mut started = false;
    loop {
        tokio::select! {
            () = shutdown.requested() => return,
            _ = tick.tick() => {}
        }
        if probing.as_ref().is_some_and(|p| p.is_finished()) {
            match probing.take().expect("probe task").await {
                Ok(ends) => {
                    for (part, end) in ends {
                        health.probed(part, end);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "end offset probe task failed"),
            }
        }
        if probing.is_none() && tokio::time::Instant::now() >= next_probe {
            next_probe = tokio::time::Instant::now() + probe_every;
            let targets = health.probe_targets();
            if !targets.is_empty() {
                if let Some(client) = prober.client() {
                    probing = Some(tokio::task::spawn_blocking(move || probe_ends(&client, &targets)));
                }
            }
        }
        snapshot::sample(&stats, &health);
        let reasons = snapshot::not_ready(&stats, &health);
        // Before the consumer first runs, "not running" is the start-up, not an alarm.
        started |= !reasons.contains(&Reason::ConsumerNotRunning);
        if started {
            alarms.update(&reasons);
        }
    }
}
