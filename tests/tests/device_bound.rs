//! Backpressure per device: a card machine that is offline while charges keep coming fills
//! its queue to `outbox.max_jobs_per_device`; then pixgate stops reading the partitions
//! that feed it (they stay in Kafka, memory stays flat) instead of growing its outbox, and
//! reads on once the device is back and drains. Nothing is lost on the way.

use pixgate_tests::broker::KafkaBroker;
use pixgate_tests::charges::{charge_record, template};
use pixgate_tests::demo::wait_until;
use pixgate_tests::gateway::{self, GatewayProcess, GatewaySettings};
use pixgate_tests::net::free_port;
use simulators::{capture, fleet, registry};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const TERMINAL: &str = "7f80e222f828767efc2f9162";
const BOUND: u64 = 4;
const CHARGES: u64 = 15;
/// `charge.upserted` partitions (capture::PIXGATE_TOPICS).
const PARTITIONS: u64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_device_queue_pauses_its_partitions_until_it_drains() {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let out = std::env::temp_dir().join(format!("pixgate-bound-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let broker = KafkaBroker::start(&out.join("kafka")).expect("broker");
    capture::ensure_topics(broker.addr(), &capture::PIXGATE_TOPICS).await.unwrap();
    let settings = GatewaySettings {
        brokers: broker.addr().to_string(),
        group_id: "pixgate-bound".into(),
        mqtt_port: free_port(),
        http_port: free_port(),
        ack_timeout_ms: 2_000,
        outbox_path: out.join("data/outbox.redb"),
    };
    let env = [("PIXGATE_OUTBOX__MAX_JOBS_PER_DEVICE", BOUND.to_string())];
    let gw = GatewayProcess::spawn_with_env(&gateway::find_binary().unwrap(), settings.clone(), &env, &out.join("pixgate.log"), Duration::from_secs(60)).unwrap();

    let spec = registry::devices_from_jsonl(fixtures.join("devices.jsonl")).unwrap().into_iter().find(|d| d.id() == TERMINAL).unwrap();
    let fleet_cfg = || fleet::FleetConfig { mqtt_host: "127.0.0.1".into(), mqtt_port: settings.mqtt_port, out_dir: out.join("devices"), devices: vec![spec.clone()] };
    let terminal = fleet::start(fleet_cfg()).await.unwrap();
    terminal.wait_connected(Duration::from_secs(30)).await.unwrap();
    terminal.shutdown().await; // offline (retained status)

    let n = capture::publish_file(broker.addr(), &fixtures.join("devices.jsonl")).await.unwrap() as u64;
    wait_until(&gw, Instant::now() + Duration::from_secs(60), |s| s["devices_applied"].as_u64() >= Some(n)).await.unwrap();

    let tpl = template(&fixtures);
    let t = chrono::Utc::now().timestamp() as u64;
    let ids: Vec<String> = (0..CHARGES).map(|i| format!("{i:024x}")).collect();
    let records: Vec<_> = ids.iter().map(|id| charge_record(&tpl, TERMINAL, id, "ACTIVE", 0, 60, t)).collect();
    capture::publish_records(&capture::producer(broker.addr()).unwrap(), &records).await.unwrap();

    // The device's queue fills to its bound and reading stops there.
    wait_until(&gw, Instant::now() + Duration::from_secs(60), |s| s["devices_at_bound"] == 1 && s["pending_records"] == 0 && s["outbox_jobs"].as_u64() >= Some(BOUND))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await; // would anything more be read?
    let s = gw.stats().unwrap();
    let queued = s["outbox_jobs"].as_u64().unwrap();
    let read = s["events_read"]["charge.upserted"].as_u64().unwrap_or(0);
    // Soft by at most one record per partition: each paused at the record that found the device full.
    assert!(queued < BOUND + PARTITIONS, "queue held to its bound: {queued} jobs (bound {BOUND})\n{s}");
    assert!(read < CHARGES, "the rest waits in Kafka: {read} of {CHARGES} read\n{s}");
    assert!(s["paused_partitions"].as_u64() >= Some(1), "{s}");

    // Back online: everything arrives, the partitions resume.
    let terminal = fleet::start(fleet_cfg()).await.unwrap();
    terminal.wait_connected(Duration::from_secs(30)).await.unwrap();
    wait_until(&gw, Instant::now() + Duration::from_secs(120), |s| {
        s["events_read"]["charge.upserted"].as_u64() == Some(CHARGES) && s["outbox_jobs"] == 0 && s["pending_records"] == 0
    })
    .await
    .unwrap();
    let s = gw.stats().unwrap();
    assert_eq!((s["paused_partitions"].as_u64(), s["devices_at_bound"].as_u64()), (Some(0), Some(0)), "{s}");
    let shown: BTreeSet<String> = terminal.effects().into_iter().map(|e| e.charge).collect();
    assert_eq!(shown, ids.iter().cloned().collect::<BTreeSet<_>>(), "every QR shown once the device is back");
    assert_eq!(terminal.duplicates(), 0);

    terminal.shutdown().await;
    drop(gw);
    broker.stop();
    let _ = std::fs::remove_dir_all(&out);
}
