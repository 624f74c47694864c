//! The upstream as it really is, against the real broker: the fixtures published by a Kafka
//! client that is not pixgate's (Python's confluent-kafka, `tests/upstream_producer.py`),
//! each file with another codec, every record with headers (a W3C `traceparent` among
//! them) and a tombstone after each file; charges that arrive while the device registry
//! is behind wait for it instead of being dead-lettered; and a dead letter for a terminal
//! that did not exist is replayed once the terminal is registered.
//!
//! The producer runs in a virtualenv made once under the target folder
//! (`python3 -m venv`, `pip install confluent-kafka==2.16.1` from PyPI).
//!
//! Codecs: zstd (devices), lz4 and gzip (charges), none (edge cases). Not snappy: tansu
//! 0.6.0 takes a snappy batch but cannot serve it (its fetch fails with
//! `UnexpectedType("Snappy")` and drops the connection), a broker limit; that pixgate's
//! librdkafka reads snappy is checked by the unit test
//! `ingest::upstream::tests::librdkafka_has_every_codec_built_in`.

use device_protocol::EffectKind;
use gateway::ops::report::StatsReport;
use pixgate_tests::demo::{self, batches_without_repeated_keys};
use pixgate_tests::gateway::{count, stats_json, total};
use pixgate_tests::harness::Rig;
use serde_json::{json, Value};
use simulators::capture::{self, CaptureRecord};
use simulators::device::{Rendering, Stats};
use simulators::expected::{Fate, Model};
use simulators::fleet::FleetOptions;
use simulators::registry::devices_from_records;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One rig at a time: each is a broker, pixgate and a fleet on two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const CONFLUENT_KAFKA: &str = "confluent-kafka==2.16.1";

/// The virtualenv's python, with confluent-kafka installed (made on first use).
fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("upstream-venv");
    pixgate_tests::python::venv(&venv, CONFLUENT_KAFKA, "confluent_kafka")
}

/// `tests/upstream_producer.py`, running; commands in, answers out.
struct Producer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Producer {
    fn start(brokers: &str) -> Producer {
        let script = pixgate_tests::repo_root().join("tests/upstream_producer.py");
        let mut child = Command::new(python())
            .arg(script)
            .arg(brokers)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the Python producer");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Producer { child, stdin, stdout }
    }

    /// Sends one command and returns how many records Kafka acknowledged.
    fn send(&mut self, cmd: Value) -> u64 {
        writeln!(self.stdin, "{cmd}").expect("writing to the producer");
        let mut line = String::new();
        tokio::task::block_in_place(|| self.stdout.read_line(&mut line)).expect("reading the producer's answer");
        let answer: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("producer answered {line:?}: {e}"));
        answer["published"].as_u64().unwrap_or_else(|| panic!("{cmd}: {answer}"))
    }

    fn publish(&mut self, file: &Path, codec: &str, lines: Option<(usize, usize)>) -> u64 {
        let mut cmd = json!({"file": file, "codec": codec, "bad_traceparent": 0});
        if let Some((a, b)) = lines {
            cmd["lines"] = json!([a, b]);
        }
        self.send(cmd)
    }

    fn tombstone(&mut self, topic: &str, key: &str, codec: &str) -> u64 {
        self.send(json!({"tombstone": topic, "key": key, "codec": codec}))
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"quit": true}));
        let _ = self.child.wait();
    }
}

fn fixtures() -> PathBuf {
    demo::default_fixtures()
}

fn records(name: &str) -> Vec<CaptureRecord> {
    capture::read_records(&fixtures().join(name)).unwrap_or_else(|e| panic!("reading fixtures file {name}: {e}"))
}

/// The line ranges of `name`'s batches in which no key repeats ([`batches_without_repeated_keys`]).
fn batch_ranges(name: &str) -> Vec<(usize, usize)> {
    let mut start = 0;
    batches_without_repeated_keys(records(name))
        .iter()
        .map(|b| {
            let r = (start, start + b.len());
            start += b.len();
            r
        })
        .collect()
}

/// Devices for a fixture replay that check payloads without drawing and count into `stats`.
fn devices(stats: &Arc<Stats>) -> FleetOptions {
    FleetOptions { honor_expiry: false, rendering: Rendering::Verify, stats: stats.clone(), ..FleetOptions::default() }
}

