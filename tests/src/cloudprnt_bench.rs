//! The CloudPRNT fleet bench behind `cloudprnt-bench`: what pixgate spends on printers that
//! fetch their jobs over their makers' protocols (Star CloudPRNT's HTTP and MQTT methods,
//! Epson Server Direct Print) against the same printers on pixgate's MQTT device protocol.
//! Figures are printed, never asserted.
//!
//! For each mode, on a fresh tansu broker and a fresh pixgate (release build, TLS, a secret
//! per printer):
//! 1. **registry**: `printers` companies, each with one printer, its default, on the
//!    mode's `printer.transport` (`cloudprnt-http` or `cloudprnt-mqtt` with a MAC of its
//!    own, `epson-sdp`; `mqtt`: pixgate's device protocol);
//! 2. **fleet**: the printers, simulated in this process, each with its own clients and
//!    connections, as a real printer, started spread over one poll interval: `http`, a
//!    [`simulators::cloudprnt::CloudPrinter`] polling every `poll_ms`; `star-mqtt`, the
//!    same printer on CloudPRNT's MQTT method ([`simulators::cloudprnt_mqtt::run`]: the
//!    settings, then an MQTT session on pixgate's listener, each job fetched as a PNG);
//!    `sdp`, a [`simulators::sdp::SdpPrinter`] polling every `poll_ms` with HTTP Digest;
//!    `mqtt`, the fleet simulator's printers on TLS with their secrets;
//! 3. **idle**: `idle_seconds` with no charge: pixgate's CPU, and in the polling modes
//!    (`http`, `sdp`) the polls it answered (`cloudprnt_polls`, `sdp_polls`), so CPU per poll;
//! 4. **load**: `rate` paid charges per second (no terminal: a receipt on the company's
//!    default printer, companies in turn) for `load_seconds`, until every receipt is
//!    acknowledged: pixgate's CPU beyond the idle rate, per receipt.
//!
//! CPU is pixgate's own (`/proc/PID/stat`), so the simulated fleet sharing the machine
//! does not count; its RSS after the load is printed too.

use crate::broker::KafkaBroker;
use crate::gateway::{GatewayProcess, GatewaySettings};
use crate::net::free_port;
use anyhow::Context;
use serde_json::{json, Value};
use simulators::capture::{self, publish_records_at, CaptureRecord};
use simulators::cloudprnt::{BasicAuth, CloudPrinter, CloudPrntOptions, Event};
use simulators::cloudprnt_mqtt::CloudPrntMqttOptions;
use simulators::device::{DeviceIdentity, MqttSecurity, Rendering, Stats};
use simulators::fleet::{self, FleetConfig, FleetOptions};
use simulators::registry::devices_from_records;
use simulators::sdp::{SdpOptions, SdpPrinter};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the printers reach pixgate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Star CloudPRNT, HTTP method, over TLS.
    Http,
    /// Star CloudPRNT, MQTT method: pixgate's MQTT listener over TLS, jobs fetched over
    /// HTTPS (Pass URL).
    StarMqtt,
    /// Epson Server Direct Print over TLS, HTTP Digest.
    Sdp,
    /// pixgate's MQTT device protocol over TLS.
    Mqtt,
}

impl Mode {
    /// The mode's name on the command line and in the figures.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Http => "http",
            Mode::StarMqtt => "star-mqtt",
            Mode::Sdp => "sdp",
            Mode::Mqtt => "mqtt",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The pixgate binary (a release build).
    pub pixgate_bin: PathBuf,
    /// Working folder, emptied first.
    pub work: PathBuf,
    /// Printers (and companies).
    pub printers: usize,
    /// CloudPRNT poll interval, ms.
    pub poll_ms: u64,
    /// Idle phase, s.
    pub idle_seconds: u64,
    /// Paid charges per second in the load phase.
    pub rate: f64,
    /// Load phase, s.
    pub load_seconds: u64,
}

/// One mode's figures.
#[derive(Debug, Clone, Default)]
pub struct BenchReport {
    /// Polls answered in the idle phase (`http`, `sdp`).
    pub idle_polls: u64,
    /// pixgate's CPU in the idle phase.
    pub idle_cpu: Duration,
    /// The idle phase's length.
    pub idle_wall: Duration,
    /// Receipts acknowledged in the load phase.
    pub jobs: u64,
    /// pixgate's CPU from the first charge to the last acknowledgement.
    pub load_cpu: Duration,
    /// That phase's length.
    pub load_wall: Duration,
    /// pixgate's resident memory after the load, KiB.
    pub rss_kib: u64,
    /// Requests the CloudPRNT server refused over the run, by rule.
    pub refusals: std::collections::BTreeMap<String, u64>,
}

