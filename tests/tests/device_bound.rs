//! Backpressure per device: a card machine that is offline while charges keep coming fills
//! its queue to `outbox.max_jobs_per_device`; then pixgate stops reading the partitions
//! that feed it (they stay in Kafka, memory stays flat) instead of growing its outbox, and
//! reads on once the device is back and drains. Nothing is lost on the way.

use pixgate_tests::charges::{charge_record, template};
use pixgate_tests::gateway::{count, stats_json};
use pixgate_tests::harness::{protocol_devices, Rig};
use simulators::capture;
use std::collections::BTreeSet;
use std::time::Duration;

const TERMINAL: &str = "7f80e222f828767efc2f9162";
const BOUND: u64 = 4;
const CHARGES: u64 = 15;
/// `charge.upserted` partitions (capture::PIXGATE_TOPICS).
const PARTITIONS: u64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_device_queue_pauses_its_partitions_until_it_drains() {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let rig = Rig::builder("bound").env("PIXGATE_OUTBOX__MAX_JOBS_PER_DEVICE", BOUND.to_string()).start().await;
    let spec = pixgate_tests::fixture_device(&fixtures, TERMINAL);
    rig.connect_and_leave(spec.clone()).await; // offline (retained status)
    rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;

    let tpl = template(&fixtures);
    let t = chrono::Utc::now().timestamp() as u64;
    let ids: Vec<String> = (0..CHARGES).map(|i| format!("{i:024x}")).collect();
    let records: Vec<_> = ids.iter().map(|id| charge_record(&tpl, TERMINAL, id, "ACTIVE", 0, 60, t)).collect();
    capture::publish_records(&rig.producer(), &records).await.unwrap();

    // The device's queue fills to its bound and reading stops there.
    rig.wait_stats(Duration::from_secs(60), |s| {
        s.counters.devices_at_bound == 1 && s.counters.pending_records == 0 && s.counters.outbox_jobs >= BOUND
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await; // would anything more be read?
    let s = rig.gateway().stats().unwrap();
    let json = stats_json(&s);
    let queued = s.counters.outbox_jobs;
    let read = count(&s.counters.events_read, "charge.upserted");
    // Soft by at most one record per partition: each paused at the record that found the device full.
    assert!(queued < BOUND + PARTITIONS, "queue held to its bound: {queued} jobs (bound {BOUND})\n{json}");
    assert!(read < CHARGES, "the rest waits in Kafka: {read} of {CHARGES} read\n{json}");
    assert!(s.counters.paused_partitions >= 1, "{json}");

    // Back online: everything arrives, the partitions resume.
    let terminal = rig.start_fleet(vec![spec], protocol_devices()).await;
    rig.wait_stats(Duration::from_secs(120), |s| {
        s.counters.events_read.get("charge.upserted").copied() == Some(CHARGES)
            && s.counters.outbox_jobs == 0
            && s.counters.pending_records == 0
    })
    .await;
    let s = rig.gateway().stats().unwrap();
    assert_eq!((s.counters.paused_partitions, s.counters.devices_at_bound), (0, 0), "{}", stats_json(&s));
    let shown: BTreeSet<String> = terminal.effects().into_iter().map(|e| e.charge).collect();
    assert_eq!(shown, ids.iter().cloned().collect::<BTreeSet<_>>(), "every QR shown once the device is back");
    assert_eq!(terminal.duplicates(), 0);

    terminal.shutdown().await;
    rig.shutdown();
}
