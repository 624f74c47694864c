//! The central shape's code path in one process, on every CI run: pixgate with
//! `cluster.enabled` plans each charge event, produces its jobs to `pixgate.device-jobs`
//! (keyed by device id), reads them back from it into the outbox, and delivers them through
//! an external MQTT broker (Debian's `mosquitto`, TLS, client certificates, an ACL) as one
//! more client of it.
//!
//! A generated scenario runs through it while pixgate is SIGKILLed and restarted twice
//! (jobs produced and not yet read back, jobs read back and not yet committed). At the end:
//! every effect the routing rules call for (an independent model, `simulators::expected`)
//! was carried out by its device exactly once after the device's dedupe, in order per
//! device, and nothing else happened; every expected job is on the device-jobs topic under
//! its device's key, and every record there is on the partition Kafka's Java producer
//! would pick for that key (murmur2, computed by the test), so any producer of the topic
//! puts a device on the same partition.
//!
//! The stages read as two consumer groups (`{group}-route` the charge topic,
//! `{group}-deliver` the device-jobs topic), and the device topic is read in full outside
//! any group, from positions the outbox keeps: no group commits its offsets, each start
//! joins the groups only once the registry has read to the ends it saw, and readiness's lag
//! of the device topic ends at 0.
//!
//! Then, with `cluster.enabled` turned off, pixgate starts while nothing is left on the
//! device-jobs topic, and refuses to start once a job is left there unread.
//!
//! Real tansu, real mosquitto, real TLS, the `pixgate` binary, the devices in-process.
//! Scale: `PIXGATE_CLUSTER_EVENTS` (default 1,500), `PIXGATE_CLUSTER_DEVICES` (default 40),
//! `PIXGATE_CLUSTER_SEED`.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::devices_broker::DevicesBroker;
use pixgate_tests::gateway::GatewayProcess;
use pixgate_tests::kafka::{committed_offsets, java_partition, read_topic};
use pixgate_tests::scenario::{self, env_scale, Plan};
use rdkafka::producer::FutureRecord;
use serde_json::Value;
use simulators::capture::generate::ScenarioConfig;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The device-jobs topic and its partition count.
const DEVICE_JOBS: (&str, i32) = ("pixgate.device-jobs", 4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_goes_through_the_device_jobs_topic_and_mosquitto_once_and_in_order() {
    let events = env_scale("PIXGATE_CLUSTER_EVENTS", 1_500);
    let devices = env_scale("PIXGATE_CLUSTER_DEVICES", 40);
    let seed = env_scale("PIXGATE_CLUSTER_SEED", 20_261_204) as u64;
    let began = Instant::now();
    let plan = Arc::new(Plan::new(ScenarioConfig::new(seed, devices, events)));
    let expected = plan.expected_count() as u64;
    println!(
        "cluster of one: seed {seed}, {} devices, {events} charge events, {expected} expected effects",
        plan.devices.len()
    );

    let dir = std::env::temp_dir().join(format!("pixgate-cluster-of-one-mosquitto-{}", std::process::id()));
    let mut mosquitto = DevicesBroker::prepare(&dir, &plan.devices);
    let broker = mosquitto.start().await;
    let mut rig = mosquitto.central_rig("cluster-of-one", DEVICE_JOBS).await;
    let run = mosquitto.run_scenario(&rig, &plan).await;
    let (stats, deadline) = (run.stats.clone(), run.deadline);
    for share in [3, 2] {
        scenario::wait_carried(&stats, expected / share, deadline, "a crash").await;
        rig.gateway().wait_assigned(Duration::from_secs(60)).await.unwrap();
        rig.kill_gateway();
        rig.start_gateway();
        println!("cluster of one: pixgate SIGKILLed and restarted at {} effects", stats.carried_out());
    }

    let positions = run.feeder.await.unwrap().expect("feeding the charge events");
    let charge_ends = scenario::end_offsets(&positions);
    let device_ends = scenario::end_offsets(&run.device_positions);
    // The route group commits the charge topic, the deliver group the device-jobs topic;
    // the device topic is read outside any group, its positions kept in the outbox.
    let group = rig.gateway().settings.group_id.clone();
    let route = format!("{group}-route");
    scenario::wait_all_delivered_in(rig.gateway(), &route, &plan, &charge_ends, &BTreeMap::new(), &stats, deadline)
        .await
        .unwrap();
    let parts = device_ends.keys().max().map_or(0, |p| p + 1);
    for g in [group.clone(), route, format!("{group}-deliver"), format!("{group}-registry")] {
        let committed = committed_offsets(rig.brokers(), &g, "device.upserted", parts).unwrap();
        assert!(committed.iter().all(|o| *o < 0), "group {g} committed device.upserted offsets: {committed:?}");
    }
    let lag = wait_device_topic_read(rig.gateway(), deadline).await;
    assert_eq!(lag, Some(0), "the registry's reader is behind device.upserted");
    let report = run.fleet.shutdown().await;
    let checked = scenario::check_delivery(&plan, &positions, &report.effects).unwrap();
    assert_eq!(report.stats.order_violations, 0, "devices saw seq going backwards");
    let log = std::fs::read_to_string(rig.dir().join("pixgate.log")).unwrap_or_default();
    assert!(log.contains("jobs go through the device-jobs topic"), "pixgate ran with cluster.enabled");
    for file in ["pixgate.log", "pixgate-1.log", "pixgate-2.log"] {
        let log = std::fs::read_to_string(rig.dir().join(file)).unwrap_or_default();
        assert!(
            log.contains(
                "the device registry has read to the ends seen at start: joining the route and deliver consumer groups"
            ),
            "{file}: pixgate joined the group only once its registry had read the device topic"
        );
    }

    // What went through the topic: every expected job, under its device's key, each record
    // on the partition Kafka's Java producer would pick for that key.
    let records = read_topic(
        rig.brokers(),
        DEVICE_JOBS.0,
        DEVICE_JOBS.1,
        expected as usize,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let mut on_topic: HashMap<String, String> = HashMap::new();
    for r in &records {
        let key = String::from_utf8(r.key.clone()).unwrap();
        assert_eq!(
            r.partition,
            java_partition(&r.key, DEVICE_JOBS.1),
            "{key}'s job on another partition than murmur2's"
        );
        let value: Value = serde_json::from_slice(&r.value).unwrap();
        assert_eq!(value["device"].as_str(), Some(key.as_str()), "the key is the job's device");
        on_topic.insert(value["job"]["message_id"].as_str().unwrap().to_string(), key);
    }
    let mut missing = Vec::new();
    for e in plan.expected() {
        match on_topic.get(&e.message_id) {
            Some(device) => assert_eq!(device, &e.device, "{} under another device", e.message_id),
            None => missing.push(e.message_id.clone()),
        }
    }
    assert!(
        missing.is_empty(),
        "{} expected jobs never on {}: {:?}",
        missing.len(),
        DEVICE_JOBS.0,
        &missing[..missing.len().min(5)]
    );
    let partitions: HashSet<i32> = records.iter().map(|r| r.partition).collect();
    println!(
        "cluster of one: {} effects on {} devices, each exactly once and in order; {} job records on {} partitions of {} ({} copies from the crashes, dropped by the outbox's dedupe window); {} raw job deliveries; {:.0} s",
        checked.effects,
        checked.devices,
        records.len(),
        partitions.len(),
        DEVICE_JOBS.0,
        records.len() - on_topic.len(),
        report.stats.raw_jobs,
        began.elapsed().as_secs_f64()
    );

    // cluster.enabled turned off: pixgate starts while the deliver group has read every
    // job, and refuses to start once a job is left on the topic that nothing would read.
    assert!(rig.stop_gateway(Duration::from_secs(30)), "pixgate stopped cleanly");
    let edge: Vec<(&str, String)> = vec![("PIXGATE_CLUSTER__ENABLED", "false".to_string())];
    let start = |n: usize| {
        let log = rig.dir().join(format!("pixgate-off-{n}.log"));
        (GatewayProcess::spawn_with_env(rig.bin(), rig.settings().clone(), &edge, &log, Duration::from_secs(60)), log)
    };
    let (clean, _) = start(1);
    drop(clean.expect("pixgate with cluster.enabled off starts when no job is left unread"));
    let record = FutureRecord::to(DEVICE_JOBS.0).key("some-device").payload("{}");
    rig.producer().send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();
    let (refused, log) = start(2);
    assert!(refused.is_err(), "pixgate started with a job left on {} and nothing to read it", DEVICE_JOBS.0);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("1 jobs on {} were never delivered", DEVICE_JOBS.0)),
        "the refusal says why: {text}"
    );
    broker.stop().await;
    rig.shutdown();
    mosquitto.remove();
}

/// The device topic's lag on `/stats` once librdkafka's statistics have caught up (the
/// registry's reader stores its positions there too), or the last seen at `deadline`.
async fn wait_device_topic_read(gw: &GatewayProcess, deadline: Instant) -> Option<u64> {
    loop {
        let lag = gw.stats().ok().and_then(|s| s.topics.get("device.upserted").and_then(|t| t.lag));
        if lag == Some(0) || Instant::now() > deadline {
            return lag;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
