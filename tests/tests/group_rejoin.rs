//! A consumer group that gives pixgate nothing of a topic that has partitions is left by
//! rejoining (`gateway/src/ingest/group_watch.rs`), against the real broker and the
//! `pixgate` binary.
//!
//! The case an operator meets: pixgate deployed before the upstream capture job created
//! `charge.upserted`. The group's leader assigns while the topic is missing from its
//! metadata, so the member holds nothing of it; once the topic exists the group stays as
//! it is until librdkafka's next metadata refresh (`topic.metadata.refresh.interval.ms`,
//! 5 minutes), and `/readyz` says `unassigned` meanwhile. With the threshold shortened
//! to 5 s, pixgate must rejoin, hold the topic's partitions and plan a charge from them well
//! within those 5 minutes (the wait below is 150 s), and count the rejoin.

use pixgate_tests::broker::KafkaBroker;
use pixgate_tests::charges::{charge_record, template};
use pixgate_tests::gateway::{self, GatewayProcess, GatewaySettings};
use pixgate_tests::net::free_port;
use simulators::capture;
use std::time::{Duration, Instant};

const TERMINAL: &str = "7f80e222f828767efc2f9162";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_created_after_the_group_formed_is_taken_by_rejoining() {
    let dir = std::env::temp_dir().join(format!("pixgate-group-rejoin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let broker = KafkaBroker::start(&dir.join("kafka")).expect("starting the Kafka broker");
    capture::ensure_topics(broker.addr(), &[("device.upserted", 3), ("pixgate.deadletter", 1)])
        .await
        .expect("creating the device topic");
    let group = "pixgate-group-rejoin".to_string();
    let settings = GatewaySettings {
        brokers: broker.addr().to_string(),
        group_id: group.clone(),
        mqtt_port: free_port(),
        http_port: free_port(),
        ack_timeout_ms: 2_000,
        outbox_path: dir.join("data/outbox.redb"),
    };
    let env = [
        // A dynamic member: a static one cannot ask its group to assign again.
        ("PIXGATE_KAFKA__INSTANCE_ID", String::new()),
        ("PIXGATE_HEALTH__UNASSIGNED_AFTER_MS", "5000".to_string()),
    ];
    let bin = gateway::find_binary().expect("the pixgate binary");
    let log = dir.join("pixgate.log");
    let started = Instant::now();
    let (b, s, l) = (bin.clone(), settings.clone(), log.clone());
    // Ready while the charge topic is missing (within the threshold) or once it holds it.
    let gw = tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.clone())).collect();
        GatewayProcess::spawn_with_env(&b, s, &env, &l, Duration::from_secs(150))
    });
    // The group forms without the charge topic, then the capture job creates it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("partitions assigned") {
        assert!(
            Instant::now() < deadline,
            "the group never formed:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    capture::ensure_topics(broker.addr(), &[("charge.upserted", 3)]).await.expect("creating the charge topic");
    let created = started.elapsed();
    let gw = gw.await.expect("the start task").unwrap_or_else(|e| {
        panic!("pixgate did not take the charge topic: {e:#}\n{}", std::fs::read_to_string(&log).unwrap_or_default())
    });
    // The stats that first show the topic held: the rejoin that took it is counted there.
    let deadline = Instant::now() + Duration::from_secs(150);
    let stats = loop {
        if let Ok(s) = gw.stats() {
            if s.topics.get("charge.upserted").is_some_and(|t| t.assigned_partitions == 3) {
                break s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the charge topic was not taken:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let took = started.elapsed() - created;
    assert!(stats.counters.group_rejoins.get(&group).copied().unwrap_or(0) >= 1, "{:?}", stats.counters.group_rejoins);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("rejoining so that it assigns again"), "no rejoin logged:\n{text}");

    // And it reads the topic: the registry, then a charge for a card machine planned into
    // the outbox from the partition it took.
    let fixtures = pixgate_tests::demo::default_fixtures();
    let devices =
        capture::publish_file(broker.addr(), &fixtures.join("devices.jsonl")).await.expect("the registry") as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while gw.stats().map_or(0, |s| s.counters.devices_applied) < devices {
        assert!(Instant::now() < deadline, "the registry was not applied: {:?}", gw.stats().map(|s| s.counters));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let t = chrono::Utc::now().timestamp() as u64;
    let record = charge_record(&template(&fixtures), TERMINAL, &format!("{:024x}", 1), "ACTIVE", 0, 60, t);
    let producer = capture::producer(broker.addr()).expect("a producer");
    capture::publish_records(&producer, &[record]).await.expect("publishing the charge");
    let deadline = Instant::now() + Duration::from_secs(60);
    while gw.stats().map_or(0, |s| s.counters.records_with_effects) == 0 {
        assert!(Instant::now() < deadline, "the charge was not planned: {:?}", gw.stats().map(|s| s.counters));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("group rejoin: the charge topic created {created:?} after start, held {took:?} later; its charge planned");
    drop(gw);
    broker.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
