//! The main job, end to end on a fixtures folder:
//!
//! 1. start a Kafka-protocol broker and create the topics;
//! 2. create a throwaway fleet CA with a certificate per device (`pki/`, as
//!    `pixgate devices credentials` does), start `pixgate` with its device listener on TLS
//!    requiring those certificates, and wait until it is ready;
//! 3. publish `devices.jsonl` and wait until pixgate has read it all (a device the
//!    registry does not know is refused);
//! 4. start one simulated device per registry entry (printers and card machines), each
//!    over TLS with its certificate, and wait until all are connected; then publish
//!    `charges.jsonl` and `edge-cases.jsonl`;
//! 5. wait until every record is finished (no pending record, no queued job);
//! 6. write `summary.json`, stop everything it started (also on Ctrl-C or error).
//!
//! Output folder: `devices/{id}/NNNN-{kind}-{charge}.png` and `devices/{id}/transcript.txt`
//! (written by the simulators), `summary.json`, `deadletters.jsonl` (read back from the
//! `pixgate.deadletter` topic), `pixgate.log`, `kafka/broker.log`.

use crate::broker::KafkaBroker;
use crate::gateway::{stats_json, total, GatewayProcess, GatewaySettings, StatsReport};
use crate::net::free_port;
use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::{json, Value};
use simulators::{capture, fleet, registry};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What to run the demo on.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Folder with `devices.jsonl`, `charges.jsonl` and `edge-cases.jsonl` (the last two
    /// optional).
    pub fixtures: PathBuf,
    /// Output folder (created; earlier `devices/` and `summary.json` are replaced).
    pub out: PathBuf,
    /// The `pixgate` binary.
    pub pixgate_bin: PathBuf,
    /// Longest wait for everything to be delivered.
    pub timeout: Duration,
    /// How the charge events are fed.
    pub pace: Pace,
}

/// How the demo feeds charge events into Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// As the fixtures were recorded: devices online and keeping up. Events go out in
    /// batches in which no charge appears twice; before the next batch, pixgate must have
    /// finished the last one. Within a batch everything runs concurrently, across devices
    /// and charges; between a charge's events its devices have caught up, as they do in a
    /// shop where payment takes seconds. This is what `expected.json` describes.
    KeepingUp,
    /// Everything at once. Devices fall behind, and a QR still queued when its charge is
    /// paid or expired is superseded (never shown): fewer `display_qr` than expected.json.
    Burst,
}

/// One effect a device carried out, as `summary.json` lists it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct SummaryEffect {
    /// Device id.
    pub device: String,
    /// Effect kind as in `expected.json`.
    pub kind: String,
    /// Charge id.
    pub charge: String,
    /// The job's message id.
    pub message_id: String,
    /// The job's per-device sequence number.
    pub seq: u64,
    /// The PNG the device made of it, relative to the output folder.
    pub file: String,
}

