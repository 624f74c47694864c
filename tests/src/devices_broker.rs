//! Debian's `mosquitto` as the devices' broker of the central shape (pixgate's `broker`
//! settings), configured by `pixgate devices broker-config mosquitto`: TLS only, two
//! listeners. The devices' listener takes certificates from a fleet CA made by pixgate's own
//! provisioning (CN = username = client id) and an ACL that keeps each device to its own
//! topics; pixgate's listener takes only certificates of a gateway CA of its own, and its
//! ACL lets pixgate's identity publish every device's jobs and read every device's acks and
//! status. `docs/operations.md` shows the same configuration.

use crate::harness::{fleet_connect_timeout, verifying_devices, Rig};
use crate::mosquitto::{Broker, ClientAuth};
use crate::net::free_port;
use crate::pki;
use crate::scenario::{self, Plan};
use simulators::capture::{Position, PIXGATE_TOPICS};
use simulators::device::Stats;
use simulators::device::{DeviceIdentity, MqttSecurity};
use simulators::fleet::FleetConfig;
use simulators::fleet::{self, FleetHandle};
use simulators::registry::DeviceSpec;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;
use tokio::task::JoinHandle;

/// The identity (certificate CN, MQTT username) of pixgate's connections to the broker.
pub const GATEWAY_IDENTITY: &str = "pixgate-gateway";
/// Longest wait for the broker to listen.
const WAIT: Duration = Duration::from_secs(30);

/// Whether pixgate's log `log` says its jobs connection to the broker was lost.
pub fn jobs_connection_lost(log: &str) -> bool {
    log.lines().any(|l| l.contains("a connection to the devices' broker was lost") && l.contains("connection=\"jobs\""))
}

/// A generated scenario running on pixgate with the devices on a [`DevicesBroker`]
/// ([`DevicesBroker::run_scenario`]).
pub struct Running {
    /// What the verifying devices carried out.
    pub stats: Arc<Stats>,
    /// The devices.
    pub fleet: FleetHandle,
    /// Where the registry's records are on `device.upserted`.
    pub device_positions: Vec<Position>,
    /// When the scenario must be over: 4 min plus 60 ms per charge event.
    pub deadline: Instant,
    /// Publishes the charge events keeping up with the devices; returns where they are.
    pub feeder: JoinHandle<anyhow::Result<Vec<Position>>>,
}

/// A fleet CA with certificates for some devices, a gateway CA with pixgate's, and the
/// configuration `pixgate devices broker-config mosquitto` writes for them, on two free
/// loopback ports (the devices' listener and pixgate's). Start (and restart) the broker
/// with [`DevicesBroker::start`]; each start gets a folder of its own (`mosquitto-N/`).
pub struct DevicesBroker {
    dir: PathBuf,
    port: u16,
    gateway_port: u16,
    /// The Star printers' listener, when asked for.
    printers_port: Option<u16>,
    pki: pki::Fleet,
    gateway_pki: pki::Fleet,
    config: String,
    starts: usize,
}

impl DevicesBroker {
    /// Writes the fleet CA with a certificate per id of `devices`, the gateway CA with one
    /// for [`GATEWAY_IDENTITY`], and the broker's configuration as the `pixgate` binary
    /// writes it, under `dir` (replaced).
    ///
    /// # Panics
    /// A file cannot be written, a device id is not one, or `pixgate devices broker-config`
    /// failed.
    pub fn prepare(dir: &Path, devices: &[DeviceSpec]) -> DevicesBroker {
        DevicesBroker::prepare_with_printers(dir, devices, &[])
    }

