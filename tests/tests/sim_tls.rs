//! The simulated devices on a real TLS broker that checks who they are: Debian's `mosquitto`
//! with a TLS listener on loopback, certificates from `pixgate_tests::pki`, and the
//! `mosquitto_pub`/`mosquitto_sub` clients (over TLS too) playing the gateway.
//!
//! - A printer proving its identity with a client certificate (CN = device id; mosquitto
//!   `require_certificate true`, `use_identity_as_username true`) connects as `dev-{id}`,
//!   takes a real receipt job from its jobs topic, prints it and acks `done`.
//! - A printer proving it with MQTT username = device id and password = its secret
//!   (mosquitto `password_file` from `mosquitto_passwd -b`, server-only TLS) does the same;
//!   one with a wrong secret is refused.
//! - A printer whose connection is cut (churn) comes back by itself and takes a job.
//! - A printer whose certificate comes from another CA never connects: its connection
//!   attempts fail, and it never becomes ready, while a fleet-CA printer on the same broker
//!   does.
//!
//! Every wait is polled under a generous deadline.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use device_protocol::messages::CONTENT_ESCPOS;
use device_protocol::{message_id, Ack, AckResult, EffectKind, Job, Topic};
use pixgate_tests::mosquitto::{self, Broker, ClientAuth, Subscriber};
use pixgate_tests::net::free_port;
use pixgate_tests::pki;
use render::codepage::CodePage;
use render::receipt::{render_receipt, PrinterProfile, Receipt, ReceiptKind};
use render::Locale;
use simulators::device::{spawn_device, DeviceHandle, DeviceIdentity, DeviceOptions, MqttSecurity, Stats};
use simulators::mqtt_link::Protocol;
use simulators::registry::DeviceSpec;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A printer of the fixtures' registry.
const PRINTER: &str = "0fb23c6f5da2cec255404e4f";
/// A second printer id.
const PRINTER2: &str = "54f31af3176813e02ea68ef7";
/// The identity of the mosquitto clients playing the gateway.
const PEER: &str = "gateway-peer";
const CHARGE: &str = "6750a1b2c3d4e5f601234567";
/// Longest wait for anything to happen (connect, job, ack).
const WAIT: Duration = Duration::from_secs(30);

/// A fresh folder under the system temp dir, removed at the end unless the test failed.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("pixgate-sim-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} (mosquitto.log, certificates, printed receipts)", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn printer_spec(id: &str) -> DeviceSpec {
    DeviceSpec::Printer {
        id: id.into(),
        paper_width_mm: 80,
        code_page: CodePage::Cp860,
        native_qr: true,
        model: String::new(),
    }
}

/// A paid receipt for `device`, rendered as pixgate renders it, as job `seq`.
fn receipt_job(device: &str, seq: u64) -> Job {
    let receipt = Receipt {
        kind: ReceiptKind::Paid,
        merchant_name: "Padaria São João".into(),
        merchant_city: "São Paulo".into(),
        amount_cents: 1990,
        items: vec![("Pão de queijo".into(), "3x".into())],
        comment: None,
        payer_name: Some("José Araújo".into()),
        paid_at: Some(chrono::Utc::now()),
        time_zone: "America/Sao_Paulo".parse().unwrap(),
        end_to_end_id: Some("E25328704202611271201yxv2kgafrfw".into()),
        charge_id: CHARGE.into(),
        txid: Some("TX123".into()),
        brcode: None,
        locale: Locale::PtBr,
    };
    let profile = PrinterProfile { paper_width_mm: 80, code_page: CodePage::Cp860, native_qr: true };
    let bytes = render_receipt(&receipt, &profile).unwrap();
    let event_id = format!("Charge:{CHARGE}:{seq}");
    Job {
        v: 1,
        message_id: message_id(&event_id, device, EffectKind::PrintReceipt),
        seq,
        kind: EffectKind::PrintReceipt,
        event_id,
        charge_id: CHARGE.into(),
        content_type: CONTENT_ESCPOS.into(),
        payload: Job::encode_payload(&bytes),
        expires_at: Some(chrono::Utc::now() + chrono::Duration::minutes(10)),
    }
}

/// mosquitto.conf: one TLS listener on `port` (loopback) with the fleet's server
/// certificate, plus `auth` (how clients must prove who they are).
fn tls_config(port: u16, fleet: &pki::Fleet, auth: &str) -> String {
    format!(
        "per_listener_settings false\npersistence false\nallow_anonymous false\n\
         listener {port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\n{auth}\n",
        fleet.ca_cert().display(),
        fleet.server_cert().display(),
        fleet.server_key().display(),
    )
}

