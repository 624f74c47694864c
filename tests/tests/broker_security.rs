//! What a device can and cannot do to another when the devices connect to an external
//! broker (Debian's `mosquitto` 2.0.11, configured by `pixgate devices broker-config
//! mosquitto`: the devices' listener takes fleet-CA certificates, CN = username = client id,
//! with an ACL of patterns on the username; pixgate's listener takes only gateway-CA
//! certificates) and pixgate is one more client of it. Card machine A is played by
//! `mosquitto_pub` and `mosquitto_sub` with A's certificate; card machine B by the same
//! clients, then by a simulated device. Checked:
//!
//! 1. No certificate: the broker refuses the connection.
//! 2. A forging B's `done` ack: the broker drops it; pixgate does not finish B's job, sends
//!    it to B again after the ack timeout, and finishes it on B's own ack.
//! 3. A subscribing to `#`, `pixgate/#`, `pixgate/v1/devices/+/jobs` and B's jobs: granted
//!    by the broker (its `acl_file` filters at delivery), and A receives nothing while B
//!    carries out its job.
//! 4. A's last will on B's status: B's retained status stays B's own (read as pixgate).
//! 5. A asking for B's client id `dev-B`: the broker gives A its own id instead; B is not
//!    cut off, A reads none of B's jobs, and B carries out its job.
//! 6. A asking for pixgate's jobs client id: A gets its own id, pixgate's connection is not
//!    cut, and B's next job is carried out; A's certificate on pixgate's listener is
//!    refused.
//!
//! Every wait polls under a generous deadline; nothing is timed.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use device_protocol::{Ack, Job, Topic};
use pixgate_tests::devices_broker::DevicesBroker;
use pixgate_tests::gateway::count;
use pixgate_tests::harness::{protocol_devices, wait_done_by, Rig};
use pixgate_tests::mosquitto::{self, ClientAuth, Subscriber};
use simulators::fleet;
use std::time::Duration;

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
    // Read as pixgate: a second connection with B's certificate would take B's client id.
    let gateway_port = broker_cfg.gateway_port();
    let gateway_auth = broker_cfg.gateway_client_auth();
    let mut status =
        Subscriber::start_as(gateway_port, &gateway_auth, "check", &Topic::Status(B.into()).path(), 1, false, WAIT)
            .await
            .unwrap();
    let retained = status.next_message(WAIT).await.unwrap().expect("B's retained status");
    assert!(retained.contains(r#""online":true"#), "B's status after A's will: {retained}");
    status.stop().await;

    // 5. A asks for B's client id: the broker gives A its own, so B is not cut off; a job
    //    for B published meanwhile reaches nobody under A's certificate, and B carries it out.
    let b = fleet.device(B).unwrap();
    let before = b.connects();
    let (mut impostor, _) =
        Subscriber::start_granted(port, &auth_a, &format!("dev-{B}"), &["#"], 1, false, WAIT).await.unwrap();
    let rec = rig.publish_charge(B, 3).await;
    assert_eq!(impostor.next_message(QUIET).await.unwrap(), None, "A read B's job asking for B's client id");
    wait_done_by(&fleet, B, &rec, WAIT).await;
    assert_eq!(b.connects(), before, "B was cut off by a connection asking for its client id");
    impostor.stop().await;
    a_sub.stop().await;

    // 6. A asks for pixgate's jobs client id: it gets its own, pixgate keeps its connection,
    //    and B's next job goes out; A's certificate is refused on pixgate's listener.
    let (asker, _) =
        Subscriber::start_granted(port, &auth_a, "pixgate-deliver-0", &[&Topic::Jobs(A.into()).path()], 1, false, WAIT)
            .await
            .unwrap();
    let rec = rig.publish_charge(B, 4).await;
    wait_done_by(&fleet, B, &rec, WAIT).await;
    asker.stop().await;
    let on_gateway_listener = mosquitto::publish_as(
        gateway_port,
        &auth_a,
        "pixgate-deliver-0",
        &Topic::Jobs(B.into()).path(),
        "{}",
        1,
        false,
    )
    .await;
    assert!(on_gateway_listener.is_err(), "a device's certificate got in on pixgate's listener");
    let log = std::fs::read_to_string(rig.dir().join("pixgate.log")).unwrap();
    assert!(!pixgate_tests::devices_broker::jobs_connection_lost(&log), "pixgate's connection was cut");
    // B's ack reaches pixgate after B counted the effect: waited for, not read once.
    rig.wait_stats(WAIT, |s| count(&s.counters.effects_done, "display_qr") >= 4).await;

    fleet.shutdown().await;
    rig.stop_gateway(Duration::from_secs(10));
    rig.shutdown();
    broker_cfg.remove();
}
