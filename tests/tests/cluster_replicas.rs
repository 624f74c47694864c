//! Two pixgate replicas of the central shape, on tansu and Debian's `mosquitto` (TLS,
//! client certificates, an ACL), the `pixgate` binary twice: the charge partitions are
//! shared in the route group and the device-jobs partitions in the deliver group, and each
//! replica reads the whole device registry outside any group, so either can route any
//! charge to any device.
//!
//! Replica A starts first and reads the registry as it is published; replica B starts on a
//! fresh outbox once the registry is on Kafka, so its registry reader must read every
//! device record before it joins the group (the start gate). Only then are the charge
//! events produced. At the end: every effect the routing rules call for (the independent
//! model, `simulators::expected`) was carried out by its device exactly once after the
//! device's dedupe, in order per device; each replica routed charges and delivered jobs;
//! neither committed a `device.upserted` offset.
//!
//! Steady state only: no replica dies or joins while jobs are queued. Moving a device's
//! queue to another replica needs the delivery log (`docs/cluster.md`, "Status").
//! Scale: `PIXGATE_REPLICAS_EVENTS` (default 1,500), `PIXGATE_REPLICAS_DEVICES` (default
//! 40), `PIXGATE_REPLICAS_SEED`.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::devices_broker::DevicesBroker;
use pixgate_tests::gateway::{count, GatewayProcess, GatewaySettings};
use pixgate_tests::harness::{fleet_connect_timeout, verifying_devices, Rig};
use pixgate_tests::kafka::committed_offsets;
use pixgate_tests::net::free_port;
use pixgate_tests::scenario::{self, env_scale, Plan};
use simulators::capture::generate::ScenarioConfig;
use simulators::capture::PIXGATE_TOPICS;
use simulators::device::Stats;
use simulators::fleet;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The device-jobs topic and its partition count.
const DEVICE_JOBS: (&str, i32) = ("pixgate.device-jobs", 6);

/// Each replica's settings beyond the rig's: the central shape, its own client ids on the
/// broker (one client id holds one connection at a time) and its own group instance id.
fn replica_env(mosquitto: &DevicesBroker, name: &str) -> Vec<(&'static str, String)> {
    let mut env = mosquitto.gateway_env();
    env.extend([
        ("PIXGATE_CLUSTER__ENABLED", "true".to_string()),
        ("PIXGATE_CLUSTER__DEVICE_JOBS_TOPIC", DEVICE_JOBS.0.to_string()),
        ("PIXGATE_CLUSTER__DEVICE_JOB_PARTITIONS", DEVICE_JOBS.1.to_string()),
        ("PIXGATE_BROKER__CLIENT_ID", format!("pixgate-{name}-jobs")),
        ("PIXGATE_BROKER__ACKS_CLIENT_ID", format!("pixgate-{name}-acks")),
        // Static membership, one instance id per replica: a shared one makes them one member.
        ("PIXGATE_KAFKA__INSTANCE_ID", format!("pixgate-cluster-replicas-{name}")),
    ]);
    env
}

