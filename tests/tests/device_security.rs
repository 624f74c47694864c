//! Devices prove who they are and reach only their own jobs: pixgate's device listener over
//! TLS, against outside clients (Debian's `mosquitto_sub`/`mosquitto_pub` with `--cafile`,
//! `--cert`, `--key`), with credentials made by pixgate's own `pixgate devices credentials`
//! (a fleet CA, device certificates, a secret, a revocation).
//!
//! Card machine A is played by the mosquitto clients; card machine B is a simulated device
//! (rumqttc over TLS with its certificate) that takes and acks its jobs by itself. Checked,
//! numbered as in the issue:
//! 1. A receives its own jobs at QoS 1 and acks them.
//! 2. A subscribing to `#`, `pixgate/#`, `pixgate/v1/devices/+/jobs` or B's jobs gets SUBACK
//!    128, and none of B's jobs.
//! 3. A publishing an ack for B's job is disconnected; B's job is done by B.
//! 4. A with a will on B's status is refused; A killed (its own will) leaves B working.
//! 5. No certificate, another CA's certificate, a revoked one, a wrong secret, a client id
//!    that is not the certificate's device: refused with the right code. A device connected
//!    when its certificate or secret is revoked is disconnected.
//! 6. A client using the gateway's link id: refused, and delivery to B goes on.
//! 7. An idle TCP socket on the TLS port does not delay a real device; it is closed at the
//!    handshake deadline.
//! 8. One device over the limit gets CONNACK 3, and gets in once another leaves.
//! 9. A device removed from the registry is disconnected and refused.
//!
//! Points 1 to 9 are proved twice: with A's clients speaking MQTT 3.1.1 and MQTT 5 (`-V
//! mqttv5`, whose refusals are MQTT 5 reason codes).
//!
//! And the protocol levels pixgate does not speak: `-V mqttv31` and a level-3 CONNECT of
//! `MQTT` get CONNACK 1, a level-6 CONNECT (written raw through `openssl s_client`) a
//! CONNACK in MQTT 5's framing with reason code 0x84, each then closed; another protocol's
//! name is closed without an answer.
//!
//! Each refusal is also checked on `/stats` (`mqtt_refusals` by rule: logged and counted).
//! Every wait polls under a generous deadline; nothing is timed.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use device_protocol::{Ack, Job, Topic};
use pixgate_tests::gateway::StatsReport;
use pixgate_tests::harness::{protocol_devices, wait_done_by, Rig};
use pixgate_tests::mosquitto::{self, ClientAuth, Subscriber};
use simulators::capture::{self, CaptureRecord};
use simulators::device::{DeviceIdentity, MqttSecurity};
use simulators::fleet::{self, FleetConfig, FleetHandle};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Card machine A (the mosquitto clients), company of the charge template.
const A: &str = "724caf4941d4072014b3ce10";
/// Card machine B (simulated), same company.
const B: &str = "7f80e222f828767efc2f9162";
/// A printer whose certificate is revoked during the test.
const C: &str = "c967a64cb14028d512c9791e";
/// A printer that authenticates with a secret.
const S: &str = "8baa7196b50ac2f86702824c";

const WAIT: Duration = Duration::from_secs(30);

