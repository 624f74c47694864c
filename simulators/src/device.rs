//! One simulated device (printer or card machine) on MQTT, speaking device-protocol v1.
//!
//! The device is one rumqttc client ([`crate::mqtt_link`], MQTT 3.1.1 or 5 as
//! [`DeviceOptions::protocol`] says) with client id `dev-{id}`, a persistent session
//! (`clean_session = false`; MQTT 5: clean start 0, kept a day), keep-alive 5 s and a last
//! will `{"v":1,"online":false}` (retained, QoS 1) on its status topic. Two tasks:
//!
//! - the **poll task** drives the `EventLoop` continuously. After every ConnAck it publishes
//!   the retained status `{"v":1,"online":true,"printer":"ready"}` (no `printer` field for a
//!   card machine; a printer reports its current [`PrinterState`], see
//!   [`DeviceHandle::set_printer_state`]) and subscribes to its jobs topic at QoS 1 (the
//!   only topic a device may subscribe to). It subscribes after every ConnAck, also when the
//!   broker resumed the session: a connection dropped right after its ConnAck leaves a
//!   resumed session without the subscription its SUBSCRIBE never delivered (a session has
//!   one subscription per filter, so subscribing again sends nothing twice). It is ready
//!   at the SUBACK. On a connection error it waits with exponential backoff and jitter
//!   (200 ms doubling to 5 s) and reconnects, forever, until shutdown. It never publishes
//!   itself (it spawns for that), so it cannot deadlock on rumqttc's request channel.
//! - the **worker** carries jobs out one at a time, in arrival order. Per job: a `message_id`
//!   already carried out is acked `done` with `duplicate: true` and nothing else happens;
//!   otherwise the job is carried out ([`crate::printer`], [`crate::terminal`]) and acked
//!   `done`, or `failed` with a reason (`permanent: true` for undecodable content, a wrong
//!   content type or an expired job). Every job's seq must be larger than the last new job's
//!   seq; violations are counted and logged. The MQTT PUBACK is sent only after the ack was
//!   published (manual acks), and only while the connection the job arrived on is still up,
//!   so a job that was received but not carried out is redelivered by the broker, and a
//!   PUBACK is never sent on a later connection (a broker may drop a connection that acks a
//!   packet id it did not send, e.g. after the gateway restarted).
//! - A printer whose state cannot print (`paper_out`, `cover_open`) refuses every job with
//!   `failed`, `permanent: false`, reason `paper_out`/`cover_open`, as a real printer's
//!   `DLE EOT` check would, and counts it ([`DeviceCounters::received_while_held`]): the
//!   gateway is supposed to send nothing while the status says so.
//!
//! [`Rendering`] says how much work a job costs: [`Rendering::Full`] draws every receipt
//! and screen to a PNG (the demo); [`Rendering::Verify`] only decodes and checks the
//! payload (content type, base64, `ESC @` for ESC/POS, the screen JSON and its BR Code's
//! CRC and amount) and writes nothing, so hundreds of devices fit in one test process.
//!
//! Shutdown (documented choice): the worker finishes the job it is on, then the device
//! publishes `{"v":1,"online":false}` retained itself and disconnects cleanly, so the last
//! will does not fire but the retained status still says offline.
//!
//! Security ([`MqttSecurity`]): plain TCP without credentials (loopback tests and demos),
//! or TLS (rustls on ring) verifying the broker against a CA file, the device proving who it
//! is with a client certificate (subject CN = device id) or with MQTT username = device id
//! and password = its secret. The TLS server name is the host given: a name, or an IP
//! address that the server certificate must carry as a SAN.
//!
//! The set of carried-out message ids lives in memory: a restarted simulator process forgets
//! it (like a printer losing power).

use crate::effect::{EffectRecord, JobError};
use crate::mqtt_link::{self, Client, Incoming, Link, LinkEvent, Protocol};
use crate::printer::{print_job, PrinterSettings};
use crate::registry::DeviceSpec;
use crate::terminal::{show_job, TerminalSettings};
use anyhow::Context;
use anyhow::Result;
use device_protocol::messages::CONTENT_ESCPOS;
use device_protocol::{Ack, Job, PrinterState, ScreenKind, Status, Topic};
use rumqttc::{TlsConfiguration, Transport};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Largest MQTT packet a device accepts or sends (receipts with raster QR codes are large).
pub const MAX_PACKET_BYTES: usize = 4 * 1024 * 1024;

/// Where and how a device connects.
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// MQTT broker host.
    pub mqtt_host: String,
    /// MQTT broker port.
    pub mqtt_port: u16,
    /// Output root; the device writes into `{out_dir}/{id}/`.
    pub out_dir: PathBuf,
    /// Refuse (ack `failed`, permanent) jobs whose `expires_at` has passed, as the protocol
    /// requires. Turn off to replay old fixtures.
    pub honor_expiry: bool,
    /// Plain TCP, or TLS with the device's credentials.
    pub security: MqttSecurity,
    /// The MQTT version it speaks.
    pub protocol: Protocol,
}

