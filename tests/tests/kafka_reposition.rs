//! `pixgate kafka reposition` on the real broker: refused while pixgate is in its consumer
//! group, a dry run allowed meanwhile; once pixgate has stopped, moved to the end, to given
//! offsets and back to a point in time, each move's skipped and replayed records counted
//! against what was produced, the commits read back from Kafka, and the restarted
//! gateway reading exactly from the new position.
//!
//! Real parts: tansu, the `pixgate` binary (gateway and CLI), the fixtures' charge records.
//! Every effect kind is switched off, as in a rollback: pixgate reads and counts, and
//! queues nothing.

// Helpers of a test are test steps too: a panic is a failed test (clippy.toml's
// allow-unwrap-in-tests covers only the #[test] fns themselves).
#![allow(clippy::unwrap_used)]

use pixgate_tests::gateway::count;
use pixgate_tests::harness::Rig;
use serde_json::Value;
use simulators::capture;
use std::time::Duration;

const TOPIC: &str = "charge.upserted";
const KINDS: [&str; 4] = ["display_qr", "payment_confirmed", "print_receipt", "charge_expired"];

/// `pixgate ARGS` with the rig's broker, group and HTTP port: (exit code, stdout, stderr).
fn pixgate(rig: &Rig, args: &[&str]) -> (i32, String, String) {
    let s = rig.settings();
    let out = std::process::Command::new(rig.bin())
        .args(args)
        .env("PIXGATE_KAFKA__BROKERS", &s.brokers)
        .env("PIXGATE_KAFKA__GROUP_ID", &s.group_id)
        .env("PIXGATE_HTTP__LISTEN", format!("127.0.0.1:{}", s.http_port))
        .env("PIXGATE_OUTBOX__PATH", &s.outbox_path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// A reposition with `--json`: its answer, after checking it succeeded.
fn reposition(rig: &Rig, args: &[&str]) -> Value {
    // No consumer of the group runs here: said for brokers that cannot answer
    // DescribeGroups (tansu 0.6.0); with one that can, the check still runs and must pass.
    let mut all = vec!["kafka", "reposition", "--json", "--no-member-check"];
    all.extend_from_slice(args);
    let (code, out, err) = pixgate(rig, &all);
    assert_eq!(code, 0, "pixgate {all:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Sums `field` over the moves of a reposition answer.
fn sum(v: &Value, field: &str) -> i64 {
    v["moves"].as_array().unwrap().iter().map(|m| m[field].as_i64().unwrap()).sum()
}

/// Each partition's target of a reposition answer, by partition.
fn targets(v: &Value) -> Vec<(i64, i64)> {
    v["moves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["partition"].as_i64().unwrap(), m["target"].as_i64().unwrap()))
        .collect()
}

fn committed(rig: &Rig) -> Vec<i64> {
    pixgate_tests::kafka::committed_offsets(rig.brokers(), &rig.settings().group_id, TOPIC, 3).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reposition_is_refused_while_the_group_runs_and_moves_it_once_empty() {
    let fixtures = pixgate_tests::demo::default_fixtures();
    // Dynamic membership: a stopped pixgate leaves the group at once (a static member
    // stays until its session timeout).
    let mut rig = Rig::builder("reposition").env("PIXGATE_KAFKA__INSTANCE_ID", "").start().await;
    for kind in KINDS {
        let (code, _, err) = pixgate(&rig, &["flags", "set", kind, "off"]);
        assert_eq!(code, 0, "{err}");
    }
    rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;
    let charges = capture::read_records(&fixtures.join("charges.jsonl")).unwrap();
    let (first, second) = charges.split_at(120);
    let producer = rig.producer();
    capture::publish_records(&producer, first).await.unwrap();
    let read_first = first.len() as u64;
    rig.wait_stats(Duration::from_secs(60), |s| {
        count(&s.counters.events_read, TOPIC) == read_first && s.counters.pending_records == 0
    })
    .await;
    assert_eq!(rig.gateway().stats().unwrap().counters.outbox_jobs, 0, "every kind is off: nothing queued");
    // Read and stored is not yet committed: the periodic commit runs every second.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (brokers, group) = (rig.brokers().to_string(), rig.settings().group_id.clone());
    pixgate_tests::kafka::wait_committed(&brokers, &group, TOPIC, 3, deadline, |c| {
        c.iter().sum::<i64>() == read_first as i64
    })
    .await
    .unwrap();

    // While pixgate is a member: refused. A broker that answers DescribeGroups names the
    // live member; tansu 0.6.0 fails DescribeGroups for every existing group (its SQLite
    // storage reads the group back as a JSON string and drops the connection), and an
    // answer that cannot be had refuses too, unless the operator says every consumer is
    // stopped (--no-member-check). A dry run goes ahead.
    let (code, out, err) = pixgate(&rig, &["kafka", "reposition", "--to", "end"]);
    assert_eq!(code, 1, "{out}{err}");
    let refusal = err.lines().find(|l| l.starts_with("refused: ")).unwrap_or_else(|| panic!("no refusal: {err}"));
    assert!(refusal.contains("live member(s)") || refusal.contains("cannot tell whether consumer group"), "{refusal}");
    assert!(refusal.contains(&format!("`{}`", rig.settings().group_id)), "{refusal}");
    assert_eq!(committed(&rig).iter().sum::<i64>(), read_first as i64, "nothing moved");
    let (code, out, err) = pixgate(&rig, &["kafka", "reposition", "--to", "end", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("dry run: nothing committed") && err.contains("would be refused"), "{out}{err}");
    assert!(
        out.lines().next().unwrap().split_whitespace().eq([
            "topic",
            "partition",
            "current",
            "target",
            "skipped",
            "replayed"
        ]),
        "{out}"
    );

    // Stopped, pixgate commits its position at the end of what it read (and, a dynamic
    // member, leaves the group).
    assert!(rig.stop_gateway(Duration::from_secs(20)), "pixgate did not stop cleanly");
    let at_stop = committed(&rig);
    assert_eq!(at_stop.iter().sum::<i64>(), read_first as i64, "{at_stop:?}");

    // Records produced while pixgate is away, after `since`.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let since = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(50)).await;
    capture::publish_records(&producer, second).await.unwrap();
    let later = second.len() as i64;

    // To the end: what was produced meanwhile is skipped, and committed.
    let v = reposition(&rig, &["--to", "end"]);
    assert_eq!(v["committed"], true, "{v}");
    assert_eq!((sum(&v, "skipped"), sum(&v, "replayed")), (later, 0), "{v}");
    let current: Vec<i64> = v["moves"].as_array().unwrap().iter().map(|m| m["current"].as_i64().unwrap()).collect();
    assert_eq!(current, at_stop, "current is what pixgate committed");
    let end: Vec<i64> = targets(&v).into_iter().map(|(_, t)| t).collect();
    assert_eq!(committed(&rig), end);
    assert_eq!(end.iter().sum::<i64>(), read_first as i64 + later);

    // To given offsets: only the partition named moves, and the records between are replayed.
    let file = rig.dir().join("offsets.json");
    std::fs::write(&file, format!("{{\"{TOPIC}\": {{\"0\": {}}}}}", at_stop[0])).unwrap();
    let v = reposition(&rig, &["--to-offsets", file.to_str().unwrap()]);
    assert_eq!(targets(&v), vec![(0, at_stop[0])], "{v}");
    assert_eq!(sum(&v, "replayed"), end[0] - at_stop[0], "{v}");
    assert_eq!(committed(&rig), vec![at_stop[0], end[1], end[2]]);
    std::fs::write(&file, format!("{{\"{TOPIC}\": {{\"0\": {}}}}}", end[0] + 1)).unwrap();
    let (code, _, err) = pixgate(&rig, &["kafka", "reposition", "--to-offsets", file.to_str().unwrap()]);
    assert!(code != 0 && err.contains("outside the partition's"), "{err}");

    // Back to `since`: the first record at or after it, on each partition, is where
    // pixgate stopped; the later records are replayed.
    let t = since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let v = reposition(&rig, &["--to-time", &t]);
    assert_eq!(targets(&v).into_iter().map(|(_, t)| t).collect::<Vec<_>>(), at_stop, "{v}");
    assert_eq!(sum(&v, "replayed"), end[1] - at_stop[1] + end[2] - at_stop[2], "{v}");
    assert_eq!(committed(&rig), at_stop);

    // pixgate started again reads exactly the records after its new position.
    rig.start_gateway();
    rig.wait_stats(Duration::from_secs(60), |s| {
        count(&s.counters.events_read, TOPIC) >= later as u64 && s.counters.pending_records == 0
    })
    .await;
    let s = rig.gateway().stats().unwrap();
    assert_eq!(count(&s.counters.events_read, TOPIC), later as u64);
    assert!(s.counters.outbox_jobs == 0 && !s.counters.skipped_by_flag.is_empty(), "{:?}", s.counters);
    assert!(rig.stop_gateway(Duration::from_secs(20)), "pixgate did not stop cleanly");
    assert_eq!(committed(&rig), end, "and commits the end again");

    // A group that never ran (the cutover's first step, before the new consumer's first
    // start) is moved to the end with the member check: it has no members.
    let fresh = format!("{}-fresh", rig.settings().group_id);
    let (code, out, err) = pixgate(&rig, &["kafka", "reposition", "--group", &fresh, "--to", "end", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["members"].clone(), sum(&v, "skipped")), (serde_json::json!([]), read_first as i64 + later), "{v}");
    assert!(v["moves"].as_array().unwrap().iter().all(|m| m["current"].is_null()), "{v}");
    assert_eq!(pixgate_tests::kafka::committed_offsets(rig.brokers(), &fresh, TOPIC, 3).unwrap(), end);
    rig.shutdown();
}