/// `pixgate ARGS` with `env`; panics with its output unless it succeeds. Returns stdout.
fn pixgate(bin: &Path, args: &[&str], env: &[(&str, &Path)]) -> String {
    let mut cmd = std::process::Command::new(bin);
    cmd.args(args).env("RUST_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "pixgate {args:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The credentials of the test: a fleet CA in `dir/ca` (certificates for A, B and C), one in
/// `dir/other` (a certificate for A from another CA), a secret for S.
struct Pki {
    ca: PathBuf,
    other: PathBuf,
    secrets: PathBuf,
    secret: String,
    /// The mosquitto clients' protocol flags (`-V mqttv5`), added to every [`ClientAuth`].
    version: Vec<&'static str>,
}

impl Pki {
    /// The pixgate binary and a new [`Pki`] in a scratch folder named after `name` (removed
    /// first, and by [`Pki::remove`] at the end of a test that passed).
    fn fresh(name: &str) -> (PathBuf, Pki) {
        let bin = pixgate_tests::gateway::find_binary().unwrap();
        let scratch = std::env::temp_dir().join(format!("pixgate-{name}-pki-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        let pki = Pki::create(&bin, &scratch);
        (bin, pki)
    }

    /// Removes the scratch folder.
    fn remove(self) {
        let _ = std::fs::remove_dir_all(self.ca.parent().unwrap());
    }

    fn create(bin: &Path, dir: &Path) -> Pki {
        let (ca, other, secrets) = (dir.join("ca"), dir.join("other"), dir.join("credentials.json"));
        let (cas, others) = (ca.to_str().unwrap(), other.to_str().unwrap());
        pixgate(bin, &["devices", "credentials", "ca", cas], &[]);
        pixgate(bin, &["devices", "credentials", "ca", others], &[]);
        for id in [A, B, C] {
            pixgate(bin, &["devices", "credentials", "issue", id, "--ca", cas], &[]);
        }
        pixgate(bin, &["devices", "credentials", "issue", A, "--ca", others], &[]);
        let secret = pixgate(bin, &["devices", "credentials", "issue", S], &[("PIXGATE_MQTT__CREDENTIALS", &secrets)])
            .trim()
            .to_string();
        assert_eq!(secret.len(), 43, "a 256-bit secret, base64url: {secret:?}");
        Pki { ca, other, secrets, secret, version: Vec::new() }
    }

    fn cert(&self, id: &str) -> ClientAuth {
        self.cert_from(&self.ca, id)
    }

    fn cert_from(&self, dir: &Path, id: &str) -> ClientAuth {
        let devices = dir.join("devices");
        self.versioned(ClientAuth::certificate(
            &self.ca.join("ca.crt"),
            &devices.join(format!("{id}.crt")),
            &devices.join(format!("{id}.key")),
        ))
    }

    /// `auth` speaking this test's protocol version.
    fn versioned(&self, auth: ClientAuth) -> ClientAuth {
        auth.with_args(&self.version)
    }

    /// The gateway's settings for TLS with this CA, its revocation list and the secrets.
    fn env(&self, connect_timeout_ms: u64, max_connections: usize) -> Vec<(&'static str, String)> {
        let mut env = pixgate_tests::pki::Fleet::open(&self.ca).gateway_env();
        env.extend([
            ("PIXGATE_MQTT__TLS__RELOAD_MS", "200".into()),
            ("PIXGATE_MQTT__CREDENTIALS", self.secrets.display().to_string()),
            ("PIXGATE_MQTT__CONNECT_TIMEOUT_MS", connect_timeout_ms.to_string()),
            ("PIXGATE_MQTT__MAX_CONNECTIONS", max_connections.to_string()),
        ]);
        env
    }
}

fn refusals(s: &StatsReport, rule: &str) -> u64 {
    s.counters.mqtt_refusals.get(rule).copied().unwrap_or(0)
}

/// Publishes once with `mosquitto_pub` (QoS 1, acknowledged before it exits) and any
/// `extra` flags; `Err` carries its stderr (e.g. `Connection Refused: not authorised.`).
async fn mosquitto_pub(
    port: u16,
    auth: &ClientAuth,
    client_id: &str,
    topic: &str,
    extra: &[&str],
) -> Result<(), String> {
    let mut cmd = tokio::process::Command::new("mosquitto_pub");
    cmd.args(auth.args()).args(["-h", "127.0.0.1", "-p", &port.to_string(), "-i", client_id, "-q", "1", "-t", topic]);
    cmd.args(["-m", r#"{"v":1,"online":true}"#]).args(extra);
    let out = tokio::time::timeout(WAIT, cmd.stdin(Stdio::null()).kill_on_drop(true).output()).await.unwrap().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{} {}", out.status, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Starts simulated card machine B over TLS with its certificate.
async fn start_b(rig: &Rig, pki: &Pki) -> FleetHandle {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let cfg = FleetConfig {
        security: MqttSecurity::Tls {
            ca: pki.ca.join("ca.crt"),
            identity: DeviceIdentity::Certificate { dir: pki.ca.join("devices") },
        },
        ..rig.fleet_config(vec![pixgate_tests::fixture_device(&fixtures, B)])
    };
    let fleet = fleet::start_with_options(cfg, protocol_devices()).await.unwrap();
    fleet.wait_connected(WAIT).await.unwrap();
    fleet
}

/// The registry's delete event for `id` (a capture of `devices.jsonl`'s record, later).
fn delete_record(id: &str) -> CaptureRecord {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let line = std::fs::read_to_string(fixtures.join("devices.jsonl"))
        .unwrap()
        .lines()
        .find(|l| l.contains(&format!("\"key\": \"{id}\"")))
        .unwrap()
        .to_string();
    let mut v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let value = &mut v["value"];
    value["operationType"] = "delete".into();
    value.as_object_mut().unwrap().remove("fullDocument");
    let t = value["clusterTime"]["$timestamp"]["t"].as_u64().unwrap() + 86_400;
    value["clusterTime"]["$timestamp"]["t"] = t.into();
    value["eventId"] = format!("Device:{id}:{}", t << 32 | 1).into();
    capture::parse_line(&v.to_string()).unwrap()
}

/// What the mosquitto clients say of a refusal, per protocol version: on MQTT 5 the
/// CONNACK's and SUBACK's reason codes (MQTT 5 §3.2.2.2, §3.9.3) and their names.
struct Words {
    not_authorised: &'static str,
    identifier_rejected: &'static str,
    suback_refused: u8,
}

const MQTT311: Words =
    Words { not_authorised: "not authorised", identifier_rejected: "identifier rejected", suback_refused: 128 };
const MQTT5: Words =
    Words { not_authorised: "Not authorized", identifier_rejected: "Client Identifier not valid", suback_refused: 135 };

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_reach_only_their_own_jobs_and_every_refusal_is_counted() {
    security_proofs("device-security", &[], &MQTT311).await;
}

/// The same proofs with card machine A's clients speaking MQTT 5 (`-V mqttv5`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mqtt5_devices_reach_only_their_own_jobs_and_every_refusal_is_counted() {
    security_proofs("device-security-v5", &["-V", "mqttv5"], &MQTT5).await;
}

async fn security_proofs(name: &str, version: &[&'static str], words: &Words) {
    mosquitto::require_clients().unwrap_or_else(|e| panic!("{e:#}"));
    let (bin, mut pki) = Pki::fresh(name);
    pki.version = version.to_vec();
    let rig = Rig::builder(name).envs(pki.env(10_000, 100)).start().await;
    let port = rig.settings().mqtt_port;
    let fixtures = pixgate_tests::demo::default_fixtures();
    rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;
    let fleet = start_b(&rig, &pki).await;
    let stats = || rig.gateway().stats().unwrap();

    // 1. A takes its own job at QoS 1 (a persistent session as dev-{A}) and acks it.
    let (a_jobs, b_jobs) = (Topic::Jobs(A.into()).path(), Topic::Jobs(B.into()).path());
    let mut a = Subscriber::start_as(port, &pki.cert(A), &format!("dev-{A}"), &a_jobs, 1, true, WAIT).await.unwrap();
    let rec = rig.publish_charge(A, 1).await;
    let job: Job = serde_json::from_str(&a.next_message(WAIT).await.unwrap().expect("A's job")).unwrap();
    let value: serde_json::Value = serde_json::from_slice(&rec.value).unwrap();
    assert_eq!(job.event_id, value["eventId"].as_str().unwrap());
    let ack = serde_json::to_string(&Ack::done(&job.message_id, job.seq, false)).unwrap();
    let acks = Topic::Acks(A.into()).path();
    mosquitto::publish_as(port, &pki.cert(A), &format!("dev-{A}.acks"), &acks, &ack, 1, false).await.unwrap();
    rig.wait_stats(WAIT, |s| s.counters.effects_done.get("display_qr").copied().unwrap_or(0) >= 1).await;

    // 2. Wildcards and B's jobs: SUBACK 128 (mosquitto_sub exits when all are refused).
    // A spy that also asks for its own jobs stays connected, and must get nothing of B's.
    let before = refusals(&stats(), "subscribe");
    for (i, filter) in ["#", "pixgate/#", "pixgate/v1/devices/+/jobs", b_jobs.as_str()].into_iter().enumerate() {
        let id = format!("dev-{A}.spy{i}");
        let (spy, codes) = Subscriber::start_granted(port, &pki.cert(A), &id, &[filter], 1, false, WAIT).await.unwrap();
        assert_eq!(codes, [words.suback_refused], "SUBACK for {filter}");
        spy.stop().await;
    }
    let filters = [a_jobs.as_str(), "#", "pixgate/v1/devices/+/jobs", b_jobs.as_str()];
    let (mut spy, codes) =
        Subscriber::start_granted(port, &pki.cert(A), &format!("dev-{A}.spy"), &filters, 1, false, WAIT).await.unwrap();
    let refused = words.suback_refused;
    assert_eq!(codes, [1, refused, refused, refused], "only A's own jobs are granted");
    assert_eq!(refusals(&stats(), "subscribe"), before + 7);

    // 3. A acks B's next job: A is disconnected, and B's job is done by B.
    let rec = rig.publish_charge(B, 2).await;
    let forged = serde_json::to_string(&Ack::done(&format!("forged-{}", rec.key.clone().unwrap()), 1, false)).unwrap();
    let b_acks = Topic::Acks(B.into()).path();
    let err = mosquitto::publish_as(port, &pki.cert(A), &format!("dev-{A}.forge"), &b_acks, &forged, 1, false).await;
    assert!(err.is_err(), "publishing on B's acks must fail: the connection is closed");
    wait_done_by(&fleet, B, &rec, WAIT).await;
    assert!(refusals(&stats(), "publish") >= 1);
    assert_eq!(spy.next_message(Duration::from_millis(500)).await.unwrap(), None, "B's job reached A's spy");

    // 4. A will on B's status: CONNACK 5. A's own will, A killed: B keeps working.
    let b_status = Topic::Status(B.into()).path();
    let a_status = Topic::Status(A.into()).path();
    let will = ["--will-topic", b_status.as_str(), "--will-payload", r#"{"v":1,"online":false}"#, "--will-retain"];
    let e = mosquitto_pub(port, &pki.cert(A), &format!("dev-{A}.will"), &a_status, &will).await.unwrap_err();
    assert!(e.contains(words.not_authorised), "{e}");
    assert!(refusals(&stats(), "will") >= 1);
    let offline = r#"{"v":1,"online":false}"#;
    let own_will = pki.cert(A).with_args(&["--will-topic", &a_status, "--will-payload", offline, "--will-retain"]);
    let killed = Subscriber::start_as(port, &own_will, &format!("dev-{A}.w"), &a_jobs, 1, false, WAIT).await;
    killed.unwrap().stop().await; // SIGKILL: the will is published, on A's status only
    let rec = rig.publish_charge(B, 3).await;
    wait_done_by(&fleet, B, &rec, WAIT).await;

    // 5. Who may not connect.
    let ca_only = pki.versioned(ClientAuth::server_only(&pki.ca.join("ca.crt")));
    let e = mosquitto_pub(port, &ca_only, &format!("dev-{A}.x"), &a_status, &[]).await.unwrap_err();
    assert!(e.contains(words.not_authorised), "no credentials: {e}");
    assert!(refusals(&stats(), "no_credentials") >= 1);
    let tls_before = refusals(&stats(), "tls_handshake");
    let e =
        mosquitto_pub(port, &pki.cert_from(&pki.other, A), &format!("dev-{A}.x"), &a_status, &[]).await.unwrap_err();
    assert!(!e.is_empty(), "another CA's certificate");
    rig.wait_stats(WAIT, |s| refusals(s, "tls_handshake") > tls_before).await;
    let e = mosquitto_pub(port, &pki.cert(A), &format!("dev-{B}"), &b_status, &[]).await.unwrap_err();
    assert!(e.contains(words.not_authorised), "A's certificate as dev-B: {e}");
    assert!(refusals(&stats(), "identity_mismatch") >= 1);
    let s_status = Topic::Status(S.into()).path();
    let right = pki.versioned(ClientAuth::password(&pki.ca.join("ca.crt"), S, &pki.secret));
    mosquitto_pub(port, &right, &format!("dev-{S}"), &s_status, &[]).await.unwrap();
    let wrong =
        pki.versioned(ClientAuth::password(&pki.ca.join("ca.crt"), S, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"));
    let e = mosquitto_pub(port, &wrong, &format!("dev-{S}"), &s_status, &[]).await.unwrap_err();
    assert!(e.contains(words.not_authorised), "wrong secret: {e}");
    assert!(refusals(&stats(), "bad_credentials") >= 1);
    // C and S stay connected; revoked (C's certificate on the revocation list, S's secret
    // removed), both are disconnected, and C no longer gets through the TLS handshake.
    let c_status = Topic::Status(C.into()).path();
    let c_jobs = Topic::Jobs(C.into()).path();
    let c_sub = Subscriber::start_as(port, &pki.cert(C), &format!("dev-{C}"), &c_jobs, 1, false, WAIT).await.unwrap();
    let s_jobs = Topic::Jobs(S.into()).path();
    let s_sub = Subscriber::start_as(port, &right, &format!("dev-{S}"), &s_jobs, 1, false, WAIT).await.unwrap();
    rig.wait_stats(WAIT, |s| s.counters.mqtt_connected >= 4).await; // B, A, C, S
    let revoked_before = refusals(&stats(), "revoked");
    pixgate(&bin, &["devices", "credentials", "revoke", C, "--ca", pki.ca.to_str().unwrap()], &[]);
    rig.wait_stats(WAIT, |s| refusals(s, "revoked") > revoked_before).await;
    pixgate(&bin, &["devices", "credentials", "revoke", S], &[("PIXGATE_MQTT__CREDENTIALS", &pki.secrets)]);
    rig.wait_stats(WAIT, |s| refusals(s, "revoked") > revoked_before + 1).await;
    let tls_before = refusals(&stats(), "tls_handshake");
    let e = mosquitto_pub(port, &pki.cert(C), &format!("dev-{C}.x"), &c_status, &[]).await.unwrap_err();
    assert!(!e.is_empty(), "C's revoked certificate");
    rig.wait_stats(WAIT, |s| refusals(s, "tls_handshake") > tls_before).await;
    let e = mosquitto_pub(port, &right, &format!("dev-{S}.x"), &s_status, &[]).await.unwrap_err();
    assert!(e.contains(words.not_authorised), "S's revoked secret: {e}");
    c_sub.stop().await;
    s_sub.stop().await;

    // 6. The gateway's link id: CONNACK 2, and delivery goes on.
    let e = mosquitto_pub(port, &pki.cert(A), "pixgate-gateway", &a_status, &[]).await.unwrap_err();
    assert!(e.contains(words.identifier_rejected), "{e}");
    assert!(refusals(&stats(), "client_id") >= 1);
    let rec = rig.publish_charge(B, 4).await;
    wait_done_by(&fleet, B, &rec, WAIT).await;

    // 9. B removed from the registry: disconnected now, refused from then on.
    let unknown_before = refusals(&stats(), "unknown_device");
    capture::publish_records(&rig.producer(), &[delete_record(B)]).await.unwrap();
    let deadline = Instant::now() + WAIT;
    while fleet.device(B).unwrap().is_ready() {
        assert!(Instant::now() < deadline, "B is still connected after its removal");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rig.wait_stats(WAIT, |s| refusals(s, "unknown_device") >= unknown_before + 2).await;
    assert!(!fleet.device(B).unwrap().is_ready(), "B got back in");

    println!("refusals by rule: {:?}", stats().counters.mqtt_refusals);
    let (code, metrics) = rig.gateway().get("/metrics").unwrap();
    assert_eq!(code, 200);
    let subscribe = metrics.lines().find(|l| l.starts_with("pixgate_mqtt_refusals_total{rule=\"subscribe\"}"));
    assert_eq!(subscribe.and_then(|l| l.rsplit(' ').next()), Some("7"), "refusals on /metrics:\n{metrics}");
    a.stop().await;
    spy.stop().await;
    fleet.shutdown().await;
    rig.shutdown();
    pki.remove();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_socket_holds_up_nobody_and_the_limit_answers_connack_3() {
    limit_proofs("device-limits", &[]).await;
}

/// The same with the devices speaking MQTT 5 (the refusal is reason code 0x88).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mqtt5_an_idle_socket_holds_up_nobody_and_the_limit_answers_0x88() {
    limit_proofs("device-limits-v5", &["-V", "mqttv5"]).await;
}

async fn limit_proofs(name: &str, version: &[&'static str]) {
    mosquitto::require_clients().unwrap_or_else(|e| panic!("{e:#}"));
    let (_, mut pki) = Pki::fresh(name);
    pki.version = version.to_vec();
    let rig = Rig::builder(name).envs(pki.env(3_000, 2)).start().await;
    let port = rig.settings().mqtt_port;
    rig.publish_registry_file(&pixgate_tests::demo::default_fixtures().join("devices.jsonl")).await;
    let stats = || rig.gateway().stats().unwrap();
    let a_status = Topic::Status(A.into()).path();

    // 7. A socket that never starts TLS; a real device connects and publishes meanwhile.
    let idle = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let opened = Instant::now();
    mosquitto_pub(port, &pki.cert(A), &format!("dev-{A}"), &a_status, &[]).await.unwrap();
    let served_in = opened.elapsed();
    idle.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 16];
    let closed = std::io::Read::read(&mut &idle, &mut buf);
    assert!(matches!(closed, Ok(0) | Err(_)), "the idle socket is closed by pixgate: {closed:?}");
    let idle_for = opened.elapsed();
    println!("a device served {served_in:?} after an idle socket opened; the idle socket closed after {idle_for:?}");
    assert!(served_in < idle_for, "the device was served before the idle socket's deadline");
    rig.wait_stats(WAIT, |s| refusals(s, "connect_timeout") >= 1).await;

    // 8. Two connected (the limit), a third gets CONNACK 3, and gets in once one leaves.
    let a_jobs = Topic::Jobs(A.into()).path();
    let first = Subscriber::start_as(port, &pki.cert(A), &format!("dev-{A}"), &a_jobs, 1, true, WAIT).await.unwrap();
    let b_jobs = Topic::Jobs(B.into()).path();
    let second = Subscriber::start_as(port, &pki.cert(B), &format!("dev-{B}"), &b_jobs, 1, true, WAIT).await.unwrap();
    rig.wait_stats(WAIT, |s| s.counters.mqtt_connected == 2).await;
    let e = mosquitto_pub(port, &pki.cert(A), &format!("dev-{A}.third"), &a_status, &[]).await.unwrap_err();
    assert!(e.contains("unavailable"), "over the limit: {e}");
    assert!(refusals(&stats(), "capacity") >= 1);
    second.stop().await;
    rig.wait_stats(WAIT, |s| s.counters.mqtt_connected == 1).await;
    mosquitto_pub(port, &pki.cert(A), &format!("dev-{A}.third"), &a_status, &[]).await.unwrap();
    first.stop().await;
    rig.shutdown();
    pki.remove();
}

/// Writes `bytes` to pixgate's device listener over TLS with device `id`'s certificate
/// (`openssl s_client`, an outside client) and returns all pixgate wrote back until it
/// closed the connection.
async fn raw_over_tls(port: u16, pki: &Pki, id: &str, bytes: &[u8]) -> Vec<u8> {
    use tokio::io::AsyncWriteExt;
    let devices = pki.ca.join("devices");
    let mut cmd = tokio::process::Command::new("openssl");
    cmd.args(["s_client", "-quiet", "-connect", &format!("127.0.0.1:{port}"), "-verify_return_error"])
        .arg("-CAfile")
        .arg(pki.ca.join("ca.crt"))
        .arg("-cert")
        .arg(devices.join(format!("{id}.crt")))
        .arg("-key")
        .arg(devices.join(format!("{id}.key")));
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(bytes).await.unwrap();
    // stdin stays open: `-quiet` ignores its end, and s_client exits when pixgate closes.
    let out =
        tokio::time::timeout(WAIT, child.wait_with_output()).await.expect("pixgate closed the connection").unwrap();
    drop(stdin);
    out.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_protocol_levels_get_their_own_refusal_and_a_close() {
    mosquitto::require_clients().unwrap_or_else(|e| panic!("{e:#}"));
    let (_, pki) = Pki::fresh("device-levels");
    let rig = Rig::builder("device-levels").envs(pki.env(10_000, 100)).start().await;
    let port = rig.settings().mqtt_port;
    rig.publish_registry_file(&pixgate_tests::demo::default_fixtures().join("devices.jsonl")).await;
    let a_status = Topic::Status(A.into()).path();
    let v = |version: &str| [String::from("-V"), version.to_string()];

    // MQTT 3.1 (`MQIsdp`, level 3) from Debian's mosquitto_pub: CONNACK 1.
    let e =
        mosquitto_pub(port, &pki.cert(A), &format!("dev-{A}"), &a_status, &v("mqttv31").each_ref().map(String::as_str))
            .await
            .unwrap_err();
    assert!(e.contains("unacceptable protocol version"), "MQTT 3.1: {e}");
    // Level 3 of `MQTT`: CONNACK 1, then closed.
    let level3 = [0x10, 12, 0, 4, b'M', b'Q', b'T', b'T', 3, 0x02, 0, 30, 0, 0];
    assert_eq!(raw_over_tls(port, &pki, A, &level3).await, [0x20, 0x02, 0x00, 0x01], "level 3: CONNACK 1 and a close");
    // Level 6, laid out like MQTT 5 (a property length after the keep-alive): a CONNACK in
    // MQTT 5's framing with reason code 0x84 "Unsupported Protocol Version", then closed.
    let level6 = [0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 6, 0x02, 0, 30, 0, 0, 0];
    assert_eq!(
        raw_over_tls(port, &pki, A, &level6).await,
        [0x20, 0x03, 0x00, 0x84, 0x00],
        "level 6: CONNACK 0x84 and a close"
    );
    // Another protocol's name: closed without an answer.
    let amqp = [0x10, 12, 0, 4, b'A', b'M', b'Q', b'P', 4, 0x02, 0, 30, 0, 0];
    assert_eq!(raw_over_tls(port, &pki, A, &amqp).await, Vec::<u8>::new(), "not MQTT: closed, nothing said");
    let s = rig.gateway().stats().unwrap();
    assert_eq!(refusals(&s, "protocol_version"), 3, "{:?}", s.counters.mqtt_refusals);
    assert_eq!(refusals(&s, "malformed"), 1, "{:?}", s.counters.mqtt_refusals);

    // MQTT 5 (`mosquitto_pub -V mqttv5`) and MQTT 3.1.1 devices beside them get in.
    let mqttv5 = v("mqttv5");
    mosquitto_pub(port, &pki.cert(A), &format!("dev-{A}"), &a_status, &mqttv5.each_ref().map(String::as_str))
        .await
        .unwrap();
    // An MQTT 3.1.1 device beside them is unchanged.
    mosquitto_pub(port, &pki.cert(A), &format!("dev-{A}"), &a_status, &[]).await.unwrap();
    rig.shutdown();
    pki.remove();
}

/// A fleet reconnecting all at once, beyond `mqtt.max_handshakes` (1 here), waits to be
/// accepted instead of being turned away: every device gets in at its first attempt and
/// nothing is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_beyond_max_handshakes_waits_to_be_accepted() {
    let rig = Rig::builder("device-storm")
        .env("PIXGATE_MQTT__MAX_HANDSHAKES", "1")
        .env("PIXGATE_MQTT__REQUIRE_REGISTERED", "false")
        .start()
        .await;
    let devices = pixgate_tests::fixture_devices(&pixgate_tests::demo::default_fixtures());
    let n = devices.len();
    let fleet = fleet::start_with_options(rig.fleet_config(devices), protocol_devices()).await.unwrap();
    fleet.wait_connected(WAIT).await.unwrap();
    let s = rig.gateway().stats().unwrap();
    assert_eq!(
        (fleet.connection_failures(), s.counters.mqtt_connected),
        (0, n as u64),
        "refusals {:?}",
        s.counters.mqtt_refusals
    );
    assert!(s.counters.mqtt_refusals.is_empty(), "{:?}", s.counters.mqtt_refusals);
    println!("{n} devices connecting at once through one handshake place: all in at their first attempt");
    fleet.shutdown().await;
    rig.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_held_from_one_address_keep_no_other_device_out() {
    mosquitto::require_clients().unwrap_or_else(|e| panic!("{e:#}"));
    let (_, pki) = Pki::fresh("device-slowloris");
    // The shipped limits on sockets being set up (the harness lifts the per-address one for
    // its simulated fleets), and a long handshake deadline: the held sockets outlast the run.
    let defaults = gateway::config::MqttConfig::default();
    let per_address = defaults.max_handshakes_per_address;
    let rig = Rig::builder("device-slowloris")
        .envs(pki.env(60_000, 100))
        .env("PIXGATE_MQTT__MAX_HANDSHAKES", defaults.max_handshakes.to_string())
        .env("PIXGATE_MQTT__MAX_HANDSHAKES_PER_ADDRESS", per_address.to_string())
        .start()
        .await;
    let port = rig.settings().mqtt_port;
    rig.publish_registry_file(&pixgate_tests::demo::default_fixtures().join("devices.jsonl")).await;
    assert!(per_address < defaults.max_handshakes, "one address cannot take every place");

    // 1,000 sockets from 127.0.0.1 that never start TLS, held.
    const HELD: usize = 1_000;
    let held: Vec<std::net::TcpStream> =
        (0..HELD).map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
    let refused = (HELD - per_address) as u64;
    rig.wait_stats(WAIT, |s| refusals(s, "handshakes_per_address") >= refused).await;

    // Card machines from other addresses get in meanwhile, over TLS with their certificates.
    for (id, from) in [(A, "127.0.0.2"), (B, "127.0.0.3")] {
        let status = Topic::Status(id.into()).path();
        mosquitto_pub(port, &pki.cert(id), &format!("dev-{id}"), &status, &["-A", from])
            .await
            .unwrap_or_else(|e| panic!("{id} from {from}, with {HELD} sockets held from 127.0.0.1: {e}"));
    }
    // ... while the sockets admitted from 127.0.0.1 are still held open by pixgate (the
    // others' closes may still be on their way: waited for).
    for s in &held {
        s.set_nonblocking(true).unwrap();
    }
    let still_open = || {
        held.iter()
            .filter(|s| {
                let mut buf = [0u8; 1];
                matches!(std::io::Read::read(&mut &**s, &mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            })
            .count()
    };
    let deadline = Instant::now() + WAIT;
    let mut open = still_open();
    while open != per_address && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        open = still_open();
    }
    assert_eq!(open, per_address, "the admitted sockets are held, the others were closed at accept");
    let s = rig.gateway().stats().unwrap();
    assert_eq!(refusals(&s, "handshakes_per_address"), refused, "{:?}", s.counters.mqtt_refusals);
    println!(
        "{HELD} sockets held from 127.0.0.1: {per_address} admitted and held, {refused} refused at accept; two card machines from 127.0.0.2 and .3 got in meanwhile"
    );
    drop(held);
    rig.shutdown();
    pki.remove();
}