/// mosquitto.conf lines: a client certificate from the fleet CA is required, and its CN is
/// the client's username.
const CERT_AUTH: &str = "require_certificate true\nuse_identity_as_username true";

fn device_options(port: u16, out: &Path, security: MqttSecurity) -> DeviceOptions {
    DeviceOptions {
        mqtt_host: "127.0.0.1".into(),
        mqtt_port: port,
        out_dir: out.to_path_buf(),
        honor_expiry: true,
        security,
        protocol: Protocol::V311,
    }
}

/// mosquitto's log once it has a line containing `what` (it writes its log file itself, so
/// the line may come after what the test saw); panics with the log after [`WAIT`].
async fn broker_log_until(broker: &Broker, what: &str) -> String {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let log = broker.log_text();
        if log.contains(what) {
            return log;
        }
        assert!(std::time::Instant::now() < deadline, "no {what:?} in mosquitto's log:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start_broker(dir: &Path, port: u16, config: &str) -> Broker {
    Broker::start(dir, config, port, WAIT).await.unwrap_or_else(|e| panic!("{e:#}"))
}

async fn wait_ready(device: &DeviceHandle, broker: &Broker) {
    if let Err(e) = device.wait_ready(WAIT).await {
        panic!(
            "{e:#}; last connection error: {:?}\nmosquitto log:\n{}",
            device.last_connection_error(),
            broker.log_text()
        );
    }
}

/// Publishes a receipt job to `device` through mosquitto_pub (as `peer`) and returns the
/// device's ack, read by `acks` (a mosquitto_sub on the device's acks topic).
async fn send_job_and_read_ack(port: u16, peer: &ClientAuth, device: &str, acks: &mut Subscriber) -> (Job, Ack) {
    let job = receipt_job(device, 1);
    let payload = serde_json::to_string(&job).unwrap();
    mosquitto::publish_as(port, peer, "peer-pub", &Topic::Jobs(device.into()).path(), &payload, 1, false)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let line = acks.next_message(WAIT).await.unwrap().unwrap_or_else(|| panic!("no ack from {device} within {WAIT:?}"));
    let ack: Ack = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not an Ack ({e}): {line}"));
    (job, ack)
}

fn assert_done(job: &Job, ack: &Ack, stats: &Stats) {
    assert_eq!(
        (ack.message_id.as_str(), ack.seq, ack.result, ack.duplicate),
        (job.message_id.as_str(), job.seq, AckResult::Done, false),
        "{ack:?}"
    );
    let effects = stats.effects();
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!((effects[0].kind, effects[0].charge.as_str()), (EffectKind::PrintReceipt, CHARGE));
    assert!(Path::new(&effects[0].file).is_file(), "the receipt was printed: {:?}", effects[0].file);
}

/// mosquitto over TLS requiring a client certificate from a throwaway fleet CA, a peer
/// (with its own certificate) reading PRINTER's acks, and PRINTER itself, connected with
/// its certificate.
struct CertRig {
    dir: TempDir,
    port: u16,
    broker: Broker,
    peer: ClientAuth,
    acks: Subscriber,
    stats: Arc<Stats>,
    device: DeviceHandle,
}

impl CertRig {
    async fn start(name: &str) -> CertRig {
        CertRig::start_speaking(name, Protocol::V311).await
    }

    /// [`CertRig::start`] with PRINTER speaking `protocol`.
    async fn start_speaking(name: &str, protocol: Protocol) -> CertRig {
        mosquitto::require_clients().unwrap_or_else(|e| panic!("{e:#}"));
        let dir = TempDir::new(name);
        let fleet = pki::Fleet::create(&dir.0.join("pki"), &[PRINTER, PEER]).unwrap();
        let port = free_port();
        let broker = start_broker(&dir.0, port, &tls_config(port, &fleet, CERT_AUTH)).await;
        let peer = ClientAuth::certificate(&fleet.ca_cert(), &fleet.device_cert(PEER), &fleet.device_key(PEER));
        let acks = Subscriber::start_as(port, &peer, "peer-acks", &Topic::Acks(PRINTER.into()).path(), 1, false, WAIT)
            .await
            .unwrap_or_else(|e| panic!("{e:#}\n{}", broker.log_text()));
        let stats = Arc::new(Stats::default());
        let security = MqttSecurity::Tls {
            ca: fleet.ca_cert(),
            identity: DeviceIdentity::Certificate { dir: fleet.devices_dir() },
        };
        let options = DeviceOptions { protocol, ..device_options(port, &dir.0.join("out"), security) };
        let device = spawn_device(&printer_spec(PRINTER), &options, stats.clone()).unwrap();
        wait_ready(&device, &broker).await;
        CertRig { dir, port, broker, peer, acks, stats, device }
    }

    async fn stop(self) {
        self.device.shutdown().await;
        self.acks.stop().await;
        self.broker.stop().await;
        drop(self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_printer_with_a_client_certificate_takes_a_job_over_tls() {
    let mut r = CertRig::start("cert").await;
    let (job, ack) = send_job_and_read_ack(r.port, &r.peer, PRINTER, &mut r.acks).await;
    assert_done(&job, &ack, &r.stats);
    // The broker took the certificate's CN as the username of client dev-{id}, on MQTT
    // 3.1.1 (mosquitto's `p2`).
    let log = broker_log_until(&r.broker, &format!("as dev-{PRINTER} (p2,")).await;
    assert!(log.contains(&format!("u'{PRINTER}'")), "{log}");
    r.stop().await;
}

/// The same printer speaking MQTT 5 (`--mqtt-version 5`) to mosquitto: connected as MQTT 5
/// (mosquitto's `p5`), it takes the job and acks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mqtt5_printer_with_a_client_certificate_takes_a_job_over_tls() {
    let mut r = CertRig::start_speaking("cert-v5", Protocol::V5).await;
    let (job, ack) = send_job_and_read_ack(r.port, &r.peer, PRINTER, &mut r.acks).await;
    assert_done(&job, &ack, &r.stats);
    broker_log_until(&r.broker, &format!("as dev-{PRINTER} (p5,")).await;
    r.stop().await;
}

/// Churn as load runs make it (`drop_connection`): the connection is cut without a
/// DISCONNECT, so the broker publishes the device's will, and the device comes back by
/// itself (a second CONNACK), subscribed again, and takes the next job; its ack's
/// latency (publish → PUBACK) is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_printer_whose_connection_is_cut_comes_back_by_itself_and_takes_a_job() {
    let mut r = CertRig::start("cut").await;
    let mut status =
        Subscriber::start_as(r.port, &r.peer, "peer-status", &Topic::Status(PRINTER.into()).path(), 1, false, WAIT)
            .await
            .unwrap_or_else(|e| panic!("{e:#}\n{}", r.broker.log_text()));
    assert_eq!((r.device.connects(), r.device.dropped_connections()), (1, 0));

    r.device.drop_connection();
    // The will (offline) reaches the peer: the broker saw the socket die, not a DISCONNECT.
    loop {
        let line = status.next_message(WAIT).await.unwrap().unwrap_or_else(|| panic!("no will within {WAIT:?}"));
        let s: device_protocol::Status = serde_json::from_str(&line).unwrap();
        if !s.online {
            break;
        }
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while !(r.device.connects() == 2 && r.device.is_ready()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not back within {WAIT:?}: {:?}",
            r.device.last_connection_error()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(r.device.dropped_connections(), 1);

    let (job, ack) = send_job_and_read_ack(r.port, &r.peer, PRINTER, &mut r.acks).await;
    assert_done(&job, &ack, &r.stats);
    let deadline = tokio::time::Instant::now() + WAIT;
    let (p50, p99) = loop {
        if let Some(l) = r.stats.ack_latency() {
            break l;
        }
        assert!(tokio::time::Instant::now() < deadline, "no ack latency recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(p50 <= p99 && p99 < WAIT, "{p50:?} {p99:?}");
    status.stop().await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_printer_with_a_secret_takes_a_job_over_tls_and_a_wrong_secret_is_refused() {
    mosquitto::require_clients().unwrap_or_else(|e| panic!("{e:#}"));
    let dir = TempDir::new("secret");
    let fleet = pki::Fleet::create(&dir.0.join("pki"), &[]).unwrap();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let (secret, secret2, peer_secret) =
        (format!("{nanos:x}-printer"), format!("{nanos:x}-printer2"), format!("{nanos:x}-peer"));
    let passwords = dir.0.join("passwords");
    mosquitto::password_file(&passwords, &[(PRINTER, &secret), (PRINTER2, &secret2), (PEER, &peer_secret)])
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let port = free_port();
    let auth = format!("require_certificate false\npassword_file {}", passwords.display());
    let broker = start_broker(&dir.0, port, &tls_config(port, &fleet, &auth)).await;
    let peer = ClientAuth::password(&fleet.ca_cert(), PEER, &peer_secret);
    let mut acks = Subscriber::start_as(port, &peer, "peer-acks", &Topic::Acks(PRINTER.into()).path(), 1, false, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", broker.log_text()));

    // PRINTER2's entry is not its secret.
    let secrets: BTreeMap<String, String> =
        [(PRINTER.to_string(), secret.clone()), (PRINTER2.to_string(), format!("{secret2}-wrong"))].into();
    let security =
        MqttSecurity::Tls { ca: fleet.ca_cert(), identity: DeviceIdentity::Secret { secrets: Arc::new(secrets) } };
    let out = dir.0.join("out");
    let stats = Arc::new(Stats::default());
    let device =
        spawn_device(&printer_spec(PRINTER), &device_options(port, &out, security.clone()), stats.clone()).unwrap();
    let wrong =
        spawn_device(&printer_spec(PRINTER2), &device_options(port, &out, security), Arc::new(Stats::default()))
            .unwrap();
    wait_ready(&device, &broker).await;

    let (job, ack) = send_job_and_read_ack(port, &peer, PRINTER, &mut acks).await;
    assert_done(&job, &ack, &stats);
    let log = broker.log_text();
    assert!(log.contains(&format!("as dev-{PRINTER} ")) && log.contains(&format!("u'{PRINTER}'")), "{log}");

    // The wrong secret: CONNACK "not authorised", again and again, never ready.
    wait_for_refusals(&wrong, 2).await;
    let err = wrong.last_connection_error().unwrap_or_default();
    eprintln!("wrong secret's last connection error: {err}");
    assert!(err.contains("NotAuthorized"), "{err}");

    wrong.shutdown().await;
    device.shutdown().await;
    acks.stop().await;
    broker.stop().await;
}

/// Polls `device` until `n` connection attempts have failed (at most [`WAIT`]), checking
/// at every poll that it is not ready.
async fn wait_for_refusals(device: &DeviceHandle, n: u64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while device.connection_failures() < n {
        assert!(!device.is_ready(), "device {} connected", device.id());
        assert!(
            tokio::time::Instant::now() < deadline,
            "device {}: only {} failed connection attempts within {WAIT:?} (last error {:?})",
            device.id(),
            device.connection_failures(),
            device.last_connection_error()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!device.is_ready(), "device {} connected", device.id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_printer_whose_certificate_is_from_another_ca_never_connects() {
    let dir = TempDir::new("other-ca");
    let fleet = pki::Fleet::create(&dir.0.join("pki"), &[PRINTER, PRINTER2]).unwrap();
    let port = free_port();
    let broker = start_broker(&dir.0, port, &tls_config(port, &fleet, CERT_AUTH)).await;
    let out = dir.0.join("out");

    // The same id, its certificate (CN = PRINTER) signed by an unrelated CA.
    let foreign =
        MqttSecurity::Tls { ca: fleet.ca_cert(), identity: DeviceIdentity::Certificate { dir: fleet.other_ca_dir() } };
    let intruder =
        spawn_device(&printer_spec(PRINTER), &device_options(port, &out, foreign), Arc::new(Stats::default())).unwrap();
    // A fleet printer on the same broker connects: the broker and its CA are fine.
    let good =
        MqttSecurity::Tls { ca: fleet.ca_cert(), identity: DeviceIdentity::Certificate { dir: fleet.devices_dir() } };
    let device =
        spawn_device(&printer_spec(PRINTER2), &device_options(port, &out, good), Arc::new(Stats::default())).unwrap();
    wait_ready(&device, &broker).await;

    // The handshake is refused, attempt after attempt; it never becomes ready.
    wait_for_refusals(&intruder, 3).await;
    assert!(intruder.wait_ready(Duration::from_secs(3)).await.is_err(), "the intruder connected");
    assert!(!intruder.is_ready());
    assert!(device.is_ready(), "the fleet printer stays connected");
    // Refused by the broker (a TLS alert, `UnknownCA` from OpenSSL), not by the device's
    // own check of the server.
    let err = intruder.last_connection_error().unwrap_or_default();
    eprintln!("intruder's last connection error: {err}");
    assert!(err.contains("received fatal alert"), "{err}");
    let log = broker.log_text();
    assert!(!log.contains(&format!("as dev-{PRINTER} ")), "mosquitto let the intruder in:\n{log}");

    intruder.shutdown().await;
    device.shutdown().await;
    broker.stop().await;
}
