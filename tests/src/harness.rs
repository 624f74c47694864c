//! The rig every end-to-end test stands on: a fresh Kafka-protocol broker with pixgate's
//! topics, the `pixgate` binary running on it, and simulated devices on its MQTT broker,
//! all under one scratch folder. A test builds one, plays its scenario, and shuts it down:
//!
//! ```no_run
//! # async fn example() {
//! use pixgate_tests::harness::{replay_devices, Rig};
//! let fixtures = pixgate_tests::demo::default_fixtures();
//! let rig = Rig::builder("example").envs(pixgate_tests::replay_clock_env(&fixtures)).start().await;
//! let fleet = rig.start_fleet(pixgate_tests::fixture_devices(&fixtures), replay_devices()).await;
//! rig.publish_registry_file(&fixtures.join("devices.jsonl")).await; // devices first
//! // ... publish charge events, kill and restart pixgate (`rig.kill_gateway()`,
//! // `rig.start_gateway()`), wait on `/stats` (`rig.wait_stats(…)`), check the devices ...
//! let report = fleet.shutdown().await;
//! rig.shutdown();
//! # }
//! ```
//!
//! What a rig is made of, each part in its own module: [`crate::broker`] (tansu, killable
//! and restartable on the same storage), [`crate::gateway`] (the `pixgate` child process,
//! configured through `PIXGATE_*` variables), `simulators::fleet` (devices as in-process
//! MQTT clients). Names derive from the test's: scratch folder
//! `$TMPDIR/pixgate-{name}-{pid}`, consumer group `pixgate-{name}`.
//!
//! The rig owns the broker and the gateway process; the test owns its fleets, because
//! devices come and go within a scenario (a card machine going offline is its fleet shut
//! down) and a fleet's shutdown returns the report the test checks.
//!
//! Everything here panics on failure, with what failed and where the logs are: these are
//! test steps, and a failed step fails the test. On a failure the scratch folder is kept
//! (pixgate's and the broker's logs are there); [`Rig::shutdown`] removes it.

use crate::broker::KafkaBroker;
use crate::gateway::{self, GatewayProcess, GatewaySettings, StatsReport};
use crate::net::free_port;
use rdkafka::producer::FutureProducer;
use simulators::capture;
use simulators::device::{Rendering, Stats};
use simulators::fleet::{self, FleetConfig, FleetHandle, FleetOptions};
use simulators::registry::DeviceSpec;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long `pixgate` may take to answer `/readyz` 200 after it is spawned.
pub const GATEWAY_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long pixgate may take to apply a registry file published by
/// [`Rig::publish_registry_file`].
pub const REGISTRY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a fleet of `n` devices may take to connect and subscribe: 30 s, plus 60 ms per
/// device (500 devices connect in well under a minute on 2 shared cores).
pub fn fleet_connect_timeout(n: usize) -> Duration {
    Duration::from_secs(30) + Duration::from_millis(60 * n as u64)
}

/// Devices that behave as the protocol says and draw every job (PNG and transcript): they
/// refuse a job whose `expires_at` has passed by their own clock. `FleetOptions::default()`.
pub fn protocol_devices() -> FleetOptions {
    FleetOptions::default()
}

/// Devices for a fixture replay (pixgate's clock set back by [`crate::replay_clock_env`]):
/// as [`protocol_devices`], but they do not refuse jobs by `expires_at`, which their real
/// clock would find long past; pixgate enforces the time to live by its replay clock.
pub fn replay_devices() -> FleetOptions {
    FleetOptions { honor_expiry: false, ..FleetOptions::default() }
}

/// Polls `done` every 100 ms until it holds: for a state another process reaches later
/// (a file it writes, a queue it drains).
///
/// # Panics
/// `done` did not hold within `timeout` (the message names `what`).
pub async fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Devices for generated scenarios: they honour `expires_at`, check each payload without
/// drawing it (`Rendering::Verify`, cheap enough for hundreds of devices), and count what
/// they carry out into `stats`, which the test reads while the scenario runs.
pub fn verifying_devices(stats: &Arc<Stats>) -> FleetOptions {
    FleetOptions { rendering: Rendering::Verify, stats: stats.clone(), ..FleetOptions::default() }
}