impl BenchReport {
    /// pixgate's CPU per second of wall time while idle, as a share of one core.
    pub fn idle_share(&self) -> f64 {
        self.idle_cpu.as_secs_f64() / self.idle_wall.as_secs_f64().max(1e-9)
    }

    /// CPU per poll, µs (all of the idle CPU charged to the polls).
    pub fn us_per_poll(&self) -> Option<f64> {
        (self.idle_polls > 0).then(|| self.idle_cpu.as_secs_f64() * 1e6 / self.idle_polls as f64)
    }

    /// CPU per receipt beyond the idle rate, µs.
    pub fn us_per_job(&self) -> f64 {
        let beyond = self.load_cpu.as_secs_f64() - self.idle_share() * self.load_wall.as_secs_f64();
        beyond.max(0.0) * 1e6 / self.jobs.max(1) as f64
    }

    /// The `CLOUDPRNT …` line.
    pub fn line(&self, mode: Mode, cfg: &BenchConfig) -> String {
        format!(
            "CLOUDPRNT mode={} printers={} poll_ms={} idle_s={:.1} idle_polls={} idle_cpu_pct={:.1} us_per_poll={} jobs={} load_s={:.1} us_per_job={:.0} rss_mib={:.0} refusals={:?}",
            mode.name(),
            cfg.printers,
            cfg.poll_ms,
            self.idle_wall.as_secs_f64(),
            self.idle_polls,
            self.idle_share() * 100.0,
            self.us_per_poll().map_or("-".into(), |u| format!("{u:.0}")),
            self.jobs,
            self.load_wall.as_secs_f64(),
            self.us_per_job(),
            self.rss_kib as f64 / 1024.0,
            self.refusals,
        )
    }
}

fn say(msg: impl AsRef<str>) {
    eprintln!("[cloudprnt-bench] {}", msg.as_ref());
}

/// A 24-hex id: `prefix` then `n`.
fn oid(prefix: &str, n: usize) -> String {
    format!("{prefix}{n:0>width$x}", width = 24 - prefix.len())
}

/// The printer of company `i`, default for it, on `mode`'s transport; a Star printer as MAC
/// `00:11:62:xx:xx:xx`.
fn printer_record(i: usize, mode: Mode, t: u64) -> CaptureRecord {
    let id = oid("b0", i);
    let mut printer = json!({ "paperWidthMm": 80, "codePage": "CP860", "nativeQr": false });
    match mode {
        Mode::Http | Mode::StarMqtt => {
            printer["transport"] = json!(if mode == Mode::Http { "cloudprnt-http" } else { "cloudprnt-mqtt" });
            printer["mac"] = json!(mac(i));
        }
        Mode::Sdp => printer["transport"] = json!("epson-sdp"),
        Mode::Mqtt => {}
    }
    let value = json!({
        "eventId": format!("Device:{id}:{}", t << 32 | (i as u64 + 1)),
        "operationType": "insert",
        "ns": { "db": "payments", "coll": "Device" },
        "documentKey": { "_id": { "$oid": id } },
        "clusterTime": { "$timestamp": { "t": t, "i": i + 1 } },
        "fullDocument": {
            "_id": { "$oid": id },
            "company": { "$oid": oid("c0", i) },
            "kind": "printer",
            "model": "Star mC-Print3",
            "printer": printer,
            "locale": "pt-BR",
            "defaultForCompany": true,
            "enabled": true,
        },
    });
    CaptureRecord { topic: "device.upserted".into(), key: Some(id), value: value.to_string().into_bytes() }
}

