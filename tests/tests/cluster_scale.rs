//! Scaling out and in under load (proof 4 of the central shape's issue): two `pixgate`
//! replicas on tansu and Debian's `mosquitto` ([`pixgate_tests::central`]); once the
//! devices have carried out a fifth of the expected effects a third replica joins (a fresh
//! outbox: its partitions' queues come from the delivery log, its charges' states from the
//! route changelog), and once it holds partitions and delivers, replica r1 is stopped with
//! SIGTERM and not started again (its partitions and their queues go to the others).
//!
//! At the end: every effect the routing rules call for (the independent model) was carried
//! out exactly once after the device's dedupe, in order per device; r1 exited cleanly on
//! SIGTERM; every replica still running delivered jobs; and nothing was repeated beyond
//! the one job in flight per moved device: the jobs the devices received again (and
//! deduplicated) are no more than the devices whose queues moved, summed over every take
//! (on tansu's eager `range` assignor every rebalance moves every partition, so that sum
//! counts a device once per rebalance), plus the jobs the route stage produced twice to
//! the device-jobs topic (read back from it; none so far).
//!
//! Events: enough that the scale-in comes under load. The replicas already there deliver
//! while the newcomer's partitions restore (restores run beside the consumer loop), so a
//! third or more of the effects can go by between the join and the newcomer's first
//! delivery.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::central::{self, CentralOptions};
use pixgate_tests::scenario::env_scale;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_joins_and_one_leaves_on_sigterm_and_only_jobs_in_flight_repeat() {
    let opts = CentralOptions {
        scale: true,
        ..CentralOptions::steady(
            "scale",
            2,
            env_scale("PIXGATE_SCALE_OUT_EVENTS", 30_000),
            env_scale("PIXGATE_SCALE_OUT_DEVICES", 40),
            env_scale("PIXGATE_SCALE_OUT_SEED", 4) as u64,
        )
    };
    let r = central::run(&opts).await.unwrap();
    assert_eq!(r.delivery.effects, r.expected, "every expected effect once");
    assert_eq!(r.order_violations, 0, "a device saw its seq go backwards");
    assert_eq!(r.sigterm_clean, Some(true), "r1 did not exit cleanly on SIGTERM");
    assert_eq!(r.replicas.len(), 2, "two replicas at the end: r0 and the one that joined");
    for (i, rep) in r.replicas.iter().enumerate() {
        assert!(rep.delivered > 0, "replica {i} at the end delivered nothing");
    }
    assert!(r.moved_devices > 0, "no take moved a device's queue: the scaling moved nothing");
    assert!(
        r.duplicates <= r.moved_devices + r.job_copies,
        "{} jobs repeated to devices, more than the {} devices whose queues moved (one job in flight each) and the {} copies the route stage produced again",
        r.duplicates,
        r.moved_devices,
        r.job_copies
    );
    println!(
        "scale: {} effects on {} devices, each exactly once and in order; {} raw job deliveries, {} repeated (at most {} allowed: {} devices moved, {} jobs produced again); {} jobs restored; longest take {} ms; {:.0} s",
        r.delivery.effects,
        r.delivery.devices,
        r.raw_jobs,
        r.duplicates,
        r.moved_devices + r.job_copies,
        r.moved_devices,
        r.job_copies,
        r.restored_jobs,
        r.longest_take_ms,
        r.secs
    );
}