/// How a simulated device reaches the broker.
#[derive(Debug, Clone, Default)]
pub enum MqttSecurity {
    /// Plain TCP, no credentials (loopback tests and demos only).
    #[default]
    Plain,
    /// TLS (rustls, ring provider), verifying the broker's certificate against `ca`, and
    /// proving the device's identity with `identity`. The client id stays `dev-{id}`.
    Tls {
        /// The CA certificate(s) the broker's certificate must chain to (PEM file).
        ca: PathBuf,
        /// How the device proves who it is.
        identity: DeviceIdentity,
    },
}

/// How a device proves its identity to the broker over TLS.
#[derive(Clone)]
pub enum DeviceIdentity {
    /// A TLS client certificate (subject CN = device id) signed by the fleet CA:
    /// `{dir}/{id}.crt` (the certificate, then any intermediates) and `{dir}/{id}.key`
    /// (PKCS#8, PKCS#1 or SEC1 private key), PEM.
    Certificate {
        /// The folder holding every device's `{id}.crt` and `{id}.key`.
        dir: PathBuf,
    },
    /// MQTT username = device id, password = the device's secret (the server is
    /// authenticated by TLS; the device sends no certificate).
    Secret {
        /// Device id → secret. A device missing from it does not start.
        secrets: Arc<BTreeMap<String, String>>,
    },
}

impl std::fmt::Debug for DeviceIdentity {
    /// Never prints a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceIdentity::Certificate { dir } => f.debug_struct("Certificate").field("dir", dir).finish(),
            DeviceIdentity::Secret { secrets } => {
                f.debug_struct("Secret").field("devices", &secrets.len()).finish_non_exhaustive()
            }
        }
    }
}

impl DeviceIdentity {
    /// Reads a secrets file: one JSON object `{"<device id>": "<secret>", ...}`.
    ///
    /// # Errors
    /// The file cannot be read or is not such an object.
    pub fn secrets_from_json(path: &Path) -> Result<DeviceIdentity> {
        let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let secrets: BTreeMap<String, String> = serde_json::from_slice(&text)
            .with_context(|| format!("{}: not a JSON object of device id to secret strings", path.display()))?;
        Ok(DeviceIdentity::Secret { secrets: Arc::new(secrets) })
    }
}

/// The TLS client side of a fleet, built once for all its devices: the CA file parsed once,
/// and for [`DeviceIdentity::Secret`] one rustls configuration shared by every device (a
/// configuration per device cost 10,000 CA parses and configurations for a fleet of 10,000).
/// The shared configuration resumes no sessions, so no device resumes another's, and every
/// handshake is a full one, as after a broker restart.
#[derive(Clone)]
pub struct ClientTls {
    ca: PathBuf,
    roots: Arc<rustls::RootCertStore>,
    identity: DeviceIdentity,
    shared: Option<Arc<rustls::ClientConfig>>,
}

impl ClientTls {
    /// The TLS material for `security`; `None` for plain TCP.
    ///
    /// # Errors
    /// The CA file cannot be read or holds no usable certificate.
    pub fn new(security: &MqttSecurity) -> Result<Option<ClientTls>> {
        let MqttSecurity::Tls { ca, identity } = security else { return Ok(None) };
        let roots = Arc::new(ca_roots(ca)?);
        let mut tls = ClientTls { ca: ca.clone(), roots, identity: identity.clone(), shared: None };
        if let DeviceIdentity::Secret { .. } = identity {
            let mut config = tls.builder()?.with_no_client_auth();
            config.resumption = rustls::client::Resumption::disabled();
            tls.shared = Some(Arc::new(config));
        }
        Ok(Some(tls))
    }

    fn builder(&self) -> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>> {
        ring_client_builder(self.roots.clone())
    }

    /// The configuration device `id` connects with: the shared one, or one with the
    /// device's client certificate for [`DeviceIdentity::Certificate`].
    fn config_for(&self, id: &str) -> Result<Arc<rustls::ClientConfig>> {
        if let Some(shared) = &self.shared {
            return Ok(shared.clone());
        }
        let DeviceIdentity::Certificate { dir } = &self.identity else {
            anyhow::bail!("device {id}: no TLS identity (CA {})", self.ca.display())
        };
        let (crt, key) = (dir.join(format!("{id}.crt")), dir.join(format!("{id}.key")));
        let chain = CertificateDer::pem_file_iter(&crt)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .with_context(|| format!("device {id}: reading certificate {}", crt.display()))?;
        anyhow::ensure!(!chain.is_empty(), "device {id}: {} holds no certificate", crt.display());
        let key = PrivateKeyDer::from_pem_file(&key)
            .with_context(|| format!("device {id}: reading private key {}", key.display()))?;
        Ok(Arc::new(
            self.builder()?
                .with_client_auth_cert(chain, key)
                .with_context(|| format!("device {id}: client certificate"))?,
        ))
    }
}

/// The certificates of the PEM file `ca`, as the only roots a TLS client trusts.
///
/// # Errors
/// The file cannot be read or holds no usable certificate.
pub fn ca_roots(ca: &Path) -> Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).with_context(|| format!("reading CA file {}", ca.display()))? {
        let cert = cert.with_context(|| format!("CA file {}", ca.display()))?;
        roots.add(cert).with_context(|| format!("CA file {}: unusable certificate", ca.display()))?;
    }
    anyhow::ensure!(!roots.is_empty(), "CA file {} holds no certificate", ca.display());
    Ok(roots)
}

