//! Replicas of the central shape dying mid-run (proof 2 of the central shape's issue, on
//! a small scale): three `pixgate` replicas on tansu and Debian's `mosquitto`
//! ([`pixgate_tests::central`]), and while the charge events are fed, replicas other than
//! the first are SIGKILLed and started again, each once the devices have carried out its
//! share of the expected effects. A killed replica's device-jobs partitions go to the
//! others at the rebalance, and their new owners restore the queues from the delivery log
//! (`docs/cluster.md`, "Hand-over"); the restarted replica starts with no queue and takes
//! partitions the same way.
//!
//! At the end: every effect the routing rules call for (the independent model) was carried
//! out by its device exactly once after the device's dedupe, in order per device (`seq`
//! never going backwards), and jobs were restored from the delivery log.
//! Scale: `PIXGATE_HANDOVER_KILLS` (default 3), `PIXGATE_HANDOVER_EVENTS` (default 2,000),
//! `PIXGATE_HANDOVER_DEVICES` (default 40), `PIXGATE_HANDOVER_SEED`;
//! `PIXGATE_HANDOVER_MEMBERSHIP=dynamic` runs the replicas without a group instance id
//! (static members by default).

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::central::{self, CentralOptions};
use pixgate_tests::scenario::env_scale;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_queues_are_restored_by_the_next_owners_and_nothing_is_lost() {
    let opts = CentralOptions {
        kills: env_scale("PIXGATE_HANDOVER_KILLS", 3),
        dynamic: std::env::var("PIXGATE_HANDOVER_MEMBERSHIP").is_ok_and(|m| m == "dynamic"),
        ..CentralOptions::steady(
            "cluster-handover",
            3,
            env_scale("PIXGATE_HANDOVER_EVENTS", 2_000),
            env_scale("PIXGATE_HANDOVER_DEVICES", 40),
            env_scale("PIXGATE_HANDOVER_SEED", 20_261_204) as u64,
        )
    };
    let r = central::run(&opts).await.unwrap_or_else(|e| panic!("{e:#}"));
    println!("handover: {opts:?}: {} expected effects", r.expected);
    for (i, rep) in r.replicas.iter().enumerate() {
        println!("handover: r{i} {rep:?}");
    }
    assert_eq!(r.kills, opts.kills);
    assert_eq!(r.delivery.effects, r.expected, "every expected effect, once (checked by the model)");
    assert_eq!(r.order_violations, 0, "devices saw seq going backwards");
    assert!(r.restored_jobs > 0, "no replica restored a job from the delivery log: the kills moved no queue");
    println!(
        "handover: {} kills; {} effects on {} devices, each exactly once and in order; {} raw job deliveries; {} jobs restored from the delivery log; {:.0} s",
        r.kills, r.delivery.effects, r.delivery.devices, r.raw_jobs, r.restored_jobs, r.secs
    );
}
