//! The load harness behind `pixgate-load` (`scripts/load.sh`): pixgate on a real broker and
//! a fleet of simulated devices, measured. Figures are printed, never asserted; only lost or
//! unexpected effects make the run fail.
//!
//! Phases, one broker and one topic throughout:
//! 1. **registry**: pixgate reads the generated device registry, then stops (SIGTERM);
//! 2. **backlog**: `events` charge events are produced while pixgate is down;
//! 3. **baseline**: a bare rdkafka `StreamConsumer` with a fresh group id reads the whole
//!    `charge.upserted` topic: the rate pixgate is compared with;
//! 4. **drain**: pixgate starts with the fleet connecting; accept rate (records committed
//!    per second, from `/stats`: `events_read − pending_records`), delivery rate (effects
//!    acknowledged per second, `effects_done`), RSS sampled from `/proc/PID/status`;
//! 5. **live**: charge events produced at `live_rate` per second for `live_seconds`;
//!    latency from handing each event to the producer to the device's `done` ack of each of
//!    its effects. Beside pixgate a bare consumer reads the same records from the topic's
//!    end with a short fetch wait (`tail_fetch_wait_ms`): when it reads a record, the
//!    record was readable, so readable → `done` ack is what pixgate adds, and produce →
//!    readable the producer's and the broker's part. pixgate's own stage histograms
//!    (`/stats`' `stage_latency`, over the live phase) span record timestamp → ack: their
//!    `kafka` stage holds the broker's part and pixgate's own fetch wait.
//!
//! Expected effects come from the model of the routing rules ([`simulators::expected`]).
//! In the backlog a charge's QR is often still queued when its payment arrives, so it is
//! superseded (never shown): the check is `carried out + superseded = expected`.

use crate::broker::KafkaBroker;
use crate::gateway::{count, stats_json, total, GatewayProcess, GatewaySettings};
use crate::net::free_port;
use anyhow::{bail, Context};
use device_protocol::EffectKind;
use simulators::capture::generate::{Scenario, ScenarioConfig};
use simulators::capture::{self, publish_records_at, CaptureRecord};
use simulators::device::{Carried, DeviceIdentity, MqttSecurity, Rendering, Stats};
use simulators::expected::Model;
use simulators::fleet::{self, FleetConfig, FleetOptions};
use simulators::registry::devices_from_records;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The central shape's topic between the stages, when `cluster_partitions` > 0.
const DEVICE_JOBS_TOPIC: &str = "pixgate.device-jobs";
const DELIVERY_LOG_TOPIC: &str = "pixgate.delivery-log";
/// The route stage's changelog: as many partitions as the charge topic.
const ROUTE_CHANGELOG_TOPIC: &str = "pixgate.route-changelog";

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Charge events produced while pixgate is down.
    pub events: usize,
    /// Devices in the registry (all simulated).
    pub devices: usize,
    /// Charge events per second in the live phase (0: no live phase).
    pub live_rate: f64,
    /// Length of the live phase, seconds.
    pub live_seconds: u64,
    /// Scenario seed.
    pub seed: u64,
    /// The `pixgate` binary.
    pub pixgate_bin: PathBuf,
    /// Working folder (broker data, outbox, logs); removed at the end unless `keep`.
    pub work: PathBuf,
    /// Keep the working folder.
    pub keep: bool,
    /// Longest wait for any phase.
    pub timeout: Duration,
    /// Extra `PIXGATE_*` settings for pixgate.
    pub env: Vec<(String, String)>,
    /// How the fleet connects: plain TCP, or TLS with per-device credentials.
    pub fleet_tls: FleetTls,
    /// Longest wait for the whole fleet to connect when the drain starts.
    pub connect_timeout: Duration,
    /// Device connections cut at random per minute over the drain and live phase (0: none),
    /// as a real fleet's network drops them; each device reconnects by itself.
    pub churn_per_minute: f64,
    /// With N > 0, pixgate runs the central shape's hand-off (`cluster.enabled`): every
    /// job goes through `pixgate.device-jobs`, created with N partitions, and is read back
    /// from it. 0: the edge box's hand-off (the outbox write).
    pub cluster_partitions: i32,
    /// `fetch.wait.max.ms` of the bare consumer that reads the live phase beside pixgate
    /// ([`crate::kafka::tail_from_end`]).
    pub tail_fetch_wait_ms: u32,
}

/// Cuts a random device's connection every `60 / per_minute` s, when ticked.
struct Churn {
    every: Option<Duration>,
    next: Instant,
    seed: u64,
}

impl Churn {
    fn new(per_minute: f64) -> Churn {
        let every = (per_minute > 0.0).then(|| Duration::from_secs_f64(60.0 / per_minute));
        Churn { every, next: Instant::now() + every.unwrap_or_default(), seed: 0x2545_F491_4F6C_DD1D }
    }

    fn tick(&mut self, fleet: &fleet::FleetHandle) {
        let Some(every) = self.every else { return };
        while Instant::now() >= self.next {
            self.next += every;
            fleet.drop_random_connection(&mut self.seed);
        }
    }
}

/// How the simulated fleet reaches pixgate (`--tls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FleetTls {
    /// Plain TCP, anonymous (the client id is the identity).
    #[default]
    Plain,
    /// TLS, each device with its own secret as MQTT password (issued in-process).
    Secret,
    /// TLS, each device with its own client certificate (issued in-process).
    Cert,
}