/// A rustls client configuration on the ring provider (the one crypto provider in the
/// build) verifying servers against `roots`, waiting for the client-authentication choice.
///
/// # Errors
/// The provider offers none of rustls's safe default protocol versions.
pub fn ring_client_builder(
    roots: Arc<rustls::RootCertStore>,
) -> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>> {
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots))
}

/// An MQTT username and password.
type Credentials = (String, String);

/// The rumqttc transport and credentials of device `id` under `tls` (`None`: plain TCP,
/// no credentials).
fn security_of(id: &str, tls: Option<&ClientTls>) -> Result<(Option<Transport>, Option<Credentials>)> {
    let Some(tls) = tls else { return Ok((None, None)) };
    let transport = Transport::tls_with_config(TlsConfiguration::Rustls(tls.config_for(id)?));
    let credentials = match &tls.identity {
        DeviceIdentity::Secret { secrets } => {
            let secret = secrets.get(id).with_context(|| format!("device {id}: no secret for it in the secrets"))?;
            Some((id.to_string(), secret.clone()))
        }
        DeviceIdentity::Certificate { .. } => None,
    };
    Ok((Some(transport), credentials))
}

/// How much a device does with a job it carries out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Rendering {
    /// Print the receipt or draw the screen to a PNG and append to the transcript.
    #[default]
    Full,
    /// Decode and check the payload only (content type, base64; ESC/POS starts with
    /// `ESC @`; a screen parses and a `pay_with_pix` BR Code passes
    /// `render::brcode::parse` with the screen's amount). Nothing is written; the effect's
    /// `file` is empty. For fleets of hundreds of devices in one process.
    Verify,
}

/// One job carried out, as streamed to [`Stats::with_sink`] (for latency measurements).
#[derive(Debug, Clone)]
pub struct Carried {
    /// Device id.
    pub device: String,
    /// Charge id.
    pub charge: String,
    /// Effect kind.
    pub kind: device_protocol::EffectKind,
    /// When the device had carried the job out (just before it publishes its `done` ack).
    pub done_at: Instant,
}

/// Counters and effects, shared by every device of a fleet (or owned by one device).
#[derive(Debug)]
pub struct Stats {
    raw_jobs: AtomicU64,
    raw_bytes: AtomicU64,
    duplicates: AtomicU64,
    order_violations: AtomicU64,
    failed: AtomicU64,
    malformed: AtomicU64,
    carried_out: AtomicU64,
    effects: Mutex<Vec<EffectRecord>>,
    /// Keep every [`EffectRecord`] (off: count only, for very long runs).
    keep_effects: bool,
    sink: Option<mpsc::UnboundedSender<Carried>>,
    /// The last [`ACK_LATENCIES_KEPT`] ack latencies, µs ([`Stats::ack_latency`]).
    ack_latencies_us: Mutex<std::collections::VecDeque<u32>>,
}

/// Ack latencies kept for [`Stats::ack_latency`].
const ACK_LATENCIES_KEPT: usize = 100_000;

impl Default for Stats {
    fn default() -> Self {
        Stats {
            raw_jobs: AtomicU64::new(0),
            raw_bytes: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            order_violations: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            carried_out: AtomicU64::new(0),
            effects: Mutex::new(Vec::new()),
            keep_effects: true,
            sink: None,
            ack_latencies_us: Mutex::default(),
        }
    }
}

/// A copy of [`Stats`] at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StatsSnapshot {
    /// Job publishes received, redeliveries included.
    pub raw_jobs: u64,
    /// Jobs whose message id had already been carried out (acked with `duplicate: true`).
    pub duplicates: u64,
    /// New jobs whose seq was not larger than the previous new job's seq on that device.
    pub order_violations: u64,
    /// Jobs acked `failed`.
    pub failed: u64,
    /// Job publishes that were not a valid [`Job`].
    pub malformed: u64,
    /// Jobs carried out.
    pub effects: u64,
}

impl Stats {
    /// Counters that keep no [`EffectRecord`] list (memory stays flat over millions of
    /// jobs) and stream each job carried out to `sink` if given.
    pub fn counting_only(sink: Option<mpsc::UnboundedSender<Carried>>) -> Stats {
        Stats { keep_effects: false, sink, ..Stats::default() }
    }

    /// Counters that keep every effect and also stream each to `sink`.
    pub fn with_sink(sink: mpsc::UnboundedSender<Carried>) -> Stats {
        Stats { sink: Some(sink), ..Stats::default() }
    }

    /// Every effect so far, in the order carried out (empty for [`Stats::counting_only`]).
    pub fn effects(&self) -> Vec<EffectRecord> {
        self.effects.lock().expect("effects lock").clone()
    }
    /// The effects from index `from` on (cheap polling of a growing list).
    pub fn effects_since(&self, from: usize) -> Vec<EffectRecord> {
        let all = self.effects.lock().expect("effects lock");
        all.get(from..).map(<[EffectRecord]>::to_vec).unwrap_or_default()
    }
    /// Ack latency, the median and the 99th percentile over the last 100,000 acks: from
    /// a device publishing its ack (QoS 1) to the broker's PUBACK for it, which pixgate
    /// sends once the gateway has taken the ack. `None` before the first.
    pub fn ack_latency(&self) -> Option<(Duration, Duration)> {
        let mut v: Vec<u32> = self.ack_latencies_us.lock().expect("latency lock").iter().copied().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let at = |q: f64| Duration::from_micros(u64::from(v[((v.len() - 1) as f64 * q).round() as usize]));
        Some((at(0.5), at(0.99)))
    }

