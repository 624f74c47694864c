//! What a device can and cannot do to another when the devices connect to an external
//! broker (Debian's `mosquitto` 2.0.11, configured as `docs/operations.md` shows: client
//! certificates from the fleet CA, CN = username, an ACL of patterns on the username) and
//! pixgate is one more client of it. Card machine A is played by `mosquitto_pub` and
//! `mosquitto_sub` with A's certificate; card machine B by the same clients, then by a
//! simulated device. Checked:
//!
//! 1. No certificate: the broker refuses the connection.
//! 2. A forging B's `done` ack: the broker drops it; pixgate does not finish B's job, sends
//!    it to B again after the ack timeout, and finishes it on B's own ack.
//! 3. A subscribing to `#`, `pixgate/#`, `pixgate/v1/devices/+/jobs` and B's jobs: granted
//!    by the broker (its `acl_file` filters at delivery), and A receives nothing while B
//!    carries out its job.
//! 4. A's last will on B's status: B's retained status stays B's own.
//! 5. A connecting under B's client id `dev-B`: the broker lets it (client ids are not bound
//!    to certificates) and cuts B off, but A reads none of B's jobs, and B carries out its
//!    job once A is gone.
//! 6. A connecting under pixgate's jobs client id: pixgate's connection is cut, it
//!    reconnects, and B's next job is carried out.
//!
//! 5 and 6 are the stock broker's limits (`docs/cluster.md`, "Client ids bound to
//! identities"): confidentiality holds, availability against a device's own certificate
//! does not. Every wait polls under a generous deadline; nothing is timed.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use device_protocol::{Ack, Job, Topic};
use pixgate_tests::devices_broker::DevicesBroker;
use pixgate_tests::gateway::count;
use pixgate_tests::harness::{protocol_devices, wait_done_by, Rig};
use pixgate_tests::mosquitto::{self, ClientAuth, Subscriber};
use simulators::fleet;
use std::time::{Duration, Instant};

/// Card machine A, the attacker (company of the charge template).
const A: &str = "724caf4941d4072014b3ce10";
/// Card machine B, the victim (same company).
const B: &str = "7f80e222f828767efc2f9162";
/// Longest wait for anything to happen.
const WAIT: Duration = Duration::from_secs(30);
/// How long a message that must not come is waited for.
const QUIET: Duration = Duration::from_secs(3);

