//! `/metrics`: the `/stats` report in the Prometheus text exposition format, written with
//! the Prometheus project's own client (`prometheus-client`).

use crate::ops::readiness::Reason;
use crate::ops::report::StatsReport;
use std::collections::BTreeMap;

/// `Content-Type` of [`prometheus_text`]: the Prometheus text exposition format 0.0.4.
pub const PROMETHEUS_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The snapshot in the Prometheus text exposition format (0.0.4), names prefixed
/// `pixgate_`: per topic (label `topic`) records read, read rate, lag, time since progress,
/// assigned and paused partitions, stalled and the alarms (`alarm` label); readiness; and
/// the counters and gauges of the [`StatsReport`] that matter for operation.
///
/// # Errors
/// Only a formatting error from the encoder (writing to a `String` does not fail).
pub fn prometheus_text(r: &StatsReport, reasons: &[Reason]) -> Result<String, std::fmt::Error> {
    let mut registry = prometheus_client::registry::Registry::with_prefix("pixgate");
    let consume_errors = reasons
        .iter()
        .filter_map(|r| match r {
            Reason::ConsumeError { error, .. } => Some(error.clone()),
            _ => None,
        })
        .collect();
    registry.register_collector(Box::new(Exposition {
        r: r.clone(),
        kinds: reasons.iter().map(Reason::kind).collect(),
        consume_errors,
    }));
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?;
    Ok(out)
}

/// Topic alarms, always exposed (0 or 1) so alert rules need no `absent()`.
const TOPIC_ALARMS: [&str; 5] = ["unassigned", "orphaned", "stalled", "slow", "quiet"];
/// Gateway-wide alarms, likewise.
const GLOBAL_ALARMS: [&str; 11] = [
    "consumer_not_running",
    "consumer_idle",
    "outbox_failing",
    "kafka_unreachable",
    "kafka_silent",
    "delivery_stalled",
    "registry_behind",
    "consume_error",
    "device_broker_unreachable",
    "owner_records_missing",
    "low_space",
];

/// One scrape: the snapshot encoded on demand (a collector, so values are read once).
#[derive(Debug)]
struct Exposition {
    r: StatsReport,
    kinds: Vec<&'static str>,
    /// The consume errors readiness reports (at most one).
    consume_errors: Vec<crate::telemetry::health::ConsumeErrorFact>,
}

mod expose {
    use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
    use prometheus_client::metrics::counter::ConstCounter;
    use prometheus_client::metrics::gauge::ConstGauge;
    use prometheus_client::metrics::MetricType;
    use prometheus_client::registry::Unit;
    use std::fmt;