    fn record_ack_latency(&self, d: Duration) {
        let mut v = self.ack_latencies_us.lock().expect("latency lock");
        if v.len() >= ACK_LATENCIES_KEPT {
            v.pop_front();
        }
        v.push_back(u32::try_from(d.as_micros()).unwrap_or(u32::MAX));
    }

    /// Jobs carried out so far.
    pub fn carried_out(&self) -> u64 {
        self.carried_out.load(Ordering::Relaxed)
    }
    /// Job publishes received, redeliveries included.
    pub fn raw_jobs(&self) -> u64 {
        self.raw_jobs.load(Ordering::Relaxed)
    }
    /// Bytes of the job publishes received (MQTT payloads), redeliveries included.
    pub fn raw_bytes(&self) -> u64 {
        self.raw_bytes.load(Ordering::Relaxed)
    }
    /// Duplicate jobs (already carried out).
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }
    /// Sequence violations.
    pub fn order_violations(&self) -> u64 {
        self.order_violations.load(Ordering::Relaxed)
    }
    /// All counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            raw_jobs: self.raw_jobs(),
            duplicates: self.duplicates(),
            order_violations: self.order_violations(),
            failed: self.failed.load(Ordering::Relaxed),
            malformed: self.malformed.load(Ordering::Relaxed),
            effects: self.carried_out(),
        }
    }

    fn record(&self, effect: EffectRecord) {
        self.carried_out.fetch_add(1, Ordering::Relaxed);
        if let Some(sink) = &self.sink {
            let _ = sink.send(Carried {
                device: effect.device.clone(),
                charge: effect.charge.clone(),
                kind: effect.kind,
                done_at: Instant::now(),
            });
        }
        if self.keep_effects {
            self.effects.lock().expect("effects lock").push(effect);
        }
    }
}

/// One device's own counters (a fleet's [`Stats`] sums all devices).
#[derive(Debug, Default)]
pub struct DeviceCounters {
    raw_jobs: AtomicU64,
    carried_out: AtomicU64,
    received_while_held: AtomicU64,
}

/// A copy of [`DeviceCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DeviceCountersSnapshot {
    /// Job publishes received, redeliveries included.
    pub raw_jobs: u64,
    /// Jobs carried out (new message ids).
    pub carried_out: u64,
    /// Jobs that arrived while the printer reported a state that cannot print (refused
    /// with a transient `failed` ack). A gateway honouring the status sends none.
    pub received_while_held: u64,
}

impl DeviceCounters {
    fn snapshot(&self) -> DeviceCountersSnapshot {
        DeviceCountersSnapshot {
            raw_jobs: self.raw_jobs.load(Ordering::Relaxed),
            carried_out: self.carried_out.load(Ordering::Relaxed),
            received_while_held: self.received_while_held.load(Ordering::Relaxed),
        }
    }
}

/// A running simulated device.
pub struct DeviceHandle {
    id: String,
    client: Client,
    ready: watch::Receiver<bool>,
    stop_worker: watch::Sender<bool>,
    stop_poll: watch::Sender<bool>,
    worker: JoinHandle<()>,
    poll: JoinHandle<()>,
    is_printer: bool,
    printer_state: Arc<watch::Sender<PrinterState>>,
    counters: Arc<DeviceCounters>,
    link: Arc<LinkState>,
}

/// What the poll task saw of the connection attempts (for [`DeviceHandle::connection_failures`]).
#[derive(Debug, Default)]
struct LinkState {
    failures: AtomicU64,
    /// Accepted CONNECTs (successful ConnAcks), the first one included.
    connects: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// QoS 1 publishes requested, counted before each request enters the client's queue
    /// ([`LinkState::publish`]).
    requested: AtomicU64,
    /// PUBACKs received.
    pubacks: AtomicU64,
    puback_seen: tokio::sync::Notify,
    /// Asks the poll task to cut the connection ([`DeviceHandle::drop_connection`]).
    cut: tokio::sync::Notify,
    /// Connections cut on request.
    cuts: AtomicU64,
}

impl LinkState {
    /// Requests a QoS 1 publish, counted first: once `pubacks` reaches the count read after
    /// the request returned, the broker has accepted this publish and every one queued
    /// before it (one PUBACK each, in order).
    async fn publish(&self, client: &Client, topic: String, retain: bool, payload: Vec<u8>) -> Result<u64> {
        self.requested.fetch_add(1, Ordering::SeqCst);
        client.publish(topic, retain, payload).await?;
        Ok(self.requested.load(Ordering::SeqCst))
    }

    /// Waits until `n` PUBACKs have been received.
    async fn pubacked(&self, n: u64) {
        loop {
            let seen = self.puback_seen.notified();
            if self.pubacks.load(Ordering::SeqCst) >= n {
                return;
            }
            seen.await;
        }
    }
}

impl DeviceHandle {
    /// The device's registry id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Connected and subscribed to its jobs topic right now.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Connection attempts (or live connections) that ended in an error so far: refused
    /// TLS handshakes, refused CONNECTs, dropped connections.
    pub fn connection_failures(&self) -> u64 {
        self.link.failures.load(Ordering::Relaxed)
    }