/// Runs the demo and returns the summary it wrote to `out/summary.json`.
///
/// # Errors
/// Any part failed to start, delivery did not finish within the timeout, or `/stats`
/// could not be read after the run; everything started is stopped either way.
pub async fn run(cfg: &DemoConfig) -> anyhow::Result<Value> {
    let out = &cfg.out;
    std::fs::create_dir_all(out)?;
    let _ = std::fs::remove_dir_all(out.join("devices"));
    let _ = std::fs::remove_file(out.join("summary.json"));
    let kafka_dir = out.join("kafka");
    let _ = std::fs::remove_dir_all(&kafka_dir);
    // A fresh broker needs a fresh outbox: its dedupe window would hide the new run's jobs.
    let _ = std::fs::remove_dir_all(out.join("pixgate-data"));
    let devices_file = cfg.fixtures.join("devices.jsonl");
    let devices = registry::devices_from_jsonl(&devices_file)?;

    progress(format!("starting Kafka-protocol broker (tansu) in {}", kafka_dir.display()));
    let broker = KafkaBroker::start(&kafka_dir)?;
    let brokers = broker.addr().to_string();
    capture::ensure_topics(&brokers, &capture::PIXGATE_TOPICS).await?;

    let settings = GatewaySettings {
        brokers: brokers.clone(),
        group_id: format!("pixgate-demo-{}", std::process::id()),
        mqtt_port: free_port(),
        http_port: free_port(),
        ack_timeout_ms: 5_000,
        outbox_path: out.join("pixgate-data/outbox.redb"),
    };
    progress(format!("starting pixgate: MQTT 127.0.0.1:{}, HTTP 127.0.0.1:{}", settings.mqtt_port, settings.http_port));
    // The fixtures were recorded days ago: replay them with pixgate's clock at that time.
    let mut env = crate::replay_clock_env(&cfg.fixtures);
    let pki = out.join("pki");
    let _ = std::fs::remove_dir_all(&pki);
    let ids: Vec<&str> = devices.iter().map(registry::DeviceSpec::id).collect();
    env.extend(crate::pki::Fleet::create_without_other(&pki, &ids)?.gateway_env());
    let mut gateway = GatewayProcess::spawn_with_env(
        &cfg.pixgate_bin,
        settings.clone(),
        &env,
        &out.join("pixgate.log"),
        Duration::from_secs(60),
    )?;

    let deadline = Instant::now() + cfg.timeout;
    let producer = capture::producer(&brokers)?;
    let registry = capture::read_records(&devices_file)?;
    let registry_records = capture::publish_records(&producer, &registry).await? as u64;
    progress(format!("published {registry_records} device events; waiting for pixgate to read the registry"));
    wait_until(&gateway, deadline, |s| idle(s, registry_records)).await?;

    progress(format!("starting {} simulated devices over TLS, each with its certificate", devices.len()));
    // Devices keep the real clock: pixgate enforces the time to live by the replay clock.
    let fleet = fleet::start_with(
        fleet::FleetConfig {
            mqtt_host: "127.0.0.1".into(),
            mqtt_port: settings.mqtt_port,
            out_dir: out.join("devices"),
            devices,
            security: simulators::device::MqttSecurity::Tls {
                ca: pki.join("ca.crt"),
                identity: simulators::device::DeviceIdentity::Certificate { dir: pki.join("devices") },
            },
        },
        false,
    )
    .await?;
    fleet.wait_connected(Duration::from_secs(30)).await?;

    let result = feed_and_wait(cfg, &producer, registry_records, deadline, &gateway).await;
    let report = fleet.shutdown().await;
    let stats = gateway.stats().context("reading pixgate /stats after the run");
    let dead_letters = match (&result, &stats) {
        (Ok(_), Ok(s)) => {
            let expected = total(&s.counters.dead_lettered_records) + total(&s.counters.dead_lettered_effects);
            read_dead_letters(&brokers, expected, &out.join("deadletters.jsonl")).await
        }
        _ => Ok(0),
    };
    let clean = gateway.stop(Duration::from_secs(15));
    // Every Kafka client goes before the broker, so none logs the broker going away.
    drop(producer);
    broker.stop();
    let published = result?;
    let stats = stats?;
    progress(format!("{} dead letters read back from pixgate.deadletter into deadletters.jsonl", dead_letters?));
    if !clean {
        tracing::warn!("pixgate did not stop cleanly within 15 s; see pixgate.log");
    }

    let mut effects: Vec<SummaryEffect> = report
        .effects
        .iter()
        .map(|e| SummaryEffect {
            device: e.device.clone(),
            kind: e.kind.as_str().to_string(),
            charge: e.charge.clone(),
            message_id: e.message_id.clone(),
            seq: e.seq,
            file: Path::new(&e.file).strip_prefix(out).map_or(e.file.clone(), |p| p.display().to_string()),
        })
        .collect();
    effects.sort_by(|a, b| (&a.device, a.seq).cmp(&(&b.device, b.seq)));
    let summary = json!({
        "effects": effects,
        "counts": counts(published, &stats, &report),
    });
    std::fs::write(out.join("summary.json"), serde_json::to_string_pretty(&summary)?)?;
    progress(format!("done: {} effects carried out; summary in {}", effects.len(), out.join("summary.json").display()));
    Ok(summary)
}

/// Publishes the charge fixtures (the registry's `published` records are in already) and
/// waits until pixgate finished them all. Returns how many records were published.
async fn feed_and_wait(
    cfg: &DemoConfig,
    producer: &rdkafka::producer::FutureProducer,
    mut published: u64,
    deadline: Instant,
    gateway: &GatewayProcess,
) -> anyhow::Result<u64> {
    for name in ["charges.jsonl", "edge-cases.jsonl"] {
        let path = cfg.fixtures.join(name);
        if !path.exists() {
            continue;
        }
        let records = capture::read_records(&path)?;
        let batches = match cfg.pace {
            Pace::Burst => vec![records],
            Pace::KeepingUp => batches_without_repeated_keys(records),
        };
        progress(format!("publishing {name} in {} batch(es)", batches.len()));
        for batch in batches {
            published += capture::publish_records(producer, &batch).await? as u64;
            wait_until(gateway, deadline, |s| idle(s, published)).await?;
        }
    }
    progress("every effect delivered and acknowledged");
    Ok(published)
}

