//! Three pixgate replicas of the central shape, on tansu and Debian's `mosquitto` (TLS,
//! client certificates, an ACL), the `pixgate` binary three times
//! ([`pixgate_tests::central`]): the charge partitions are shared in the route group and
//! the device-jobs partitions in the deliver group, and each replica reads the whole device
//! registry outside any group, so any of them can route any charge to any device.
//!
//! The replicas started after the registry was published read all of it before joining
//! the groups (the start gate). At the end: every effect the routing rules call for (the
//! independent model, `simulators::expected`) was carried out by its device exactly once
//! after the device's dedupe, in order per device; each replica routed charges and
//! delivered jobs; no group committed a `device.upserted` offset.
//!
//! A steady state: no replica dies or joins while jobs are queued (`cluster_handover.rs`
//! kills replicas mid-run).
//! Scale: `PIXGATE_REPLICAS` (default 3, at most the charge topic's 3 partitions),
//! `PIXGATE_REPLICAS_EVENTS` (default 1,500), `PIXGATE_REPLICAS_DEVICES` (default 40),
//! `PIXGATE_REPLICAS_SEED`.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::central::{self, CentralOptions};
use pixgate_tests::scenario::env_scale;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_partitions_and_each_routes_with_the_whole_registry() {
    let opts = CentralOptions::steady(
        "cluster-replicas",
        env_scale("PIXGATE_REPLICAS", 3),
        env_scale("PIXGATE_REPLICAS_EVENTS", 1_500),
        env_scale("PIXGATE_REPLICAS_DEVICES", 40),
        env_scale("PIXGATE_REPLICAS_SEED", 20_261_203) as u64,
    );
    let r = central::run(&opts).await.unwrap_or_else(|e| panic!("{e:#}"));
    println!("replicas: {opts:?}: {} expected effects", r.expected);
    assert_eq!(r.delivery.effects, r.expected, "every expected effect, once (checked by the model)");
    assert_eq!(r.order_violations, 0, "devices saw seq going backwards");
    let mut routed = 0;
    for (i, rep) in r.replicas.iter().enumerate() {
        println!("replicas: r{i} {rep:?}");
        assert!(rep.routed > 0 && rep.delivered > 0, "replica r{i} routed or delivered nothing");
        routed += rep.routed;
        if i > 0 {
            assert_eq!(
                rep.registry_at_start,
                Some(r.device_records),
                "r{i} read the whole registry before joining the groups"
            );
        }
    }
    assert!(routed >= opts.events as u64, "the replicas read {routed} of {} charge events", opts.events);
    for (g, committed) in &r.device_topic_commits {
        assert!(committed.iter().all(|o| *o < 0), "group {g} committed device.upserted offsets: {committed:?}");
    }
    println!(
        "replicas: {} effects on {} devices, each exactly once and in order; {} raw job deliveries; {:.0} s",
        r.delivery.effects, r.delivery.devices, r.raw_jobs, r.secs
    );
}