    /// Connections the broker accepted so far (successful ConnAcks, reconnects included).
    pub fn connects(&self) -> u64 {
        self.link.connects.load(Ordering::Relaxed)
    }

    /// Cuts the connection as a network failure would (no DISCONNECT: the broker sees the
    /// socket close and publishes the will); the device reconnects after a random 0.5–3 s,
    /// resuming its session. For churn in load runs ([`crate::fleet::FleetHandle::churn`]).
    pub fn drop_connection(&self) {
        self.link.cut.notify_one();
    }

    /// Connections cut by [`DeviceHandle::drop_connection`] so far.
    pub fn dropped_connections(&self) -> u64 {
        self.link.cuts.load(Ordering::Relaxed)
    }

    /// The last connection error, as rumqttc put it (e.g. a TLS alert from the broker).
    pub fn last_connection_error(&self) -> Option<String> {
        self.link.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// This device's own counters.
    pub fn counters(&self) -> DeviceCountersSnapshot {
        self.counters.snapshot()
    }

    /// The printer state the device reports now (`ready` for a card machine).
    pub fn printer_state(&self) -> PrinterState {
        *self.printer_state.borrow()
    }

    /// Waits until the device is connected and subscribed.
    ///
    /// # Errors
    /// Not ready within `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let mut rx = self.ready.clone();
        tokio::time::timeout(timeout, rx.wait_for(|r| *r))
            .await
            .map_err(|_| anyhow::anyhow!("device {} not connected after {timeout:?}", self.id))?
            .map_err(|_| anyhow::anyhow!("device {} stopped", self.id))?;
        Ok(())
    }

    /// Simulates the printer's condition changing (paper out, cover open, paper loaded):
    /// from now on the device reports `state` in its retained status
    /// `{"v":1,"online":true,"printer":state}` (also after every reconnect) and refuses jobs
    /// while `state` cannot print. Publishes the status and returns once the broker has
    /// accepted it (its PUBACK: the broker routes a publish to its subscribers, the
    /// gateway among them, before the next one it accepts from the device).
    ///
    /// # Errors
    /// Not a printer, the publish request failed, or no PUBACK within 10 s (not connected).
    pub async fn set_printer_state(&self, state: PrinterState) -> Result<()> {
        anyhow::ensure!(self.is_printer, "device {} is a card machine, not a printer", self.id);
        self.printer_state.send_replace(state);
        let status = Status { v: 1, online: true, printer: Some(state) };
        let payload = serde_json::to_vec(&status).expect("status serialises");
        let n = self.link.publish(&self.client, Topic::Status(self.id.clone()).path(), true, payload).await?;
        tokio::time::timeout(Duration::from_secs(10), self.link.pubacked(n))
            .await
            .map_err(|_| anyhow::anyhow!("device {}: status {state:?} not acknowledged within 10 s", self.id))?;
        Ok(())
    }

    /// Stops the device: finishes the current job, publishes offline status (retained) and
    /// disconnects cleanly. Bounded: gives up waiting after a few seconds.
    pub async fn shutdown(self) {
        let _ = self.stop_worker.send(true);
        let mut worker = self.worker;
        if tokio::time::timeout(Duration::from_secs(30), &mut worker).await.is_err() {
            tracing::warn!(device = %self.id, "worker did not stop in time");
            worker.abort();
        }
        let offline = status_payload(false, self.is_printer);
        let status_topic = Topic::Status(self.id.clone()).path();
        let connected = *self.ready.borrow();
        if connected {
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                self.link.publish(&self.client, status_topic, true, offline),
            )
            .await;
            let _ = tokio::time::timeout(Duration::from_secs(2), self.client.disconnect()).await;
        } else {
            let _ = self.stop_poll.send(true);
        }
        let mut poll = self.poll;
        if tokio::time::timeout(Duration::from_secs(3), &mut poll).await.is_err() {
            let _ = self.stop_poll.send(true);
            if tokio::time::timeout(Duration::from_secs(1), &mut poll).await.is_err() {
                poll.abort();
            }
        }
    }
}

/// The status JSON: `{"v":1,"online":..}` plus `"printer":"ready"` for an online printer.
pub fn status_payload(online: bool, is_printer: bool) -> Vec<u8> {
    status_payload_with(online, is_printer.then_some(PrinterState::Ready))
}

/// The status JSON of a device that is `online` and, for a printer, in `printer` state
/// (omitted when offline).
fn status_payload_with(online: bool, printer: Option<PrinterState>) -> Vec<u8> {
    let s = Status { v: 1, online, printer: printer.filter(|_| online) };
    serde_json::to_vec(&s).expect("status serialises")
}

/// What the device does with a job: print it or show it.
#[derive(Debug, Clone)]
enum Effector {
    Printer(PrinterSettings),
    Terminal(TerminalSettings),
}

/// Starts a simulated device; it connects in the background (see [`DeviceHandle::wait_ready`]).
/// Must be called inside a tokio runtime.
///
/// # Errors
/// [`MqttSecurity::Tls`] whose CA file, client certificate or key cannot be read, or no
/// secret for this device. (A broker that refuses the device is not an error here: the
/// device keeps retrying, see [`DeviceHandle::connection_failures`].)
pub fn spawn_device(spec: &DeviceSpec, opts: &DeviceOptions, stats: Arc<Stats>) -> Result<DeviceHandle> {
    spawn_device_with(spec, opts, Rendering::Full, stats)
}