/// The fleet's connection to pixgate at the start of the drain ([`LoadReport::connect`]).
#[derive(Debug, Clone, Default)]
pub struct ConnectReport {
    /// Setting up the throwaway CA and the devices' credentials.
    pub credentials_setup: Duration,
    /// From pixgate's start (fleet started right after) to every device connected and
    /// subscribed.
    pub all_connected: Duration,
    /// Every 5 s: (t s, devices connected per the fleet, pixgate's `mqtt_connected`,
    /// connections accepted per second over the 5 s, connection failures so far, RSS KiB).
    pub timeline: Vec<(f64, usize, u64, f64, u64, u64)>,
    /// Connections accepted (ConnAcks) and failed attempts seen by the devices until all
    /// were connected.
    pub connects: u64,
    /// See [`ConnectReport::connects`].
    pub failures: u64,
    /// pixgate's refusals by rule until all were connected.
    pub refusals: std::collections::BTreeMap<String, u64>,
    /// pixgate's RSS once every device was connected, KiB.
    pub rss_kib: u64,
    /// pixgate's CPU time from its start to every device connected.
    pub pixgate_cpu: Option<Duration>,
    /// The fewest devices pixgate held connected over the drain, and connects and
    /// failures the devices saw over the drain and live phase (reconnects).
    pub min_held: u64,
    /// See [`ConnectReport::min_held`].
    pub later_connects: u64,
    /// See [`ConnectReport::min_held`].
    pub later_failures: u64,
    /// Connections cut on purpose (`churn_per_minute`).
    pub cut: u64,
    /// Ack latency at the devices, publish → PUBACK (median, 99th percentile).
    pub ack_latency: Option<(Duration, Duration)>,
}

/// One sample of pixgate during the drain.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since pixgate started.
    pub t: f64,
    /// Charge records read and finished (committed or about to be).
    pub accepted: u64,
    /// Effects acknowledged by devices.
    pub delivered: u64,
    /// Jobs in the outbox.
    pub outbox: u64,
    /// Job payload bytes the devices received so far (MQTT publishes, resends included).
    pub job_bytes: u64,
    /// Resident set size, KiB.
    pub rss_kib: u64,
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    /// Records produced in the backlog and their production time.
    pub produced: (u64, Duration),
    /// Bare consumer: records read and time.
    pub bare: (u64, Duration),
    /// The broker's CPU time while the bare consumer read; `None` without `/proc`.
    pub bare_broker_cpu: Option<Duration>,
    /// Time from pixgate's start to its first accepted record (start-up and group join).
    pub first_accept: Duration,
    /// Time from pixgate's start to every backlog record accepted.
    pub accept_time: Duration,
    /// Time from pixgate's start to every backlog effect delivered (pixgate idle).
    pub drain_time: Duration,
    /// Effects acknowledged in the drain.
    pub drained_effects: u64,
    /// Expected effects of the backlog (model) and the superseded QRs pixgate reported.
    pub expected_backlog: (u64, u64),
    /// Samples over the drain.
    pub samples: Vec<Sample>,
    /// Live phase: events produced, effects timed, latencies sorted (ms).
    pub live: (u64, Vec<f64>),
    /// Live phase, per effect timed: produce → readable (read by the bare consumer beside
    /// pixgate), ms, sorted.
    pub live_readable: Vec<f64>,
    /// Live phase, per effect timed: readable → the device's `done` ack (pixgate's added
    /// latency), ms, sorted; negative when the bare consumer, sharing the cores, read the
    /// record after pixgate had it carried out.
    pub live_added: Vec<f64>,
    /// Live phase: effects whose record the bare consumer never read.
    pub live_unread: u64,
    /// pixgate's stage histograms over the live phase (`/stats`' `stage_latency`).
    pub live_stages: std::collections::BTreeMap<String, gateway::telemetry::latency::Histogram>,
    /// Devices' raw job deliveries and effects carried out, whole run.
    pub raw_jobs: (u64, u64),
    /// pixgate's own resend counter (`job_redeliveries`), whole run.
    pub pixgate_redeliveries: u64,
    /// Peak RSS (`VmHWM`) of the draining pixgate, KiB.
    pub peak_rss_kib: u64,
    /// CPU used over the drain (pixgate's start to the last ack): pixgate, this process
    /// (the fleet of devices, mostly) and the whole machine; `None` without `/proc`.
    pub drain_cpu: Option<DrainCpu>,
    /// The fleet connecting.
    pub connect: ConnectReport,
    /// What pixgate wrote to storage over the drain; `None` without `/proc/PID/io`.
    pub drain_io: Option<DrainIo>,
}

/// Bytes written over the drain ([`LoadReport::drain_io`]): the write amplification an
/// edge box's flash wears by.
#[derive(Debug, Clone, Copy)]
pub struct DrainIo {
    /// pixgate's bytes sent to storage, start-up included ([`crate::disk_io::written`]).
    pub written: u64,
    /// Of which its log file (its size: pixgate's stdout and stderr go there).
    pub log: u64,
    /// Job bytes the devices received (payload of every MQTT publish, resends included).
    pub job_bytes: u64,
}

/// CPU time over the drain ([`LoadReport::drain_cpu`]).
#[derive(Debug, Clone, Copy)]
pub struct DrainCpu {
    /// pixgate, start-up included.
    pub pixgate: Duration,
    /// This process: the simulated fleet, the stats polling.
    pub harness: Duration,
    /// The Kafka-protocol broker (tansu).
    pub broker: Duration,
    /// The machine, all cores: busy and total (busy + idle).
    pub machine: crate::cpu::Machine,
}

fn say(msg: impl AsRef<str>) {
    println!("[pixgate-load] {}", msg.as_ref());
}