/// What a [`Rig`] is started with; from [`Rig::builder`].
#[derive(Debug, Clone)]
pub struct RigBuilder {
    name: String,
    topics: Vec<(&'static str, i32)>,
    env: Vec<(&'static str, String)>,
    ack_timeout_ms: u64,
}

impl RigBuilder {
    /// One more `PIXGATE_*` setting for every start of the gateway (applied after the rig's
    /// own, so it overrides them: e.g. `("PIXGATE_KAFKA__INSTANCE_ID", "")` for dynamic
    /// group membership).
    pub fn env(mut self, key: &'static str, value: impl Into<String>) -> RigBuilder {
        self.env.push((key, value.into()));
        self
    }

    /// [`RigBuilder::env`] for each pair, e.g. [`crate::replay_clock_env`]'s.
    pub fn envs(mut self, pairs: impl IntoIterator<Item = (&'static str, String)>) -> RigBuilder {
        self.env.extend(pairs);
        self
    }

    /// The topics to create (name, partitions) instead of `capture::PIXGATE_TOPICS`: e.g.
    /// without `pixgate.deadletter`, so that pixgate cannot write a dead letter yet.
    pub fn topics(mut self, topics: &[(&'static str, i32)]) -> RigBuilder {
        self.topics = topics.to_vec();
        self
    }

    /// Starts the broker in a fresh scratch folder (an earlier one of the same name is
    /// removed), creates the topics, and starts pixgate on them, ready (`/readyz` 200).
    ///
    /// # Panics
    /// The broker, the topics or pixgate could not be started (the error says which; the
    /// logs are in the scratch folder).
    pub async fn start(self) -> Rig {
        let dir = std::env::temp_dir().join(format!("pixgate-{}-{}", self.name, std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let broker = KafkaBroker::start(&dir.join("kafka"))
            .unwrap_or_else(|e| panic!("starting the Kafka broker in {}: {e:#}", dir.display()));
        capture::ensure_topics(broker.addr(), &self.topics)
            .await
            .unwrap_or_else(|e| panic!("creating topics {:?}: {e:#}", self.topics));
        let settings = GatewaySettings {
            brokers: broker.addr().to_string(),
            group_id: format!("pixgate-{}", self.name),
            mqtt_port: free_port(),
            http_port: free_port(),
            ack_timeout_ms: self.ack_timeout_ms,
            outbox_path: dir.join("data/outbox.redb"),
        };
        let bin = gateway::find_binary().unwrap_or_else(|e| panic!("{e:#}"));
        let mut rig = Rig { gateway: None, broker, dir, bin, settings, env: self.env, starts: 0 };
        rig.start_gateway();
        rig
    }
}

/// A broker, pixgate on it, and their scratch folder (see the module docs). Dropping it
/// kills pixgate and stops the broker, keeping the folder; [`Rig::shutdown`] also removes it.
pub struct Rig {
    // Declared first so that it is dropped (killed) before the broker it reads from.
    gateway: Option<GatewayProcess>,
    broker: KafkaBroker,
    dir: PathBuf,
    bin: PathBuf,
    settings: GatewaySettings,
    env: Vec<(&'static str, String)>,
    starts: usize,
}

impl Rig {
    /// A rig named `name` (scratch folder `pixgate-{name}-{pid}`, consumer group
    /// `pixgate-{name}`): topics `capture::PIXGATE_TOPICS`, device ack timeout 2 s
    /// (`delivery.ack_timeout_ms`), no extra settings.
    pub fn builder(name: &str) -> RigBuilder {
        RigBuilder {
            name: name.to_string(),
            topics: capture::PIXGATE_TOPICS.to_vec(),
            env: Vec::new(),
            ack_timeout_ms: 2_000,
        }
    }

    /// The scratch folder: `kafka/` (the broker's SQLite file and log), `data/outbox.redb`,
    /// `pixgate.log` (`pixgate-N.log` for the N-th restart), `devices/` (the simulators').
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The Kafka broker (to kill and restart it mid-scenario).
    pub fn broker(&self) -> &KafkaBroker {
        &self.broker
    }

    /// `HOST:PORT` of the broker, for `bootstrap.servers`.
    pub fn brokers(&self) -> &str {
        self.broker.addr()
    }

    /// The settings every start of the gateway gets (ports, consumer group, outbox path).
    pub fn settings(&self) -> &GatewaySettings {
        &self.settings
    }

    /// The `pixgate` binary the rig runs (also the operator's CLI: `pixgate outbox list`).
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// An idempotent producer on the rig's broker (`capture::producer`).
    ///
    /// # Panics
    /// librdkafka refuses the configuration.
    pub fn producer(&self) -> FutureProducer {
        capture::producer(self.brokers()).expect("a Kafka producer")
    }

    /// The running gateway.
    ///
    /// # Panics
    /// It was killed or stopped and not started again.
    pub fn gateway(&self) -> &GatewayProcess {
        self.gateway.as_ref().expect("pixgate is not running: call Rig::start_gateway")
    }

    /// Starts pixgate (again) with the rig's settings, on the same outbox and consumer group,
    /// and waits until `/readyz` is 200. Its log is `pixgate.log` the first time and
    /// `pixgate-N.log` for the N-th restart.
    ///
    /// # Panics
    /// One is still running (kill or stop it first), or it did not get ready within
    /// [`GATEWAY_READY_TIMEOUT`].
    pub fn start_gateway(&mut self) -> &GatewayProcess {
        assert!(self.gateway.is_none(), "pixgate is already running: kill or stop it first");
        let log = match self.starts {
            0 => self.dir.join("pixgate.log"),
            n => self.dir.join(format!("pixgate-{n}.log")),
        };
        self.starts += 1;
        let env: Vec<(&str, String)> = self.env.iter().map(|(k, v)| (*k, v.clone())).collect();
        let gw = GatewayProcess::spawn_with_env(&self.bin, self.settings.clone(), &env, &log, GATEWAY_READY_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e:#}"));
        self.gateway.insert(gw)
    }

    /// SIGKILL to pixgate: it dies at once, mid-whatever it was doing (a crash).
    ///
    /// # Panics
    /// It is not running.
    pub fn kill_gateway(&mut self) {
        self.gateway.take().expect("pixgate is not running").kill();
    }

    /// SIGTERM to pixgate, then SIGKILL if it has not exited within `grace`. Returns whether
    /// it exited on its own with status 0.
    ///
    /// # Panics
    /// It is not running.
    pub fn stop_gateway(&mut self, grace: Duration) -> bool {
        self.gateway.take().expect("pixgate is not running").stop(grace)
    }

    /// Polls pixgate's `/stats` (every 20 ms, printing progress) until `done` holds.
    ///
    /// # Panics
    /// `timeout` passed first (the last stats are in the message), or `/stats` did not answer.
    pub async fn wait_stats(&self, timeout: Duration, done: impl Fn(&StatsReport) -> bool) {
        crate::demo::wait_until(self.gateway(), Instant::now() + timeout, done)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// Where devices of this rig connect, and write into `devices/{id}/`.
    pub fn fleet_config(&self, devices: Vec<DeviceSpec>) -> FleetConfig {
        FleetConfig {
            mqtt_host: "127.0.0.1".into(),
            mqtt_port: self.settings.mqtt_port,
            out_dir: self.dir.join("devices"),
            devices,
            security: simulators::device::MqttSecurity::Plain,
        }
    }

    /// Starts one simulated device per spec on pixgate's MQTT broker and waits until every
    /// one is connected and subscribed to its jobs topic ([`fleet_connect_timeout`]).
    ///
    /// # Panics
    /// The output folder cannot be created, or some device did not connect (named).
    pub async fn start_fleet(&self, devices: Vec<DeviceSpec>, options: FleetOptions) -> FleetHandle {
        let timeout = fleet_connect_timeout(devices.len());
        let fleet = fleet::start_with_options(self.fleet_config(devices), options)
            .await
            .unwrap_or_else(|e| panic!("starting the device fleet: {e:#}"));
        fleet.wait_connected(timeout).await.unwrap_or_else(|e| panic!("{e:#}"));
        fleet
    }

    /// Connects `device` once and disconnects it cleanly: its retained status then says
    /// `{"online":false}`, so pixgate knows it is away and queues its jobs until it is back.
    ///
    /// # Panics
    /// As [`Rig::start_fleet`].
    pub async fn connect_and_leave(&self, device: DeviceSpec) {
        self.start_fleet(vec![device], protocol_devices()).await.shutdown().await;
    }

    /// Publishes a new ACTIVE charge on card machine `terminal` (of the fixtures' charge
    /// template's company), its id made from `n`, dated now and expiring in an hour.
    /// Returns the record.
    ///
    /// # Panics
    /// The fixtures cannot be read, or the publish failed.
    pub async fn publish_charge(&self, terminal: &str, n: u64) -> capture::CaptureRecord {
        let tpl = crate::charges::template(&crate::demo::default_fixtures());
        let t = chrono::Utc::now().timestamp() as u64;
        let rec = crate::charges::charge_record(&tpl, terminal, &format!("{n:024x}"), "ACTIVE", 0, 60, t);
        capture::publish_records(&self.producer(), std::slice::from_ref(&rec))
            .await
            .unwrap_or_else(|e| panic!("publishing charge {n}: {e:#}"));
        rec
    }

    /// Publishes `records` of `charge.upserted` one at a time, each read (and nothing
    /// pending) before the next is sent: their jobs are queued in this order.
    ///
    /// # Panics
    /// A publish failed, or pixgate did not read a record within 30 s.
    pub async fn publish_charges_in_order(&self, records: &[capture::CaptureRecord]) {
        let producer = self.producer();
        let read_now = |s: &crate::gateway::StatsReport| s.counters.events_read.get("charge.upserted").copied();
        let before = self.gateway().stats().map(|s| read_now(&s).unwrap_or(0)).unwrap_or(0);
        for (r, read) in records.iter().zip(before + 1..) {
            capture::publish_records(&producer, std::slice::from_ref(r))
                .await
                .unwrap_or_else(|e| panic!("publishing a charge record: {e:#}"));
            self.wait_stats(Duration::from_secs(30), |s| read_now(s) == Some(read) && s.counters.pending_records == 0)
                .await;
        }
    }

    /// Replays the charge records `charges` keeping up, as the demo does: a batch without a
    /// repeated charge ([`crate::demo::batches_without_repeated_keys`]), then everything read
    /// (beyond the `before` records of any topic read already), committed, and no job left
    /// queued or in the outbox, before the next batch.
    ///
    /// # Panics
    /// A publish failed, or a batch was not done within `timeout`.
    pub async fn replay_charges_keeping_up(
        &self,
        charges: Vec<capture::CaptureRecord>,
        before: u64,
        timeout: Duration,
    ) {
        let producer = self.producer();
        let mut read = 0;
        for batch in crate::demo::batches_without_repeated_keys(charges) {
            read += capture::publish_records(&producer, &batch)
                .await
                .unwrap_or_else(|e| panic!("publishing charge records: {e:#}")) as u64;
            self.wait_stats(timeout, |s| {
                let c = &s.counters;
                crate::gateway::total(&c.events_read) >= before + read
                    && c.pending_records == 0
                    && c.queued_jobs == 0
                    && c.outbox_jobs == 0
            })
            .await;
        }
    }

    /// Publishes a registry file (`devices.jsonl` lines, `capture::publish_file`) and waits
    /// until pixgate has applied that many device records (`devices_applied` on `/stats`),
    /// as the contract asks before any charge event. Returns how many records it published.
    ///
    /// # Panics
    /// The file is unreadable, a publish failed, or pixgate did not apply them within
    /// [`REGISTRY_TIMEOUT`].
    pub async fn publish_registry_file(&self, path: &Path) -> u64 {
        let n = capture::publish_file(self.brokers(), path)
            .await
            .unwrap_or_else(|e| panic!("publishing {}: {e:#}", path.display())) as u64;
        self.wait_stats(REGISTRY_TIMEOUT, |s| s.counters.devices_applied >= n).await;
        n
    }

    /// Stops everything and removes the scratch folder (kept with `PIXGATE_KEEP_RIG` set,
    /// to read the logs of a run whose checks fail after it): pixgate (SIGTERM, SIGKILL
    /// after 10 s), then the broker. Shut the fleets down first: a device leaves cleanly
    /// through pixgate's MQTT broker.
    pub fn shutdown(mut self) {
        if let Some(mut gw) = self.gateway.take() {
            gw.stop(Duration::from_secs(10));
        }
        self.broker.stop();
        if std::env::var_os("PIXGATE_KEEP_RIG").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("logs kept in {} (pixgate*.log, kafka/broker.log)", self.dir.display());
        }
    }
}

/// Waits until `device` of `fleet` has carried out an effect of the charge of `rec`.
///
/// # Panics
/// Not within `timeout`.
pub async fn wait_done_by(fleet: &FleetHandle, device: &str, rec: &capture::CaptureRecord, timeout: Duration) {
    let charge = rec.key.clone().unwrap_or_default();
    let deadline = Instant::now() + timeout;
    while !fleet.effects().iter().any(|e| e.device == device && e.charge == charge) {
        assert!(Instant::now() < deadline, "{device} never carried out charge {charge}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