/// [`spawn_device`] with a choice of [`Rendering`].
///
/// # Errors
/// As [`spawn_device`].
pub fn spawn_device_with(
    spec: &DeviceSpec,
    opts: &DeviceOptions,
    rendering: Rendering,
    stats: Arc<Stats>,
) -> Result<DeviceHandle> {
    spawn_device_sharing(spec, opts, rendering, stats, ClientTls::new(&opts.security)?.as_ref())
}

/// [`spawn_device_with`] with the fleet's TLS material built once ([`ClientTls::new`] of
/// `opts.security`; `None` for plain TCP).
///
/// # Errors
/// As [`spawn_device`].
pub fn spawn_device_sharing(
    spec: &DeviceSpec,
    opts: &DeviceOptions,
    rendering: Rendering,
    stats: Arc<Stats>,
    tls: Option<&ClientTls>,
) -> Result<DeviceHandle> {
    let id = spec.id().to_string();
    let effector = match spec {
        DeviceSpec::Printer { paper_width_mm, code_page, model, .. } => {
            Effector::Printer(PrinterSettings::for_paper(*paper_width_mm, *code_page).with_model(model))
        }
        DeviceSpec::Terminal { width_px, height_px, locale, time_zone, .. } => Effector::Terminal(TerminalSettings {
            width_px: *width_px,
            height_px: *height_px,
            locale: locale.clone(),
            time_zone: time_zone.clone(),
        }),
    };
    let is_printer = matches!(effector, Effector::Printer(_));
    let status_topic = Topic::Status(id.clone()).path();
    let (transport, credentials) = security_of(&id, tls)?;
    let settings = mqtt_link::Settings {
        client_id: format!("dev-{id}"),
        host: opts.mqtt_host.clone(),
        port: opts.mqtt_port,
        keep_alive: Duration::from_secs(5),
        will: (status_topic, status_payload(false, false)),
        max_packet: MAX_PACKET_BYTES,
        transport,
        credentials,
        connection_timeout_s: 5,
    };
    let (client, eventloop) = mqtt_link::new(opts.protocol, settings, 64);

    let (ready_tx, ready_rx) = watch::channel(false);
    let (stop_worker, stop_worker_rx) = watch::channel(false);
    let (stop_poll, stop_poll_rx) = watch::channel(false);
    let (jobs_tx, jobs_rx) = mpsc::unbounded_channel::<(Incoming, u64)>();
    let printer_state = Arc::new(watch::channel(PrinterState::Ready).0);
    let counters = Arc::new(DeviceCounters::default());
    let generation = Arc::new(AtomicU64::new(0));
    let link = Arc::new(LinkState::default());

    let worker = tokio::spawn(
        Worker {
            id: id.clone(),
            client: client.clone(),
            effector,
            rendering,
            dir: opts.out_dir.join(crate::effect::file_safe(&id)),
            honor_expiry: opts.honor_expiry,
            stats,
            counters: counters.clone(),
            printer_state: printer_state.subscribe(),
            generation: generation.clone(),
            connected: ready_rx.clone(),
            done: HashSet::new(),
            attempted: HashMap::new(),
            last_seq: None,
            link: link.clone(),
        }
        .run(jobs_rx, stop_worker_rx),
    );
    let poll = tokio::spawn(poll_loop(
        PollContext {
            id: id.clone(),
            is_printer,
            client: client.clone(),
            jobs_tx,
            ready: ready_tx,
            printer_state: printer_state.subscribe(),
            generation,
            link: link.clone(),
        },
        eventloop,
        stop_poll_rx,
    ));
    Ok(DeviceHandle {
        id,
        client,
        ready: ready_rx,
        stop_worker,
        stop_poll,
        worker,
        poll,
        is_printer,
        printer_state,
        counters,
        link,
    })
}

/// Resolves once `rx` says `true` or its sender is gone.
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// A small xorshift for backoff jitter (no need for a real RNG here).
fn jitter(seed: &mut u64, max_ms: u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    if max_ms == 0 {
        0
    } else {
        *seed % max_ms
    }
}

/// What the poll task shares with the rest of the device.
struct PollContext {
    id: String,
    is_printer: bool,
    client: Client,
    jobs_tx: mpsc::UnboundedSender<(Incoming, u64)>,
    ready: watch::Sender<bool>,
    printer_state: watch::Receiver<PrinterState>,
    generation: Arc<AtomicU64>,
    link: Arc<LinkState>,
}

