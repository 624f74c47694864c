//! MQTT 5 devices beside MQTT 3.1.1 ones, against outside clients over TLS with device
//! certificates: card machine A is Eclipse Paho (paho-mqtt 2.x, `protocol=MQTTv5`,
//! `tests/mqtt5_device.py`), with Debian's `mosquitto_sub -V mqttv5` as A's second
//! connection; card machine B is a simulated MQTT 3.1.1 device, and at the end A is the
//! simulators' MQTT 5 device. Checked:
//! - the CONNACK announces what pixgate takes (Maximum Packet Size, Receive Maximum,
//!   Maximum QoS 1, no retain, wildcards or shared subscriptions) and the session expiry;
//! - A's jobs arrive with their time to live as Message Expiry Interval and their message
//!   id as a user property (read by paho and by mosquitto_sub), A acks them and they are
//!   done; B's jobs are done as before;
//! - a refused filter gets SUBACK 0x87, a malformed ack PUBACK 0x99, a PUBLISH on another
//!   device's topic a DISCONNECT 0x87, a device beyond its rate for 10 s a DISCONNECT 0x96;
//! - a session with an expiry is resumed (session present) within it;
//! - a device that asks for raw payloads gets its job's bytes with its fields as
//!   properties, the same bytes the JSON on its other connection encodes.
//!
//! Real parts: tansu, the `pixgate` binary, Paho from PyPI in a virtualenv, Debian's
//! mosquitto clients, certificates made by the test.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use device_protocol::{Job, Topic};
use pixgate_tests::gateway::{count, StatsReport};
use pixgate_tests::harness::{protocol_devices, wait_done_by, Rig};
use pixgate_tests::mosquitto::{self, ClientAuth, Subscriber};
use pixgate_tests::pki::Fleet;
use serde_json::{json, Value};
use simulators::device::{DeviceIdentity, MqttSecurity};
use simulators::fleet::{self, FleetConfig, FleetHandle, FleetOptions};
use simulators::mqtt_link::Protocol;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// Card machine A (Paho, MQTT 5), company of the charge template.
const A: &str = "724caf4941d4072014b3ce10";
/// Card machine B (simulated, MQTT 3.1.1), same company.
const B: &str = "7f80e222f828767efc2f9162";
const WAIT: Duration = Duration::from_secs(30);
const PAHO: &str = "paho-mqtt==2.1.0";

fn refusals(s: &StatsReport, rule: &str) -> u64 {
    s.counters.mqtt_refusals.get(rule).copied().unwrap_or(0)
}

/// `tests/mqtt5_device.py` as device `id`, running: commands in, events out.
struct Paho {
    child: Child,
    stdin: ChildStdin,
    events: Lines<BufReader<ChildStdout>>,
}

impl Paho {
    fn start(port: u16, pki: &Fleet, id: &str) -> Paho {
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("paho-venv");
        let python = pixgate_tests::python::venv(&venv, PAHO, "paho.mqtt.client");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mqtt5_device.py");
        let mut child = tokio::process::Command::new(python)
            .arg(script)
            .args(["127.0.0.1", &port.to_string(), id])
            .arg(pki.ca_cert())
            .arg(pki.device_cert(id))
            .arg(pki.device_key(id))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let events = BufReader::new(child.stdout.take().unwrap()).lines();
        Paho { child, stdin, events }
    }

