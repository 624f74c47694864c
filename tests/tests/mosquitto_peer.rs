//! A card machine that is not our code: Debian's `mosquitto-clients` play the device against
//! pixgate's embedded MQTT broker, as `device-protocol/README.md` describes it.
//! `mosquitto_sub -q 1 -c -i dev-{id}` takes the jobs (a persistent session, QoS 1),
//! `mosquitto_pub -r -i dev-{id}.status` sets the retained online status, `mosquitto_pub -q 1
//! -i dev-{id}.acks` sends the acks (second connections of the same device),
//! built from `device_protocol::Ack`.
//!
//! Checked: each job is a `device_protocol::Job` for its charge event (version, per-device
//! `seq`, kind, event id, the deterministic message id, a pay-with-Pix screen whose BR Code
//! parses and carries the charge's amount); a job not acknowledged comes again, the same,
//! and the device's next job waits behind it until the `done` ack (one in flight per device);
//! pixgate counts each acknowledged effect (`effects_done` on `/stats`). A device that takes
//! its job and never answers makes readiness fail, naming the stalled delivery
//! (`health.delivery_stall_after_ms`, 3 s here), and the ack makes it ready again.
//!
//! Real tansu broker, the `pixgate` binary, real outside MQTT clients.

// Helpers of a test are test steps too: a panic is a failed test (clippy.toml's
// allow-unwrap-in-tests covers only the #[test] fns themselves).
#![allow(clippy::unwrap_used)]

use device_protocol::messages::CONTENT_SCREEN;
use device_protocol::{Ack, EffectKind, Job, ScreenContent, ScreenKind, Status, Topic};
use pixgate_tests::charges::{charge_record, template};
use pixgate_tests::gateway::count;
use pixgate_tests::harness::Rig;
use pixgate_tests::mosquitto::{self, Subscriber};
use serde_json::Value;
use simulators::capture::{self, CaptureRecord};
use std::time::Duration;

/// A card machine of the fixtures' registry (company of the charge template).
const TERMINAL: &str = "7f80e222f828767efc2f9162";
/// Longest wait for a job to reach the device.
const JOB_TIMEOUT: Duration = Duration::from_secs(30);