    /// A counter family (`_total` is appended), one sample per label set.
    pub fn counters<'a, L: EncodeLabelSet + 'a>(
        enc: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (L, u64)>,
    ) -> fmt::Result {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (labels, v) in samples {
            ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// A gauge family, one sample per label set.
    pub fn gauges<'a, L: EncodeLabelSet + 'a>(
        enc: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (L, f64)>,
    ) -> fmt::Result {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (labels, v) in samples {
            ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// A single unlabelled gauge.
    pub fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> fmt::Result {
        ConstGauge::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
    }

    /// A histogram family (`_bucket`, `_sum`, `_count`), one per label set: `(labels,
    /// sum, count, buckets)`, the buckets `(upper bound, count)` not cumulative, the last
    /// bound `f64::INFINITY`.
    pub fn histograms<'a, L: EncodeLabelSet + 'a>(
        enc: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        unit: &Unit,
        samples: impl IntoIterator<Item = (L, f64, u64, Vec<(f64, u64)>)>,
    ) -> fmt::Result {
        let mut m = enc.encode_descriptor(name, help, Some(unit), MetricType::Histogram)?;
        for (labels, sum, count, buckets) in samples {
            m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
        }
        Ok(())
    }

    /// A single unlabelled counter (`_total` is appended).
    pub fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
        ConstCounter::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
    }
}

impl prometheus_client::collector::Collector for Exposition {
    fn encode(&self, mut enc: prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        use expose::{counter, counters, gauge, gauges, histograms};
        let (s, e) = (&self.r.counters, &mut enc);
        let topics = || self.r.topics.iter().map(|(t, v)| ([("topic", t.as_str())], v));
        let by = |label: &'static str, m: &'_ BTreeMap<String, u64>| {
            m.iter().map(move |(k, v)| ([(label, k.clone())], *v)).collect::<Vec<_>>()
        };
        let flag = |b: bool| if b { 1.0 } else { 0.0 };

        counters(e, "topic_records_read", "Records read from the topic.", topics().map(|(l, t)| (l, t.records_read)))?;
        gauges(
            e,
            "topic_read_rate_per_second",
            "Records read per second over the rate window (health.rate_window_ms).",
            topics().map(|(l, t)| (l, t.rate_per_s)),
        )?;
        gauges(e, "topic_lag_records", "Records on the assigned partitions beyond the consumer's stored or committed offset (absent while unknown).", topics().filter_map(|(l, t)| Some((l, t.lag? as f64))))?;
        gauges(
            e,
            "topic_seconds_since_progress",
            "Seconds since a record was read or an offset stored on the topic (absent before the first).",
            topics().filter_map(|(l, t)| Some((l, t.ms_since_progress? as f64 / 1000.0))),
        )?;
        gauges(
            e,
            "topic_assigned_partitions",
            "Partitions of the topic held by this consumer.",
            topics().map(|(l, t)| (l, t.assigned_partitions as f64)),
        )?;
        gauges(
            e,
            "topic_paused_partitions",
            "Partitions of the topic paused for backpressure.",
            topics().map(|(l, t)| (l, t.paused_partitions as f64)),
        )?;
        gauges(
            e,
            "topic_stalled",
            "1 while the topic has lag and no progress for health.stall_after_ms.",
            topics().map(|(l, t)| (l, flag(t.stalled))),
        )?;
        let alarms = topics().flat_map(|([(_, topic)], t)| {
            TOPIC_ALARMS.iter().map(move |a| ([("topic", topic), ("alarm", *a)], flag(t.alarms.iter().any(|x| x == a))))
        });
        gauges(
            e,
            "topic_alarm",
            "1 while the alarm holds on the topic (unassigned, orphaned, stalled, slow, quiet); each fails /readyz.",
            alarms,
        )?;

        gauge(e, "ready", "1 when /readyz answers 200.", flag(self.kinds.is_empty()))?;
        let global = GLOBAL_ALARMS.iter().map(|a| ([("alarm", *a)], flag(self.kinds.contains(a))));
        gauges(e, "alarm", "1 while the gateway-wide alarm holds (consumer_not_running, consumer_idle, kafka_unreachable, delivery_stalled, registry_behind, consume_error); each fails /readyz.", global)?;
        let consume = self.consume_errors.iter().map(|c| {
            let (topic, partition, offset) = match &c.at {
                Some((t, p, o)) => (t.clone(), p.to_string(), o.to_string()),
                None => (String::new(), String::new(), String::new()),
            };
            ([("topic", topic), ("partition", partition), ("offset", offset), ("error", c.error.clone())], 1.0)
        });
        gauges(e, "kafka_consume_error", "1 while Kafka consume errors keep coming: librdkafka's error text, and the topic, partition and offset that cannot be read once found (empty until then).", consume)?;
        if let Some(up) = self.r.kafka_brokers_up {
            gauge(
                e,
                "kafka_brokers_up",
                "Broker connections in state UP in librdkafka's latest statistics.",
                up as f64,
            )?;
        }
        let kinds = self.r.effect_flags.iter().map(|(k, on)| ([("kind", k.clone())], flag(*on)));
        gauges(
            e,
            "effect_enabled",
            "1 while the effect kind is switched on, 0 while its effects are skipped (effect flags).",
            kinds,
        )?;
        gauge(e, "consumer_running", "1 while the consumer loop runs.", flag(s.consumer_running))?;
        gauge(e, "mqtt_connected", "Devices connected to the MQTT listener.", s.mqtt_connected as f64)?;
        gauge(
            e,
            "consumer_idle_seconds",
            "Seconds since the consumer loop last ran.",
            s.consumer_idle_ms as f64 / 1000.0,
        )?;

        counters(
            e,
            "effects_done",
            "Effects acknowledged as done by their device, by kind.",
            by("kind", &s.effects_done),
        )?;
        counters(
            e,
            "mqtt_refusals",
            "Sockets, CONNECTs and packets the device listener refused, by rule.",
            by("rule", &s.mqtt_refusals),
        )?;
        counters(
            e,
            "cloudprnt_refusals",
            "Connections and requests the CloudPRNT server refused, by rule.",
            by("rule", &s.cloudprnt_refusals),
        )?;
        counters(
            e,
            "cloudprnt_forwards",
            "Printers' requests for a queue another replica holds, by outcome (forwarded, failed, no_owner, not_owner).",
            by("outcome", &s.cloudprnt_forwards),
        )?;
        counters(
            e,
            "group_rejoins",
            "Times this replica rejoined a consumer group that gave it no partition of a topic, by group.",
            by("group", &s.group_rejoins),
        )?;
        counters(
            e,
            "dead_lettered_records",
            "Whole records dead-lettered, by reason.",
            by("reason", &s.dead_lettered_records),
        )?;
        counters(
            e,
            "dead_lettered_effects",
            "Single effects dead-lettered, by reason.",
            by("reason", &s.dead_lettered_effects),
        )?;
        counters(e, "ignored_records", "Records with no effect by design, by reason.", by("reason", &s.ignored))?;
        counters(
            e,
            "expired_jobs",
            "Jobs whose time to live passed before they were done, by kind.",
            by("kind", &s.expired),
        )?;
        counters(
            e,
            "skipped_by_flag",
            "Effects decided but left out because their kind is switched off, by kind.",
            by("kind", &s.skipped_by_flag),
        )?;
        counter(e, "records_with_effects", "Records whose effects were planned.", s.records_with_effects)?;
        counter(
            e,
            "job_redeliveries",
            "Job sends beyond the first (ack timeout or transient failure).",
            s.job_redeliveries,
        )?;
        counter(
            e,
            "superseded_jobs",
            "Queued display_qr jobs dropped because their charge's next screen came first.",
            s.superseded,
        )?;
        counter(e, "deadletters_published", "Dead letters Kafka acknowledged.", s.deadletters_published)?;
        counter(
            e,
            "http_unauthorized",
            "Requests to an admin endpoint refused with 401 (missing or wrong admin token).",
            s.http_unauthorized,
        )?;
        counter(e, "cloudprnt_polls", "Polls the CloudPRNT server answered (authenticated).", s.cloudprnt_polls)?;
        counter(e, "sdp_polls", "Polls the Epson Server Direct Print server answered (authenticated).", s.sdp_polls)?;
        gauge(e, "deadletters_parked", "Dead letters waiting in the outbox for Kafka.", s.deadletters_parked as f64)?;
        gauge(
            e,
            "outbox_jobs",
            "Jobs in the durable outbox (the bound outbox.max_jobs applies to this).",
            s.outbox_jobs as f64,
        )?;
        gauge(
            e,
            "queued_jobs",
            "Jobs waiting or in flight, all devices (the dispatcher's view).",
            s.queued_jobs as f64,
        )?;
        gauge(e, "pending_records", "Records read and not yet finished.", s.pending_records as f64)?;
        gauge(e, "paused_partitions", "Partitions paused for backpressure.", s.paused_partitions as f64)?;
        gauge(e, "assigned_partitions", "Partitions assigned to this consumer.", s.assigned_partitions as f64)?;
        gauge(
            e,
            "devices_at_bound",
            "Devices whose queue is at outbox.max_jobs_per_device.",
            s.devices_at_bound as f64,
        )?;
        gauges(
            e,
            "held_devices",
            "Devices whose queue is held by their status, by why (offline, paper_out, cover_open).",
            s.held_devices.iter().map(|(k, v)| ([("reason", k.clone())], *v as f64)),
        )?;
        histograms(
            e,
            "stage_latency",
            "Time a record or job spent in each stage: kafka (record timestamp to planned), accept (planned to durably accepted), queue (accepted to first send), device (first send to the done ack).",
            &prometheus_client::registry::Unit::Seconds,
            s.stage_latency.iter().map(|(stage, h)| ([("stage", stage.clone())], h.sum_s, h.count, h.buckets())),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::ops::report;
    use crate::telemetry::latency::Stage;
    use crate::telemetry::{Monitor, Stats};
    use rdkafka::statistics::{Broker, Partition as KafkaPartition, Statistics, Topic};

    /// One exposition sample: metric name, labels, value.
    type Sample = (String, BTreeMap<String, String>, f64);

    /// Reads the Prometheus text format line by line, independently of the encoder: every
    /// line is `# HELP …`, `# UNIT …`, `# TYPE name counter|gauge|histogram`, or
    /// `name{k="v",…} value`.
    fn parse(text: &str) -> Result<Vec<Sample>, String> {
        let mut out = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let kind = rest.split(' ').nth(1).ok_or(line)?;
                if !["counter", "gauge", "histogram"].contains(&kind) {
                    return Err(format!("type {kind:?}: {line}"));
                }
                continue;
            }
            if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').ok_or(line)?;
            let value: f64 = value.parse().map_err(|e| format!("{e}: {line}"))?;
            let (name, labels) = match series.split_once('{') {
                None => (series, BTreeMap::new()),
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').ok_or(line)?;
                    let mut labels = BTreeMap::new();
                    for pair in body.split("\",").filter(|p| !p.is_empty()) {
                        let (k, v) = pair.split_once("=\"").ok_or(line)?;
                        labels.insert(k.to_string(), v.trim_end_matches('"').to_string());
                    }
                    (name, labels)
                }
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                return Err(format!("bad metric name: {line}"));
            }
            out.push((name.to_string(), labels, value));
        }
        Ok(out)
    }

    fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
                    && l.len() == labels.len()
            })
            .map(|s| s.2)
    }

    fn statistics(end: i64, stored: i64) -> Statistics {
        let broker = Broker {
            name: "127.0.0.1:9092/1".into(),
            source: "learned".into(),
            state: "UP".into(),
            ..Broker::default()
        };
        let internal =
            Broker { name: ":0/internal".into(), source: "internal".into(), state: "INIT".into(), ..Broker::default() };
        let p = KafkaPartition {
            partition: 0,
            hi_offset: end,
            ls_offset: end,
            stored_offset: stored,
            committed_offset: -1001,
            lo_offset: 0,
            ..KafkaPartition::default()
        };
        let ua = KafkaPartition { partition: -1, hi_offset: 99, ..KafkaPartition::default() };
        let topic =
            Topic { topic: "charge.upserted".into(), partitions: [(0, p), (-1, ua)].into(), ..Topic::default() };
        Statistics {
            brokers: [("a".into(), broker), ("b".into(), internal)].into(),
            topics: [("charge.upserted".into(), topic)].into(),
            ..Statistics::default()
        }
    }

    #[test]
    fn metrics_are_prometheus_text_with_per_topic_lag_and_the_counters() {
        let (stats, health) = (Stats::default(), Monitor::default());
        health.assigned([("charge.upserted".to_string(), 0), ("device.upserted".to_string(), 0)]);
        health.kafka_statistics(&statistics(12, 7));
        stats.update(|s| {
            s.consumer_running = true;
            s.events_read.insert("charge.upserted".into(), 9);
            s.effects_done.insert("print_receipt".into(), 3);
            s.job_redeliveries = 2;
            s.http_unauthorized = 3;
            s.cloudprnt_polls = 5;
            s.sdp_polls = 6;
            s.outbox_jobs = 4;
            s.paused_partitions = 1;
        });
        for ms in [3, 8, 40] {
            stats.observe(Stage::Device, std::time::Duration::from_millis(ms));
        }
        stats.polled();
        report::sample(&stats, &health);
        let (snapshot, reasons) = report::report(&stats, &health, &crate::model::EffectFlags::default());
        assert!(reasons.is_empty(), "{reasons:?}");
        assert_eq!(snapshot.topics["charge.upserted"].lag, Some(5));
        assert_eq!(snapshot.kafka_brokers_up, Some(1), "the internal broker is not a connection");
        let text = prometheus_text(&snapshot, &reasons).unwrap();
        let samples = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let ch = [("topic", "charge.upserted")];
        assert_eq!(value(&samples, "pixgate_topic_lag_records", &ch), Some(5.0), "{text}");
        assert_eq!(value(&samples, "pixgate_topic_records_read_total", &ch), Some(9.0));
        assert_eq!(value(&samples, "pixgate_topic_assigned_partitions", &ch), Some(1.0));
        assert_eq!(value(&samples, "pixgate_topic_stalled", &ch), Some(0.0));
        assert_eq!(
            value(&samples, "pixgate_topic_alarm", &[("topic", "charge.upserted"), ("alarm", "stalled")]),
            Some(0.0)
        );
        assert_eq!(value(&samples, "pixgate_ready", &[]), Some(1.0));
        assert_eq!(value(&samples, "pixgate_alarm", &[("alarm", "kafka_unreachable")]), Some(0.0));
        assert_eq!(value(&samples, "pixgate_kafka_brokers_up", &[]), Some(1.0));
        assert_eq!(value(&samples, "pixgate_effects_done_total", &[("kind", "print_receipt")]), Some(3.0));
        assert_eq!(value(&samples, "pixgate_job_redeliveries_total", &[]), Some(2.0));
        assert_eq!(value(&samples, "pixgate_http_unauthorized_total", &[]), Some(3.0));
        assert_eq!(value(&samples, "pixgate_cloudprnt_polls_total", &[]), Some(5.0));
        assert_eq!(value(&samples, "pixgate_sdp_polls_total", &[]), Some(6.0));
        assert_eq!(value(&samples, "pixgate_outbox_jobs", &[]), Some(4.0));
        let device = |le: &'static str| {
            value(&samples, "pixgate_stage_latency_seconds_bucket", &[("stage", "device"), ("le", le)])
        };
        assert_eq!(
            [device("0.005"), device("0.01"), device("0.02"), device("0.05"), device("+Inf")],
            [Some(1.0), Some(2.0), Some(2.0), Some(3.0), Some(3.0)],
            "cumulative buckets: {text}"
        );
        assert_eq!(value(&samples, "pixgate_stage_latency_seconds_count", &[("stage", "device")]), Some(3.0));
        let sum = value(&samples, "pixgate_stage_latency_seconds_sum", &[("stage", "device")]);
        assert!(sum.is_some_and(|s| (s - 0.051).abs() < 1e-9), "{sum:?}");
        assert_eq!(value(&samples, "pixgate_stage_latency_seconds_count", &[("stage", "queue")]), None, "not yet seen");
        assert_eq!(value(&samples, "pixgate_paused_partitions", &[]), Some(1.0));
        // device.upserted has no known offsets yet: no lag sample rather than a made-up one.
        assert_eq!(value(&samples, "pixgate_topic_lag_records", &[("topic", "device.upserted")]), None);
    }

    #[test]
    fn alarms_show_on_stats_and_metrics() {
        let mut cfg = Config::default();
        cfg.health.stall_after_ms = 1; // the lag below stalls at once
        let (stats, health) = (Stats::default(), Monitor::new(&cfg));
        health.assigned([("charge.upserted".to_string(), 0), ("device.upserted".to_string(), 0)]);
        health.kafka_statistics(&statistics(12, 7));
        stats.update(|s| s.consumer_running = true);
        stats.polled();
        report::sample(&stats, &health);
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (snapshot, reasons) = report::report(&stats, &health, &crate::model::EffectFlags::default());
        assert_eq!(reasons.iter().map(Reason::kind).collect::<Vec<_>>(), ["stalled"]);
        assert!(
            snapshot.not_ready[0].starts_with("topic charge.upserted stalled: lag 5 records, no progress for "),
            "{:?}",
            snapshot.not_ready
        );
        assert!(snapshot.topics["charge.upserted"].stalled);
        assert_eq!(snapshot.topics["charge.upserted"].alarms, ["stalled"]);
        let samples = parse(&prometheus_text(&snapshot, &reasons).unwrap()).unwrap();
        assert_eq!(value(&samples, "pixgate_topic_stalled", &[("topic", "charge.upserted")]), Some(1.0));
        assert_eq!(
            value(&samples, "pixgate_topic_alarm", &[("topic", "charge.upserted"), ("alarm", "stalled")]),
            Some(1.0)
        );
        assert_eq!(value(&samples, "pixgate_ready", &[]), Some(0.0));
    }
}