    /// [`DevicesBroker::prepare`], with a third listener for Star printers on CloudPRNT's
    /// MQTT method when `star_printers` (device id, MAC) is not empty: user name and
    /// password (the file [`DevicesBroker::printers_password_file`], which
    /// `pixgate devices credentials issue ID --mosquitto-passwd` fills before the broker
    /// starts), each printer its own MAC's topics.
    ///
    /// # Panics
    /// As [`DevicesBroker::prepare`].
    pub fn prepare_with_printers(dir: &Path, devices: &[DeviceSpec], star_printers: &[(&str, &str)]) -> DevicesBroker {
        let _ = std::fs::remove_dir_all(dir);
        let ids: Vec<&str> = devices.iter().map(|d| d.id()).collect();
        let pki = pki::Fleet::create_without_other(&dir.join("pki"), &ids)
            .unwrap_or_else(|e| panic!("making the fleet CA in {}: {e:#}", dir.display()));
        let gateway_pki = pki::Fleet::create_without_other(&dir.join("gateway-pki"), &[GATEWAY_IDENTITY])
            .unwrap_or_else(|e| panic!("making the gateway CA in {}: {e:#}", dir.display()));
        let (port, gateway_port) = (free_port(), free_port());
        let out = dir.join("broker");
        let bin = crate::gateway::find_binary().unwrap_or_else(|e| panic!("{e:#}"));
        let (devices_listener, gateway_listener) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{gateway_port}"));
        let args = [
            "devices",
            "broker-config",
            "mosquitto",
            "--ca",
            &pki.dir().display().to_string(),
            "--gateway-ca",
            &gateway_pki.dir().display().to_string(),
            "--out",
            &out.display().to_string(),
            "--devices-listener",
            &devices_listener,
            "--gateway-listener",
            &gateway_listener,
            "--gateway-identity",
            GATEWAY_IDENTITY,
        ];
        let mut args: Vec<String> = args.map(String::from).to_vec();
        let printers_port = (!star_printers.is_empty()).then(free_port);
        if let Some(port) = printers_port {
            let list = dir.join("star-printers");
            let lines: Vec<String> = star_printers.iter().map(|(id, mac)| format!("{id} {mac}")).collect();
            std::fs::write(&list, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{}: {e}", list.display()));
            args.extend(["--printers-listener".to_string(), format!("127.0.0.1:{port}")]);
            args.extend(["--star-printers".to_string(), list.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stdout, stderr) = crate::gateway::cli(&bin, free_port(), &args, &[]);
        assert!(ok, "pixgate devices broker-config mosquitto: {stdout}{stderr}");
        let conf = out.join("mosquitto.conf");
        let config = std::fs::read_to_string(&conf).unwrap_or_else(|e| panic!("reading {}: {e}", conf.display()));
        DevicesBroker { dir: dir.to_path_buf(), port, gateway_port, printers_port, pki, gateway_pki, config, starts: 0 }
    }

    /// Starts mosquitto (again) on the port, logging connections only.
    ///
    /// # Panics
    /// It did not start or listen (its log is in the message).
    pub async fn start(&mut self) -> Broker {
        self.starts += 1;
        let dir = self.dir.join(format!("mosquitto-{}", self.starts));
        Broker::start_logging(&dir, &self.config, self.port, WAIT, false).await.unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// The `PIXGATE_BROKER__*` settings that make pixgate use this broker's listener of
    /// its own with its gateway-CA certificate.
    pub fn gateway_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("PIXGATE_BROKER__HOST", "127.0.0.1".to_string()),
            ("PIXGATE_BROKER__PORT", self.gateway_port.to_string()),
            ("PIXGATE_BROKER__TLS__CA", self.pki.ca_cert().display().to_string()),
            ("PIXGATE_BROKER__TLS__CERT", self.gateway_pki.device_cert(GATEWAY_IDENTITY).display().to_string()),
            ("PIXGATE_BROKER__TLS__KEY", self.gateway_pki.device_key(GATEWAY_IDENTITY).display().to_string()),
        ]
    }

    /// A rig whose pixgate runs the central shape in one process (`cluster.enabled`) on
    /// this broker, named `name`, on [`central_topics`]`(device_jobs)`.
    pub async fn central_rig(&self, name: &str, device_jobs: (&'static str, i32)) -> Rig {
        Rig::builder(name)
            .topics(&central_topics(device_jobs))
            .envs(self.gateway_env())
            .env("PIXGATE_CLUSTER__ENABLED", "true")
            .env("PIXGATE_CLUSTER__DEVICE_JOBS_TOPIC", device_jobs.0)
            .env("PIXGATE_CLUSTER__DEVICE_JOB_PARTITIONS", device_jobs.1.to_string())
            .start()
            .await
    }

    /// Replica `r`'s settings on this broker in the central shape, on the device-jobs topic
    /// `device_jobs` (name, partitions): [`DevicesBroker::gateway_env`], `cluster.enabled`,
    /// and jobs and acks client ids of its own (one client id holds one connection at a
    /// time; the partition connections' ids are shared, which is the fence).
    pub fn replica_env(&self, r: usize, device_jobs: (&str, i32)) -> Vec<(&'static str, String)> {
        let mut env = self.gateway_env();
        env.extend([
            ("PIXGATE_CLUSTER__ENABLED", "true".to_string()),
            ("PIXGATE_CLUSTER__DEVICE_JOBS_TOPIC", device_jobs.0.to_string()),
            ("PIXGATE_CLUSTER__DEVICE_JOB_PARTITIONS", device_jobs.1.to_string()),
            ("PIXGATE_BROKER__CLIENT_ID", format!("pixgate-r{r}-jobs")),
            ("PIXGATE_BROKER__ACKS_CLIENT_ID", format!("pixgate-r{r}-acks")),
        ]);
        env
    }

    /// pixgate's listener's port.
    pub fn gateway_port(&self) -> u16 {
        self.gateway_port
    }

    /// Adds a copy of pixgate's listener on a port of its own (the same CA, ACL and
    /// settings) and returns the port: replicas each on their own listener let the broker's
    /// log tell which replica holds a connection (`New connection from … on port P`).
    /// Takes effect at the next [`DevicesBroker::start`].
    ///
    /// # Panics
    /// The generated configuration has no listener on [`DevicesBroker::gateway_port`].
    pub fn add_gateway_listener(&mut self) -> u16 {
        let head = format!("listener {} ", self.gateway_port);
        let at = self.config.find(&head).unwrap_or_else(|| panic!("no `{head}` block in the broker's configuration"));
        let block: String = self.config[at..].split("\n\n").next().unwrap_or_default().to_string();
        let port = free_port();
        let copy = block.replacen(&head, &format!("listener {port} "), 1);
        self.config.push_str(&format!("\n{copy}\n"));
        port
    }

    /// A fleet of `devices` on this broker, each with its certificate, writing into `out`.
    pub fn fleet_config(&self, devices: Vec<DeviceSpec>, out: &Path) -> FleetConfig {
        FleetConfig {
            mqtt_host: "127.0.0.1".into(),
            mqtt_port: self.port,
            out_dir: out.to_path_buf(),
            devices,
            security: MqttSecurity::Tls {
                ca: self.pki.ca_cert(),
                identity: DeviceIdentity::Certificate { dir: self.pki.devices_dir() },
            },
        }
    }

    /// The devices' listener's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// How `mosquitto_pub`/`mosquitto_sub` connect with `id`'s certificate.
    pub fn client_auth(&self, id: &str) -> ClientAuth {
        ClientAuth::certificate(&self.pki.ca_cert(), &self.pki.device_cert(id), &self.pki.device_key(id))
    }

    /// How `mosquitto_pub`/`mosquitto_sub` connect as pixgate: its gateway-CA certificate
    /// (connect to [`DevicesBroker::gateway_port`]).
    pub fn gateway_client_auth(&self) -> ClientAuth {
        ClientAuth::certificate(
            &self.pki.ca_cert(),
            &self.gateway_pki.device_cert(GATEWAY_IDENTITY),
            &self.gateway_pki.device_key(GATEWAY_IDENTITY),
        )
    }

    /// The Star printers' listener's port ([`DevicesBroker::prepare_with_printers`]).
    pub fn printers_port(&self) -> Option<u16> {
        self.printers_port
    }

    /// The printers' mosquitto password file (`passwd-printers` beside the configuration).
    pub fn printers_password_file(&self) -> PathBuf {
        self.dir.join("broker").join("passwd-printers")
    }

    /// The broker's server certificate and key (of the fleet CA, for 127.0.0.1): what
    /// another TLS server of the test may present to clients that trust only that CA.
    pub fn server_cert_and_key(&self) -> (PathBuf, PathBuf) {
        (self.pki.server_cert(), self.pki.server_key())
    }

    /// The fleet CA's certificate (what a client without a certificate of its own trusts).
    pub fn ca_cert(&self) -> PathBuf {
        self.pki.ca_cert()
    }

    /// Starts `plan`'s devices on this broker (each with its certificate, verifying what
    /// it carries out), publishes the registry to `rig` and waits until pixgate applied it,
    /// then feeds the charge events as a shop produces them, in a task.
    ///
    /// # Panics
    /// The fleet did not connect, or the registry was not applied in time.
    pub async fn run_scenario(&self, rig: &Rig, plan: &Arc<Plan>) -> Running {
        let stats = Arc::new(Stats::default());
        let cfg = self.fleet_config(plan.devices.clone(), &rig.dir().join("devices"));
        let fleet = fleet::start_with_options(cfg, verifying_devices(&stats)).await.unwrap_or_else(|e| panic!("{e:#}"));
        fleet.wait_connected(fleet_connect_timeout(plan.devices.len())).await.unwrap_or_else(|e| panic!("{e:#}"));
        let producer = rig.producer();
        let device_positions =
            scenario::publish_registry(&producer, plan, rig.gateway()).await.unwrap_or_else(|e| panic!("{e:#}"));
        let events = plan.charges.len() as u64;
        let deadline = Instant::now() + Duration::from_secs(240) + Duration::from_millis(60 * events);
        let feeder = {
            let (plan, stats) = (plan.clone(), stats.clone());
            tokio::spawn(async move { scenario::feed_keeping_up(&producer, &plan, stats, deadline).await })
        };
        Running { stats, fleet, device_positions, deadline, feeder }
    }

    /// Removes the folder (certificates, broker logs).
    pub fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The central shape's topics: those of [`PIXGATE_TOPICS`], the device-jobs topic
/// `device_jobs` (name, partitions), its delivery log with as many partitions, and the
/// route changelog with as many as `charge.upserted`.
pub fn central_topics(device_jobs: (&'static str, i32)) -> Vec<(&'static str, i32)> {
    let mut topics = PIXGATE_TOPICS.to_vec();
    let charge = topics.iter().find(|(t, _)| *t == "charge.upserted").map_or(1, |(_, n)| *n);
    topics.extend([device_jobs, ("pixgate.delivery-log", device_jobs.1), ("pixgate.route-changelog", charge)]);
    topics
}
