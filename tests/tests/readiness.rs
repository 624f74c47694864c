//! Readiness tells the truth (`gateway/src/health.rs`), against the real broker and the
//! `pixgate` binary:
//! - Kafka goes away: `/readyz` turns 503 naming Kafka, and green again once the broker is
//!   back on the same storage;
//! - Kafka freezes with its connections open (SIGSTOP) under a 60 s session timeout:
//!   `/readyz` names the broker that does not answer within `health.kafka_down_after_ms`;
//! - a topic stalls behind backpressure: an offline card machine at its outbox bound holds
//!   the partitions that feed it while more records wait behind on them; `/readyz` turns
//!   503 naming the topic as stalled, with its lag and why; once the device is back the
//!   backlog drains and `/readyz` is green again.
//!
//! `/metrics` is checked to be the Prometheus text format, line by line, and to carry the
//! per-topic lag. Thresholds are shortened through `PIXGATE_HEALTH__*`; every wait polls
//! under a generous deadline (no timed assertions).

use pixgate_tests::charges::{charge_record, template};
use pixgate_tests::gateway::{self, stats_json, GatewayProcess};
use pixgate_tests::harness::{protocol_devices, Rig};
use simulators::capture;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

const TERMINAL: &str = "7f80e222f828767efc2f9162";

/// One sample of the exposition: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Reads `/metrics` as the Prometheus text format (0.0.4): every line is a `# HELP` or
/// `# TYPE` comment or `name{label="value",…} value` with a float value.
fn metrics(gw: &GatewayProcess) -> Vec<Sample> {
    let (code, text) = gw.get("/metrics").expect("GET /metrics");
    assert_eq!(code, 200, "{text}");
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not `name value`: {line:?}"));
        let value: f64 = value.parse().unwrap_or_else(|e| panic!("value of {line:?}: {e}"));
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line:?}"));
                let labels = body
                    .split("\",")
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (k, v) = p.split_once("=\"").unwrap_or_else(|| panic!("label not k=\"v\": {line:?}"));
                        (k.to_string(), v.trim_end_matches('"').to_string())
                    })
                    .collect();
                (name, labels)
            }
        };
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "metric name in {line:?}"
        );
        out.push((name.to_string(), labels, value));
    }
    out
}

fn sample(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|s| s.2)
}