/// The job `line` must be: effect `display_qr` of the event `record` for [`TERMINAL`], as
/// the `seq`-th job of that device. Returns it.
fn check_job(line: &str, record: &CaptureRecord, seq: u64) -> Job {
    let job: Job = serde_json::from_str(line).unwrap_or_else(|e| panic!("not a device-protocol Job ({e}): {line}"));
    let event: Value = serde_json::from_slice(&record.value).unwrap();
    let event_id = event["eventId"].as_str().unwrap();
    assert_eq!((job.v, job.seq, job.kind), (1, seq, EffectKind::DisplayQr), "{line}");
    assert_eq!(job.event_id, event_id, "{line}");
    assert_eq!(Some(job.charge_id.as_str()), record.key.as_deref(), "{line}");
    assert_eq!(
        job.message_id,
        device_protocol::message_id(event_id, TERMINAL, EffectKind::DisplayQr),
        "the deterministic message id: {line}"
    );
    assert_eq!(job.content_type, CONTENT_SCREEN, "{line}");
    let doc = &event["fullDocument"];
    let screen: ScreenContent =
        serde_json::from_slice(&job.payload_bytes().expect("base64 payload")).expect("a screen");
    let cents =
        doc["value"].as_u64().or_else(|| doc["value"]["$numberLong"].as_str().and_then(|s| s.parse().ok())).unwrap();
    assert_eq!((screen.screen, screen.amount_cents), (ScreenKind::PayWithPix, cents), "{screen:?}");
    let brcode = render::brcode::parse(screen.brcode.as_deref().expect("a BR Code on the pay-with-Pix screen"))
        .expect("a valid BR Code");
    assert_eq!(brcode.amount_cents(), Some(cents), "the QR asks for the charge's amount");
    assert!(job.expires_at.is_some(), "a QR job expires with its charge: {line}");
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mosquitto_clients_card_machine_gets_one_job_at_a_time_until_it_acks() {
    mosquitto::require_clients().unwrap_or_else(|e| panic!("{e:#}"));
    let fixtures = pixgate_tests::demo::default_fixtures();
    let rig = Rig::builder("mosquitto-peer").env("PIXGATE_HEALTH__DELIVERY_STALL_AFTER_MS", "3000").start().await;
    let port = rig.settings().mqtt_port;
    let (jobs, acks, status) = (
        Topic::Jobs(TERMINAL.into()).path(),
        Topic::Acks(TERMINAL.into()).path(),
        Topic::Status(TERMINAL.into()).path(),
    );

    // The registry holds one card machine.
    let registry: Vec<CaptureRecord> = capture::read_records(&fixtures.join("devices.jsonl"))
        .unwrap()
        .into_iter()
        .filter(|r| r.key.as_deref() == Some(TERMINAL))
        .collect();
    assert_eq!(registry.len(), 1);
    let producer = rig.producer();
    capture::publish_records(&producer, &registry).await.unwrap();
    rig.wait_stats(Duration::from_secs(60), |s| s.counters.devices_applied == 1 && s.counters.pending_records == 0)
        .await;

    // The device comes up as the protocol says: a persistent session as dev-{id} subscribed
    // to its jobs at QoS 1, then its status, retained, from a second connection of the
    // same device (`dev-{id}.status`: mosquitto_sub cannot publish, and a second client
    // with the same id would take the subscriber's session).
    let mut device =
        Subscriber::start(port, &format!("dev-{TERMINAL}"), &jobs, 1, true, Duration::from_secs(30)).await.unwrap();
    let online = serde_json::to_string(&Status { v: 1, online: true, printer: None }).unwrap();
    mosquitto::publish(port, &format!("dev-{TERMINAL}.status"), &status, &online, 1, true).await.unwrap();

    // A first charge: its QR job reaches the device.
    let tpl = template(&fixtures);
    let t = chrono::Utc::now().timestamp() as u64;
    let first = charge_record(&tpl, TERMINAL, &"a".repeat(24), "ACTIVE", 0, 60, t);
    let second = charge_record(&tpl, TERMINAL, &"b".repeat(24), "ACTIVE", 0, 60, t);
    capture::publish_records(&producer, std::slice::from_ref(&first)).await.unwrap();
    let line = device.next_message(JOB_TIMEOUT).await.unwrap().expect("the first job");
    let job1 = check_job(&line, &first, 1);
    let mut copies_of_job1 = 1u64;

    // A second charge while the first job is not acknowledged: its job is queued behind.
    capture::publish_records(&producer, std::slice::from_ref(&second)).await.unwrap();
    rig.wait_stats(Duration::from_secs(30), |s| {
        count(&s.counters.events_read, "charge.upserted") == 2
            && s.counters.pending_records == 0
            && s.counters.outbox_jobs == 2
    })
    .await;
    // pixgate sends the first job again after its ack timeout (2 s) rather than the second:
    // wait for a redelivery counted after the second job was queued, and read every job
    // sent until then; each must be the first job, the same message id and seq.
    let before = rig.gateway().stats().unwrap().counters.job_redeliveries;
    rig.wait_stats(Duration::from_secs(60), |s| s.counters.job_redeliveries > before).await;
    let sent = 1 + rig.gateway().stats().unwrap().counters.job_redeliveries;
    while copies_of_job1 < sent {
        let line = device.next_message(JOB_TIMEOUT).await.unwrap().expect("the redelivered job");
        let again: Job = serde_json::from_str(&line).unwrap();
        assert_eq!(
            (again.message_id.as_str(), again.seq),
            (job1.message_id.as_str(), 1),
            "the second job arrived before the first was acknowledged: {line}"
        );
        copies_of_job1 += 1;
    }
    assert_eq!(
        count(&rig.gateway().stats().unwrap().counters.effects_done, "display_qr"),
        0,
        "nothing is done before its ack"
    );
    // The device takes its job and never answers: readiness says delivery has stalled.
    let body = rig
        .gateway()
        .readyz_until("named the stalled delivery", Duration::from_secs(60), |code, body| {
            code == 503 && body.contains("delivery stalled: 1 jobs in flight to reachable devices")
        })
        .await;
    println!("mosquitto peer: /readyz while the device does not ack: {}", body.trim());

    // The `done` ack: the effect is recorded, and only now the second job goes out.
    let ack = |job: &Job| serde_json::to_string(&Ack::done(&job.message_id, job.seq, false)).unwrap();
    mosquitto::publish(port, &format!("dev-{TERMINAL}.acks"), &acks, &ack(&job1), 1, false).await.unwrap();
    rig.wait_stats(Duration::from_secs(30), |s| count(&s.counters.effects_done, "display_qr") == 1).await;
    let job2 = loop {
        let line = device.next_message(JOB_TIMEOUT).await.unwrap().expect("the second job after the ack");
        let job: Job = serde_json::from_str(&line).unwrap();
        if job.message_id == job1.message_id {
            copies_of_job1 += 1; // a redelivery that crossed the ack
            continue;
        }
        break check_job(&line, &second, 2);
    };
    mosquitto::publish(port, &format!("dev-{TERMINAL}.acks"), &acks, &ack(&job2), 1, false).await.unwrap();
    rig.wait_stats(Duration::from_secs(30), |s| {
        count(&s.counters.effects_done, "display_qr") == 2 && s.counters.outbox_jobs == 0 && s.counters.queued_jobs == 0
    })
    .await;
    rig.gateway().readyz_until("became ready after the acks", Duration::from_secs(60), |code, _| code == 200).await;

    device.stop().await;
    println!("mosquitto peer: 2 jobs acknowledged in seq order by mosquitto_sub/mosquitto_pub; the first sent {copies_of_job1} times before its ack was seen, the second only after it");
    rig.shutdown();
}
