//! The crash proof at scale: a generated registry of printers and card machines, charge
//! lifecycles published as a shop produces them, and `pixgate` SIGKILLed at seeded random
//! moments and restarted on the same outbox and consumer group each time. At the end every
//! effect the routing rules call for (an independent model, `simulators::expected`) was
//! carried out by its device exactly once after the device's dedupe by message id, in
//! order per device (seq, and the offsets of each partition), and nothing else happened.
//!
//! Real tansu broker, real MQTT (pixgate's embedded broker), the devices in-process
//! (`simulators::fleet`, checking payloads without drawing them), real process kills. A
//! kill waits until the restarted pixgate has its partitions again: killing it in the
//! middle of its group join trips a tansu 0.6.0 bug (`GatewayProcess::wait_assigned`).
//!
//! Scale (environment): `PIXGATE_SCALE_EVENTS` (charge events, default 20,000: the issue's
//! proof, which takes about 2.5 min on 2 cores, most of it the 20 restarts),
//! `PIXGATE_SCALE_DEVICES` (default 500), `PIXGATE_SCALE_KILLS` (default 20),
//! `PIXGATE_SCALE_SEED`. `scripts/load.sh crash` runs it alone.

use pixgate_tests::harness::{verifying_devices, Rig};
use pixgate_tests::scenario::{self, env_scale, Plan};
use simulators::capture::generate::ScenarioConfig;
use simulators::device::Stats;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// SplitMix64, for the kill schedule (same seed, same moments).
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_scale_loses_nothing_and_repeats_nothing() {
    let events = env_scale("PIXGATE_SCALE_EVENTS", 20_000);
    let devices = env_scale("PIXGATE_SCALE_DEVICES", 500);
    let kills = env_scale("PIXGATE_SCALE_KILLS", 20);
    let seed = env_scale("PIXGATE_SCALE_SEED", 20_261_127) as u64;
    let began = Instant::now();
    let plan = Arc::new(Plan::new(ScenarioConfig::new(seed, devices, events)));
    let expected = plan.expected_count();
    println!("crash scale: seed {seed}, {} devices, {events} charge events, {expected} expected effects, {kills} kills; {:?}", plan.devices.len(), plan.summary());

    let mut rig = Rig::builder("crash-scale").start().await;
    let stats = Arc::new(Stats::default());
    let fleet = rig.start_fleet(plan.devices.clone(), verifying_devices(&stats)).await;
    let producer = rig.producer();
    let device_positions = scenario::publish_registry(&producer, &plan, rig.gateway()).await.unwrap();

    // Generous: the default scale took 2.5 min on 2 cores (4,000 events: 3.5 min on a
    // machine shared with other builds).
    let deadline = Instant::now() + Duration::from_secs(180) + Duration::from_millis(60 * events as u64);
    let mut feeder = {
        let (plan, stats) = (plan.clone(), stats.clone());
        tokio::spawn(async move { scenario::feed_keeping_up(&producer, &plan, stats, deadline).await })
    };

    // Kill when the devices have carried out a seeded random share of the effects, after
    // a seeded random delay: spread over the whole run whatever its speed.
    let mut rng = seed ^ 0xDEAD_BEEF;
    let mut thresholds: Vec<f64> =
        (0..kills).map(|_| 0.02 + 0.93 * (splitmix(&mut rng) % 10_000) as f64 / 10_000.0).collect();
    thresholds.sort_by(f64::total_cmp);
    let mut killed_at = Vec::new();
    let mut last_print = Instant::now();
    let mut fed = None;
    for (i, share) in thresholds.iter().enumerate() {
        let target = (share * expected as f64) as u64;
        while stats.carried_out() < target {
            assert!(
                Instant::now() < deadline,
                "stuck at {} of {expected} effects before kill {}",
                stats.carried_out(),
                i + 1
            );
            if fed.is_none() && feeder.is_finished() {
                let r = (&mut feeder).await.unwrap();
                if let Err(e) = &r {
                    panic!("feeding the charge events failed: {e:#}");
                }
                fed = Some(r);
            }
            if last_print.elapsed() > Duration::from_secs(15) {
                last_print = Instant::now();
                println!(
                    "crash scale: {:.0} s, {} of {expected} effects carried out, {i} kills so far",
                    began.elapsed().as_secs_f64(),
                    stats.carried_out()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(splitmix(&mut rng) % 500)).await;
        // Not during a group join (see `GatewayProcess::wait_assigned`).
        rig.gateway().wait_assigned(Duration::from_secs(60)).await.unwrap();
        let (p, q) = rig.gateway().stats().map_or(("?".into(), "?".into()), |s| {
            (s.counters.pending_records.to_string(), s.counters.queued_jobs.to_string())
        });
        killed_at.push(format!("{}@{}(p{p},q{q})", stats.carried_out(), began.elapsed().as_secs()));
        rig.kill_gateway();
        rig.start_gateway();
    }
    println!("crash scale: kills at effects@seconds(pending,queued): {}", killed_at.join(" "));

    let positions = match fed {
        Some(r) => r,
        None => feeder.await.unwrap(),
    }
    .expect("feeding the charge events");
    let charge_ends = scenario::end_offsets(&positions);
    let device_ends = scenario::end_offsets(&device_positions);
    scenario::wait_all_delivered(rig.gateway(), &plan, &charge_ends, &device_ends, &stats, deadline).await.unwrap();
    let report = fleet.shutdown().await;

    let checked = scenario::check_delivery(&plan, &positions, &report.effects).unwrap();
    assert_eq!(report.stats.order_violations, 0, "devices saw seq going backwards");
    println!(
        "crash scale: {kills} SIGKILLs; {} effects on {} devices, each exactly once and in order; {} raw job deliveries = {} redeliveries ({} duplicates absorbed by device dedupe, {} refused); {:.0} s",
        checked.effects,
        checked.devices,
        report.stats.raw_jobs,
        report.stats.raw_jobs - checked.effects as u64,
        report.stats.duplicates,
        report.stats.failed,
        began.elapsed().as_secs_f64()
    );
    rig.shutdown();
}
