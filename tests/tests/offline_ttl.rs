//! A card machine offline for 25 minutes (by pixgate's injectable clock, not by sleeping),
//! then back: its backlog arrives in order, without the jobs whose time to live passed;
//! those are recorded on the dead-letter topic (reason `expired`, with their source record
//! and the job), never shown. Its paired
//! printer keeps printing meanwhile. A dead letter's job can be replayed with
//! `pixgate deadletter replay` against the running gateway, even while its device is
//! offline: it counts in the outbox like any queued job and arrives after the backlog.
//!
//! Real parts: tansu, the `pixgate` binary (with `clock.control` on), MQTT devices, and
//! the `pixgate` CLI as an operator would run it.

// Helpers of a test are test steps too: a panic is a failed test (clippy.toml's
// allow-unwrap-in-tests covers only the #[test] fns themselves).
#![allow(clippy::unwrap_used)]

use base64::Engine;
use pixgate_tests::gateway::count;
use pixgate_tests::harness::{protocol_devices, wait_for, Rig};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::ClientConfig;
use serde_json::Value;
use simulators::capture::{self, CaptureRecord};
use simulators::fleet;
use std::path::Path;
use std::time::Duration;

const TERMINAL: &str = "7f80e222f828767efc2f9162";
const PRINTER: &str = "8baa7196b50ac2f86702824c";

fn charge(template: &Value, id: &str, status: &str, v: i64, expires_in_min: i64, t: u64) -> CaptureRecord {
    pixgate_tests::charges::charge_record(template, TERMINAL, id, status, v, expires_in_min, t)
}

/// The effects a device carried out, as (kind, charge) in order.
fn carried_out(f: &fleet::FleetHandle, device: &str) -> Vec<(String, String)> {
    f.effects()
        .into_iter()
        .filter(|e| e.device == device)
        .map(|e| (e.kind.as_str().to_string(), e.charge.clone()))
        .collect()
}