async fn poll_loop(ctx: PollContext, mut eventloop: Link, mut stop: watch::Receiver<bool>) {
    let PollContext { id, is_printer, client, jobs_tx, ready, printer_state, generation, link } = ctx;
    let jobs_topic = Topic::Jobs(id.clone()).path();
    let status_topic = Topic::Status(id.clone()).path();
    let mut failures: u32 = 0;
    let mut seed: u64 = id.bytes().fold(0x9E37_79B9_7F4A_7C15, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01B3)) | 1;
    loop {
        let ev = tokio::select! {
            _ = stopped(&mut stop) => break,
            ev = eventloop.poll() => ev,
            () = link.cut.notified() => {
                // Dropping the socket without DISCONNECT, as a connection error does (what
                // was in flight is sent again on the next connection); the next poll
                // connects again.
                eventloop.clean();
                let _ = ready.send(false);
                link.cuts.fetch_add(1, Ordering::Relaxed);
                let wait = 500 + jitter(&mut seed, 2_500);
                tracing::info!(device = %id, "connection cut; reconnecting in {wait} ms");
                tokio::select! {
                    _ = stopped(&mut stop) => break,
                    _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                }
                continue;
            }
        };
        match ev {
            Ok(LinkEvent::ConnAck { accepted, code, session_present }) => {
                if !accepted {
                    tracing::warn!(device = %id, %code, "connection refused");
                    continue;
                }
                failures = 0;
                link.connects.fetch_add(1, Ordering::Relaxed);
                let gen = generation.fetch_add(1, Ordering::SeqCst) + 1;
                tracing::info!(device = %id, session_present, gen, "connected");
                let (c, jt, st, l) = (client.clone(), jobs_topic.clone(), status_topic.clone(), link.clone());
                let online = status_payload_with(true, is_printer.then(|| *printer_state.borrow()));
                tokio::spawn(async move {
                    if let Err(e) = c.subscribe(jt).await {
                        tracing::warn!("subscribe request failed: {e}");
                    }
                    if let Err(e) = l.publish(&c, st, true, online).await {
                        tracing::warn!("status request failed: {e}");
                    }
                });
            }
            Ok(LinkEvent::SubAck) => {
                let _ = ready.send(true);
            }
            Ok(LinkEvent::Publish(p)) => {
                let topic = p.topic();
                if topic == jobs_topic {
                    let _ = jobs_tx.send((p, generation.load(Ordering::SeqCst)));
                } else {
                    tracing::debug!(device = %id, %topic, "ignoring publish");
                    client.try_ack(&p);
                }
            }
            Ok(LinkEvent::PubAck) => {
                link.pubacks.fetch_add(1, Ordering::SeqCst);
                link.puback_seen.notify_waiters();
            }
            Ok(LinkEvent::Disconnected) => {
                tracing::info!(device = %id, "disconnected");
                let _ = ready.send(false);
                break;
            }
            Ok(_) => {}
            Err(e) => {
                let _ = ready.send(false);
                link.failures.fetch_add(1, Ordering::Relaxed);
                *link.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e.to_string());
                failures = failures.saturating_add(1);
                let base = (200u64 << failures.min(5).saturating_sub(1)).min(5000);
                let wait = base / 2 + jitter(&mut seed, base / 2 + 1);
                tracing::warn!(device = %id, "mqtt: {e}; reconnecting in {wait} ms");
                tokio::select! {
                    _ = stopped(&mut stop) => break,
                    _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                }
            }
        }
    }
}

struct Worker {
    id: String,
    /// Counts the QoS 1 publishes (acks) for [`DeviceHandle::set_printer_state`].
    link: Arc<LinkState>,
    client: Client,
    effector: Effector,
    rendering: Rendering,
    dir: PathBuf,
    honor_expiry: bool,
    stats: Arc<Stats>,
    counters: Arc<DeviceCounters>,
    printer_state: watch::Receiver<PrinterState>,
    generation: Arc<AtomicU64>,
    /// The connection is up (the poll task's ready flag).
    connected: watch::Receiver<bool>,
    /// Message ids carried out.
    done: HashSet<String>,
    /// Message ids seen (carried out or not) with their seq, so a retry of a failed job is
    /// not an order violation.
    attempted: HashMap<String, u64>,
    last_seq: Option<u64>,
}