/// Waits until pixgate counts `n` effects done.
async fn effects_done(rig: &Rig, n: u64) {
    rig.wait_stats(WAIT, |s| pixgate_tests::gateway::total(&s.counters.effects_done) >= n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_external_broker_a_device_reads_nothing_of_another_and_cannot_finish_its_jobs() {
    mosquitto::require_clients().unwrap();
    let fixtures = pixgate_tests::demo::default_fixtures();
    let specs = [A, B].map(|id| pixgate_tests::fixture_device(&fixtures, id)).to_vec();
    let dir = std::env::temp_dir().join(format!("pixgate-broker-security-mosquitto-{}", std::process::id()));
    let mut broker_cfg = DevicesBroker::prepare(&dir, &specs);
    let _broker = broker_cfg.start().await;
    let port = broker_cfg.port();
    let mut rig = Rig::builder("broker-security").envs(broker_cfg.gateway_env()).start().await;
    rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;
    let (auth_a, auth_b) = (broker_cfg.client_auth(A), broker_cfg.client_auth(B));

    // 1. No certificate: refused.
    let refused =
        mosquitto::publish_as(port, &ClientAuth::server_only(&broker_cfg.ca_cert()), "dev-x", "x", "x", 1, false).await;
    assert!(refused.is_err(), "a client without a certificate got in");

    // 2. B, played by mosquitto_sub (persistent, QoS 1), takes its job and does not ack it.
    let mut b_sub =
        Subscriber::start_as(port, &auth_b, &format!("dev-{B}"), &Topic::Jobs(B.into()).path(), 1, true, WAIT)
            .await
            .unwrap();
    rig.publish_charge(B, 1).await;
    let line = b_sub.next_message(WAIT).await.unwrap().expect("B's job");
    let job: Job = serde_json::from_str(&line).unwrap();
    let forged = serde_json::to_string(&Ack::done(&job.message_id, job.seq, false)).unwrap();
    mosquitto::publish_as(port, &auth_a, &format!("dev-{A}"), &Topic::Acks(B.into()).path(), &forged, 1, false)
        .await
        .expect("the broker takes the PUBLISH (and drops it: MQTT 3.1.1 has no refusal for it)");
    let again = b_sub.next_message(WAIT).await.unwrap().expect("B's job sent again: A's ack did not finish it");
    assert_eq!(serde_json::from_str::<Job>(&again).unwrap().message_id, job.message_id);
    assert_eq!(pixgate_tests::gateway::total(&rig.gateway().stats().unwrap().counters.effects_done), 0);
    mosquitto::publish_as(port, &auth_b, &format!("dev-{B}.acks"), &Topic::Acks(B.into()).path(), &forged, 1, false)
        .await
        .unwrap();
    effects_done(&rig, 1).await;
    b_sub.stop().await;

    // 3. A subscribes to everything it could want; simulated B carries out its next job.
    let topics = ["#", "pixgate/#", "pixgate/v1/devices/+/jobs", &Topic::Jobs(B.into()).path()];
    let (mut a_sub, granted) =
        Subscriber::start_granted(port, &auth_a, &format!("dev-{A}"), &topics, 1, false, WAIT).await.unwrap();
    println!("broker security: A's SUBACK for {topics:?}: {granted:?}");
    let fleet_cfg =
        broker_cfg.fleet_config(vec![pixgate_tests::fixture_device(&fixtures, B)], &rig.dir().join("devices"));
    let fleet = fleet::start_with_options(fleet_cfg, protocol_devices()).await.unwrap();
    fleet.wait_connected(WAIT).await.unwrap();
    let rec = rig.publish_charge(B, 2).await;
    wait_done_by(&fleet, B, &rec, WAIT).await;
    assert_eq!(a_sub.next_message(QUIET).await.unwrap(), None, "A read something of B's");

    // 4. A's will on B's status fires (A killed): B's retained status is still B's.
    let will = [
        "--will-topic",
        &Topic::Status(B.into()).path(),
        "--will-payload",
        r#"{"v":1,"online":false}"#,
        "--will-retain",
        "--will-qos",
        "1",
    ];
    let (willing, _) = Subscriber::start_granted(
        port,
        &auth_a.clone().with_args(&will),
        &format!("dev-{A}.will"),
        &[&Topic::Jobs(A.into()).path()],
        1,
        false,
        WAIT,
    )
    .await
    .unwrap();
    willing.stop().await;
    tokio::time::sleep(QUIET).await;
    let mut status =
        Subscriber::start_as(port, &auth_b, &format!("dev-{B}.check"), &Topic::Status(B.into()).path(), 1, false, WAIT)
            .await
            .unwrap();
    let retained = status.next_message(WAIT).await.unwrap().expect("B's retained status");
    assert!(retained.contains(r#""online":true"#), "B's status after A's will: {retained}");
    status.stop().await;

    // 5. A takes B's client id: B is cut off (and the two take the id from each other while
    //    both try); a job for B published meanwhile reaches nobody under A's certificate,
    //    and B carries it out once A is gone.
    let b = fleet.device(B).unwrap();
    let before = b.connects();
    let (mut impostor, _) =
        Subscriber::start_granted(port, &auth_a, &format!("dev-{B}"), &["#"], 1, false, WAIT).await.unwrap();
    let deadline = Instant::now() + WAIT;
    while b.connects() == before {
        assert!(Instant::now() < deadline, "B was never cut off by a connection under its client id");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rec = rig.publish_charge(B, 3).await;
    assert_eq!(impostor.next_message(QUIET).await.unwrap(), None, "A read B's job under B's client id");
    impostor.stop().await;
    wait_done_by(&fleet, B, &rec, WAIT).await;
    a_sub.stop().await;

    // 6. A takes pixgate's jobs client id: pixgate reconnects, and B's next job goes out.
    let (cutter, _) =
        Subscriber::start_granted(port, &auth_a, "pixgate-deliver-0", &[&Topic::Jobs(A.into()).path()], 1, false, WAIT)
            .await
            .unwrap();
    cutter.stop().await;
    let rec = rig.publish_charge(B, 4).await;
    wait_done_by(&fleet, B, &rec, WAIT).await;
    let log = std::fs::read_to_string(rig.dir().join("pixgate.log")).unwrap();
    assert!(pixgate_tests::devices_broker::jobs_connection_lost(&log), "pixgate's connection was not cut");
    // B's ack reaches pixgate after B counted the effect: waited for, not read once.
    rig.wait_stats(WAIT, |s| count(&s.counters.effects_done, "display_qr") >= 4).await;

    fleet.shutdown().await;
    rig.stop_gateway(Duration::from_secs(10));
    rig.shutdown();
    broker_cfg.remove();
}
