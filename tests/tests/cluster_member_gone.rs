//! A replica whose machine is gone: three `pixgate` replicas with dynamic group
//! membership on tansu and Debian's `mosquitto` ([`pixgate_tests::central`]); once the
//! devices have carried out half of the expected effects, one is SIGKILLed and never
//! started again. It leaves its groups without a word (no LeaveGroup).
//!
//! Kafka expires such a member after its session timeout and rebalances. tansu 0.6.0
//! expires it from the member list and keeps the group's assignment as it was, so its
//! charge and device-jobs partitions stay given to nobody alive. The two left see those
//! partitions make no progress (`orphaned` on `/readyz`, `gateway/src/ingest/group_watch.rs`,
//! the threshold `health.stall_after_ms` shortened to 10 s here) and rejoin, so that the
//! group rebalances; they take the partitions, restore their queues and charge states from
//! the delivery log and the route changelog, and deliver the rest.
//!
//! At the end: every effect the routing rules call for (the independent model) was carried
//! out exactly once after the device's dedupe, in order per device, and the replicas left
//! hold every charge and device-jobs partition between them.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::central::{self, CentralOptions};
use pixgate_tests::scenario::env_scale;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_gone_for_good_leaves_its_partitions_to_the_others() {
    let opts = CentralOptions {
        kills: 1,
        dynamic: true,
        gone: true,
        env: vec![("PIXGATE_HEALTH__STALL_AFTER_MS", "10000".to_string())],
        ..CentralOptions::steady(
            "member-gone",
            3,
            env_scale("PIXGATE_GONE_EVENTS", 3_000),
            env_scale("PIXGATE_GONE_DEVICES", 40),
            env_scale("PIXGATE_GONE_SEED", 31) as u64,
        )
    };
    let r = central::run(&opts).await.unwrap();
    assert_eq!(r.delivery.effects, r.expected, "every expected effect once");
    assert_eq!(r.order_violations, 0, "a device saw its seq go backwards");
    assert_eq!(r.replicas.len(), 2, "{:?}", r.replicas);
    let held = |f: fn(&(usize, usize, usize)) -> usize| r.replicas.iter().map(|x| f(&x.partitions)).sum::<usize>();
    assert_eq!((held(|p| p.1), held(|p| p.2)), (3, 6), "the charge and device-jobs partitions held: {:?}", r.replicas);
    for (i, x) in r.replicas.iter().enumerate() {
        println!("member gone: r{i} {x:?}");
    }
    println!(
        "member gone: {} effects on {} devices, each exactly once and in order; {} rejoins; {} jobs restored; {:.0} s",
        r.delivery.effects,
        r.delivery.devices,
        r.replicas.iter().map(|x| x.rejoins).sum::<u64>(),
        r.restored_jobs,
        r.secs
    );
}
