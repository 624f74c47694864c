//! SIGTERM: pixgate stops reading, writes what it read, commits and exits 0 within its
//! shutdown bound. The commit is real: started again on the same group, it reads nothing
//! twice.

use pixgate_tests::gateway::{stats_json, total};
use pixgate_tests::harness::{replay_devices, Rig};
use simulators::capture;
use std::collections::BTreeSet;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_commits_what_was_read_and_exits_cleanly() {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let mut rig = Rig::builder("sigterm").envs(pixgate_tests::replay_clock_env(&fixtures)).start().await;
    let fleet = rig.start_fleet(pixgate_tests::fixture_devices(&fixtures), replay_devices()).await;
    // The registry first (as the contract asks), then every charge event at once.
    let mut published = rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;
    published += capture::publish_file(rig.brokers(), &fixtures.join("charges.jsonl")).await.unwrap() as u64;
    rig.wait_stats(Duration::from_secs(120), |s| {
        total(&s.counters.events_read) >= published && s.counters.pending_records == 0
    })
    .await;

    // Mid-delivery (devices still working through their queues): SIGTERM.
    let log = rig.gateway().log().to_path_buf();
    assert!(rig.stop_gateway(Duration::from_secs(30)), "exit 0 within the bound after SIGTERM; see {}", log.display());
    let text = std::fs::read_to_string(&log).unwrap();
    // "final offsets committed", or "… (already, by the last periodic commit)" when the
    // SIGTERM came more than `auto.commit.interval.ms` after the last record was stored.
    assert!(text.contains("final offsets committed"), "the final commit ran:\n{text}");

    // Started again: the committed position is past everything read, so nothing is read
    // again; the jobs still queued come from the outbox and are all carried out.
    rig.start_gateway();
    rig.wait_stats(Duration::from_secs(180), |s| s.counters.outbox_jobs == 0 && s.counters.pending_records == 0).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = rig.gateway().stats().unwrap();
    assert_eq!(s.counters.events_read.len(), 0, "nothing read twice after a clean stop: {}", stats_json(&s));
    let report = fleet.shutdown().await;
    // A QR may be superseded while devices work through the burst; every other effect is
    // certain, and nothing is carried out that was not expected.
    let want: BTreeSet<(String, String, String)> = pixgate_tests::expected_effects(&fixtures)
        .into_iter()
        .flat_map(|((device, charge), kinds)| kinds.into_iter().map(move |k| (device.clone(), charge.clone(), k)))
        .collect();
    let got: BTreeSet<(String, String, String)> =
        report.effects.iter().map(|e| (e.device.clone(), e.charge.clone(), e.kind.as_str().to_string())).collect();
    let missing: Vec<_> = want.iter().filter(|e| e.2 != "display_qr" && !got.contains(*e)).collect();
    assert!(missing.is_empty(), "lost across the SIGTERM: {missing:?}");
    assert!(got.is_subset(&want), "extra: {:?}", got.difference(&want).collect::<Vec<_>>());
    rig.shutdown();
}