fn pixgate_cli(bin: &Path, http_port: u16, args: &[&str]) -> (bool, Value, String) {
    let out = std::process::Command::new(bin)
        .args(args)
        .env("PIXGATE_HTTP__LISTEN", format!("127.0.0.1:{http_port}"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    (
        out.status.success(),
        serde_json::from_str(&stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_25_minutes_then_back_delivers_in_order_and_expires_what_outlived_its_ttl() {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let rig = Rig::builder("offline").env("PIXGATE_CLOCK__CONTROL", "true").start().await;
    let (bin, http_port) = (rig.bin(), rig.settings().http_port);
    let device = |id: &str| vec![pixgate_tests::fixture_device(&fixtures, id)];
    let printer = rig.start_fleet(device(PRINTER), protocol_devices()).await;
    // The card machine connects, then goes away: its retained status says offline.
    rig.connect_and_leave(pixgate_tests::fixture_device(&fixtures, TERMINAL)).await;
    let n = rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;

    let template = pixgate_tests::charges::template(&fixtures);
    let t = chrono::Utc::now().timestamp() as u64;
    let records = [
        charge(&template, "aaaaaaaaaaaaaaaaaaaaaaaa", "ACTIVE", 0, 60, t), // QR valid for an hour: shown when back
        charge(&template, "bbbbbbbbbbbbbbbbbbbbbbbb", "ACTIVE", 0, 15, t), // QR expires while offline
        charge(&template, "cccccccccccccccccccccccc", "ACTIVE", 0, 60, t), // QR superseded by "paid"…
        charge(&template, "cccccccccccccccccccccccc", "COMPLETED", 1, 60, t), // …whose 10 min TTL passes; the receipt prints
        charge(&template, "dddddddddddddddddddddddd", "ACTIVE", 0, 60, t),    // two more QRs valid for an hour:
        charge(&template, "eeeeeeeeeeeeeeeeeeeeeeee", "ACTIVE", 0, 60, t),    // the backlog's order after the gaps
    ];
    // One at a time: the charges have different keys, so different partitions, and the
    // order a device gets them in is the order pixgate reads them in.
    let producer = rig.producer();
    for (i, r) in records.iter().enumerate() {
        capture::publish_records(&producer, std::slice::from_ref(r)).await.unwrap();
        let read = n + i as u64 + 1;
        rig.wait_stats(Duration::from_secs(30), |s| {
            s.counters.events_read.get("charge.upserted").copied() == Some(read - n) && s.counters.pending_records == 0
        })
        .await;
    }

    // The printer is not held back by the offline card machine.
    wait_for("the receipt on the paired printer", Duration::from_secs(60), || {
        carried_out(&printer, PRINTER) == [("print_receipt".to_string(), "c".repeat(24))]
    })
    .await;
    rig.wait_stats(Duration::from_secs(30), |s| s.counters.outbox_jobs == 5 && s.counters.superseded == 1).await;
    let (ok, queued, err) = pixgate_cli(bin, http_port, &["outbox", "list", TERMINAL]);
    assert!(ok, "{err}");
    let kinds: Vec<(&str, &str)> = queued["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["kind"].as_str().unwrap(), &j["charge_id"].as_str().unwrap()[..1]))
        .collect();
    assert_eq!(
        kinds,
        [
            ("display_qr", "a"),
            ("display_qr", "b"),
            ("payment_confirmed", "c"),
            ("display_qr", "d"),
            ("display_qr", "e")
        ],
        "the backlog, in order"
    );

    // 25 minutes pass.
    let (status, body) = rig.gateway().post("/clock/advance?ms=1500000").unwrap();
    assert_eq!(status, 200, "{body}");
    rig.wait_stats(Duration::from_secs(30), |s| {
        count(&s.counters.expired, "display_qr") == 1
            && count(&s.counters.expired, "payment_confirmed") == 1
            && s.counters.outbox_jobs == 3
    })
    .await;

    // The expired jobs are recorded on the dead-letter topic, and listed by the CLI.
    let dls = read_dead_letters(rig.brokers(), 2).await;
    let mut seen: Vec<(String, String, String)> = dls
        .iter()
        .map(|d| {
            (
                d["reason"].as_str().unwrap().into(),
                d["effect"].as_str().unwrap().into(),
                d["device"].as_str().unwrap().into(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("expired".into(), "display_qr".into(), TERMINAL.into()),
            ("expired".into(), "payment_confirmed".into(), TERMINAL.into())
        ]
    );
    // Each carries its source record as it was produced (read back from Kafka by the
    // publisher: the outbox keeps only its position) and the job that expired.
    for d in &dls {
        let source = if d["effect"] == "display_qr" { &records[1] } else { &records[3] };
        let value = base64::engine::general_purpose::STANDARD.decode(d["value_base64"].as_str().unwrap()).unwrap();
        assert!(value == source.value, "the source record's value: {d}");
        assert_eq!(d["key"].as_str(), source.key.as_deref(), "{d}");
        let job: Value = serde_json::from_str(d["job"].as_str().expect("the job")).unwrap();
        assert_eq!((&job["kind"], &job["message_id"]), (&d["effect"], &d["message_id"]), "{d}");
    }
    // Marked published once Kafka's acknowledgement reaches pixgate, a moment after a reader can see it.
    let paid_listed = || {
        let (ok, list, err) = pixgate_cli(bin, http_port, &["deadletter", "list"]);
        assert!(ok, "{err}");
        list["deadletters"].as_array().unwrap().iter().find(|d| d["effect"] == "payment_confirmed").unwrap().clone()
    };
    wait_for("the paid screen's dead letter published", Duration::from_secs(30), || {
        paid_listed()["state"] == "published"
    })
    .await;
    let paid = paid_listed();
    assert_eq!(paid["replayable"].as_bool(), Some(true), "{paid}");

    // While the card machine is still offline, an operator replays the "paid" screen: it
    // waits behind the QR still valid, with its original id, and counts in the outbox (and
    // against the device's bound) like any queued job.
    let id = paid["id"].as_u64().unwrap().to_string();
    let (ok, replayed, err) = pixgate_cli(bin, http_port, &["deadletter", "replay", &id]);
    assert!(ok, "{err}");
    assert_eq!(replayed["replayed"]["message_id"], paid["message_id"]);
    rig.wait_stats(Duration::from_secs(30), |s| s.counters.outbox_jobs == 4).await;
    let (ok, _, err) = pixgate_cli(bin, http_port, &["deadletter", "replay", &id]);
    assert!(!ok && err.contains("already replayed"), "a second replay is refused: {err}");

    // Back online: the QRs still valid in their order, then the replayed "paid" screen;
    // nothing expired is shown.
    let terminal = rig.start_fleet(device(TERMINAL), protocol_devices()).await;
    wait_for("the valid QRs and the replayed paid screen", Duration::from_secs(30), || {
        carried_out(&terminal, TERMINAL).len() == 4
    })
    .await;
    rig.wait_stats(Duration::from_secs(30), |s| s.counters.outbox_jobs == 0).await;
    let qr = |c: &str| ("display_qr".to_string(), c.repeat(24));
    assert_eq!(
        carried_out(&terminal, TERMINAL),
        [qr("a"), qr("d"), qr("e"), ("payment_confirmed".to_string(), "c".repeat(24))]
    );

    terminal.shutdown().await;
    printer.shutdown().await;
    rig.shutdown();
}

async fn read_dead_letters(brokers: &str, want: usize) -> Vec<Value> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("dl-reader-{}", std::process::id()))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&["pixgate.deadletter"]).unwrap();
    let mut out = Vec::new();
    while out.len() < want {
        let m = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .expect("dead letters within 60 s")
            .unwrap();
        out.push(serde_json::from_slice(m.payload().unwrap()).unwrap());
    }
    out
}
