//! mosquitto restarted mid-run under three replicas (proof 5 of the central shape's
//! issue): three `pixgate` replicas on tansu and Debian's `mosquitto`
//! ([`pixgate_tests::central`]); mosquitto is SIGKILLed twice while the charge events are
//! fed, each time once the devices have carried out their share of the expected effects,
//! and started again empty (mosquitto keeps no sessions: every device's and every
//! replica's connection and subscription is gone, and so is every job and ack in it).
//!
//! At the end: every effect the routing rules call for (the independent model) was carried
//! out exactly once after the device's dedupe, in order per device; each restart cut the
//! connection of every device-jobs partition (6, shared by the replicas), and every one of
//! them came back (its last line in its replica's log is not the drop); and none stood
//! down nor was taken over: a connection cut by the broker,
//! whose claim in the delivery log is still its replica's, reconnects, and no two replicas
//! hold one partition's client id.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::central::{self, CentralOptions, DEVICE_JOBS};
use pixgate_tests::scenario::env_scale;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_and_device_reconnects_after_the_broker_restarts_and_nothing_is_lost() {
    let opts = CentralOptions {
        broker_restarts: 2,
        ..CentralOptions::steady(
            "broker-restart",
            3,
            env_scale("PIXGATE_BROKER_RESTART_EVENTS", 2_000),
            env_scale("PIXGATE_BROKER_RESTART_DEVICES", 40),
            env_scale("PIXGATE_BROKER_RESTART_SEED", 5) as u64,
        )
    };
    let r = central::run(&opts).await.unwrap();
    assert_eq!(r.broker_restarts, opts.broker_restarts);
    assert_eq!(r.delivery.effects, r.expected, "every expected effect once");
    assert_eq!(r.order_violations, 0, "a device saw its seq go backwards");
    // Each restart cuts the connection of every partition (6, shared by the replicas).
    let at_least = DEVICE_JOBS.1 as usize * opts.broker_restarts;
    assert!(
        r.partition_connections_dropped >= at_least,
        "{} partition connections dropped, fewer than {at_least}: a restart did not cut them all",
        r.partition_connections_dropped
    );
    assert!(
        r.partition_connections_not_back.is_empty(),
        "partition connections (replica log, partition) never back after a restart: {:?}",
        r.partition_connections_not_back
    );
    assert_eq!(r.stood_down, 0, "a partition connection cut by the broker stood down although its claim was its own");
    let partition_takeovers: Vec<_> = r.takeovers.iter().filter(|t| t.0.starts_with("pixgate-partition-")).collect();
    assert!(partition_takeovers.is_empty(), "two replicas held one partition's client id: {partition_takeovers:?}");
    for (i, rep) in r.replicas.iter().enumerate() {
        assert!(rep.delivered > 0, "replica {i} delivered nothing");
    }
    println!(
        "broker restart: {} restarts; {} effects on {} devices, each exactly once and in order; {} raw job deliveries; {} partition connections dropped and all back; {:.0} s",
        r.broker_restarts,
        r.delivery.effects,
        r.delivery.devices,
        r.raw_jobs,
        r.partition_connections_dropped,
        r.secs
    );
}
