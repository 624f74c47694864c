//! SIGTERM: pixgate stops reading, writes what it read, commits and exits 0 within its
//! shutdown bound. The commit is real: started again on the same group, it reads nothing
//! twice.

use pixgate_tests::broker::KafkaBroker;
use pixgate_tests::demo::wait_until;
use pixgate_tests::gateway::{self, GatewayProcess, GatewaySettings};
use pixgate_tests::net::free_port;
use simulators::{capture, fleet, registry};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_commits_what_was_read_and_exits_cleanly() {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let out = std::env::temp_dir().join(format!("pixgate-sigterm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let broker = KafkaBroker::start(&out.join("kafka")).expect("broker");
    capture::ensure_topics(broker.addr(), &capture::PIXGATE_TOPICS).await.unwrap();
    let settings = GatewaySettings {
        brokers: broker.addr().to_string(),
        group_id: "pixgate-sigterm".into(),
        mqtt_port: free_port(),
        http_port: free_port(),
        ack_timeout_ms: 2_000,
        outbox_path: out.join("data/outbox.redb"),
    };
    let bin = gateway::find_binary().unwrap();
    let clock = pixgate_tests::replay_clock_env(&fixtures);
    let mut gw = GatewayProcess::spawn_with_env(&bin, settings.clone(), &clock, &out.join("pixgate-1.log"), Duration::from_secs(60)).unwrap();
    let devices = registry::devices_from_jsonl(fixtures.join("devices.jsonl")).unwrap();
    let fleet = fleet::start_with(fleet::FleetConfig { mqtt_host: "127.0.0.1".into(), mqtt_port: settings.mqtt_port, out_dir: out.join("devices"), devices }, false)
        .await
        .unwrap();
    fleet.wait_connected(Duration::from_secs(30)).await.unwrap();
    // The registry first (as the contract asks), then every charge event at once.
    let mut published = capture::publish_file(broker.addr(), &fixtures.join("devices.jsonl")).await.unwrap() as u64;
    let n = published;
    wait_until(&gw, Instant::now() + Duration::from_secs(60), |s| s["devices_applied"].as_u64() >= Some(n)).await.unwrap();
    published += capture::publish_file(broker.addr(), &fixtures.join("charges.jsonl")).await.unwrap() as u64;
    let read_all = |s: &serde_json::Value| s["events_read"].as_object().map_or(0, |m| m.values().filter_map(|v| v.as_u64()).sum::<u64>()) >= published;
    wait_until(&gw, Instant::now() + Duration::from_secs(120), |s| read_all(s) && s["pending_records"] == 0).await.unwrap();

    // Mid-delivery (devices still working through their queues): SIGTERM.
    assert!(gw.stop(Duration::from_secs(30)), "exit 0 within the bound after SIGTERM; see {}", out.join("pixgate-1.log").display());
    let log = std::fs::read_to_string(out.join("pixgate-1.log")).unwrap();
    assert!(log.contains("final offsets committed"), "the final commit ran:\n{log}");

    // Started again: the committed position is past everything read, so nothing is read
    // again; the jobs still queued come from the outbox and are all carried out.
    let gw = GatewayProcess::spawn_with_env(&bin, settings.clone(), &clock, &out.join("pixgate-2.log"), Duration::from_secs(60)).unwrap();
    wait_until(&gw, Instant::now() + Duration::from_secs(180), |s| s["outbox_jobs"] == 0 && s["pending_records"] == 0).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = gw.stats().unwrap();
    assert_eq!(s["events_read"].as_object().map_or(0, |m| m.len()), 0, "nothing read twice after a clean stop: {s}");
    let report = fleet.shutdown().await;
    // A QR may be superseded while devices work through the burst; every other effect is
    // certain, and nothing is carried out that was not expected.
    let want: BTreeSet<(String, String, String)> = pixgate_tests::expected_effects(&fixtures)
        .into_iter()
        .flat_map(|((device, charge), kinds)| kinds.into_iter().map(move |k| (device.clone(), charge.clone(), k)))
        .collect();
    let got: BTreeSet<(String, String, String)> = report.effects.iter().map(|e| (e.device.clone(), e.charge.clone(), e.kind.as_str().to_string())).collect();
    let missing: Vec<_> = want.iter().filter(|e| e.2 != "display_qr" && !got.contains(*e)).collect();
    assert!(missing.is_empty(), "lost across the SIGTERM: {missing:?}");
    assert!(got.is_subset(&want), "extra: {:?}", got.difference(&want).collect::<Vec<_>>());
    drop(gw);
    broker.stop();
    let _ = std::fs::remove_dir_all(&out);
}
