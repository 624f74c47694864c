//! A consumer-group member's librdkafka settings, as [`crate::ingest`] describes them
//! ("Offsets"): offsets stored by the loop once a record's effects are accepted, committed
//! by librdkafka every second.

use crate::config::Config;
use crate::ingest::rebalance::{GatewayConsumer, Rebalances};
use crate::kafka_client;
use crate::telemetry::Monitor;
use anyhow::Context;
use std::sync::Arc;

/// A member of consumer group `group`, configured as [`crate::ingest`] describes (offsets
/// stored by us, committed by librdkafka every second); its static membership id is
/// `kafka.instance_id` followed by `instance_suffix` (none when `kafka.instance_id` is
/// empty).
pub fn create(
    cfg: &Config,
    health: &Arc<Monitor>,
    group: &str,
    instance_suffix: &str,
) -> anyhow::Result<GatewayConsumer> {
    let k = &cfg.kafka;
    let mut client = kafka_client::client(&k.brokers);
    if !k.instance_id.is_empty() {
        client.set("group.instance.id", format!("{}{instance_suffix}", k.instance_id));
    }
    if !k.debug.is_empty() {
        client.set("debug", &k.debug);
    }
    client
        .set("group.id", group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", &k.assignment_strategy)
        .set("session.timeout.ms", k.session_timeout_ms.to_string())
        .set("max.poll.interval.ms", k.max_poll_interval_ms.to_string())
        .set("fetch.wait.max.ms", k.fetch_wait_max_ms.to_string())
        .set("queued.max.messages.kbytes", "16384")
        .set("statistics.interval.ms", cfg.health.statistics_interval_ms.to_string())
        .create_with_context(Rebalances::new(health.clone()))
        .context("creating the Kafka consumer")
}
