//! The central shape's partition connections against a real broker (Debian's `mosquitto`,
//! plain TCP on loopback): the fence on sends (`docs/cluster.md`, "Fencing") at the level
//! of the connections, with the delivery log's answer faked (the one boundary faked here;
//! `tests/tests/cluster_fence.rs` runs the whole thing).
//!
//! 1. Replica A holds partition 1's connection; replica B opens its own for partition 1
//!    (the same client id). The broker closes A's. A asks whether the partition is still
//!    its own, hears no, and stands down: it never reconnects (the broker's log shows two
//!    connections of that client id, A's and B's, and one takeover), A refuses sends to the
//!    partition's devices and B takes them.
//! 2. The broker restarts: B's connection drops, B asks, hears yes, and reconnects.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use gateway::config::{BrokerConfig, Config};
use gateway::deliver::broker::{self, OwnerCheck, PartitionLinks};
use gateway::model::device_partition::partition_of;
use gateway::shutdown::Shutdown;
use gateway::telemetry::Monitor;
use pixgate_tests::mosquitto::Broker;
use pixgate_tests::net::free_port;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const PARTITIONS: i32 = 4;
const WAIT: Duration = Duration::from_secs(10);

/// The delivery log's answer, set by the test; counts the questions.
#[derive(Default)]
struct Answer {
    still_owner: AtomicBool,
    asked: AtomicUsize,
}

impl OwnerCheck for Answer {
    fn still_owner(self: Arc<Self>, _: i32) -> Pin<Box<dyn Future<Output = anyhow::Result<bool>> + Send>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let answer = self.still_owner.load(Ordering::SeqCst);
        Box::pin(async move { Ok(answer) })
    }
}

/// A replica's partition connections to the broker on `port`, with `answer` as its log.
fn replica(port: u16, name: &str, answer: Arc<Answer>, shutdown: &Shutdown) -> Arc<PartitionLinks> {
    let cfg = BrokerConfig {
        host: "127.0.0.1".into(),
        port,
        plain: true,
        client_id: format!("{name}-jobs"),
        acks_client_id: format!("{name}-acks"),
        ..BrokerConfig::default()
    };
    let health = Arc::new(Monitor::new(&Config::default()));
    let (incoming, _rx) = tokio::sync::mpsc::channel(16);
    // The receiver end is dropped: no device acks in this test.
    let stats = Arc::new(gateway::telemetry::Stats::default());
    let (publisher, _) =
        broker::start(&cfg, Some(PARTITIONS), health, stats, incoming, broker::Extras::default(), shutdown.clone())
            .unwrap();
    let links = publisher.partitions().unwrap();
    links.set_owner_check(answer);
    links
}

fn config(port: u16) -> String {
    format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
}

fn count(log: &str, text: &str) -> usize {
    log.lines().filter(|l| l.contains(text)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_taken_over_by_a_newer_owner_stands_down_and_one_cut_by_a_restart_reconnects() {
    let dir = std::env::temp_dir().join(format!("pixgate-partition-connections-{}", std::process::id()));
    let port = free_port();
    let mosquitto = Broker::start(&dir.join("1"), &config(port), port, WAIT).await.unwrap();
    let device = (0..).map(|i| format!("dev-{i}")).find(|d| partition_of(d, PARTITIONS) == 1).unwrap();
    let shutdown = Shutdown::new();

    let (a_answer, b_answer) = (Arc::new(Answer::default()), Arc::new(Answer::default()));
    b_answer.still_owner.store(true, Ordering::SeqCst);
    let a = replica(port, "a", a_answer.clone(), &shutdown);
    a.open(1);
    assert!(a.wait_up(1, WAIT).await, "A's partition connection never came up");
    assert!(a.publish(&device, "t".into(), b"x".to_vec()), "A sends while it holds the partition");

    let b = replica(port, "b", b_answer.clone(), &shutdown);
    b.open(1);
    assert!(b.wait_up(1, WAIT).await, "B's partition connection never came up");
    // Long enough for A to find its connection closed, ask, and (without the fence) to
    // reconnect several times over (its first pause is 100 ms).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = mosquitto.log_text();
    let client = a.client_id(1);
    assert_eq!(count(&log, &format!("as {client} ")), 2, "A's and B's connections only:\n{log}");
    assert_eq!(count(&log, &format!("Client {client} already connected")), 1, "one takeover, B's:\n{log}");
    assert!(a_answer.asked.load(Ordering::SeqCst) >= 1, "A never asked the log before reconnecting");
    assert!(!a.publish(&device, "t".into(), b"x".to_vec()), "A still sends after standing down");
    assert!(b.publish(&device, "t".into(), b"x".to_vec()), "B, the owner, sends");

    mosquitto.stop().await;
    let mosquitto = Broker::start(&dir.join("2"), &config(port), port, WAIT).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(b.wait_up(1, WAIT).await, "B did not reconnect after the broker restarted");
    assert!(b_answer.asked.load(Ordering::SeqCst) >= 1, "B reconnected without asking the log");
    assert!(!a.wait_up(1, Duration::from_secs(1)).await, "A came back after standing down");
    let log = mosquitto.log_text();
    assert_eq!(count(&log, &format!("as {client} ")), 1, "B alone reconnects:\n{log}");

    shutdown.request();
    mosquitto.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
