//! A card machine offline for 25 minutes (by pixgate's injectable clock, not by sleeping),
//! then back: its backlog arrives in order, without the jobs whose time to live passed;
//! those are recorded on the dead-letter topic (reason `expired`), never shown. Its paired
//! printer keeps printing meanwhile. A dead letter's job can be replayed with
//! `pixgate deadletter replay` against the running gateway.
//!
//! Real parts: tansu, the `pixgate` binary (with `clock.control` on), MQTT devices, and
//! the `pixgate` CLI as an operator would run it.

use pixgate_tests::broker::KafkaBroker;
use pixgate_tests::gateway::{self, GatewayProcess, GatewaySettings};
use pixgate_tests::net::free_port;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::ClientConfig;
use serde_json::Value;
use simulators::capture::{self, CaptureRecord};
use simulators::{fleet, registry};
use std::path::Path;
use std::time::{Duration, Instant};

const TERMINAL: &str = "7f80e222f828767efc2f9162";
const PRINTER: &str = "8baa7196b50ac2f86702824c";

fn charge(template: &Value, id: &str, status: &str, v: i64, expires_in_min: i64, t: u64) -> CaptureRecord {
    pixgate_tests::charges::charge_record(template, TERMINAL, id, status, v, expires_in_min, t)
}

/// The effects a device carried out, as (kind, charge) in order.
fn carried_out(f: &fleet::FleetHandle, device: &str) -> Vec<(String, String)> {
    f.effects().into_iter().filter(|e| e.device == device).map(|e| (e.kind.as_str().to_string(), e.charge.clone())).collect()
}

async fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pixgate_cli(bin: &Path, http_port: u16, args: &[&str]) -> (bool, Value, String) {
    let out = std::process::Command::new(bin).args(args).env("PIXGATE_HTTP__LISTEN", format!("127.0.0.1:{http_port}")).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    (out.status.success(), serde_json::from_str(&stdout).unwrap_or(Value::Null), String::from_utf8_lossy(&out.stderr).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_25_minutes_then_back_delivers_in_order_and_expires_what_outlived_its_ttl() {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let out = std::env::temp_dir().join(format!("pixgate-offline-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let broker = KafkaBroker::start(&out.join("kafka")).expect("broker");
    capture::ensure_topics(broker.addr(), &capture::PIXGATE_TOPICS).await.unwrap();
    let settings = GatewaySettings {
        brokers: broker.addr().to_string(),
        group_id: "pixgate-offline".into(),
        mqtt_port: free_port(),
        http_port: free_port(),
        ack_timeout_ms: 2_000,
        outbox_path: out.join("data/outbox.redb"),
    };
    let bin = gateway::find_binary().unwrap();
    let control = [("PIXGATE_CLOCK__CONTROL", "true".to_string())];
    let gw = GatewayProcess::spawn_with_env(&bin, settings.clone(), &control, &out.join("pixgate.log"), Duration::from_secs(60)).unwrap();

    let all = registry::devices_from_jsonl(fixtures.join("devices.jsonl")).unwrap();
    let spec = |id: &str| all.iter().find(|d| d.id() == id).unwrap().clone();
    let fleet_cfg = |devices| fleet::FleetConfig { mqtt_host: "127.0.0.1".into(), mqtt_port: settings.mqtt_port, out_dir: out.join("devices"), devices };
    let printer = fleet::start(fleet_cfg(vec![spec(PRINTER)])).await.unwrap();
    printer.wait_connected(Duration::from_secs(30)).await.unwrap();
    // The card machine connects, then goes away: its retained status says offline.
    let terminal = fleet::start(fleet_cfg(vec![spec(TERMINAL)])).await.unwrap();
    terminal.wait_connected(Duration::from_secs(30)).await.unwrap();
    terminal.shutdown().await;

    let n = capture::publish_file(broker.addr(), &fixtures.join("devices.jsonl")).await.unwrap() as u64;
    pixgate_tests::demo::wait_until(&gw, Instant::now() + Duration::from_secs(60), |s| s["devices_applied"].as_u64() >= Some(n)).await.unwrap();

    let template = pixgate_tests::charges::template(&fixtures);
    let t = chrono::Utc::now().timestamp() as u64;
    let records = vec![
        charge(&template, "aaaaaaaaaaaaaaaaaaaaaaaa", "ACTIVE", 0, 60, t), // QR valid for an hour: shown when back
        charge(&template, "bbbbbbbbbbbbbbbbbbbbbbbb", "ACTIVE", 0, 15, t), // QR expires while offline
        charge(&template, "cccccccccccccccccccccccc", "ACTIVE", 0, 60, t), // QR superseded by "paid"…
        charge(&template, "cccccccccccccccccccccccc", "COMPLETED", 1, 60, t), // …whose 10 min TTL passes; the receipt prints
    ];
    // One at a time: the charges have different keys, so different partitions, and the
    // order a device gets them in is the order pixgate reads them in.
    let producer = capture::producer(broker.addr()).unwrap();
    for (i, r) in records.iter().enumerate() {
        capture::publish_records(&producer, std::slice::from_ref(r)).await.unwrap();
        let read = n + i as u64 + 1;
        pixgate_tests::demo::wait_until(&gw, Instant::now() + Duration::from_secs(30), |s| {
            s["events_read"]["charge.upserted"].as_u64() == Some(read - n) && s["pending_records"] == 0
        })
        .await
        .unwrap();
    }

    // The printer is not held back by the offline card machine.
    wait_for("the receipt on the paired printer", Duration::from_secs(60), || carried_out(&printer, PRINTER) == [("print_receipt".to_string(), "c".repeat(24))]).await;
    pixgate_tests::demo::wait_until(&gw, Instant::now() + Duration::from_secs(30), |s| s["outbox_jobs"] == 3 && s["superseded"] == 1).await.unwrap();
    let (ok, queued, err) = pixgate_cli(&bin, settings.http_port, &["outbox", "list", TERMINAL]);
    assert!(ok, "{err}");
    let kinds: Vec<(&str, &str)> = queued["jobs"].as_array().unwrap().iter().map(|j| (j["kind"].as_str().unwrap(), &j["charge_id"].as_str().unwrap()[..1])).collect();
    assert_eq!(kinds, [("display_qr", "a"), ("display_qr", "b"), ("payment_confirmed", "c")], "the backlog, in order");

    // 25 minutes pass.
    let (status, body) = pixgate_tests::net::http_post(&format!("127.0.0.1:{}", settings.http_port), "/clock/advance?ms=1500000").unwrap();
    assert_eq!(status, 200, "{body}");
    pixgate_tests::demo::wait_until(&gw, Instant::now() + Duration::from_secs(30), |s| s["expired"]["display_qr"] == 1 && s["expired"]["payment_confirmed"] == 1 && s["outbox_jobs"] == 1)
        .await
        .unwrap();

    // Back online: only the QR still valid is shown.
    let terminal = fleet::start(fleet_cfg(vec![spec(TERMINAL)])).await.unwrap();
    terminal.wait_connected(Duration::from_secs(30)).await.unwrap();
    wait_for("the valid QR", Duration::from_secs(30), || !carried_out(&terminal, TERMINAL).is_empty()).await;
    pixgate_tests::demo::wait_until(&gw, Instant::now() + Duration::from_secs(30), |s| s["outbox_jobs"] == 0).await.unwrap();
    assert_eq!(carried_out(&terminal, TERMINAL), [("display_qr".to_string(), "a".repeat(24))]);

    // The expired jobs are recorded on the dead-letter topic, and listed by the CLI.
    let dls = read_dead_letters(broker.addr(), 2).await;
    let mut seen: Vec<(String, String, String)> = dls.iter().map(|d| (d["reason"].as_str().unwrap().into(), d["effect"].as_str().unwrap().into(), d["device"].as_str().unwrap().into())).collect();
    seen.sort();
    assert_eq!(seen, [("expired".into(), "display_qr".into(), TERMINAL.into()), ("expired".into(), "payment_confirmed".into(), TERMINAL.into())]);
    let (ok, list, err) = pixgate_cli(&bin, settings.http_port, &["deadletter", "list"]);
    assert!(ok, "{err}");
    let paid = list["deadletters"].as_array().unwrap().iter().find(|d| d["effect"] == "payment_confirmed").unwrap().clone();
    assert_eq!((paid["state"].as_str(), paid["replayable"].as_bool()), (Some("published"), Some(true)), "{paid}");

    // An operator replays the "paid" screen: it comes after the QR, with its original id.
    let id = paid["id"].as_u64().unwrap().to_string();
    let (ok, replayed, err) = pixgate_cli(&bin, settings.http_port, &["deadletter", "replay", &id]);
    assert!(ok, "{err}");
    assert_eq!(replayed["replayed"]["message_id"], paid["message_id"]);
    wait_for("the replayed paid screen", Duration::from_secs(30), || carried_out(&terminal, TERMINAL).len() == 2).await;
    assert_eq!(carried_out(&terminal, TERMINAL)[1], ("payment_confirmed".to_string(), "c".repeat(24)));
    let (ok, _, err) = pixgate_cli(&bin, settings.http_port, &["deadletter", "replay", &id]);
    assert!(!ok && err.contains("already replayed"), "a second replay is refused: {err}");

    terminal.shutdown().await;
    printer.shutdown().await;
    drop(gw);
    broker.stop();
    let _ = std::fs::remove_dir_all(&out);
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
        let m = tokio::time::timeout(Duration::from_secs(60), consumer.recv()).await.expect("dead letters within 60 s").unwrap();
        out.push(serde_json::from_slice(m.payload().unwrap()).unwrap());
    }
    out
}