/// Polls pixgate's log until `count(log)` reaches `want` (its alarms are logged by a task
/// that runs every second, so a log line can trail what `/readyz` already says).
async fn log_until(log: &Path, what: &str, want: usize, count: impl Fn(&str) -> usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let n = count(&text);
        if n >= want {
            assert_eq!(n, want, "{what}: logged {n} times, not {want}");
            return;
        }
        assert!(Instant::now() < deadline, "{what}: logged {n} times, not {want}, within 30 s; see {}", log.display());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A rig with `setting`, assigned its partitions and ready, its consumer a dynamic member:
/// tansu 0.6.0 can leave a static member's group stuck after an outage (see
/// tests/tests/kafka_restart.rs).
async fn ready_through_an_outage(name: &str, setting: (&'static str, &str)) -> Rig {
    let rig = Rig::builder(name).env(setting.0, setting.1).env("PIXGATE_KAFKA__INSTANCE_ID", "").start().await;
    let gw = rig.gateway();
    gw.wait_assigned(Duration::from_secs(60)).await.unwrap_or_else(|e| panic!("{e:#}"));
    gw.readyz_until("ready", Duration::from_secs(60), |c, _| c == 200).await;
    rig
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_going_away_fails_readiness_until_it_is_back() {
    let rig = ready_through_an_outage("readiness-kafka", ("PIXGATE_HEALTH__KAFKA_DOWN_AFTER_MS", "2000")).await;
    let gw = rig.gateway();

    // Healthy: /metrics is Prometheus text and has each topic's lag once librdkafka's
    // statistics arrived (nothing produced: lag 0).
    let deadline = Instant::now() + Duration::from_secs(30);
    let m = loop {
        let m = metrics(gw);
        if ["charge.upserted", "device.upserted"]
            .iter()
            .all(|t| sample(&m, "pixgate_topic_lag_records", &[("topic", t)]).is_some())
        {
            break m;
        }
        assert!(Instant::now() < deadline, "no per-topic lag on /metrics: {m:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(sample(&m, "pixgate_topic_lag_records", &[("topic", "charge.upserted")]), Some(0.0));
    assert_eq!(sample(&m, "pixgate_ready", &[]), Some(1.0));
    assert_eq!(sample(&m, "pixgate_alarm", &[("alarm", "kafka_unreachable")]), Some(0.0));
    assert!(sample(&m, "pixgate_kafka_brokers_up", &[]) >= Some(1.0));

    // The broker dies: /readyz names Kafka, one reason per line.
    rig.broker().kill();
    let body = gw
        .readyz_until("named Kafka", Duration::from_secs(60), |c, b| {
            c == 503 && b.contains("kafka unreachable: no broker up for ")
        })
        .await;
    let log = gw.log().to_path_buf();
    let count = |needle: &'static str| move |text: &str| text.lines().filter(|l| l.contains(needle)).count();
    log_until(
        &log,
        "the Kafka alarm's start (warn)",
        1,
        count("WARN gateway::ops::readiness: not ready: kafka unreachable"),
    )
    .await;
    assert!(body.ends_with('\n') && body.lines().all(|l| !l.trim().is_empty()), "one reason per line: {body:?}");
    let stats = gw.stats().unwrap();
    assert!(stats.not_ready.iter().any(|r| r.starts_with("kafka unreachable")), "{}", stats_json(&stats));
    assert_eq!(stats.kafka_brokers_up, Some(0), "{}", stats_json(&stats));
    let m = metrics(gw);
    assert_eq!(sample(&m, "pixgate_alarm", &[("alarm", "kafka_unreachable")]), Some(1.0));
    assert_eq!(sample(&m, "pixgate_ready", &[]), Some(0.0));
    let (code, _) = gw.get("/healthz").unwrap();
    assert_eq!(code, 200, "/healthz is liveness only");

    // Back on the same storage: ready again.
    rig.broker().start_again().expect("broker restart on the same folder and port");
    gw.readyz_until("ready again after the broker restart", Duration::from_secs(120), |c, _| c == 200).await;
    assert_eq!(sample(&metrics(gw), "pixgate_alarm", &[("alarm", "kafka_unreachable")]), Some(0.0));

    log_until(
        &log,
        "the Kafka alarm's end (info)",
        1,
        count("INFO gateway::ops::readiness: alarm cleared (was: kafka unreachable"),
    )
    .await;
    log_until(
        &log,
        "the Kafka alarm's start, still",
        1,
        count("WARN gateway::ops::readiness: not ready: kafka unreachable"),
    )
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("not ready: consumer not running"), "the start-up is no alarm");
    println!("readiness: /readyz named Kafka during the outage ({}), green after the restart", body.trim());
    rig.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_held_by_a_full_device_queue_is_a_stall_until_the_device_drains() {
    const BOUND: u64 = 2;
    const CHARGES: u64 = 12;
    /// Produced once the partitions are paused: only the end offset probe sees them.
    const LATER: u64 = 6;
    const ALL: u64 = CHARGES + LATER;
    let fixtures = pixgate_tests::demo::default_fixtures();
    let rig = Rig::builder("readiness-stall")
        .env("PIXGATE_OUTBOX__MAX_JOBS_PER_DEVICE", BOUND.to_string())
        .env("PIXGATE_HEALTH__STALL_AFTER_MS", "3000")
        .env("PIXGATE_HEALTH__PAUSED_PROBE_INTERVAL_MS", "1000")
        .start()
        .await;
    let gw = rig.gateway();
    gw.wait_assigned(Duration::from_secs(60)).await.unwrap();

    let spec = pixgate_tests::fixture_device(&fixtures, TERMINAL);
    rig.connect_and_leave(spec.clone()).await; // offline (retained status)
    rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;
    gw.readyz_until("ready before the charges", Duration::from_secs(60), |c, _| c == 200).await;

    let tpl = template(&fixtures);
    let t = chrono::Utc::now().timestamp() as u64;
    let records: Vec<_> =
        (0..ALL).map(|i| charge_record(&tpl, TERMINAL, &format!("{i:024x}"), "ACTIVE", 0, 60, t)).collect();
    let producer = rig.producer();
    capture::publish_records(&producer, &records[..CHARGES as usize]).await.unwrap();

    // The card machine's queue is at its bound, its partitions are paused with records
    // behind: the topic is stalled, and /readyz says so, with the lag and why.
    let body = gw
        .readyz_until("named charge.upserted as stalled", Duration::from_secs(90), |c, b| {
            c == 503 && b.contains("topic charge.upserted stalled: lag ")
        })
        .await;
    let line = body.lines().find(|l| l.starts_with("topic charge.upserted stalled")).unwrap().to_string();
    let lag: u64 = line["topic charge.upserted stalled: lag ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|e| panic!("lag in {line:?}: {e}"));
    assert!(lag > 0, "{line}");
    assert!(
        line.contains("paused for backpressure")
            && line.contains("at the per-device outbox bound")
            && line.contains(TERMINAL),
        "why: {line}"
    );
    assert!(!body.contains("device.upserted"), "only the stalled topic is named: {body}");
    let log = gw.log().to_path_buf();
    let count = |needle: &'static str| move |text: &str| text.lines().filter(|l| l.contains(needle)).count();
    log_until(
        &log,
        "the stall's start (warn)",
        1,
        count("WARN gateway::ops::readiness: not ready: topic charge.upserted stalled"),
    )
    .await;

    // More records arrive behind the paused partitions. librdkafka does not fetch a paused
    // partition, so only the end offset probe learns of them; the lag is what waits in
    // Kafka: every record not yet durably accepted.
    let paused = gw.stats().unwrap().topics["charge.upserted"].paused_partitions;
    assert_eq!(paused, 3, "every partition of charge.upserted feeds the card machine and is paused");
    capture::publish_records(&producer, &records[CHARGES as usize..]).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (lag, read, m) = loop {
        let s = gw.stats().unwrap();
        let topic = s.topics.get("charge.upserted");
        let read = gateway::count(&s.counters.events_read, "charge.upserted");
        let m = metrics(gw);
        let metric_lag = sample(&m, "pixgate_topic_lag_records", &[("topic", "charge.upserted")]);
        if s.counters.pending_records == 0
            && topic.is_some_and(|t| t.lag == Some(ALL - read) && t.stalled)
            && metric_lag == Some((ALL - read) as f64)
        {
            break (ALL - read, read, m);
        }
        assert!(
            Instant::now() < deadline,
            "lag never matched the records left in Kafka ({read} of {ALL} read): {}\nmetrics lag {metric_lag:?}",
            stats_json(&s)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(read < CHARGES, "the rest waits in Kafka");
    let stalled = gw
        .readyz_until("named the grown lag", Duration::from_secs(30), |_, b| {
            b.contains(&format!("topic charge.upserted stalled: lag {lag} records"))
        })
        .await;
    assert_eq!(sample(&m, "pixgate_topic_stalled", &[("topic", "charge.upserted")]), Some(1.0));
    assert_eq!(sample(&m, "pixgate_topic_alarm", &[("topic", "charge.upserted"), ("alarm", "stalled")]), Some(1.0));
    assert_eq!(sample(&m, "pixgate_topic_stalled", &[("topic", "device.upserted")]), Some(0.0));
    assert!(sample(&m, "pixgate_topic_paused_partitions", &[("topic", "charge.upserted")]) >= Some(1.0));
    assert_eq!(sample(&m, "pixgate_devices_at_bound", &[]), Some(1.0));
    assert_eq!(sample(&m, "pixgate_topic_records_read_total", &[("topic", "charge.upserted")]), Some(read as f64));

    // Back online: the backlog drains, the partitions resume, readiness is green.
    let terminal = rig.start_fleet(vec![spec], protocol_devices()).await;
    // Every record read and written (a record read but not yet written has its job counted
    // nowhere yet), and every job out of the outbox.
    rig.wait_stats(Duration::from_secs(120), |s| {
        s.counters.events_read.get("charge.upserted").copied() == Some(ALL)
            && s.counters.pending_records == 0
            && s.counters.outbox_jobs == 0
    })
    .await;
    gw.readyz_until("ready again after the device drained", Duration::from_secs(60), |c, _| c == 200).await;
    // librdkafka's statistics arrive every second: the lag reaches 0 within a few.
    rig.wait_stats(Duration::from_secs(30), |s| {
        s.topics.get("charge.upserted").is_some_and(|t| t.lag == Some(0) && !t.stalled)
    })
    .await;
    assert_eq!(terminal.effects().len() as u64, ALL, "every QR shown once the device is back");

    log_until(
        &log,
        "the stall's end (info)",
        1,
        count("INFO gateway::ops::readiness: alarm cleared (was: topic charge.upserted stalled"),
    )
    .await;
    log_until(
        &log,
        "the stall's start, still",
        1,
        count("WARN gateway::ops::readiness: not ready: topic charge.upserted stalled"),
    )
    .await;
    println!("readiness: stalled at lag {lag} ({read} of {ALL} read): {}", stalled.trim());
    terminal.shutdown().await;
    rig.shutdown();
}

/// A port in use (HTTP or MQTT) stops pixgate at start with an error naming the setting,
/// instead of leaving it running without health endpoints or without a device listener.
#[test]
fn a_port_in_use_stops_pixgate_at_start() {
    let dir = std::env::temp_dir().join(format!("pixgate-port-in-use-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let bin = gateway::find_binary().unwrap();
    for (setting, http_port, mqtt_port) in
        [("http.listen", port, pixgate_tests::net::free_port()), ("mqtt.listen", pixgate_tests::net::free_port(), port)]
    {
        let settings = gateway::GatewaySettings {
            // Nothing listens there: the ports are bound before Kafka is reached.
            brokers: format!("127.0.0.1:{}", pixgate_tests::net::free_port()),
            group_id: "pixgate-port-in-use".into(),
            mqtt_port,
            http_port,
            ack_timeout_ms: 2_000,
            outbox_path: dir.join(format!("{setting}.redb")),
        };
        let log = dir.join(format!("{setting}.log"));
        let err = GatewayProcess::spawn(&bin, settings, &log, Duration::from_secs(30))
            .err()
            .unwrap_or_else(|| panic!("pixgate started with {setting} on a port in use"));
        assert!(err.to_string().contains("exited"), "{err:#}");
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains(&format!("binding {setting} `127.0.0.1:{port}`")), "{setting}:\n{text}");
    }
    drop(taken);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A broker frozen with its connections open (SIGSTOP) is reported by readiness within
/// `health.kafka_down_after_ms`, whatever the session timeout: with
/// `kafka.session_timeout_ms = 60000` nothing else would tell for a minute (the
/// connections stay `UP`, the partitions stay assigned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_broker_is_named_within_the_threshold() {
    let rig = ready_through_an_outage("readiness-frozen", ("PIXGATE_KAFKA__SESSION_TIMEOUT_MS", "60000")).await;
    let gw = rig.gateway();

    rig.broker().freeze().unwrap();
    let frozen = Instant::now();
    let body = gw
        .readyz_until("named the frozen broker", Duration::from_secs(45), |c, b| {
            c == 503 && b.contains("kafka broker not answering: ")
        })
        .await;
    let named_after = frozen.elapsed();
    let port = rig.brokers().rsplit(':').next().unwrap().to_string();
    let line = body.lines().find(|l| l.starts_with("kafka broker not answering")).unwrap();
    assert!(line.contains(&format!(":{port}/")), "the broker is named: {line}");
    assert_eq!(sample(&metrics(gw), "pixgate_alarm", &[("alarm", "kafka_silent")]), Some(1.0));

    rig.broker().thaw().unwrap();
    gw.readyz_until("ready again once it answers", Duration::from_secs(120), |c, _| c == 200).await;
    assert_eq!(sample(&metrics(gw), "pixgate_alarm", &[("alarm", "kafka_silent")]), Some(0.0));
    println!("readiness: a frozen broker named after {named_after:?} (threshold 10 s, session timeout 60 s): {line}");
    rig.shutdown();
}
