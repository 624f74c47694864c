//! SIGTERM: pixgate stops reading, writes what it read, commits and exits 0 within its
//! shutdown bound. The commit is real: started again on the same group, it reads nothing
//! twice. With Kafka gone, on the edge box and in the central shape mid-delivery, it still
//! exits 0, within seconds of its `stopped` line.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::central::DEVICE_JOBS;
use pixgate_tests::devices_broker::DevicesBroker;
use pixgate_tests::gateway::{stats_json, total};
use pixgate_tests::harness::{replay_devices, Rig};
use pixgate_tests::scenario::{self, Plan};
use simulators::capture::{self, generate::ScenarioConfig};
use std::collections::BTreeSet;
use std::sync::Arc;
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

/// SIGTERM while Kafka is away: librdkafka's clients cannot close cleanly (each waits for
/// brokers that are gone, rust-rdkafka #611), and pixgate still exits within its bound
/// rather than waiting for them for good (an operator's `systemctl stop` would otherwise
/// wait for systemd's own kill). On the edge box, and in the central shape mid-delivery,
/// whose delivery log producer never gives a record up (`message.timeout.ms` = 0) and has
/// the ends of the jobs done since Kafka went away still to write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_kafka_is_away_still_exits() {
    let mut rig = Rig::builder("sigterm-kafka-away").start().await;
    rig.gateway().wait_assigned(Duration::from_secs(60)).await.unwrap();
    rig.broker().kill();
    // The clients notice: their connections fail and retry.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stops_within_its_bound(&mut rig, "the edge box");
    rig.shutdown();

    let plan = Arc::new(Plan::new(ScenarioConfig::new(7, 20, 600)));
    let dir = std::env::temp_dir().join(format!("pixgate-sigterm-central-mosquitto-{}", std::process::id()));
    let mut mosquitto = DevicesBroker::prepare(&dir, &plan.devices);
    let _broker = mosquitto.start().await;
    let mut rig = mosquitto.central_rig("sigterm-central-kafka-away", DEVICE_JOBS).await;
    let run = mosquitto.run_scenario(&rig, &plan).await;
    // Mid-delivery: jobs queued, devices acking, ends being logged.
    scenario::wait_carried(&run.stats, plan.expected_count() as u64 / 3, run.deadline, "Kafka goes away").await;
    rig.broker().kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stops_within_its_bound(&mut rig, "the central shape");
    run.fleet.shutdown().await;
    rig.shutdown();
    mosquitto.remove();
}

/// Longest wait from pixgate's `stopped` line to its exit: its exit wait for what still
/// runs on its blocking threads (5 s), and some slack.
const EXIT_AFTER_STOPPED: Duration = Duration::from_secs(10);

/// SIGTERMs the rig's pixgate and asserts it ran its shutdown, logged `stopped` and
/// exited 0 within [`EXIT_AFTER_STOPPED`] of it.
fn stops_within_its_bound(rig: &mut Rig, shape: &str) {
    let log = rig.gateway().log().to_path_buf();
    let started = std::time::Instant::now();
    let exited = rig.stop_gateway(Duration::from_secs(60));
    let gone_at = chrono::Utc::now();
    let text = std::fs::read_to_string(&log).unwrap();
    let stopped_at = text
        .lines()
        .find(|l| l.contains("gateway::app: stopped"))
        .and_then(|l| chrono::DateTime::parse_from_rfc3339(l.split_whitespace().next()?).ok())
        .unwrap_or_else(|| panic!("{shape}: no `stopped` line: it did not go through its shutdown:\n{text}"));
    let after = (gone_at - stopped_at.with_timezone(&chrono::Utc)).to_std().unwrap_or_default();
    println!(
        "{shape}: exited {:.1} s after SIGTERM with Kafka away, {:.1} s after its `stopped` line",
        started.elapsed().as_secs_f64(),
        after.as_secs_f64()
    );
    assert!(exited, "{shape}: not exited 0 within 60 s of SIGTERM with Kafka away; see {}", log.display());
    assert!(
        after <= EXIT_AFTER_STOPPED,
        "{shape}: exited {:.1} s after its `stopped` line (at most {EXIT_AFTER_STOPPED:?}); see {}",
        after.as_secs_f64(),
        log.display()
    );
}