/// pixgate read `published` records and finished them, and the devices have nothing left.
fn idle(s: &StatsReport, published: u64) -> bool {
    let c = &s.counters;
    total(&c.events_read) >= published && c.pending_records == 0 && c.queued_jobs == 0 && c.outbox_jobs == 0
}

fn effects_of(stats: &Stats) -> BTreeMap<(String, String, String), usize> {
    let mut got = BTreeMap::new();
    for e in stats.effects() {
        *got.entry((e.device.clone(), e.charge.clone(), e.kind.as_str().to_string())).or_default() += 1;
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixtures_from_a_foreign_producer_with_every_codec_headers_and_tombstones() {
    let _one = SERIAL.lock().await;
    let fx = fixtures();
    let rig = Rig::builder("upstream-fixtures").envs(pixgate_tests::replay_clock_env(&fx)).start().await;
    let stats = Arc::new(Stats::default());
    let fleet = rig.start_fleet(pixgate_tests::fixture_devices(&fx), devices(&stats)).await;
    let mut producer = Producer::start(rig.brokers());
    let deadline = Instant::now() + Duration::from_secs(300);
    let wait_idle = |published: u64| {
        let gw = rig.gateway();
        async move { demo::wait_until(gw, deadline, |s| idle(s, published)).await.unwrap() }
    };

    // The registry, zstd, then a tombstone; charges follow at once (no wait: a charge read
    // before its terminal's record waits for the registry).
    let mut published = producer.publish(&fx.join("devices.jsonl"), "zstd", None);
    published += producer.tombstone("device.upserted", records("devices.jsonl")[0].key.as_deref().unwrap(), "zstd");
    // Charges as the devices keep up with them: lz4 for the first half, gzip for the rest.
    let ranges = batch_ranges("charges.jsonl");
    let half = ranges.last().unwrap().1 / 2;
    for (a, b) in ranges {
        published += producer.publish(&fx.join("charges.jsonl"), if a < half { "lz4" } else { "gzip" }, Some((a, b)));
        wait_idle(published).await;
    }
    published += producer.tombstone("charge.upserted", records("charges.jsonl")[0].key.as_deref().unwrap(), "gzip");
    for (a, b) in batch_ranges("edge-cases.jsonl") {
        published += producer.publish(&fx.join("edge-cases.jsonl"), "none", Some((a, b)));
        wait_idle(published).await;
    }
    published += producer.tombstone("charge.upserted", records("edge-cases.jsonl")[0].key.as_deref().unwrap(), "none");
    wait_idle(published).await;

    // Exactly the effects of expected.json, each once.
    let mut want: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for ((device, charge), kinds) in pixgate_tests::expected_effects(&fx) {
        for kind in kinds {
            *want.entry((device.clone(), charge.clone(), kind)).or_default() += 1;
        }
    }
    let want_total: usize = want.values().sum();
    let until = Instant::now() + Duration::from_secs(60);
    while (stats.carried_out() as usize) < want_total && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(effects_of(&stats), want, "effects carried out differ from expected.json");

    // Every record read and accounted for: the tombstones ignored as such, and no dead
    // letter beyond the fixtures' own (one unknown_terminal among them).
    let s = rig.gateway().stats().unwrap();
    let (c, json) = (&s.counters, stats_json(&s));
    assert_eq!(total(&c.events_read), published, "{json}");
    assert_eq!(published, 17 + 233 + 14 + 3);
    assert_eq!(count(&c.ignored, "tombstone"), 3, "{json}");
    let dead = &c.dead_lettered_records;
    for (reason, n) in [
        ("not_json", 2),
        ("unknown_terminal", 1),
        ("terminal_of_another_company", 1),
        ("invalid_field:status", 1),
        ("invalid_field:value", 2),
        ("missing_field:company", 1),
    ] {
        assert_eq!(count(dead, reason), n, "dead-lettered {reason}: {json}");
    }
    assert_eq!(total(dead) + total(&c.dead_lettered_effects), 10, "{json}");

    // The traceparent of a record is in the log lines about its effects; a malformed one
    // is ignored.
    let log = std::fs::read_to_string(rig.gateway().log()).unwrap();
    let traced: Vec<&str> =
        log.lines().filter(|l| l.contains("record's effects accepted") && l.contains("trace_id=")).collect();
    assert!(traced.len() > 200, "{} effect lines with a trace id", traced.len());
    // The first line of each file carries a malformed traceparent (bad_traceparent: 0).
    let second_charge = hex_trace("charges.jsonl", 1);
    assert!(
        traced.iter().any(|l| l.contains(&second_charge)),
        "no line carries the trace id {second_charge} of charges.jsonl's second record"
    );
    assert!(!log.contains(&hex_trace("charges.jsonl", 0)), "the malformed traceparent of the first record is ignored");
    assert!(
        log.lines().any(|l| l.contains("dead letter") && l.contains("trace_id=")),
        "a dead letter's warning carries its record's trace id"
    );
    println!("upstream: {published} records from confluent-kafka (zstd, lz4, gzip, none), {} effects as expected.json, {} tombstones ignored", stats.carried_out(), count(&c.ignored, "tombstone"));
    fleet.shutdown().await;
    rig.shutdown();
}

/// The trace id `tests/upstream_producer.py` gives line `n` of fixtures file `name`.
fn hex_trace(name: &str, n: usize) -> String {
    let out = Command::new(python())
        .args(["-c", &format!("import hashlib; print(hashlib.sha256(b'{name}:{n}').hexdigest()[:32])")])
        .output()
        .expect("running the virtualenv's python");
    String::from_utf8(out.stdout).expect("a hex digest is UTF-8").trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_wait_for_a_registry_that_is_behind_and_none_is_dead_lettered() {
    let _one = SERIAL.lock().await;
    let fx = fixtures();
    // The device topic is not read for 25 s after pixgate starts (testing knob), so the
    // charges published after the devices arrive first.
    let rig = Rig::builder("upstream-behind")
        .envs(pixgate_tests::replay_clock_env(&fx))
        .env("PIXGATE_KAFKA__INSTANCE_ID", "")
        .env("PIXGATE_KAFKA__HOLD_DEVICE_TOPIC_MS", "25000")
        .start()
        .await;
    rig.gateway().wait_assigned(Duration::from_secs(20)).await.unwrap();
    let stats = Arc::new(Stats::default());
    let fleet = rig.start_fleet(pixgate_tests::fixture_devices(&fx), devices(&stats)).await;
    let mut producer = Producer::start(rig.brokers());
    let mut published = producer.publish(&fx.join("devices.jsonl"), "zstd", None);
    // The first event of every charge, in order (no charge twice: no QR is superseded).
    let text = std::fs::read_to_string(fx.join("charges.jsonl")).unwrap();
    let mut keys = std::collections::HashSet::new();
    let firsts: Vec<&str> = text
        .lines()
        .filter(|l| keys.insert(serde_json::from_str::<Value>(l).unwrap()["key"].as_str().unwrap().to_string()))
        .collect();
    let firsts_file = rig.dir().join("first-events.jsonl");
    std::fs::write(&firsts_file, firsts.join("\n") + "\n").unwrap();
    let firsts: Vec<CaptureRecord> = capture::read_records(&firsts_file).unwrap();
    published += producer.publish(&firsts_file, "lz4", None);

    let why = rig
        .gateway()
        .readyz_until("saying charges wait for the registry", Duration::from_secs(20), |code, body| {
            code == 503
                && body.contains("charges waiting for the device registry")
                && body.contains("device.upserted behind by")
        })
        .await;
    println!("/readyz while the registry is behind: {why}");
    let s = rig.gateway().stats().unwrap();
    assert_eq!(
        total(&s.counters.dead_lettered_records),
        0,
        "nothing dead-lettered while the registry is behind: {}",
        stats_json(&s)
    );
    assert!(s.counters.pending_records > 0, "{}", stats_json(&s));
    assert_eq!(stats.carried_out(), 0);

    // Once the device topic is read, every held charge is routed and delivered.
    let deadline = Instant::now() + Duration::from_secs(120);
    demo::wait_until(rig.gateway(), deadline, |s| idle(s, published)).await.unwrap();
    let mut model = Model::new();
    for r in records("devices.jsonl") {
        model.apply_device(&r.value);
    }
    let mut want: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    let mut dead = 0;
    for r in &firsts {
        match model.apply_charge(&r.value) {
            Fate::DeadLetter(_) => dead += 1,
            fate => {
                for e in fate.effects() {
                    *want.entry((e.device.clone(), e.charge.clone(), e.kind.as_str().to_string())).or_default() += 1;
                }
            }
        }
    }
    let want_total: usize = want.values().sum();
    let until = Instant::now() + Duration::from_secs(60);
    while (stats.carried_out() as usize) < want_total && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(want_total > 50, "the first events have {want_total} effects");
    assert_eq!(effects_of(&stats), want, "every held charge's effects, once");
    let s = rig.gateway().stats().unwrap();
    assert_eq!(
        total(&s.counters.dead_lettered_records),
        dead,
        "only the dead letters the registry, complete, calls for: {}",
        stats_json(&s)
    );
    rig.gateway().readyz_until("ready again", Duration::from_secs(20), |code, _| code == 200).await;
    fleet.shutdown().await;
    rig.shutdown();
}

/// A header key that is not UTF-8, as a producer on librdkafka's C API (here Debian's
/// kcat) or a Go client may write: the record is read like any other (its value is not
/// JSON: a dead letter), the gateway runs on, and the record after it is read too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_key_that_is_not_utf8_is_read_past() {
    use std::os::unix::ffi::OsStrExt;
    let _one = SERIAL.lock().await;
    let rig = Rig::builder("upstream-raw-header").start().await;
    let kcat = |key: &str, value: &str, header: &[u8]| {
        let mut child = Command::new("kcat")
            .args(["-P", "-b", rig.brokers(), "-t", "charge.upserted", "-k", key, "-H"])
            .arg(std::ffi::OsStr::from_bytes(header))
            .stdin(Stdio::piped())
            .spawn()
            .expect("kcat on PATH (scripts/ensure-kcat.sh)");
        child.stdin.take().unwrap().write_all(format!("{value}\n").as_bytes()).unwrap();
        assert!(child.wait().unwrap().success(), "kcat failed");
    };
    kcat("c-raw-1", "not json", b"x-\xff\xfe=raw");
    kcat("c-raw-2", "not json either", b"traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    let deadline = Instant::now() + Duration::from_secs(60);
    let read = demo::wait_until(rig.gateway(), deadline, |s| {
        total(&s.counters.events_read) == 2 && count(&s.counters.dead_lettered_records, "not_json") == 2
    })
    .await;
    assert!(read.is_ok(), "both records read and dead-lettered: {read:?}");
    rig.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_for_an_unknown_terminal_is_replayed_once_it_is_registered() {
    let _one = SERIAL.lock().await;
    let fx = fixtures();
    // A new card machine: a copy of the fixtures' first one under another id.
    let devices_fx = records("devices.jsonl");
    let template = devices_fx
        .iter()
        .map(|r| serde_json::from_slice::<Value>(&r.value).unwrap())
        .find(|v| v["fullDocument"]["kind"] == "terminal")
        .unwrap();
    let old_terminal = template["fullDocument"]["_id"]["$oid"].as_str().unwrap().to_string();
    let new_terminal = "7e5700000000000000000a01";
    let mut device = template.clone();
    device["eventId"] = json!(format!("Device:{new_terminal}:9000000000000000001"));
    device["documentKey"]["_id"]["$oid"] = json!(new_terminal);
    device["fullDocument"]["_id"]["$oid"] = json!(new_terminal);
    device["clusterTime"]["$timestamp"]["i"] = json!(9001);
    let device_rec = CaptureRecord {
        topic: "device.upserted".into(),
        key: Some(new_terminal.into()),
        value: serde_json::to_vec(&device).unwrap(),
    };
    // A new charge shown on it (ACTIVE: a QR).
    let mut charge = records("charges.jsonl")
        .iter()
        .map(|r| serde_json::from_slice::<Value>(&r.value).unwrap())
        .find(|v| {
            v["operationType"] == "insert"
                && v["fullDocument"]["terminal"]["$oid"] == old_terminal.as_str()
                && v["fullDocument"]["status"] == "ACTIVE"
        })
        .expect("an ACTIVE charge on the template terminal");
    let charge_id = "7e5700000000000000000c01";
    let event_id = format!("Charge:{charge_id}:9000000000000000002");
    charge["eventId"] = json!(event_id);
    charge["documentKey"]["_id"]["$oid"] = json!(charge_id);
    charge["fullDocument"]["_id"]["$oid"] = json!(charge_id);
    charge["fullDocument"]["terminal"]["$oid"] = json!(new_terminal);

    let rig = Rig::builder("upstream-replay").envs(pixgate_tests::replay_clock_env(&fx)).start().await;
    let write = |name: &str, topic: &str, key: &str, value: &Value| {
        let path = rig.dir().join(name);
        std::fs::write(&path, format!("{}\n", json!({"topic": topic, "key": key, "value": value}))).unwrap();
        path
    };
    let (device_file, charge_file) = (
        write("new-terminal.jsonl", "device.upserted", new_terminal, &device),
        write("new-charge.jsonl", "charge.upserted", charge_id, &charge),
    );
    let stats = Arc::new(Stats::default());
    let mut specs = pixgate_tests::fixture_devices(&fx);
    specs.extend(devices_from_records(&[device_rec]));
    let fleet = rig.start_fleet(specs, devices(&stats)).await;
    let mut producer = Producer::start(rig.brokers());
    let deadline = Instant::now() + Duration::from_secs(120);

    let mut published = producer.publish(&fx.join("devices.jsonl"), "zstd", None);
    demo::wait_until(rig.gateway(), deadline, |s| idle(s, published)).await.unwrap();
    published += producer.publish(&charge_file, "gzip", None);
    demo::wait_until(rig.gateway(), deadline, |s| {
        idle(s, published) && count(&s.counters.dead_lettered_records, "unknown_terminal") == 1
    })
    .await
    .unwrap();
    let (_, list) = rig.gateway().get("/deadletters").unwrap();
    let list: Value = serde_json::from_str(&list).unwrap();
    let dl = list["deadletters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["reason"] == "unknown_terminal")
        .expect("the unknown_terminal dead letter")
        .clone();
    assert_eq!(dl["replayable"], true, "{dl}");
    let id = dl["id"].as_u64().unwrap();

    // Not registered yet: the replay is refused and can be tried again.
    let replay = |id: u64| {
        Command::new(rig.bin())
            .args(["deadletter", "replay", &id.to_string()])
            .env("PIXGATE_HTTP__LISTEN", format!("127.0.0.1:{}", rig.settings().http_port))
            .env("PIXGATE_OUTBOX__PATH", &rig.settings().outbox_path)
            .output()
            .unwrap()
    };
    let early = replay(id);
    assert!(!early.status.success(), "replayed before the terminal exists");
    assert!(
        String::from_utf8_lossy(&early.stderr).contains("still unknown_terminal"),
        "{}",
        String::from_utf8_lossy(&early.stderr)
    );

    published += producer.publish(&device_file, "lz4", None);
    demo::wait_until(rig.gateway(), deadline, |s| idle(s, published)).await.unwrap();
    let out = replay(id);
    assert!(out.status.success(), "replay failed: {}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let jobs = answer["replayed"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{answer}");
    assert_eq!((jobs[0]["device"].as_str(), jobs[0]["kind"].as_str()), (Some(new_terminal), Some("display_qr")));
    assert_eq!(
        jobs[0]["message_id"].as_str(),
        Some(device_protocol::message_id(&event_id, new_terminal, EffectKind::DisplayQr).as_str()),
        "the id the event would have had"
    );

    let until = Instant::now() + Duration::from_secs(30);
    while stats.carried_out() < 1 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = replay(id);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already replayed"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = effects_of(&stats);
    assert_eq!(
        got,
        BTreeMap::from([((new_terminal.to_string(), charge_id.to_string(), "display_qr".to_string()), 1)]),
        "delivered once"
    );
    fleet.shutdown().await;
    rig.shutdown();
}