/// Partitions of `topic` a replica holds in the group (or reads, for the device topic).
fn assigned(gw: &GatewayProcess, topic: &str) -> usize {
    gw.stats().ok().and_then(|s| s.topics.get(topic).map(|t| t.assigned_partitions as usize)).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_the_partitions_and_each_routes_with_the_whole_registry() {
    let events = env_scale("PIXGATE_REPLICAS_EVENTS", 1_500);
    let devices = env_scale("PIXGATE_REPLICAS_DEVICES", 40);
    let seed = env_scale("PIXGATE_REPLICAS_SEED", 20_261_203) as u64;
    let began = Instant::now();
    let plan = Arc::new(Plan::new(ScenarioConfig::new(seed, devices, events)));
    let expected = plan.expected_count() as u64;
    println!(
        "two replicas: seed {seed}, {} devices, {events} charge events, {expected} expected effects",
        plan.devices.len()
    );

    let dir = std::env::temp_dir().join(format!("pixgate-cluster-replicas-mosquitto-{}", std::process::id()));
    let mut mosquitto = DevicesBroker::prepare(&dir, &plan.devices);
    let broker = mosquitto.start().await;
    let mut topics = PIXGATE_TOPICS.to_vec();
    topics.push(DEVICE_JOBS);
    let partitions = |name: &str| topics.iter().find(|(t, _)| *t == name).map(|(_, n)| *n as usize).unwrap();
    let (device_parts, charge_parts) = (partitions("device.upserted"), partitions("charge.upserted"));
    let rig = Rig::builder("cluster-replicas").topics(&topics).envs(replica_env(&mosquitto, "a")).start().await;
    let a = rig.gateway();

    let stats = Arc::new(Stats::default());
    let fleet_cfg = mosquitto.fleet_config(plan.devices.clone(), &rig.dir().join("devices"));
    let fleet = fleet::start_with_options(fleet_cfg, verifying_devices(&stats)).await.unwrap();
    fleet.wait_connected(fleet_connect_timeout(plan.devices.len())).await.unwrap();
    let producer = rig.producer();
    let device_positions = scenario::publish_registry(&producer, &plan, a).await.unwrap();
    let device_records = device_positions.len();

    // B: same group, its own outbox, HTTP port and broker client ids.
    let settings = GatewaySettings {
        http_port: free_port(),
        mqtt_port: free_port(),
        outbox_path: rig.dir().join("data-b/outbox.redb"),
        ..rig.settings().clone()
    };
    let env = replica_env(&mosquitto, "b");
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.clone())).collect();
    let b = GatewayProcess::spawn_with_env(
        rig.bin(),
        settings,
        &env,
        &rig.dir().join("pixgate-b.log"),
        Duration::from_secs(60),
    )
    .unwrap();

    // The group has settled when the two hold every charge and device-jobs partition
    // between them and each holds some of both; each reads every device partition.
    let settle = Instant::now() + Duration::from_secs(90);
    loop {
        let shares: Vec<(usize, usize, usize)> = [a, &b]
            .iter()
            .map(|g| (assigned(g, "device.upserted"), assigned(g, "charge.upserted"), assigned(g, DEVICE_JOBS.0)))
            .collect();
        let settled = shares.iter().all(|(d, c, j)| *d == device_parts && *c > 0 && *j > 0)
            && shares.iter().map(|s| s.1).sum::<usize>() == charge_parts
            && shares.iter().map(|s| s.2).sum::<usize>() == DEVICE_JOBS.1 as usize;
        if settled {
            println!("two replicas: partitions (device, charge, device-jobs) A {:?}, B {:?}", shares[0], shares[1]);
            break;
        }
        assert!(
            Instant::now() < settle,
            "the group did not settle on two members: (device, charge, device-jobs) {shares:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let deadline = Instant::now() + Duration::from_secs(240) + Duration::from_millis(60 * events as u64);
    let positions = scenario::feed_keeping_up(&producer, &plan, stats.clone(), deadline).await.unwrap();
    let charge_ends = scenario::end_offsets(&positions);
    let group = rig.settings().group_id.clone();
    let route = format!("{group}-route");
    scenario::wait_all_delivered_in(a, &route, &plan, &charge_ends, &BTreeMap::new(), &stats, deadline).await.unwrap();
    while !b.stats().is_ok_and(|s| s.counters.pending_records == 0 && s.counters.outbox_jobs == 0) {
        assert!(Instant::now() < deadline, "replica B still busy: {:?}", b.stats().map(|s| s.counters));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let report = fleet.shutdown().await;
    let checked = scenario::check_delivery(&plan, &positions, &report.effects).unwrap();
    assert_eq!(report.stats.order_violations, 0, "devices saw seq going backwards");

    let (sa, sb) = (a.stats().unwrap(), b.stats().unwrap());
    for (name, s) in [("A", &sa), ("B", &sb)] {
        let routed = count(&s.counters.events_read, "charge.upserted");
        let delivered: u64 = s.counters.effects_done.values().sum();
        println!("two replicas: {name} read {routed} charge events and had {delivered} jobs done");
        assert!(routed > 0 && delivered > 0, "replica {name} routed or delivered nothing");
    }
    let read = count(&sa.counters.events_read, "charge.upserted") + count(&sb.counters.events_read, "charge.upserted");
    assert!(read >= events as u64, "the two read {read} of {events} charge events");
    let log_b = std::fs::read_to_string(rig.dir().join("pixgate-b.log")).unwrap();
    let gate = format!("before joining it topic=device.upserted partitions={device_parts} records={device_records}");
    assert!(log_b.contains(&gate), "B read the whole registry ({device_records} records) before joining the groups");
    for g in [route, format!("{group}-deliver"), format!("{group}-registry")] {
        let committed = committed_offsets(rig.brokers(), &g, "device.upserted", device_parts as i32).unwrap();
        assert!(committed.iter().all(|o| *o < 0), "group {g} committed device.upserted offsets: {committed:?}");
    }
    println!(
        "two replicas: {} effects on {} devices, each exactly once and in order; {} raw job deliveries; {:.0} s",
        checked.effects,
        checked.devices,
        report.stats.raw_jobs,
        began.elapsed().as_secs_f64()
    );
    drop(b);
    broker.stop().await;
    rig.shutdown();
    mosquitto.remove();
}
