//! Reconciliation windows against the bundled fixtures: the demo runs them end to end
//! (tansu, pixgate, the simulated fleet over TLS), then `pixgate report` reads the counts
//! from the stopped gateway's outbox file. Each topic's records read per 10-minute window
//! of event time equal what the fixture files hold per window; delivered per kind equals
//! `expected.json`; in every window each kind's queued jobs are delivered, superseded or
//! expired; the dead letters counted are those pixgate wrote to `pixgate.deadletter`.

// Helpers of a test are test steps too: a panic is a failed test (clippy.toml's
// allow-unwrap-in-tests covers only the #[test] fns themselves).
#![allow(clippy::unwrap_used)]

use gateway::store::reconcile::Window;
use pixgate_tests::demo::{self, DemoConfig};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const WINDOW_S: u64 = 600;

/// `pixgate report ARGS` on the outbox file at `outbox` (no gateway answers on the port).
fn report(bin: &Path, outbox: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(bin)
        .arg("report")
        .args(args)
        .env("PIXGATE_OUTBOX__PATH", outbox)
        .env("PIXGATE_HTTP__LISTEN", format!("127.0.0.1:{}", pixgate_tests::net::free_port()))
        .output()
        .unwrap();
    assert!(out.status.success(), "pixgate report {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn windows(json: &str) -> Vec<Window> {
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("not JSON ({e}): {json}"));
    assert_eq!(v["window_s"], WINDOW_S);
    serde_json::from_value(v["windows"].clone()).unwrap()
}

/// The `clusterTime` second of a fixture line's value, when it has a readable one.
fn cluster_time(line: &Value) -> Option<u64> {
    let value = match &line["value"] {
        Value::String(s) => serde_json::from_str(s).ok()?,
        v => v.clone(),
    };
    value["clusterTime"]["$timestamp"]["t"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fixture_run_reconciles_window_by_window() {
    let fixtures = demo::default_fixtures();
    let out = std::env::temp_dir().join(format!("pixgate-reconcile-{}", std::process::id()));
    let started = chrono::Utc::now().timestamp() as u64;
    let cfg = DemoConfig {
        fixtures: fixtures.clone(),
        out: out.clone(),
        pixgate_bin: pixgate_tests::gateway::find_binary().unwrap(),
        timeout: Duration::from_secs(300),
        pace: demo::Pace::KeepingUp,
    };
    demo::run(&cfg).await.unwrap();
    let (bin, outbox) = (cfg.pixgate_bin.clone(), out.join("pixgate-data/outbox.redb"));
    let got = windows(&report(&bin, &outbox, &["--window", "10m", "--json"]));

    // Records read per topic and window: the fixture files, by their clusterTime; a record
    // without one (malformed) by its Kafka timestamp, during this run.
    let mut want_read: BTreeMap<(String, u64), u64> = BTreeMap::new();
    let mut malformed = 0;
    for name in ["devices.jsonl", "charges.jsonl", "edge-cases.jsonl"] {
        for line in std::fs::read_to_string(fixtures.join(name)).unwrap().lines() {
            let line: Value = serde_json::from_str(line).unwrap();
            match cluster_time(&line) {
                Some(t) => {
                    *want_read.entry((line["topic"].as_str().unwrap().into(), t / WINDOW_S * WINDOW_S)).or_default() +=
                        1
                }
                None => malformed += 1,
            }
        }
    }
    let run_window = started / WINDOW_S * WINDOW_S;
    let mut got_read: BTreeMap<(String, u64), u64> = BTreeMap::new();
    let mut read_during_run = 0;
    for w in &got {
        let start = w.start.timestamp() as u64;
        assert_eq!(w.end.timestamp() as u64, start + WINDOW_S);
        if start >= run_window {
            read_during_run += w.read;
        } else {
            got_read.insert((w.topic.clone(), start), w.read);
        }
    }
    assert!(malformed > 0 && want_read.len() > 2, "{want_read:?}");
    assert_eq!(got_read, want_read, "records read per topic and window of event time");
    assert_eq!(read_during_run, malformed, "the records without a clusterTime, by their Kafka timestamp");

    // Delivered per kind: expected.json.
    let mut want_delivered: BTreeMap<String, u64> = BTreeMap::new();
    for kinds in pixgate_tests::expected_effects(&fixtures).into_values() {
        for k in kinds {
            *want_delivered.entry(k).or_default() += 1;
        }
    }
    let mut delivered: BTreeMap<String, u64> = BTreeMap::new();
    for (k, n) in got.iter().flat_map(|w| &w.delivered) {
        *delivered.entry(k.clone()).or_default() += n;
    }
    assert_eq!(delivered, want_delivered, "delivered per kind, all windows");

    // Each window's queued jobs left the queue: delivered, superseded (a QR) or expired.
    for w in &got {
        let mut left = w.queued.clone();
        for (k, n) in w.delivered.iter().chain(&w.expired) {
            *left.entry(k.clone()).or_default() -= n;
        }
        *left.entry("display_qr".into()).or_default() -= w.superseded;
        assert!(left.values().all(|n| *n == 0), "jobs unaccounted for in {w:?}");
    }

    // Dead letters: those on pixgate.deadletter, by reason (`expired` counted apart).
    let mut want_dead: BTreeMap<String, u64> = BTreeMap::new();
    for line in std::fs::read_to_string(out.join("deadletters.jsonl")).unwrap().lines() {
        let dl: Value = serde_json::from_str(line).unwrap();
        *want_dead.entry(dl["reason"].as_str().unwrap().to_string()).or_default() += 1;
    }
    let mut dead: BTreeMap<String, u64> = BTreeMap::new();
    for w in &got {
        for (k, n) in &w.dead_lettered {
            *dead.entry(k.clone()).or_default() += n;
        }
        for n in w.expired.values() {
            *dead.entry("expired".into()).or_default() += n;
        }
    }
    assert!(!want_dead.is_empty());
    assert_eq!(dead, want_dead, "dead letters by reason");

    // --since keeps the windows from the one holding it; the text form shows the same.
    let last = got.iter().filter(|w| (w.start.timestamp() as u64) < run_window).map(|w| w.start).max().unwrap();
    let since = (last + chrono::Duration::seconds(1)).to_rfc3339();
    let from_last = windows(&report(&bin, &outbox, &["--window", "10m", "--since", &since, "--json"]));
    assert!(from_last.iter().all(|w| w.start >= last) && from_last.iter().any(|w| w.start == last), "{from_last:?}");
    let text = report(&bin, &outbox, &["--since", &since]);
    let first = &from_last[0];
    assert!(text.contains(&format!("  read            {}\n", first.read)), "{text}");
    let _ = std::fs::remove_dir_all(&out);
}
