//! The Kafka broker restarts mid-run (tansu with SQLite storage, killed and started again
//! on the same data folder and port; see `KafkaBroker::restart` for why a kill) while
//! pixgate keeps running: nothing is lost (every
//! record is still on its topic, pixgate's committed offsets survived), pixgate recovers by
//! itself (it is never restarted; `/readyz` may go red during the outage and must come back)
//! and every effect the routing rules call for is delivered exactly once, in order. During
//! the outage the devices keep getting what pixgate had already accepted into its outbox.

use pixgate_tests::broker::KafkaBroker;
use pixgate_tests::gateway::{self, GatewayProcess, GatewaySettings};
use pixgate_tests::kafka::{committed_offsets, read_topic};
use pixgate_tests::net::free_port;
use pixgate_tests::scenario::{self, Plan};
use simulators::capture::{self, generate::ScenarioConfig};
use simulators::device::{Rendering, Stats};
use simulators::fleet::{self, FleetConfig, FleetOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restart_mid_run_loses_nothing_and_pixgate_recovers_alone() {
    let plan = Arc::new(Plan::new(ScenarioConfig::new(777, 60, 2_000)));
    let expected = plan.expected_count();
    println!("kafka restart: {} devices, {} charge events, {expected} expected effects", plan.devices.len(), plan.charges.len());

    let out = std::env::temp_dir().join(format!("pixgate-kafka-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let broker = KafkaBroker::start(&out.join("kafka")).expect("broker");
    capture::ensure_topics(broker.addr(), &capture::PIXGATE_TOPICS).await.unwrap();
    let settings = GatewaySettings {
        brokers: broker.addr().to_string(),
        group_id: "pixgate-kafka-restart".into(),
        mqtt_port: free_port(),
        http_port: free_port(),
        ack_timeout_ms: 2_000,
        outbox_path: out.join("data/outbox.redb"),
    };
    let gw = GatewayProcess::spawn(&gateway::find_binary().unwrap(), settings.clone(), &out.join("pixgate.log"), Duration::from_secs(60)).unwrap();
    let stats = Arc::new(Stats::default());
    let fleet = fleet::start_with_options(
        FleetConfig { mqtt_host: "127.0.0.1".into(), mqtt_port: settings.mqtt_port, out_dir: out.join("devices"), devices: plan.devices.clone() },
        FleetOptions { honor_expiry: true, rendering: Rendering::Verify, stats: stats.clone() },
    )
    .await
    .unwrap();
    fleet.wait_connected(Duration::from_secs(30)).await.unwrap();
    let producer = capture::producer(broker.addr()).unwrap();
    let device_positions = scenario::publish_registry(&producer, &plan, &gw).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(400);
    let feeder = {
        let (plan, stats) = (plan.clone(), stats.clone());
        tokio::spawn(async move { scenario::feed_keeping_up(&producer, &plan, stats, deadline).await })
    };

    // A third of the way through, with the auto-commit having run, stop the broker.
    while stats.carried_out() < expected as u64 / 3 {
        assert!(Instant::now() < deadline && !feeder.is_finished(), "no progress before the restart: {}", stats.carried_out());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (brokers, group) = (broker.addr().to_string(), settings.group_id.clone());
    let before = tokio::task::spawn_blocking({
        let (b, g) = (brokers.clone(), group.clone());
        move || committed_offsets(&b, &g, "charge.upserted", 3)
    })
    .await
    .unwrap()
    .unwrap();
    assert!(before.iter().any(|&o| o > 0), "pixgate committed nothing before the restart: {before:?}");
    broker.kill();
    let down_at = Instant::now();
    let carried_at_stop = stats.carried_out();

    // While the broker is down: pixgate stays up, the outbox drains to the devices.
    let mut ready_during_outage = Vec::new();
    loop {
        ready_during_outage.push(gw.is_ready());
        let s = gw.stats().expect("pixgate serves /stats during the outage");
        if s["outbox_jobs"] == 0 && s["queued_jobs"] == 0 && down_at.elapsed() > Duration::from_secs(5) {
            break;
        }
        assert!(Instant::now() < deadline, "the outbox did not drain while Kafka was down: {s}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let delivered_in_outage = stats.carried_out() - carried_at_stop;
    broker.start_again().expect("broker restart on the same folder and port");
    let outage = down_at.elapsed();

    // The broker kept the group's committed offsets (it did not reset them).
    let after = tokio::task::spawn_blocking({
        let (b, g) = (brokers.clone(), group.clone());
        move || committed_offsets(&b, &g, "charge.upserted", 3)
    })
    .await
    .unwrap()
    .unwrap();
    for (p, (b, a)) in before.iter().zip(&after).enumerate() {
        assert!(a >= b, "partition {p}: committed offset {a} after the restart, {b} before: offsets lost");
    }

    // Every record is still on the topic after the restart, byte for byte, exactly once;
    // where it is comes from the topic itself (see `positions_from_topic`).
    let reported = feeder.await.unwrap().expect("feeding the charge events across the outage");
    let records = read_topic(&brokers, "charge.upserted", 3, plan.charges.len(), Duration::from_millis(500), Duration::from_secs(60)).await.unwrap();
    assert_eq!(records.len(), plan.charges.len(), "records on charge.upserted after the restart");
    let positions = scenario::positions_from_topic(&plan.charges, &records).unwrap();
    let misreported = reported.iter().zip(&positions).filter(|(r, p)| r != p).count();

    // pixgate catches up alone, and is ready again.
    let (charge_ends, device_ends) = (scenario::end_offsets(&positions), scenario::end_offsets(&device_positions));
    scenario::wait_all_delivered(&gw, &plan, &charge_ends, &device_ends, &stats, deadline).await.unwrap();
    let ready_deadline = Instant::now() + Duration::from_secs(30);
    while !gw.is_ready() {
        assert!(Instant::now() < ready_deadline, "/readyz did not come back after the broker restart: {:?}", gw.get("/readyz"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let report = fleet.shutdown().await;
    drop(gw);
    broker.stop();
    let checked = scenario::check_delivery(&plan, &positions, &report.effects).unwrap();
    let went_red = ready_during_outage.iter().filter(|r| !**r).count();
    println!(
        "kafka restart: broker down {:.1} s at {carried_at_stop} of {expected} effects; {delivered_in_outage} effects delivered from the outbox during the outage; /readyz red in {went_red} of {} polls during it, green after; committed offsets {before:?} before, {after:?} after; {} effects delivered exactly once in order; {} records intact on the topic (producer delivery reports wrong for {misreported} of them); {} raw deliveries",
        outage.as_secs_f64(),
        ready_during_outage.len(),
        checked.effects,
        records.len(),
        report.stats.raw_jobs
    );
    let _ = std::fs::remove_dir_all(&out);
}
