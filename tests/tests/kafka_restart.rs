//! The Kafka broker restarts mid-run (tansu with SQLite storage, killed and started again
//! on the same data folder and port; see `KafkaBroker::restart` for why a kill) while
//! pixgate keeps running: nothing is lost (every
//! record is still on its topic, pixgate's committed offsets survived), pixgate recovers by
//! itself (it is never restarted; `/readyz` may go red during the outage and must come back)
//! and every effect the routing rules call for is delivered exactly once, in order. During
//! the outage the devices keep getting what pixgate had already accepted into its outbox.
//!
//! Two outages:
//! - a quick restart (about 2 s, shorter than `session.timeout.ms`) with the production
//!   setting, static group membership (`kafka.instance_id`);
//! - a long one (over 12 s, past the 10 s session timeout, so pixgate must rejoin the group
//!   from scratch) with dynamic membership. With static membership, tansu 0.6.0 sometimes
//!   keeps the group in `Forming` after such an outage with a leader member id that is no
//!   longer a member (the static member came back under a new member id), and the group
//!   never completes: pixgate gets its partitions, loses them 3 s later and never gets them
//!   back. Seen in 1 of 3 runs of this test and 1 of 5 runs of a plain restart script (0 of
//!   5 with dynamic membership); a real Kafka broker replaces a static member's id instead.

// Helpers of a test are test steps too: a panic is a failed test (clippy.toml's
// allow-unwrap-in-tests covers only the #[test] fns themselves).
#![allow(clippy::unwrap_used)]

use pixgate_tests::gateway::stats_json;
use pixgate_tests::harness::{verifying_devices, Rig};
use pixgate_tests::kafka::{committed_offsets, read_topic, wait_committed};
use pixgate_tests::scenario::{self, Plan};
use simulators::capture::generate::ScenarioConfig;
use simulators::device::Stats;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_broker_restart_with_static_membership() {
    broker_restart_mid_run(Membership::Static, Duration::from_secs(2), 1_200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_broker_outage_past_the_session_timeout() {
    broker_restart_mid_run(Membership::Dynamic, Duration::from_secs(12), 2_000).await;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Membership {
    /// `group.instance.id` set (pixgate's recommended setting).
    Static,
    /// No `group.instance.id`.
    Dynamic,
}

/// Publishes `events` charge events keeping up, kills the broker a third of the way
/// through, keeps it down for at least `outage` (and, for long outages, until pixgate's
/// outbox has drained to the devices), starts it again, and checks everything.
async fn broker_restart_mid_run(membership: Membership, outage: Duration, events: usize) {
    let plan = Arc::new(Plan::new(ScenarioConfig::new(777, 60, events)));
    let expected = plan.expected_count();
    let name = format!("{membership:?}-{}s", outage.as_secs()).to_lowercase();
    println!(
        "kafka restart ({name}): {} devices, {} charge events, {expected} expected effects",
        plan.devices.len(),
        plan.charges.len()
    );

    let mut rig = Rig::builder(&format!("kafka-restart-{name}"));
    if membership == Membership::Dynamic {
        rig = rig.env("PIXGATE_KAFKA__INSTANCE_ID", "");
    }
    let rig = rig.start().await;
    let stats = Arc::new(Stats::default());
    let fleet = rig.start_fleet(plan.devices.clone(), verifying_devices(&stats)).await;
    let producer = rig.producer();
    let device_positions = scenario::publish_registry(&producer, &plan, rig.gateway()).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(400);
    let feeder = {
        let (plan, stats) = (plan.clone(), stats.clone());
        tokio::spawn(async move { scenario::feed_keeping_up(&producer, &plan, stats, deadline).await })
    };

    // A third of the way through, kill the broker ...
    while stats.carried_out() < expected as u64 / 3 {
        assert!(
            Instant::now() < deadline && !feeder.is_finished(),
            "no progress before the restart: {}",
            stats.carried_out()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ... and once pixgate has committed offsets (auto-commit runs every second).
    let (brokers, group) = (rig.brokers().to_string(), rig.settings().group_id.clone());
    let before = wait_committed(&brokers, &group, "charge.upserted", 3, deadline, |c| c.iter().any(|&o| o > 0))
        .await
        .expect("pixgate committed nothing");
    rig.broker().kill();
    let down_at = Instant::now();
    let carried_at_stop = stats.carried_out();

    // While the broker is down: pixgate stays up; in a long outage the outbox drains to
    // the devices.
    let mut ready_during_outage = Vec::new();
    loop {
        ready_during_outage.push(rig.gateway().is_ready());
        let s = rig.gateway().stats().expect("pixgate serves /stats during the outage");
        let drained = s.counters.outbox_jobs == 0 && s.counters.queued_jobs == 0;
        if down_at.elapsed() >= outage && (drained || membership == Membership::Static) {
            break;
        }
        assert!(Instant::now() < deadline, "the outbox did not drain while Kafka was down: {}", stats_json(&s));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let delivered_in_outage = stats.carried_out() - carried_at_stop;
    rig.broker().start_again().expect("broker restart on the same folder and port");
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
    let records = read_topic(
        &brokers,
        "charge.upserted",
        3,
        plan.charges.len(),
        Duration::from_millis(500),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert_eq!(records.len(), plan.charges.len(), "records on charge.upserted after the restart");
    let positions = scenario::positions_from_topic(&plan.charges, &records).unwrap();
    let misreported = reported.iter().zip(&positions).filter(|(r, p)| r != p).count();

    // pixgate catches up alone, and is ready again.
    let (charge_ends, device_ends) = (scenario::end_offsets(&positions), scenario::end_offsets(&device_positions));
    scenario::wait_all_delivered(rig.gateway(), &plan, &charge_ends, &device_ends, &stats, deadline).await.unwrap();
    let ready_deadline = Instant::now() + Duration::from_secs(30);
    while !rig.gateway().is_ready() {
        assert!(
            Instant::now() < ready_deadline,
            "/readyz did not come back after the broker restart: {:?}",
            rig.gateway().get("/readyz")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let report = fleet.shutdown().await;
    let checked = scenario::check_delivery(&plan, &positions, &report.effects).unwrap();
    let went_red = ready_during_outage.iter().filter(|r| !**r).count();
    println!(
        "kafka restart ({name}): broker down {:.1} s at {carried_at_stop} of {expected} effects; {delivered_in_outage} effects delivered from the outbox during the outage; /readyz red in {went_red} of {} polls during it, green after; committed offsets {before:?} before, {after:?} after; {} effects delivered exactly once in order; {} records intact on the topic (producer delivery reports wrong for {misreported} of them); {} raw deliveries",
        outage.as_secs_f64(),
        ready_during_outage.len(),
        checked.effects,
        records.len(),
        report.stats.raw_jobs
    );
    rig.shutdown();
}
