//! A replica frozen while the group gives its partitions to another, then continued
//! (proof 3 of the central shape's issue): three `pixgate` replicas on tansu and Debian's
//! `mosquitto` ([`pixgate_tests::central`]), each on a listener of its own so that the
//! broker's log says which replica holds each connection. Once the devices have carried
//! out a third of the expected effects, replica r1 is SIGSTOPped and a replacement is
//! started with its identity (its group instance id), as an orchestrator does for a
//! replica it holds dead: the group hands r1's partitions to the replacement at once, while
//! r1 still believes it owns them. Half a second after the replacement has connected as their owner,
//! r1 is continued (SIGCONT), given 5 s, then stopped: on tansu, which gives two members
//! with one instance id the same member id, r1 is never told it lost the partitions
//! (Kafka would answer it `FENCED_INSTANCE_ID`), and after a session timeout it would
//! claim them again as a replica the group still gives them to.
//!
//! (The same with the others taking r1's partitions at its session timeout cannot be shown
//! on tansu 0.6.0: tried with a 30 s stop and a 10 s session timeout, its group coordinator
//! left the partitions with the frozen member, or, with static membership, left the group
//! with no assignment at all; `docs/cluster.md`, "The test broker".)
//!
//! The fence (`docs/cluster.md`, "Fencing"): the replacement claims each partition in the
//! delivery log and connects with the partition's client id, which makes the broker close
//! r1's connection; when r1 wakes, its connections find themselves closed, ask the
//! delivery log, see the newer claims and stand down instead of reconnecting.
//!
//! At the end: every effect the routing rules call for (the independent model) was carried
//! out exactly once after the device's dedupe, in order per device; the broker closed some
//! of r1's partition connections for the replacement; **every** takeover the broker logged
//! took a connection from r1, for the replacement: r1 never took one back (a replica that
//! took a partition connection back from a live owner would be two senders for those
//! devices); each partition connection of r1 that stood down had its partition's queues
//! dropped (nothing of it retried or dead-lettered by r1). Whether r1's connections stood down by asking the delivery log or were closed
//! first by librdkafka's own session timeout (it notices the time it was stopped) is a
//! race; both are counted and printed.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::central::{self, CentralOptions};
use pixgate_tests::scenario::env_scale;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_never_sends_beside_the_owner_that_replaced_it() {
    let opts = CentralOptions {
        stop_ms: 500,
        ..CentralOptions::steady(
            "fence",
            3,
            env_scale("PIXGATE_FENCE_EVENTS", 2_000),
            env_scale("PIXGATE_FENCE_DEVICES", 40),
            env_scale("PIXGATE_FENCE_SEED", 26) as u64,
        )
    };
    let r = central::run(&opts).await.unwrap();
    assert_eq!(r.delivery.effects, r.expected, "every expected effect once");
    assert_eq!(r.order_violations, 0, "a device saw its seq go backwards");
    for t in &r.takeovers {
        println!("takeover: {} from replica {:?} by replica {:?}", t.0, t.1, t.2);
    }
    let partition_takeovers: Vec<_> = r.takeovers.iter().filter(|t| t.0.starts_with("pixgate-partition-")).collect();
    assert!(
        !partition_takeovers.is_empty(),
        "no partition connection of the stopped replica was taken over: the stop moved nothing ({:?})",
        r.takeovers
    );
    for (client, from, by) in &partition_takeovers {
        assert_eq!(
            (*from, *by),
            (Some(1), Some(3)),
            "{client} was taken from replica {from:?} by replica {by:?} (3: r1's replacement): only the stopped replica r1 may lose a partition connection that way, to its replacement"
        );
    }
    assert!(
        r.suspended >= r.stood_down,
        "{} partition connections stood down but only {} partitions had their queues dropped: a stood-down replica would go on retrying, expiring and dead-lettering jobs its successor delivers",
        r.stood_down,
        r.suspended
    );
    println!(
        "fence: {} effects on {} devices, each exactly once and in order; {} partition connections taken over from r1, {} stood down, {} partitions' queues dropped; {} jobs restored; {:.0} s",
        r.delivery.effects,
        r.delivery.devices,
        partition_takeovers.len(),
        r.stood_down,
        r.suspended,
        r.restored_jobs,
        r.secs
    );
}