fn mac(i: usize) -> String {
    format!("00:11:62:{:02x}:{:02x}:{:02x}", (i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff)
}

/// Paid charge `n` of company `n % printers`, without a terminal, from the fixtures'
/// first charge.
fn paid_charge(template: &Value, n: usize, printers: usize, t: u64) -> CaptureRecord {
    let id = oid("d0", n);
    let mut rec = crate::charges::charge_record(template, &oid("e0", 0), &id, "COMPLETED", 1, 60, t);
    let mut value: Value = serde_json::from_slice(&rec.value).expect("a charge record is JSON");
    let doc = &mut value["fullDocument"];
    doc["company"] = json!({ "$oid": oid("c0", n % printers) });
    if let Some(d) = doc.as_object_mut() {
        d.remove("terminal");
    }
    rec.value = value.to_string().into_bytes();
    rec
}

/// Runs one mode.
///
/// # Errors
/// The broker, pixgate or the fleet cannot start, or a phase times out.
pub async fn run(cfg: &BenchConfig, mode: Mode) -> anyhow::Result<BenchReport> {
    let mut report = BenchReport::default();
    let work = cfg.work.join(mode.name());
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let broker = KafkaBroker::start(&work.join("kafka"))?;
    let brokers = broker.addr().to_string();
    capture::ensure_topics(&brokers, &capture::PIXGATE_TOPICS).await?;

    let t = chrono::Utc::now().timestamp() as u64;
    let registry: Vec<CaptureRecord> = (0..cfg.printers).map(|i| printer_record(i, mode, t)).collect();
    let ids: Vec<String> = registry.iter().filter_map(|r| r.key.clone()).collect();
    let pki = crate::pki::Fleet::create_without_other(&work.join("pki"), &[])?;
    let secrets_file = work.join("pki/credentials.json");
    let mut credentials = gateway::store::credentials::Credentials::load(&secrets_file, true)?;
    let issued = match mode {
        Mode::Sdp => credentials.issue_many_with_digest(ids.iter().map(String::as_str))?,
        _ => credentials.issue_many(ids.iter().map(String::as_str))?,
    };
    let secrets: BTreeMap<String, String> = issued.into_iter().collect();
    let room = (cfg.printers + 64).to_string();
    let cloudprnt_listen = format!("127.0.0.1:{}", free_port());
    let mut env = pki.gateway_env();
    env.extend([
        ("PIXGATE_KAFKA__INSTANCE_ID", String::new()),
        ("PIXGATE_MQTT__CREDENTIALS", secrets_file.display().to_string()),
        ("PIXGATE_MQTT__MAX_CONNECTIONS", room.clone()),
        ("PIXGATE_MQTT__MAX_PER_ADDRESS", room.clone()),
        ("PIXGATE_MQTT__MAX_HANDSHAKES_PER_ADDRESS", room),
        ("PIXGATE_CLOUDPRNT__LISTEN", cloudprnt_listen.clone()),
        ("PIXGATE_CLOUDPRNT__TLS_CERT", pki.server_cert().display().to_string()),
        ("PIXGATE_CLOUDPRNT__TLS_KEY", pki.server_key().display().to_string()),
        // An HTTP client may open a second connection while its first goes back to its pool.
        ("PIXGATE_CLOUDPRNT__MAX_CONNECTIONS", (2 * cfg.printers + 64).to_string()),
        ("PIXGATE_LOG__LEVEL", "warn".into()),
    ]);
    let settings = GatewaySettings {
        brokers: brokers.clone(),
        group_id: "cloudprnt-bench".into(),
        mqtt_port: free_port(),
        http_port: free_port(),
        ack_timeout_ms: 5_000,
        outbox_path: work.join("data/outbox.redb"),
    };
    let gw = GatewayProcess::spawn_with_env(
        &cfg.pixgate_bin,
        settings.clone(),
        &env,
        &work.join("pixgate.log"),
        Duration::from_secs(60),
    )?;
    let deadline = || Instant::now() + Duration::from_secs(600);
    let producer = capture::producer(&brokers)?;
    publish_records_at(&producer, &registry, None).await?;
    let n = registry.len() as u64;
    crate::demo::wait_until(&gw, deadline(), |s| s.counters.devices_applied >= n && s.counters.pending_records == 0)
        .await?;
    say(format!("{mode:?}: registry of {n} printers applied"));

    // The fleet.
    let done = Arc::new(AtomicU64::new(0));
    let mut fleet_handle = None;
    let mut pollers = Vec::new();
    let spread = Duration::from_millis(cfg.poll_ms) / cfg.printers.max(1) as u32;
    let printed = |done: &Arc<AtomicU64>| {
        let done = done.clone();
        move |e: &Event| {
            if matches!(e, Event::Printed { .. }) {
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    match mode {
        Mode::Http | Mode::StarMqtt => {
            let url = format!("https://{cloudprnt_listen}/cloudprnt");
            for (i, id) in ids.iter().enumerate() {
                let printer = CloudPrinter::new(CloudPrntOptions {
                    url: url.parse()?,
                    mac: mac(i),
                    out: work.join("printers").join(id),
                    auth: Some(BasicAuth { user: id.clone(), password: secrets[id].clone() }),
                    ca: Some(pki.ca_cert()),
                    poll: Duration::from_millis(cfg.poll_ms),
                    state_file: None,
                    skip_confirm: 0,
                    paper_mm: 80,
                    confirm_delay: std::time::Duration::ZERO,
                })?;
                let mut report = printed(&done);
                pollers.push(tokio::spawn(async move {
                    tokio::time::sleep(spread * i as u32).await;
                    if mode == Mode::Http {
                        printer.run(&mut report).await;
                    } else {
                        simulators::cloudprnt_mqtt::run(printer, CloudPrntMqttOptions::default(), &mut report).await;
                    }
                }));
            }
            if mode == Mode::StarMqtt {
                crate::demo::wait_until(&gw, deadline(), |s| s.counters.mqtt_connected >= n).await?;
                tokio::time::sleep(Duration::from_secs(2)).await;
            } else {
                // One whole interval for every printer to have polled, and one more for the
                // connections to settle.
                tokio::time::sleep(Duration::from_millis(2 * cfg.poll_ms + 1_000)).await;
            }
        }
        Mode::Sdp => {
            let url = format!("https://{cloudprnt_listen}/sdp");
            for (i, id) in ids.iter().enumerate() {
                let printer = SdpPrinter::new(SdpOptions {
                    url: url.parse()?,
                    id: id.clone(),
                    credentials: BasicAuth { user: id.clone(), password: secrets[id].clone() },
                    ca: Some(pki.ca_cert()),
                    poll: Duration::from_millis(cfg.poll_ms),
                    paper_mm: 80,
                    out: work.join("printers").join(id),
                    skip_confirm: 0,
                    status_every: None,
                })?;
                let mut report = printed(&done);
                pollers.push(tokio::spawn(async move {
                    tokio::time::sleep(spread * i as u32).await;
                    printer.run(&mut report).await;
                }));
            }
            tokio::time::sleep(Duration::from_millis(2 * cfg.poll_ms + 1_000)).await;
        }
        Mode::Mqtt => {
            let stats = Arc::new(Stats::counting_only(None));
            let identity = DeviceIdentity::Secret { secrets: Arc::new(secrets.clone()) };
            let handle = fleet::start_with_options(
                FleetConfig {
                    mqtt_host: "127.0.0.1".into(),
                    mqtt_port: settings.mqtt_port,
                    out_dir: work.join("printers"),
                    devices: devices_from_records(&registry),
                    security: MqttSecurity::Tls { ca: pki.ca_cert(), identity },
                },
                FleetOptions { rendering: Rendering::Verify, stats, ..FleetOptions::default() },
            )
            .await?;
            crate::demo::wait_until(&gw, deadline(), |s| s.counters.mqtt_connected >= n).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            fleet_handle = Some(handle);
        }
    }
    say(format!("{mode:?}: {n} printers up"));

    // Idle.
    let pid = gw.pid();
    let cpu = || crate::cpu::process(pid).context("pixgate's CPU time");
    let polls = |gw: &GatewayProcess| gw.stats().map(|s| s.counters.cloudprnt_polls + s.counters.sdp_polls);
    let (c0, p0, t0) = (cpu()?, polls(&gw)?, Instant::now());
    tokio::time::sleep(Duration::from_secs(cfg.idle_seconds)).await;
    let (c1, p1) = (cpu()?, polls(&gw)?);
    report.idle_wall = t0.elapsed();
    report.idle_cpu = c1.saturating_sub(c0);
    report.idle_polls = p1 - p0;
    say(format!("{mode:?}: idle {:.1} s, {} polls", report.idle_wall.as_secs_f64(), report.idle_polls));

    // Load.
    let template = crate::charges::template(&crate::demo::default_fixtures());
    let total = (cfg.rate * cfg.load_seconds as f64).round() as usize;
    let (c0, t0) = (cpu()?, Instant::now());
    let tick = Duration::from_secs_f64(1.0 / cfg.rate.max(0.001));
    for k in 0..total {
        let due = t0 + tick * k as u32;
        tokio::time::sleep_until(due.into()).await;
        publish_records_at(&producer, &[paid_charge(&template, k, cfg.printers, t)], None).await?;
    }
    let want = total as u64;
    crate::demo::wait_until(&gw, deadline(), |s| s.counters.effects_done.get("print_receipt").copied() >= Some(want))
        .await?;
    report.load_wall = t0.elapsed();
    report.load_cpu = cpu()?.saturating_sub(c0);
    let end = gw.stats()?.counters;
    report.jobs = end.effects_done.get("print_receipt").copied().unwrap_or(0);
    report.refusals = end.cloudprnt_refusals;
    report.rss_kib = gw.memory_kib().map(|(rss, _)| rss).unwrap_or(0);
    if mode != Mode::Mqtt {
        say(format!("{mode:?}: {} receipts printed by the simulated printers", done.load(Ordering::Relaxed)));
    }
    for p in pollers {
        p.abort();
    }
    if let Some(f) = fleet_handle {
        f.shutdown().await;
    }
    drop(gw);
    drop(broker);
    Ok(report)
}

/// The default working folder.
pub fn default_work_dir() -> PathBuf {
    std::env::temp_dir().join(format!("cloudprnt-bench-{}", std::process::id()))
}

/// Whether `path` is a release build (the figures of a debug build mean little).
pub fn is_release(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "release")
}