impl Worker {
    async fn run(mut self, mut jobs: mpsc::UnboundedReceiver<(Incoming, u64)>, mut stop: watch::Receiver<bool>) {
        loop {
            let next = tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                j = jobs.recv() => j,
            };
            let Some((publish, gen)) = next else { break };
            self.handle(&publish).await;
            if gen == self.generation.load(Ordering::SeqCst) && *self.connected.borrow() {
                if let Err(e) = self.client.ack(&publish).await {
                    tracing::warn!(device = %self.id, "puback: {e}");
                }
            }
        }
    }

    async fn send_ack(&self, ack: &Ack) {
        let topic = Topic::Acks(self.id.clone()).path();
        let payload = serde_json::to_vec(ack).expect("ack serialises");
        let sent = Instant::now();
        match self.link.publish(&self.client, topic, false, payload).await {
            Ok(n) => {
                let (link, stats) = (self.link.clone(), self.stats.clone());
                // Timed off the worker, so the next job does not wait for this PUBACK.
                tokio::spawn(async move {
                    if tokio::time::timeout(Duration::from_secs(60), link.pubacked(n)).await.is_ok() {
                        stats.record_ack_latency(sent.elapsed());
                    }
                });
            }
            Err(e) => tracing::warn!(device = %self.id, "ack publish: {e}"),
        }
    }

    async fn handle(&mut self, publish: &Incoming) {
        self.stats.raw_jobs.fetch_add(1, Ordering::Relaxed);
        self.stats.raw_bytes.fetch_add(publish.payload().len() as u64, Ordering::Relaxed);
        self.counters.raw_jobs.fetch_add(1, Ordering::Relaxed);
        let job: Job = match serde_json::from_slice(publish.payload()) {
            Ok(j) => j,
            Err(e) => {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(device = %self.id, "malformed job: {e}");
                // Ack what can be identified, so the gateway does not retry forever.
                let v: serde_json::Value = serde_json::from_slice(publish.payload()).unwrap_or_default();
                if let Some(mid) = v.get("message_id").and_then(|m| m.as_str()) {
                    self.stats.failed.fetch_add(1, Ordering::Relaxed);
                    let seq = v.get("seq").and_then(|s| s.as_u64()).unwrap_or(0);
                    self.send_ack(&failed_ack(mid, seq, &JobError::permanent(format!("malformed job: {e}")))).await;
                }
                return;
            }
        };
        if matches!(self.effector, Effector::Printer(_)) {
            let state = *self.printer_state.borrow();
            if !state.can_print() {
                // A real printer cannot print now either: refuse, the gateway retries later.
                self.counters.received_while_held.fetch_add(1, Ordering::Relaxed);
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                let reason =
                    serde_json::to_value(state).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
                tracing::warn!(device = %self.id, seq = job.seq, %reason, "job received while the printer cannot print");
                self.send_ack(&Ack::failed(&job.message_id, job.seq, reason, false)).await;
                return;
            }
        }
        if self.done.contains(&job.message_id) {
            self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
            tracing::info!(device = %self.id, seq = job.seq, message_id = %job.message_id, "duplicate job, acking again");
            self.send_ack(&Ack::done(&job.message_id, job.seq, true)).await;
            return;
        }
        if !self.attempted.contains_key(&job.message_id) {
            if let Some(last) = self.last_seq {
                if job.seq <= last {
                    self.stats.order_violations.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(device = %self.id, seq = job.seq, last, "ORDER VIOLATION: job seq not increasing");
                }
            }
            self.last_seq = Some(self.last_seq.map_or(job.seq, |l| l.max(job.seq)));
            self.attempted.insert(job.message_id.clone(), job.seq);
        }
        let outcome = self.carry_out(&job).await;
        match outcome {
            Ok(file) => {
                self.done.insert(job.message_id.clone());
                tracing::info!(device = %self.id, seq = job.seq, kind = job.kind.as_str(), charge = %job.charge_id, "carried out");
                // Recorded before the ack: once the gateway has the ack (and a test sees the
                // outbox empty), the effect is already in the list.
                self.counters.carried_out.fetch_add(1, Ordering::Relaxed);
                self.stats.record(EffectRecord {
                    device: self.id.clone(),
                    kind: job.kind,
                    charge: job.charge_id.clone(),
                    message_id: job.message_id.clone(),
                    seq: job.seq,
                    file: file.display().to_string(),
                });
                self.send_ack(&Ack::done(&job.message_id, job.seq, false)).await;
            }
            Err(e) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(device = %self.id, seq = job.seq, message_id = %job.message_id, "job failed: {e}");
                self.send_ack(&failed_ack(&job.message_id, job.seq, &e)).await;
            }
        }
    }

    async fn carry_out(&self, job: &Job) -> Result<PathBuf, JobError> {
        if self.honor_expiry {
            if let Some(exp) = job.expires_at {
                if exp < chrono::Utc::now() {
                    return Err(JobError::permanent(format!("job expired at {exp}")));
                }
            }
        }
        if self.rendering == Rendering::Verify {
            return verify_job(&self.effector, job).map(|()| PathBuf::new());
        }
        let (effector, job, dir) = (self.effector.clone(), job.clone(), self.dir.clone());
        tokio::task::spawn_blocking(move || match effector {
            Effector::Printer(s) => print_job(&s, &job, &dir),
            Effector::Terminal(s) => show_job(&s, &job, &dir),
        })
        .await
        .unwrap_or_else(|e| Err(JobError::transient(format!("device crashed: {e}"))))
    }
}

/// [`Rendering::Verify`]: checks a job's payload without drawing it.
fn verify_job(effector: &Effector, job: &Job) -> Result<(), JobError> {
    match effector {
        Effector::Printer(_) => {
            let bytes = crate::effect::payload_for(job, CONTENT_ESCPOS, "a printer")?;
            if !bytes.starts_with(&[0x1B, 0x40]) {
                return Err(JobError::permanent("ESC/POS stream does not start with ESC @"));
            }
            Ok(())
        }
        Effector::Terminal(_) => {
            let content = crate::terminal::parse_screen_job(job)?;
            preview::screen::screen_from_content(&content).map_err(|e| JobError::permanent(e.to_string()))?;
            if content.screen == ScreenKind::PayWithPix {
                let brcode = content.brcode.as_deref().unwrap_or_default();
                let parsed =
                    render::brcode::parse(brcode).map_err(|e| JobError::permanent(format!("invalid BR Code: {e}")))?;
                if parsed.amount_cents().is_some_and(|c| c != content.amount_cents) {
                    return Err(JobError::permanent(format!(
                        "BR Code amount differs from the screen's {} centavos",
                        content.amount_cents
                    )));
                }
                if parsed.leaves_amount_to_payer() && content.amount_cents > 0 {
                    return Err(JobError::permanent(format!(
                        "static BR Code names no amount for the screen's {} centavos",
                        content.amount_cents
                    )));
                }
            }
            Ok(())
        }
    }
}

fn failed_ack(message_id: &str, seq: u64, e: &JobError) -> Ack {
    Ack::failed(message_id, seq, e.reason.clone(), e.permanent)
}