/// pixgate has read `published` records and finished all of them.
fn idle(s: &StatsReport, published: u64) -> bool {
    let c = &s.counters;
    total(&c.events_read) >= published && c.pending_records == 0 && c.queued_jobs == 0 && c.outbox_jobs == 0
}

/// Splits `records`, in order, into consecutive batches in which no key appears twice.
pub fn batches_without_repeated_keys(records: Vec<capture::CaptureRecord>) -> Vec<Vec<capture::CaptureRecord>> {
    let mut batches: Vec<Vec<capture::CaptureRecord>> = Vec::new();
    let mut keys = std::collections::HashSet::new();
    for r in records {
        if batches.is_empty() || r.key.as_ref().is_some_and(|k| keys.contains(k)) {
            batches.push(Vec::new());
            keys.clear();
        }
        if let Some(k) = &r.key {
            keys.insert(k.clone());
        }
        batches.last_mut().expect("pushed above").push(r);
    }
    batches
}

/// Polls the gateway's `/stats` every 20 ms, printing progress, until `done` holds.
///
/// # Errors
/// `/stats` unreachable or not a [`StatsReport`], or `deadline` passed (the last stats are
/// in the error).
pub async fn wait_until(
    gateway: &GatewayProcess,
    deadline: Instant,
    done: impl Fn(&StatsReport) -> bool,
) -> anyhow::Result<()> {
    let mut last = String::new();
    let mut last_print = Instant::now();
    loop {
        let stats = gateway.stats().context("reading pixgate /stats")?;
        if done(&stats) {
            return Ok(());
        }
        let c = &stats.counters;
        let line = format!(
            "  read {} | pending records {} | queued jobs {} | effects done {}",
            total(&c.events_read),
            c.pending_records,
            c.queued_jobs,
            total(&c.effects_done)
        );
        if line != last && last_print.elapsed() > Duration::from_secs(1) {
            progress(&line);
            last = line;
            last_print = Instant::now();
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for pixgate; last stats: {}", stats_json(&stats));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads `expected` records of `pixgate.deadletter` from the beginning (as an outside
/// consumer would) and writes their values, one JSON per line, to `path`.
async fn read_dead_letters(brokers: &str, expected: u64, path: &Path) -> anyhow::Result<u64> {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("pixgate-demo-deadletters-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("pixgate.deadletter", 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut lines = String::new();
    let mut n = 0;
    while n < expected {
        let msg = tokio::time::timeout(Duration::from_secs(20), consumer.recv())
            .await
            .with_context(|| format!("only {n} of {expected} dead letters on pixgate.deadletter"))??;
        lines.push_str(&String::from_utf8_lossy(msg.payload().unwrap_or_default()));
        lines.push('\n');
        n += 1;
    }
    std::fs::write(path, lines)?;
    Ok(n)
}

/// `counts` of `summary.json`: what pixgate read, ignored and dead-lettered (by reason),
/// what the devices saw, and how many records and jobs each latency stage timed.
fn counts(published: u64, stats: &StatsReport, report: &fleet::FleetReport) -> Value {
    let c = &stats.counters;
    let mut dead: BTreeMap<&str, u64> = BTreeMap::new();
    for (reason, n) in c.dead_lettered_records.iter().chain(&c.dead_lettered_effects) {
        *dead.entry(reason).or_default() += n;
    }
    json!({
        "events_published": published,
        "events_read": total(&c.events_read),
        "events_read_by_topic": c.events_read,
        "ignored": c.ignored,
        "dead_lettered": dead,
        "dead_lettered_records": c.dead_lettered_records,
        "dead_lettered_effects": c.dead_lettered_effects,
        "superseded": c.superseded,
        "effects_acknowledged": c.effects_done,
        "job_redeliveries": c.job_redeliveries,
        "device_jobs_received": report.stats.raw_jobs,
        "device_failed_acks": report.stats.failed,
        "device_duplicates": report.stats.duplicates,
        "device_order_violations": report.stats.order_violations,
        "stage_latency_counts": c.stage_latency.iter().map(|(stage, h)| (stage.clone(), h.count)).collect::<BTreeMap<_, _>>(),
    })
}

fn progress(msg: impl AsRef<str>) {
    println!("[pixgate-demo] {}", msg.as_ref());
}

/// The default fixtures folder: the project's own copy of the CDC fixtures.
pub fn default_fixtures() -> PathBuf {
    crate::repo_root().join("fixtures/cdc")
}

/// Whether `dir` looks like a fixtures folder.
pub fn is_fixtures_dir(dir: &Path) -> bool {
    dir.join("devices.jsonl").is_file()
}