    async fn send(&mut self, cmd: Value) {
        self.stdin.write_all(format!("{cmd}\n").as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// The next event named `event` (others are printed and skipped).
    async fn next(&mut self, event: &str) -> Value {
        let read = async {
            loop {
                let line = self.events.next_line().await.unwrap().expect("the Paho device exited");
                let v: Value = serde_json::from_str(&line).unwrap();
                assert_ne!(v["event"], "error", "{v}");
                if v["event"] == event {
                    return v;
                }
                println!("paho: {v}");
            }
        };
        tokio::time::timeout(WAIT, read).await.unwrap_or_else(|_| panic!("no {event} from the Paho device"))
    }

    /// Connects with a Receive Maximum of 1: pixgate has one job in flight at a time.
    async fn connect(&mut self, clean_start: bool, session_expiry: u32) -> Value {
        let cmd =
            json!({"cmd": "connect", "clean_start": clean_start, "session_expiry": session_expiry, "receive_max": 1});
        self.send(cmd).await;
        self.next("connack").await
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Card machine `id` of the fixtures as a simulated device over TLS with its certificate,
/// connected.
async fn simulated(rig: &Rig, pki: &Fleet, id: &str, options: FleetOptions) -> FleetHandle {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let security =
        MqttSecurity::Tls { ca: pki.ca_cert(), identity: DeviceIdentity::Certificate { dir: pki.devices_dir() } };
    let cfg = FleetConfig { security, ..rig.fleet_config(vec![pixgate_tests::fixture_device(&fixtures, id)]) };
    let fleet = fleet::start_with_options(cfg, options).await.unwrap();
    fleet.wait_connected(WAIT).await.unwrap();
    fleet
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt5_devices_get_their_jobs_with_properties_and_reason_codes() {
    mosquitto::require_clients().unwrap_or_else(|e| panic!("{e:#}"));
    let scratch: PathBuf = std::env::temp_dir().join(format!("pixgate-mqtt5-pki-{}", std::process::id()));
    let pki = Fleet::create_without_other(&scratch, &[A, B]).unwrap();
    let defaults = gateway::config::MqttConfig::default();
    let rig = Rig::builder("mqtt5-devices")
        .envs(pki.gateway_env())
        .env("PIXGATE_MQTT__MAX_MESSAGES_PER_SECOND", defaults.max_messages_per_second.to_string())
        .start()
        .await;
    let port = rig.settings().mqtt_port;
    let fixtures = pixgate_tests::demo::default_fixtures();
    rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;
    let stats = || rig.gateway().stats().unwrap();
    let b = simulated(&rig, &pki, B, protocol_devices()).await;

    // A connects over MQTT 5: the CONNACK says what pixgate takes.
    let mut a = Paho::start(port, &pki, A);
    let connack = a.connect(true, 300).await;
    println!("CONNACK to Paho: {connack}");
    assert_eq!((connack["reason"].as_u64(), connack["session_present"].as_bool()), (Some(0), Some(false)));
    let props = &connack["props"];
    assert_eq!(props["MaximumPacketSize"].as_u64(), Some(defaults.max_payload_bytes as u64), "{props}");
    assert_eq!(props["SessionExpiryInterval"], 300);
    assert_eq!(props["ReceiveMaximum"], 32);
    assert_eq!((props["MaximumQoS"].as_u64(), props["RetainAvailable"].as_u64()), (Some(1), Some(0)));
    assert_eq!(props["WildcardSubscriptionAvailable"], 0);
    assert_eq!(props["SharedSubscriptionAvailable"], 0);
    // Its own jobs granted at QoS 1; B's refused with 0x87 "Not authorized".
    let (a_jobs, b_jobs) = (Topic::Jobs(A.into()).path(), Topic::Jobs(B.into()).path());
    a.send(json!({"cmd": "subscribe", "topics": [a_jobs, b_jobs]})).await;
    assert_eq!(a.next("suback").await["reason_codes"], json!([1, 0x87]));
    // mosquitto_sub -V mqttv5 as A's second connection, printing each message's expiry
    // interval and user properties as mosquitto decodes them.
    let auth = ClientAuth::certificate(&pki.ca_cert(), &pki.device_cert(A), &pki.device_key(A))
        .with_args(&["-V", "mqttv5", "-F", "%E|%P|%p"]);
    let mut tool = Subscriber::start_as(port, &auth, &format!("dev-{A}.sub"), &a_jobs, 1, false, WAIT).await.unwrap();

    // A charge for each: A's job with its properties, acked by Paho; B's done by B.
    let rec_a = rig.publish_charge(A, 1).await;
    let rec_b = rig.publish_charge(B, 2).await;
    let got = a.next("job").await;
    let job: Job = serde_json::from_str(got["payload"].as_str().unwrap()).unwrap();
    let event: Value = serde_json::from_slice(&rec_a.value).unwrap();
    assert_eq!(job.event_id, event["eventId"].as_str().unwrap());
    let ttl = (job.expires_at.expect("a QR job expires") - chrono::Utc::now()).num_seconds();
    let expiry = got["props"]["MessageExpiryInterval"].as_i64().expect("a Message Expiry Interval");
    println!("A's job: expires_at in {ttl} s, Message Expiry Interval {expiry} s, {}", got["props"]);
    assert!((ttl..=ttl + 2).contains(&expiry), "the job's time to live: {expiry} vs {ttl}");
    let user = got["props"]["UserProperty"].as_array().unwrap();
    assert!(user.contains(&json!(["message_id", job.message_id])), "{user:?}");
    assert!(user.contains(&json!(["seq", job.seq.to_string()])), "{user:?}");
    assert_eq!(got["props"]["ContentType"], "application/json");
    let line = tool.next_message(WAIT).await.unwrap().expect("the job on A's second connection");
    let (expiry_line, rest) = line.split_once('|').unwrap();
    let seen: i64 = expiry_line.parse().unwrap_or_else(|_| panic!("mosquitto_sub's %E: {line}"));
    assert!((ttl - 2..=ttl + 2).contains(&seen), "mosquitto_sub saw expiry {seen}: {line}");
    assert!(rest.contains(&format!("message_id:{}", job.message_id)), "mosquitto_sub's %P: {line}");
    wait_done_by(&b, B, &rec_b, WAIT).await;
    rig.wait_stats(WAIT, |s| count(&s.counters.effects_done, "display_qr") == 2).await;

    // An ack that is not one: PUBACK 0x99, counted, the connection stays.
    let acks = Topic::Acks(A.into()).path();
    let before = refusals(&stats(), "malformed_message");
    a.send(json!({"cmd": "publish", "topic": acks, "payload": "not an ack"})).await;
    let mid = a.next("published").await["mid"].clone();
    let puback = loop {
        let p = a.next("puback").await;
        if p["mid"] == mid {
            break p;
        }
    };
    assert_eq!(puback["reason"], 0x99, "PUBACK of the malformed ack: {puback}");
    assert_eq!(refusals(&stats(), "malformed_message"), before + 1);

    // Its session is kept for its expiry: resumed after a clean disconnect.
    a.send(json!({"cmd": "disconnect"})).await;
    assert_eq!(a.next("disconnect").await["reason"], 0);
    a.stop().await;
    let mut a = Paho::start(port, &pki, A);
    let connack = a.connect(false, 300).await;
    assert_eq!(connack["session_present"], true, "resumed within its expiry: {connack}");
    // ... and its subscription with it: the next job comes without a SUBSCRIBE.
    let rec = rig.publish_charge(A, 3).await;
    let got = a.next("job").await;
    assert!(got["payload"].as_str().unwrap().contains(rec.key.as_deref().unwrap()), "{got}");
    rig.wait_stats(WAIT, |s| count(&s.counters.effects_done, "display_qr") == 3).await;

    // A PUBLISH on B's acks: DISCONNECT 0x87 before the close.
    a.send(json!({"cmd": "publish", "topic": Topic::Acks(B.into()).path(), "payload": "{}"})).await;
    assert_eq!(a.next("disconnect").await["reason"], 0x87);
    assert!(refusals(&stats(), "publish") >= 1);
    a.stop().await;

    // Beyond its rate for 10 s on end: DISCONNECT 0x96 "Message rate too high".
    let mut a = Paho::start(port, &pki, A);
    assert_eq!(a.connect(true, 0).await["reason"], 0);
    let status = Topic::Status(A.into()).path();
    let flooding = Instant::now();
    let per_second = 5 * defaults.max_messages_per_second;
    a.send(json!({"cmd": "flood", "topic": status, "payload": r#"{"v":1,"online":true}"#, "per_second": per_second, "seconds": 25}))
        .await;
    assert_eq!(a.next("disconnect").await["reason"], 0x96);
    println!("a device beyond its rate got DISCONNECT 0x96 after {:?}", flooding.elapsed());
    assert_eq!(refusals(&stats(), "rate_disconnect"), 1);

    // B, on MQTT 3.1.1, is unchanged throughout.
    let rec = rig.publish_charge(B, 4).await;
    wait_done_by(&b, B, &rec, WAIT).await;

    // A asks for raw payloads (CONNECT user property `pixgate-payload: raw`): its job comes
    // as the payload's bytes with the job's fields as properties, and Paho acks it from
    // them. mosquitto_sub, A's second connection without the property, gets the same job as
    // JSON, whose base64 payload is those bytes.
    a.stop().await;
    let mut a = Paho::start(port, &pki, A);
    a.send(json!({"cmd": "connect", "clean_start": true, "session_expiry": 0, "receive_max": 1, "raw": true})).await;
    assert_eq!(a.next("connack").await["reason"], 0);
    a.send(json!({"cmd": "subscribe", "topics": [a_jobs]})).await;
    assert_eq!(a.next("suback").await["reason_codes"], json!([1]));
    let rec = rig.publish_charge(A, 5).await;
    let got = a.next("job").await;
    assert!(got["payload"].is_null(), "not JSON: {got}");
    let user: std::collections::HashMap<String, String> =
        serde_json::from_value::<Vec<(String, String)>>(got["props"]["UserProperty"].clone())
            .unwrap()
            .into_iter()
            .collect();
    let job: Job = loop {
        let line = tool.next_message(WAIT).await.unwrap().expect("A's job on its JSON connection");
        if line.contains(&user["message_id"]) {
            break serde_json::from_str(line.splitn(3, '|').nth(2).unwrap()).unwrap();
        }
    };
    let event: Value = serde_json::from_slice(&rec.value).unwrap();
    assert_eq!(job.event_id, event["eventId"].as_str().unwrap());
    assert_eq!(got["payload_b64"].as_str(), Some(job.payload.as_str()), "the bytes the JSON's payload encodes");
    assert_eq!(got["size"].as_u64(), Some(job.payload_bytes().unwrap().len() as u64));
    assert_eq!(got["props"]["ContentType"].as_str(), Some(job.content_type.as_str()));
    assert_eq!(got["props"]["PayloadFormatIndicator"], 0);
    let fields = [
        ("seq", job.seq.to_string()),
        ("kind", job.kind.as_str().to_string()),
        ("event_id", job.event_id.clone()),
        ("charge_id", job.charge_id.clone()),
        ("v", "1".to_string()),
    ];
    for (k, v) in fields {
        assert_eq!(user.get(k), Some(&v), "user property {k}: {user:?}");
    }
    println!(
        "A's raw job: {} bytes of {} against {} bytes of JSON",
        got["size"],
        job.content_type,
        serde_json::to_string(&job).unwrap().len()
    );
    rig.wait_stats(WAIT, |s| count(&s.counters.effects_done, "display_qr") == 5).await;

    // A again, as the simulators' MQTT 5 device (`--mqtt-version 5`): it takes its next job.
    a.stop().await;
    let sim_a = simulated(&rig, &pki, A, FleetOptions { protocol: Protocol::V5, ..protocol_devices() }).await;
    let rec = rig.publish_charge(A, 6).await;
    wait_done_by(&sim_a, A, &rec, WAIT).await;
    sim_a.shutdown().await;
    println!("refusals by rule: {:?}", stats().counters.mqtt_refusals);
    tool.stop().await;
    b.shutdown().await;
    rig.shutdown();
    let _ = std::fs::remove_dir_all(&scratch);
}
