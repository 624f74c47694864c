//! One device floods pixgate's listener and cannot flood its log or hold up the fleet:
//! Debian's `mosquitto_pub -l` (an outside client, QoS 0, one message per line of its
//! standard input) plays a card machine that sends 50,000 malformed acks, then goes on
//! beyond its rate until it is disconnected, while a simulated card machine beside it
//! gets and acknowledges its jobs.
//!
//! Checked: every malformed ack is counted exactly (`malformed_message` for those within
//! the device's rate, `message_rate` for those dropped beyond it, together 50,000); the
//! device beyond its rate for 10 s is disconnected (`rate_disconnect`); pixgate's log
//! gains at most the first 20 lines of each rule and, when the minute ends, one summary
//! line per rule naming the device; the other card machine's job is done meanwhile.
//!
//! Real parts: tansu, the `pixgate` binary with the shipped rate limits, mosquitto_pub.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use device_protocol::Topic;
use pixgate_tests::charges::{charge_record, template};
use pixgate_tests::gateway::{count, StatsReport};
use pixgate_tests::harness::{protocol_devices, Rig};
use pixgate_tests::mosquitto;
use simulators::capture;
use simulators::fleet;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// The flooding card machine.
const A: &str = "724caf4941d4072014b3ce10";
/// The card machine beside it, simulated.
const B: &str = "7f80e222f828767efc2f9162";
/// Malformed acks in the first burst.
const FLOOD: u64 = 50_000;
const WAIT: Duration = Duration::from_secs(60);

fn refusals(s: &StatsReport, rule: &str) -> u64 {
    s.counters.mqtt_refusals.get(rule).copied().unwrap_or(0)
}

/// pixgate's log lines about device refusals: each refusal written in full, and the
/// summaries of those held back.
fn refusal_lines(rig: &Rig) -> Vec<String> {
    std::fs::read_to_string(rig.gateway().log())
        .unwrap()
        .lines()
        .filter(|l| l.contains("device refused") || l.contains("device log lines held back"))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_device_is_counted_exactly_logged_briefly_and_disconnected() {
    mosquitto::require_clients().unwrap_or_else(|e| panic!("{e:#}"));
    let defaults = gateway::config::MqttConfig::default();
    let rig = Rig::builder("device-flood")
        .env("PIXGATE_MQTT__MAX_MESSAGES_PER_SECOND", defaults.max_messages_per_second.to_string())
        .env("PIXGATE_MQTT__MAX_BYTES_PER_SECOND", defaults.max_bytes_per_second.to_string())
        .start()
        .await;
    let started = Instant::now();
    let fixtures = pixgate_tests::demo::default_fixtures();
    rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;
    let fleet = fleet::start_with_options(
        rig.fleet_config(vec![pixgate_tests::fixture_device(&fixtures, B)]),
        protocol_devices(),
    )
    .await
    .unwrap();
    fleet.wait_connected(WAIT).await.unwrap();

    // A: mosquitto_pub reading its messages from a pipe, on A's acks topic.
    let port = rig.settings().mqtt_port.to_string();
    let acks = Topic::Acks(A.into()).path();
    let mut publisher = tokio::process::Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port, "-i", &format!("dev-{A}"), "-q", "0", "-t", &acks, "-l"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = publisher.stdin.take().unwrap();
    rig.wait_stats(WAIT, |s| s.counters.mqtt_connected == 2).await;
    let before = refusal_lines(&rig).len();

    // 50,000 malformed acks at once, while B's job goes out.
    let flood: String = (0..FLOOD).map(|i| format!("not an ack {i}\n")).collect();
    lines.write_all(flood.as_bytes()).await.unwrap();
    lines.flush().await.unwrap();
    let tpl = template(&fixtures);
    let t = chrono::Utc::now().timestamp() as u64;
    let charge = charge_record(&tpl, B, &"c".repeat(24), "ACTIVE", 0, 60, t);
    capture::publish_records(&rig.producer(), std::slice::from_ref(&charge)).await.unwrap();
    rig.wait_stats(WAIT, |s| refusals(s, "malformed_message") + refusals(s, "message_rate") >= FLOOD).await;
    let s = rig.gateway().stats().unwrap();
    let (taken, dropped) = (refusals(&s, "malformed_message"), refusals(&s, "message_rate"));
    assert_eq!(taken + dropped, FLOOD, "each malformed ack counted once: {:?}", s.counters.mqtt_refusals);
    assert!(taken >= u64::from(defaults.max_messages_per_second), "a second's worth taken: {taken}");
    assert!(dropped > 0, "the rest beyond the rate: {dropped}");
    rig.wait_stats(WAIT, |s| count(&s.counters.effects_done, "display_qr") == 1).await;

    // A goes on beyond its rate: disconnected once it has been for 10 s.
    let flooding = Instant::now();
    let mut n = FLOOD;
    while refusals(&rig.gateway().stats().unwrap(), "rate_disconnect") == 0 {
        assert!(flooding.elapsed() < WAIT, "not disconnected after {:?} beyond its rate", flooding.elapsed());
        let burst: String = (n..n + 50).map(|i| format!("not an ack {i}\n")).collect();
        n += 50;
        if lines.write_all(burst.as_bytes()).await.is_err() {
            break; // mosquitto_pub gave up on its connection
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cut_after = flooding.elapsed();
    rig.wait_stats(WAIT, |s| refusals(s, "rate_disconnect") == 1).await;
    drop(lines);
    let _ = publisher.kill().await;

    // The log: the first refusals of each rule written in full, the rest summed up when
    // their minute is over, in one line per rule naming A; every refusal in one or the
    // other.
    let deadline = started + Duration::from_secs(200);
    let rules = ["malformed_message", "message_rate", "rate_disconnect"];
    let accounted = |rule: &str, lines: &[String]| -> (u64, u64) {
        let tag = format!("rule=\"{rule}\"");
        let full = lines.iter().filter(|l| l.contains("device refused") && l.contains(&tag)).count() as u64;
        let held: u64 = lines
            .iter()
            .filter(|l| l.contains("device log lines held back") && l.contains(&tag))
            .map(|l| {
                assert!(l.contains(A), "a summary names the device: {l}");
                l.split("held_back=").nth(1).unwrap().split_whitespace().next().unwrap().parse::<u64>().unwrap()
            })
            .sum();
        (full, held)
    };
    let (written, s) = loop {
        // The counters first: a line is logged after its count, so a count the lines
        // have not caught up with is waited for, never missed.
        let s = rig.gateway().stats().unwrap();
        let written = refusal_lines(&rig)[before..].to_vec();
        if rules.iter().all(|r| {
            let (full, held) = accounted(r, &written);
            full + held == refusals(&s, r)
        }) {
            break (written, s);
        }
        assert!(Instant::now() < deadline, "refusals not all in the log:\n{}", written.join("\n"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for r in rules {
        let (full, held) = accounted(r, &written);
        println!("flood: {r}: {} counted, {full} lines in full, {held} summed up", refusals(&s, r));
        assert!((1..=40).contains(&full), "{full} lines in full of {r}: at most 20 a minute");
    }
    println!(
        "flood: {FLOOD} malformed acks: {taken} taken and dropped as malformed, {} beyond the rate; then disconnected after {cut_after:?} beyond its rate ({} more lines sent); {} log lines in all; B's job done meanwhile",
        FLOOD - taken,
        n - FLOOD,
        written.len()
    );
    assert!(written.len() <= 90, "{} refusal lines:\n{}", written.len(), written.join("\n"));
    fleet.shutdown().await;
    rig.shutdown();
}
