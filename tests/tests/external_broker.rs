//! pixgate delivering through an external MQTT broker (the central shape's transport,
//! `[broker]`): Debian's `mosquitto` holds the devices' connections, pixgate is one more
//! client of it, and the broker is a pipe: every job stays pixgate's until the device's own
//! ack comes back through the broker.
//!
//! The broker is set up as a payments company would: TLS only, every client proves who it
//! is with a certificate from the fleet CA (`require_certificate`,
//! `use_identity_as_username`), and an ACL keeps each device to its own topics while
//! pixgate's identity may publish every device's jobs and read every device's acks and
//! status.
//!
//! A generated scenario (charges on card machines and printers, published as a shop
//! produces them) runs through it while mosquitto is SIGKILLed and restarted (it keeps no
//! sessions: every queued message in it is lost) and, later, pixgate is SIGKILLed and
//! restarted. At the end every effect the routing rules call for (an independent model,
//! `simulators::expected`) was carried out by its device exactly once after the device's
//! dedupe, in order per device, and nothing else happened. Then `/readyz` fails while the
//! broker is gone, naming it, and passes again once it is back.
//!
//! Real tansu, real mosquitto, real TLS, the `pixgate` binary, the devices in-process
//! (`simulators::fleet`). Scale: `PIXGATE_BROKER_EVENTS` (default 1,500),
//! `PIXGATE_BROKER_DEVICES` (default 40), `PIXGATE_BROKER_SEED`.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::devices_broker::DevicesBroker;
use pixgate_tests::harness::Rig;
use pixgate_tests::scenario::{self, env_scale, Plan};
use simulators::capture::generate::ScenarioConfig;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest wait for readiness to change.
const WAIT: Duration = Duration::from_secs(30);

/// Polls pixgate's `/readyz` until it answers 503 with a line containing `text`.
async fn wait_unready(rig: &Rig, text: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = rig.gateway().get("/readyz");
        if let Ok((503, body)) = &answer {
            if body.contains(text) {
                println!("external broker: /readyz 503: {}", body.trim());
                return;
            }
        }
        assert!(Instant::now() < deadline, "/readyz never failed with `{text}`; last answer {answer:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls pixgate's `/readyz` until it answers 200 (ready again once the broker is back).
async fn wait_ready(rig: &Rig) {
    let deadline = Instant::now() + WAIT;
    while !rig.gateway().is_ready() {
        assert!(Instant::now() < deadline, "not ready again after the broker came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_go_through_mosquitto_and_survive_its_crash_and_pixgates() {
    let events = env_scale("PIXGATE_BROKER_EVENTS", 1_500);
    let devices = env_scale("PIXGATE_BROKER_DEVICES", 40);
    let seed = env_scale("PIXGATE_BROKER_SEED", 20_261_203) as u64;
    let began = Instant::now();
    let plan = Arc::new(Plan::new(ScenarioConfig::new(seed, devices, events)));
    let expected = plan.expected_count() as u64;
    println!(
        "external broker: seed {seed}, {} devices, {events} charge events, {expected} expected effects",
        plan.devices.len()
    );

    let dir = std::env::temp_dir().join(format!("pixgate-external-broker-mosquitto-{}", std::process::id()));
    let mut mosquitto = DevicesBroker::prepare(&dir, &plan.devices);
    let broker = mosquitto.start().await;
    let mut rig = Rig::builder("external-broker")
        .envs(mosquitto.gateway_env())
        .env("PIXGATE_HEALTH__DEVICE_BROKER_DOWN_AFTER_MS", "2000")
        .start()
        .await;
    let run = mosquitto.run_scenario(&rig, &plan).await;
    let (stats, deadline) = (run.stats.clone(), run.deadline);

    // mosquitto dies with jobs and acks in it, and comes back empty.
    scenario::wait_carried(&stats, expected / 3, deadline, "the broker's crash").await;
    broker.stop().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let crashed_at = stats.carried_out();
    let broker = mosquitto.start().await;
    println!("external broker: mosquitto SIGKILLed and restarted at {crashed_at} effects");

    // Then pixgate dies, its outbox and its broker sessions left behind.
    scenario::wait_carried(&stats, crashed_at + expected / 3, deadline, "pixgate's crash").await;
    rig.gateway().wait_assigned(Duration::from_secs(60)).await.unwrap();
    rig.kill_gateway();
    rig.start_gateway();
    println!("external broker: pixgate SIGKILLed and restarted at {} effects", stats.carried_out());

    let positions = run.feeder.await.unwrap().expect("feeding the charge events");
    let charge_ends = scenario::end_offsets(&positions);
    let device_ends = scenario::end_offsets(&run.device_positions);
    scenario::wait_all_delivered(rig.gateway(), &plan, &charge_ends, &device_ends, &stats, deadline).await.unwrap();
    wait_ready(&rig).await;
    let report = run.fleet.shutdown().await;

    let checked = scenario::check_delivery(&plan, &positions, &report.effects).unwrap();
    assert_eq!(report.stats.order_violations, 0, "devices saw seq going backwards");
    let log = std::fs::read_to_string(rig.dir().join("pixgate.log")).unwrap_or_default();
    assert!(log.contains("devices through an external MQTT broker"), "pixgate used the external broker");
    assert!(
        pixgate_tests::devices_broker::jobs_connection_lost(&log),
        "pixgate saw the broker go (its log: {})",
        rig.dir().join("pixgate.log").display()
    );
    println!(
        "external broker: {} effects on {} devices, each exactly once and in order through mosquitto, its crash and pixgate's; {} raw job deliveries ({} duplicates absorbed by device dedupe); {:.0} s",
        checked.effects,
        checked.devices,
        report.stats.raw_jobs,
        report.stats.duplicates,
        began.elapsed().as_secs_f64()
    );

    // Readiness tells the truth about the broker: gone, then back.
    broker.stop().await;
    wait_unready(&rig, "the devices' MQTT broker unreachable for").await;
    let broker = mosquitto.start().await;
    wait_ready(&rig).await;
    broker.stop().await;
    rig.shutdown();
    mosquitto.remove();
}