/// Runs every phase and returns the figures (also printed as they come).
///
/// # Errors
/// Any part failed to start, a phase exceeded `timeout`, or effects were lost.
pub async fn run(cfg: &LoadConfig) -> anyhow::Result<LoadReport> {
    let mut report = LoadReport::default();
    let _ = std::fs::remove_dir_all(&cfg.work);
    std::fs::create_dir_all(&cfg.work)?;
    let live_events = (cfg.live_rate * cfg.live_seconds as f64).round() as usize;
    let scenario = Scenario::new(ScenarioConfig::new(cfg.seed, cfg.devices, cfg.events + live_events));
    let devices = devices_from_records(scenario.device_records());
    let mut model = Model::new();
    for r in scenario.device_records() {
        model.apply_device(&r.value);
    }

    let broker = KafkaBroker::start(&cfg.work.join("kafka"))?;
    let brokers = broker.addr().to_string();
    capture::ensure_topics(&brokers, &capture::PIXGATE_TOPICS).await?;
    if cfg.cluster_partitions > 0 {
        let charge_partitions =
            capture::PIXGATE_TOPICS.iter().find(|(t, _)| *t == "charge.upserted").map_or(1, |(_, n)| *n);
        capture::ensure_topics(
            &brokers,
            &[
                (DEVICE_JOBS_TOPIC, cfg.cluster_partitions),
                (DELIVERY_LOG_TOPIC, cfg.cluster_partitions),
                (ROUTE_CHANGELOG_TOPIC, charge_partitions),
            ],
        )
        .await?;
    }
    let settings = GatewaySettings {
        brokers: brokers.clone(),
        group_id: "pixgate-load".into(),
        mqtt_port: free_port(),
        http_port: free_port(),
        ack_timeout_ms: 5_000,
        outbox_path: cfg.work.join("data/outbox.redb"),
    };
    // Dynamic group membership: with a static `group.instance.id`, tansu 0.6.0 answered the
    // restarted member's heartbeat with UNKNOWN_MEMBER_ID and then kept the group's leader
    // set to the old member id, failing every SyncGroup: the group never settled and the
    // drain stalled (seen with `kafka.debug = cgrp`). Dynamic membership also joins in
    // about 2 s instead of 13. `--pixgate-env PIXGATE_KAFKA__INSTANCE_ID=…` overrides it.
    let mut env: Vec<(&str, String)> = vec![("PIXGATE_KAFKA__INSTANCE_ID", String::new())];
    // Every simulated device comes from 127.0.0.1: room for the whole fleet.
    let room = (cfg.devices + 64).max(256).to_string();
    env.push(("PIXGATE_MQTT__MAX_CONNECTIONS", room.clone()));
    env.push(("PIXGATE_MQTT__MAX_PER_ADDRESS", room.clone()));
    env.push(("PIXGATE_MQTT__MAX_HANDSHAKES_PER_ADDRESS", room));
    if cfg.cluster_partitions > 0 {
        env.push(("PIXGATE_CLUSTER__ENABLED", "true".into()));
        env.push(("PIXGATE_CLUSTER__DEVICE_JOBS_TOPIC", DEVICE_JOBS_TOPIC.into()));
        env.push(("PIXGATE_CLUSTER__DEVICE_JOB_PARTITIONS", cfg.cluster_partitions.to_string()));
    }
    let setup = Instant::now();
    let ids: Vec<String> = devices.iter().map(|d| d.id().to_string()).collect();
    let (security, tls_env) = fleet_security(cfg.fleet_tls, &cfg.work.join("pki"), &ids)?;
    report.connect.credentials_setup = setup.elapsed();
    if cfg.fleet_tls != FleetTls::Plain {
        say(format!(
            "tls: throwaway CA and {} device {} in {:.1} s",
            ids.len(),
            if cfg.fleet_tls == FleetTls::Cert { "certificates" } else { "secrets" },
            setup.elapsed().as_secs_f64()
        ));
    }
    env.extend(tls_env);
    env.extend(cfg.env.iter().map(|(k, v)| (k.as_str(), v.clone())));
    let spawn = |n: usize| {
        GatewayProcess::spawn_with_env(
            &cfg.pixgate_bin,
            settings.clone(),
            &env,
            &cfg.work.join(format!("pixgate-{n}.log")),
            Duration::from_secs(60),
        )
    };

    // 1. The registry, read by pixgate before it goes down.
    let producer = capture::producer(&brokers)?;
    {
        let mut gw = spawn(0)?;
        publish_records_at(&producer, scenario.device_records(), None).await?;
        let n = scenario.device_records().len() as u64;
        crate::demo::wait_until(&gw, Instant::now() + cfg.timeout, |s| {
            s.counters.devices_applied >= n && s.counters.pending_records == 0
        })
        .await?;
        // Let the auto-commit (1 s) store the registry's offsets before the stop.
        let clean = gw.stop(Duration::from_secs(15));
        say(format!("registry: {n} devices read by pixgate, which then stopped (clean: {clean})"));
    }

    // 2. The backlog, produced while pixgate is down.
    let mut events = scenario.charge_events();
    let start = Instant::now();
    let mut produced = 0usize;
    let mut expected = 0u64;
    let mut last = Instant::now();
    while produced < cfg.events {
        let chunk: Vec<CaptureRecord> = events.by_ref().take((cfg.events - produced).min(10_000)).collect();
        for r in &chunk {
            expected += model.apply_charge(&r.value).effects().len() as u64;
        }
        publish_records_at(&producer, &chunk, None).await?;
        produced += chunk.len();
        if last.elapsed() > Duration::from_secs(10) {
            last = Instant::now();
            say(format!(
                "backlog: {produced} of {} events produced ({:.0}/s)",
                cfg.events,
                produced as f64 / start.elapsed().as_secs_f64()
            ));
        }
    }
    report.produced = (produced as u64, start.elapsed());
    say(format!(
        "backlog: {produced} events in {:.1} s while pixgate was down; {expected} effects expected",
        start.elapsed().as_secs_f64()
    ));

    // 3. Baseline: a bare consumer reads the whole topic.
    let broker_cpu = || broker.pid().and_then(crate::cpu::process);
    let b0 = broker_cpu();
    report.bare = crate::kafka::bare_consume(&brokers, &["charge.upserted"], produced as u64).await?;
    report.bare_broker_cpu = b0.zip(broker_cpu()).map(|(a, b)| b.saturating_sub(a));
    say(format!(
        "baseline: bare StreamConsumer read {} records in {:.2} s",
        report.bare.0,
        report.bare.1.as_secs_f64()
    ));

    // 4. Drain: pixgate starts, the fleet connects.
    let (sink_tx, mut sink_rx) = mpsc::unbounded_channel::<Carried>();
    let stats = Arc::new(Stats::counting_only(Some(sink_tx)));
    // Live phase: the record each timed effect comes from (its index among the live
    // records), and each timed effect's record with when it was carried out.
    let effect_record: Arc<Mutex<HashMap<(String, EffectKind), usize>>> = Arc::default();
    let carried: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::default();
    let collected = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let collector = {
        let (effect_record, carried, collected) = (effect_record.clone(), carried.clone(), collected.clone());
        tokio::spawn(async move {
            while let Some(c) = sink_rx.recv().await {
                collected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(i) = effect_record.lock().expect("lock").remove(&(c.charge, c.kind)) {
                    carried.lock().expect("lock").push((i, c.done_at));
                }
            }
        })
    };
    let t0 = Instant::now();
    let cpu_at_start = (crate::cpu::process(std::process::id()), crate::cpu::Machine::now());
    let broker_at_start = broker_cpu();
    let gw = spawn(1)?;
    let fleet = fleet::start_with_options(
        FleetConfig {
            mqtt_host: "127.0.0.1".into(),
            mqtt_port: settings.mqtt_port,
            out_dir: cfg.work.join("devices"),
            devices,
            security,
        },
        FleetOptions { rendering: Rendering::Verify, stats: stats.clone(), ..FleetOptions::default() },
    )
    .await?;
    connect_phase(&gw, &fleet, cfg, t0, &mut report.connect).await?;
    let (connects_at_drain, failures_at_drain) = (fleet.connects(), fleet.connection_failures());
    report.connect.min_held = u64::MAX;
    let mut churn = Churn::new(cfg.churn_per_minute);
    let deadline = Instant::now() + cfg.timeout;
    let mut next_sample = Instant::now();
    let mut last_print = Instant::now();
    let mut accepted_at = None;
    loop {
        let s = gw.stats()?;
        let c = &s.counters;
        let read = count(&c.events_read, "charge.upserted");
        let accepted = read.saturating_sub(c.pending_records);
        let delivered = total(&c.effects_done);
        // With the hand-off over Kafka, jobs waiting on the device-jobs topic are in no
        // counter: the drain also waits for every expected effect to be done or superseded.
        let idle = c.pending_records == 0
            && c.queued_jobs == 0
            && c.outbox_jobs == 0
            && (cfg.cluster_partitions == 0 || delivered + c.superseded >= expected);
        report.connect.min_held = report.connect.min_held.min(c.mqtt_connected);
        if report.first_accept.is_zero() && accepted > 0 {
            report.first_accept = t0.elapsed();
        }
        if accepted_at.is_none() && read >= produced as u64 && c.pending_records == 0 {
            accepted_at = Some(t0.elapsed());
        }
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(1);
            let (rss, hwm) = gw.memory_kib().unwrap_or((0, 0));
            report.peak_rss_kib = report.peak_rss_kib.max(hwm);
            report.samples.push(Sample {
                t: t0.elapsed().as_secs_f64(),
                accepted,
                delivered,
                outbox: c.outbox_jobs,
                job_bytes: stats.raw_bytes(),
                rss_kib: rss,
            });
        }
        if accepted_at.is_some() && idle {
            report.drain_time = t0.elapsed();
            if let ((Some(h0), Some(m0)), Some(b0), Some(p), Some(h1), Some(b1), Some(m1)) = (
                cpu_at_start,
                broker_at_start,
                crate::cpu::process(gw.pid()),
                crate::cpu::process(std::process::id()),
                broker_cpu(),
                crate::cpu::Machine::now(),
            ) {
                report.drain_cpu = Some(DrainCpu {
                    pixgate: p,
                    harness: h1.saturating_sub(h0),
                    broker: b1.saturating_sub(b0),
                    machine: m1.since(m0),
                });
            }
            report.drained_effects = delivered;
            report.expected_backlog = (expected, c.superseded);
            report.drain_io = crate::disk_io::written(gw.pid()).map(|written| DrainIo {
                written,
                log: std::fs::metadata(cfg.work.join("pixgate-1.log")).map_or(0, |m| m.len()),
                job_bytes: stats.raw_bytes(),
            });
            break;
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            last_print = Instant::now();
            let rss = report.samples.last().map_or(0, |x| x.rss_kib);
            say(format!(
                "drain: t={:.0} s accepted {accepted}/{produced} delivered {delivered} outbox {} rss {} MiB; devices connected {}",
                t0.elapsed().as_secs_f64(),
                c.outbox_jobs,
                rss / 1024,
                c.mqtt_connected
            ));
        }
        if Instant::now() > deadline {
            bail!("drain not finished within {:?}; stats {}", cfg.timeout, stats_json(&s));
        }
        churn.tick(&fleet);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    report.accept_time = accepted_at.unwrap_or(report.drain_time);
    let (exp, superseded) = report.expected_backlog;
    say(format!(
        "drain: accepted in {:.1} s, delivered in {:.1} s: {} effects + {superseded} superseded QRs, {exp} expected",
        report.accept_time.as_secs_f64(),
        report.drain_time.as_secs_f64(),
        report.drained_effects
    ));
    if report.drained_effects + superseded != exp || stats.carried_out() != report.drained_effects {
        bail!("backlog effects do not add up: devices carried out {}, pixgate acked {}, superseded {superseded}, expected {exp}", stats.carried_out(), report.drained_effects);
    }

    // 5. Live traffic at a fixed rate.
    if live_events > 0 {
        let carried_before = stats.carried_out();
        let live: Vec<CaptureRecord> = events.by_ref().take(live_events).collect();
        let mut live_expected = 0u64;
        let fates: Vec<Vec<(String, EffectKind)>> = live
            .iter()
            .map(|r| {
                let f = model.apply_charge(&r.value);
                live_expected += f.effects().len() as u64;
                f.effects().iter().map(|e| (e.charge.clone(), e.kind)).collect()
            })
            .collect();
        let (tail, readable) = tail_live(&brokers, cfg.tail_fetch_wait_ms, &live)?;
        let before = gw.stats()?.counters;
        let superseded_before = before.superseded;
        let mut produced_at: Vec<Option<Instant>> = vec![None; live.len()];
        let start = Instant::now();
        let mut i = 0;
        while i < live.len() {
            let due = ((start.elapsed().as_secs_f64() * cfg.live_rate) as usize + 1).min(live.len());
            if due > i {
                {
                    let mut map = effect_record.lock().expect("lock");
                    let now = Instant::now();
                    for (n, f) in fates.iter().enumerate().take(due).skip(i) {
                        produced_at[n] = Some(now);
                        for key in f {
                            map.insert(key.clone(), n);
                        }
                    }
                }
                publish_records_at(&producer, &live[i..due], None).await?;
                i = due;
            }
            churn.tick(&fleet);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let deadline = Instant::now() + cfg.timeout;
        loop {
            let s = gw.stats()?;
            let c = &s.counters;
            let superseded = c.superseded - superseded_before;
            let idle = c.pending_records == 0 && c.queued_jobs == 0 && c.outbox_jobs == 0;
            if idle && stats.carried_out() - carried_before + superseded >= live_expected {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "live phase not delivered within {:?}: {} of {live_expected}; stats {}",
                    cfg.timeout,
                    stats.carried_out() - carried_before,
                    stats_json(&s)
                );
            }
            churn.tick(&fleet);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Let the collector catch up with the sink (every carried-out effect goes through it).
        let catch_up = Instant::now() + Duration::from_secs(10);
        while collected.load(std::sync::atomic::Ordering::Relaxed) < stats.carried_out() && Instant::now() < catch_up {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tail.abort();
        let after = gw.stats()?.counters;
        let readable = readable.lock().expect("lock").clone();
        let ms = |later: Instant, earlier: Instant| {
            if later >= earlier {
                later.duration_since(earlier).as_secs_f64() * 1e3
            } else {
                -(earlier.duration_since(later).as_secs_f64() * 1e3)
            }
        };
        let (mut total, mut broker, mut added) = (Vec::new(), Vec::new(), Vec::new());
        for &(n, done) in carried.lock().expect("lock").iter() {
            let Some(produced) = produced_at[n] else { continue };
            total.push(ms(done, produced));
            match readable[n] {
                Some(r) => {
                    broker.push(ms(r, produced));
                    added.push(ms(done, r));
                }
                None => report.live_unread += 1,
            }
        }
        for v in [&mut total, &mut broker, &mut added] {
            v.sort_by(f64::total_cmp);
        }
        report.live = (live.len() as u64, total);
        report.live_readable = broker;
        report.live_added = added;
        report.live_stages = after
            .stage_latency
            .iter()
            .map(|(stage, h)| (stage.clone(), h.since(before.stage_latency.get(stage).unwrap_or(&Default::default()))))
            .collect();
    }

    report.pixgate_redeliveries = gw.stats()?.counters.job_redeliveries;
    if let Ok((_, hwm)) = gw.memory_kib() {
        report.peak_rss_kib = report.peak_rss_kib.max(hwm);
    }
    report.connect.later_connects = fleet.connects() - connects_at_drain;
    report.connect.cut = fleet.dropped_connections();
    report.connect.ack_latency = fleet.ack_latency();
    report.connect.later_failures = fleet.connection_failures() - failures_at_drain;
    let fleet_report = fleet.shutdown().await;
    report.raw_jobs = (fleet_report.stats.raw_jobs, fleet_report.stats.effects);
    let mut gw = gw;
    let clean = gw.stop(Duration::from_secs(15));
    say(format!("pixgate stopped (clean: {clean})"));
    drop(producer);
    broker.stop();
    collector.abort();
    if !cfg.keep {
        let _ = std::fs::remove_dir_all(&cfg.work);
    }
    Ok(report)
}

/// When each live record was first read by the bare consumer beside pixgate, by index.
type Stamps = Arc<Mutex<Vec<Option<Instant>>>>;

/// Starts a bare consumer reading `charge.upserted` from its end beside pixgate
/// ([`crate::kafka::tail_from_end`]) and stamps, for each of `live` (matched by its value),
/// when it was first read: when it was readable. A value produced twice (the scenario's
/// upstream redeliveries) stamps both records at its first read; the redelivery has no
/// effects of its own to time.
fn tail_live(
    brokers: &str,
    fetch_wait_ms: u32,
    live: &[CaptureRecord],
) -> anyhow::Result<(tokio::task::JoinHandle<()>, Stamps)> {
    use rdkafka::Message;
    let digest = |v: &[u8]| {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        v.hash(&mut h);
        h.finish()
    };
    // The scenario repeats some change events as an upstream redelivery would: one value,
    // several records.
    let mut index: HashMap<u64, Vec<usize>> = HashMap::new();
    for (n, r) in live.iter().enumerate() {
        index.entry(digest(&r.value)).or_default().push(n);
    }
    let readable: Stamps = Arc::new(Mutex::new(vec![None; live.len()]));
    let consumer = crate::kafka::tail_from_end(brokers, "charge.upserted", fetch_wait_ms)?;
    let stamps = readable.clone();
    let task = tokio::spawn(async move {
        loop {
            match consumer.recv().await {
                Ok(m) => {
                    let now = Instant::now();
                    if let Some(records) = index.get(&digest(m.payload().unwrap_or_default())) {
                        let mut stamps = stamps.lock().expect("lock");
                        for &n in records {
                            stamps[n].get_or_insert(now);
                        }
                    }
                }
                Err(e) => {
                    say(format!("live: the bare consumer beside pixgate: {e}"));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    });
    Ok((task, readable))
}

/// The fleet's security and pixgate's matching settings: for TLS, a throwaway CA in `dir`
/// (server certificate for 127.0.0.1) and a secret or certificate for each of `ids`.
fn fleet_security(
    tls: FleetTls,
    dir: &std::path::Path,
    ids: &[String],
) -> anyhow::Result<(MqttSecurity, Vec<(&'static str, String)>)> {
    if tls == FleetTls::Plain {
        return Ok((MqttSecurity::Plain, Vec::new()));
    }
    let fleet = crate::pki::Fleet::create_without_other(dir, &[])?;
    let secrets_file = dir.join("credentials.json");
    let identity = if tls == FleetTls::Secret {
        let mut creds = gateway::store::credentials::Credentials::load(&secrets_file, true)?;
        let issued = creds.issue_many(ids.iter().map(String::as_str))?;
        DeviceIdentity::Secret { secrets: Arc::new(issued.into_iter().collect()) }
    } else {
        for id in ids {
            gateway::cli::credentials::issue_certificate(dir, id, 30)?;
        }
        DeviceIdentity::Certificate { dir: fleet.devices_dir() }
    };
    let mut env = fleet.gateway_env();
    env.extend([
        // As in plain runs, the registry's disabled devices connect too (and get no jobs):
        // the whole fleet authenticates, which is what is measured. Later settings win.
        ("PIXGATE_MQTT__REQUIRE_REGISTERED", "false".into()),
        ("PIXGATE_MQTT__CREDENTIALS", secrets_file.display().to_string()),
    ]);
    Ok((MqttSecurity::Tls { ca: fleet.ca_cert(), identity }, env))
}

/// Waits for the whole fleet to connect, printing every 5 s: devices connected, pixgate's
/// count, connections accepted per second, failures, pixgate's RSS.
async fn connect_phase(
    gw: &GatewayProcess,
    fleet: &fleet::FleetHandle,
    cfg: &LoadConfig,
    t0: Instant,
    out: &mut ConnectReport,
) -> anyhow::Result<()> {
    let n = fleet.device_ids().len();
    let deadline = Instant::now() + cfg.connect_timeout;
    let mut last = (Instant::now(), 0u64);
    let mut next_print = Instant::now() + Duration::from_secs(5);
    loop {
        let connected = fleet.connected();
        let done = connected == n;
        if done || Instant::now() >= next_print || Instant::now() > deadline {
            next_print += Duration::from_secs(5);
            let connects = fleet.connects();
            let rate = (connects - last.1) as f64 / last.0.elapsed().as_secs_f64().max(1e-3);
            last = (Instant::now(), connects);
            let s = gw.stats()?;
            let rss = gw.memory_kib().map_or(0, |m| m.0);
            let failures = fleet.connection_failures();
            let t = t0.elapsed().as_secs_f64();
            out.timeline.push((t, connected, s.counters.mqtt_connected, rate, failures, rss));
            say(format!(
                "connect: t={t:.0} s devices connected {connected}/{n} (pixgate: {}), {rate:.0} connections/s, {failures} failed attempts, pixgate rss {} MiB",
                s.counters.mqtt_connected,
                rss / 1024
            ));
            if done || Instant::now() > deadline {
                out.all_connected = t0.elapsed();
                out.connects = connects;
                out.failures = failures;
                out.refusals = s.counters.mqtt_refusals.clone();
                out.rss_kib = rss;
                out.pixgate_cpu = crate::cpu::process(gw.pid());
                say(format!(
                    "connect: {connected} of {n} devices connected after {:.1} s; {connects} connections accepted, {failures} failed attempts; pixgate refusals {:?}",
                    out.all_connected.as_secs_f64(),
                    out.refusals
                ));
                if !done {
                    bail!(
                        "{} of {n} devices not connected after {:?}; last errors: {:?}",
                        n - connected,
                        cfg.connect_timeout,
                        fleet.last_errors(5)
                    );
                }
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What a stage spans, for the table.
fn stage_span(stage: gateway::telemetry::latency::Stage) -> &'static str {
    use gateway::telemetry::latency::Stage;
    match stage {
        Stage::Kafka => "record timestamp → planned",
        Stage::Accept => "planned → durably accepted",
        Stage::Queue => "accepted → first send",
        Stage::Device => "first send → done ack",
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The figures as a table, with RSS samples over the drain.
pub fn table(cfg: &LoadConfig, r: &LoadReport) -> String {
    let secs = |d: Duration| d.as_secs_f64().max(1e-9);
    let bare_rate = r.bare.0 as f64 / secs(r.bare.1);
    // Rates from pixgate's first accepted record: start-up and the group join are shown apart.
    let accept_rate = r.produced.0 as f64 / secs(r.accept_time.saturating_sub(r.first_accept));
    let delivery_rate = r.drained_effects as f64 / secs(r.drain_time.saturating_sub(r.first_accept));
    let e2e_rate = r.produced.0 as f64 / secs(r.drain_time.saturating_sub(r.first_accept));
    let (live_n, lat) = &r.live;
    let mut t = String::new();
    t.push_str(&format!(
        "\npixgate load run: {} charge events backlog, {} devices, seed {}, live {} ev/s for {} s; hand-off: {}\n",
        cfg.events,
        cfg.devices,
        cfg.seed,
        cfg.live_rate,
        cfg.live_seconds,
        match cfg.cluster_partitions {
            0 => "the outbox write (edge box)".to_string(),
            n => format!("{DEVICE_JOBS_TOPIC}, {n} partitions (cluster.enabled)"),
        }
    ));
    t.push_str("| figure | value |\n|---|---|\n");
    t.push_str(&format!(
        "| backlog produced (pixgate down) | {} records in {:.1} s ({:.0} records/s) |\n",
        r.produced.0,
        secs(r.produced.1),
        r.produced.0 as f64 / secs(r.produced.1)
    ));
    t.push_str(&format!("| bare StreamConsumer, fresh group, whole topic | {} records in {:.2} s = **{bare_rate:.0} records/s** (baseline) |\n", r.bare.0, secs(r.bare.1)));
    t.push_str(&format!(
        "| pixgate start → first record accepted (start-up, group join) | {:.1} s (not in the rates below) |\n",
        secs(r.first_accept)
    ));
    if r.accept_time.saturating_sub(r.first_accept) < Duration::from_secs(1) {
        // A large fleet takes longer to connect than pixgate takes to read the backlog:
        // the records were all accepted before the first sample, so there is no rate.
        t.push_str(&format!("| pixgate accept rate (records committed, backlog) | all accepted while the fleet connected ({:.1} s after start): not measured |\n", secs(r.accept_time)));
    } else {
        t.push_str(&format!("| pixgate accept rate (records committed, backlog) | {accept_rate:.0} records/s (all accepted {:.1} s after start) = {:.4} × baseline |\n", secs(r.accept_time), accept_rate / bare_rate));
    }
    t.push_str(&format!("| pixgate delivery rate (effects acked, backlog) | {delivery_rate:.0} effects/s ({} effects, all acked {:.1} s after start) |\n", r.drained_effects, secs(r.drain_time)));
    t.push_str(&format!("| pixgate end to end (backlog record → all effects acked) | {e2e_rate:.0} records/s = **{:.4} × baseline** |\n", e2e_rate / bare_rate));
    t.push_str(&format!(
        "| backlog effects | {} acked + {} superseded QRs = {} expected by the model |\n",
        r.drained_effects, r.expected_backlog.1, r.expected_backlog.0
    ));
    if *live_n > 0 {
        t.push_str(&format!(
            "| live latency, produce → device ack ({} events at {} ev/s, {} effects timed) | p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms |\n",
            live_n,
            cfg.live_rate,
            lat.len(),
            pct(lat, 0.5),
            pct(lat, 0.99),
            lat.last().copied().unwrap_or(f64::NAN)
        ));
        let fetch_wait = cfg
            .env
            .iter()
            .find(|(k, _)| k == "PIXGATE_KAFKA__FETCH_WAIT_MAX_MS")
            .map_or("100 (default)".to_string(), |(_, v)| v.clone());
        let spread = |v: &[f64]| {
            format!(
                "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                pct(v, 0.5),
                pct(v, 0.99),
                v.last().copied().unwrap_or(f64::NAN)
            )
        };
        t.push_str(&format!(
            "| live, produce → readable (a bare consumer beside pixgate, fetch.wait.max.ms {}) | {} |\n",
            cfg.tail_fetch_wait_ms,
            spread(&r.live_readable)
        ));
        t.push_str(&format!(
            "| live, **pixgate's added latency**: readable → device ack (pixgate's kafka.fetch_wait_max_ms {fetch_wait}) | {}; min {:.1} ms; {} effects not read by the bare consumer |\n",
            spread(&r.live_added),
            r.live_added.first().copied().unwrap_or(f64::NAN),
            r.live_unread
        ));
        for stage in gateway::telemetry::latency::Stage::ALL {
            let Some(h) = r.live_stages.get(stage.as_str()) else { continue };
            let q = |p| h.quantile(p).map_or(f64::NAN, |s| s * 1e3);
            t.push_str(&format!(
                "| live, pixgate stage `{}` ({}; from its histogram, interpolated in 1-2-5 buckets) | p50 {:.1} ms, p99 {:.1} ms, mean {:.1} ms ({} observations) |\n",
                stage.as_str(),
                stage_span(stage),
                q(0.5),
                q(0.99),
                h.mean().map_or(f64::NAN, |s| s * 1e3),
                h.count
            ));
        }
    }
    t.push_str(&format!(
        "| raw job deliveries at devices | {} for {} effects = {} redeliveries (pixgate resends: {}) |\n",
        r.raw_jobs.0,
        r.raw_jobs.1,
        r.raw_jobs.0.saturating_sub(r.raw_jobs.1),
        r.pixgate_redeliveries
    ));
    t.push_str(&format!("| pixgate peak RSS (VmHWM) | {:.1} MiB |\n", r.peak_rss_kib as f64 / 1024.0));
    let c = &r.connect;
    let rates = c.timeline.iter().map(|x| x.3).fold(0.0, f64::max);
    t.push_str(&format!(
        "| fleet connect ({:?}) | {} devices connected {:.1} s after pixgate started ({:.0} connections/s on average, peak 5 s {:.0}/s); {} connections accepted, {} failed attempts; pixgate refusals {:?}; pixgate RSS then {:.0} MiB, CPU {} |\n",
        cfg.fleet_tls,
        cfg.devices,
        secs(c.all_connected),
        c.connects as f64 / secs(c.all_connected),
        rates,
        c.connects,
        c.failures,
        c.refusals,
        c.rss_kib as f64 / 1024.0,
        c.pixgate_cpu.map_or("-".into(), |d| format!("{:.1} s", d.as_secs_f64()))
    ));
    t.push_str(&format!(
        "| connections held over the drain | at least {} of {} at pixgate; {} connections cut on purpose (churn); {} reconnects and {} failed attempts at the devices after all had connected |\n",
        c.min_held, cfg.devices, c.cut, c.later_connects, c.later_failures
    ));
    if let Some((p50, p99)) = c.ack_latency {
        t.push_str(&format!(
            "| ack latency at the devices (ack publish → PUBACK, the last 100,000 acks) | p50 {:.1} ms, p99 {:.1} ms |\n",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        ));
    }
    let per_record = |d: Duration| d.as_secs_f64() * 1e6 / r.produced.0.max(1) as f64;
    if let Some(b) = r.bare_broker_cpu {
        t.push_str(&format!("| broker CPU per record while the bare consumer read | {:.0} µs |\n", per_record(b)));
    }
    if let Some(c) = r.drain_cpu {
        let other = c.machine.busy.saturating_sub(c.pixgate + c.harness + c.broker);
        t.push_str(&format!(
            "| CPU over the drain, per backlog record (pixgate; fleet and harness; broker; the rest: kernel, other) | pixgate {:.0} µs, fleet {:.0} µs, broker {:.0} µs, rest {:.0} µs; the machine was {:.0}% busy ({:.1} of {:.1} core-seconds) |\n",
            per_record(c.pixgate),
            per_record(c.harness),
            per_record(c.broker),
            per_record(other),
            100.0 * c.machine.busy.as_secs_f64() / c.machine.total.as_secs_f64().max(1e-9),
            c.machine.busy.as_secs_f64(),
            c.machine.total.as_secs_f64()
        ));
    }
    if let Some(io) = r.drain_io {
        let outbox = io.written.saturating_sub(io.log);
        t.push_str(&format!(
            "| bytes written to storage over the drain (pixgate's /proc/PID/io write_bytes) | {:.1} MiB: {} per backlog record; without its log file ({:.1} MiB), {} per record = **{:.2} × the job bytes** ({} per record sent to devices) |\n",
            io.written as f64 / (1024.0 * 1024.0),
            io.written / r.produced.0.max(1),
            io.log as f64 / (1024.0 * 1024.0),
            outbox / r.produced.0.max(1),
            outbox as f64 / io.job_bytes.max(1) as f64,
            io.job_bytes / r.produced.0.max(1)
        ));
    }
    if let (Some(first), Some(last)) = (r.samples.first(), r.samples.last()) {
        let grew = last.rss_kib.saturating_sub(first.rss_kib) as f64 / 1024.0;
        let mib = last.job_bytes as f64 / (1024.0 * 1024.0);
        t.push_str(&format!("| RSS growth over the drain vs job bytes sent over MQTT | +{grew:.0} MiB RSS for {mib:.0} MiB of job payloads ({:.2} MiB RSS per MiB sent) |\n", grew / mib.max(1e-9)));
    }
    // One line for scripts/fleet-bench.sh. CPU per message: pixgate's CPU after the whole
    // fleet had connected, per effect acked in the drain.
    let cpu_msg = r.drain_cpu.zip(c.pixgate_cpu).map_or(f64::NAN, |(d, at_connect)| {
        d.pixgate.saturating_sub(at_connect).as_secs_f64() * 1e6 / r.drained_effects.max(1) as f64
    });
    t.push_str(&format!(
        "\nFLEET broker=pixgate tls={:?} devices={} held={} connect_s={:.1} handshakes_per_s={:.0} peak_handshakes_per_s={:.0} failed_attempts={} rss_connected_mib={:.0} rss_peak_mib={:.0} messages={} messages_per_s={delivery_rate:.0} cpu_us_per_msg={cpu_msg:.0}\n",
        cfg.fleet_tls,
        cfg.devices,
        c.min_held,
        secs(c.all_connected),
        c.connects as f64 / secs(c.all_connected),
        rates,
        c.failures,
        c.rss_kib as f64 / 1024.0,
        r.peak_rss_kib as f64 / 1024.0,
        r.drained_effects,
    ));
    t.push_str("\nRSS over the drain (t s: RSS MiB, records accepted, effects acked, outbox jobs, job MiB sent):\n");
    let step = (r.samples.len() / 20).max(1);
    for s in r.samples.iter().step_by(step).chain(r.samples.last()) {
        t.push_str(&format!(
            "  t={:>6.0}  rss={:>7.1}  accepted={:>8}  acked={:>8}  outbox={:>6}  sent={:>7.1}\n",
            s.t,
            s.rss_kib as f64 / 1024.0,
            s.accepted,
            s.delivered,
            s.outbox,
            s.job_bytes as f64 / (1024.0 * 1024.0)
        ));
    }
    t
}

/// The working folder used when none is given.
pub fn default_work_dir() -> PathBuf {
    std::env::temp_dir().join(format!("pixgate-load-{}", std::process::id()))
}

/// Parses `KEY=VALUE`.
///
/// # Errors
/// No `=`.
pub fn parse_env(s: &str) -> anyhow::Result<(String, String)> {
    let (k, v) = s.split_once('=').context("expected KEY=VALUE")?;
    Ok((k.to_string(), v.to_string()))
}
