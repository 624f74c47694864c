//! A damaged outbox is named, not a panic: the outbox of a stopped pixgate holding queued
//! jobs gets random bytes over the pages that hold them (as a failing SD card or eMMC
//! would leave it), and pixgate then refuses to start with one clear error naming the
//! file, what is wrong and what to do, instead of exiting 101 from inside redb.
//! `pixgate outbox check FILE` says the same of the damaged file and passes a copy taken
//! before the damage. With the check switched off, the panic inside redb ends with pixgate's
//! own log line naming the outbox code that read the page.
//!
//! `pixgate outbox salvage` copies what a damaged file still holds into a new one, names
//! exactly the jobs it lost, and its reposition has pixgate queue those again, once.
//!
//! Real parts: tansu, the `pixgate` binary, its CLI; the damage is done to the file itself.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::harness::Rig;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A card machine of the fixtures that stays offline: its jobs wait in the outbox.
const TERMINAL: &str = "7f80e222f828767efc2f9162";
/// redb's page size.
const PAGE: u64 = 4096;

/// Overwrites with pseudo-random bytes every page of `path` that holds `needle`; returns
/// how many.
fn damage_pages_holding(path: &Path, needle: &[u8]) -> usize {
    let mut bytes = Vec::new();
    std::fs::File::open(path).unwrap().read_to_end(&mut bytes).unwrap();
    let mut pages: Vec<u64> =
        bytes.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i as u64 / PAGE).collect();
    pages.dedup();
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for &p in &pages {
        let noise: Vec<u8> = (0..PAGE)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        file.seek(SeekFrom::Start(p * PAGE)).unwrap();
        file.write_all(&noise).unwrap();
    }
    file.sync_all().unwrap();
    pages.len()
}

/// `pixgate ARGS` on the outbox at `outbox` (no Kafka needed before the outbox is open):
/// exit code, stdout, stderr.
fn pixgate(bin: &Path, outbox: &Path, brokers: &str, args: &[&str]) -> (i32, String, String) {
    pixgate_with(Command::new(bin), outbox, brokers, args)
}

/// [`pixgate`] with `cmd` (the binary, and any settings of the caller's).
fn pixgate_with(mut cmd: Command, outbox: &Path, brokers: &str, args: &[&str]) -> (i32, String, String) {
    let out = cmd
        .args(args)
        .env("PIXGATE_OUTBOX__PATH", outbox)
        .env("PIXGATE_KAFKA__BROKERS", brokers)
        .env("PIXGATE_MQTT__LISTEN", "127.0.0.1:0")
        .env("PIXGATE_MQTT__PLAIN", "true")
        .env("PIXGATE_HTTP__LISTEN", "127.0.0.1:0")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_outbox_is_named_with_what_to_do_not_a_panic() {
    let mut rig = Rig::builder("outbox-damage").start().await;
    rig.publish_registry_file(&pixgate_tests::demo::default_fixtures().join("devices.jsonl")).await;
    let mut message_ids = Vec::new();
    for n in 0..3u64 {
        let rec = rig.publish_charge(TERMINAL, n).await;
        let event: serde_json::Value = serde_json::from_slice(&rec.value).unwrap();
        let event_id = event["eventId"].as_str().unwrap();
        message_ids.push(device_protocol::message_id(event_id, TERMINAL, device_protocol::EffectKind::DisplayQr));
    }
    // Every charge's QR stored (pending_records alone can be 0 before the last record is
    // fetched at all).
    rig.wait_stats(Duration::from_secs(60), |s| s.counters.outbox_jobs >= 3 && s.counters.pending_records == 0).await;
    assert!(rig.stop_gateway(Duration::from_secs(30)), "pixgate stopped cleanly");

    let outbox = rig.settings().outbox_path.clone();
    let intact = outbox.with_extension("intact.redb");
    std::fs::copy(&outbox, &intact).unwrap();
    let bin = rig.bin().to_path_buf();
    let brokers = rig.brokers().to_string();
    let (code, out, err) = pixgate(&bin, &intact, &brokers, &["outbox", "check", intact.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("intact"), "{out}");

    // The pages that hold the queued job (its message id is in its row).
    let queued = message_ids.last().unwrap();
    let damaged = damage_pages_holding(&outbox, queued.as_bytes());
    assert!(damaged >= 1, "the queued job {queued} is in the file");
    println!("outbox damage: {damaged} page(s) holding job {queued} overwritten");

    let (code, out, err) = pixgate(&bin, &outbox, &brokers, &["run"]);
    println!("pixgate run on the damaged outbox: exit {code}\n{err}");
    assert_eq!(code, 1, "an error exit, not a panic's 101: {out}{err}");
    assert!(!err.contains("panicked"), "{err}");
    let line = err.lines().find(|l| l.contains("damaged")).unwrap_or_else(|| panic!("no word of the damage: {err}"));
    assert!(line.contains(outbox.to_str().unwrap()), "the file is named: {line}");
    assert!(err.contains("pixgate outbox check"), "what to do: {err}");

    let (code, out, err) = pixgate(&bin, &outbox, &brokers, &["outbox", "check", outbox.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("damaged") && err.contains(outbox.to_str().unwrap()), "{err}");

    // Without the check, the first read of the damaged page panics inside redb: the log's
    // last word names pixgate's component that read it, and where to look.
    let mut unchecked = Command::new(&bin);
    unchecked.env("PIXGATE_OUTBOX__CHECK_ON_OPEN", "false").env("RUST_BACKTRACE", "0");
    let (code, out, err) = pixgate_with(unchecked, &outbox, &brokers, &["run"]);
    assert_eq!(code, 101, "a panic: {out}{err}");
    let line =
        err.lines().find(|l| l.contains("pixgate panicked in")).unwrap_or_else(|| panic!("no panic line: {err}"));
    println!("unchecked open: {line}");
    assert!(line.contains("ERROR") && line.contains("gateway::store::outbox"), "the component: {line}");
    assert!(line.contains("journalctl -u pixgate"), "where to read: {line}");
    rig.shutdown();
}

/// Charges queued for the offline card machine in the salvage test: enough that its queue
/// spans several of the file's pages, so that a damaged page costs some of them.
const QUEUED: u64 = 24;

/// The queue of [`TERMINAL`] in the outbox `file` (gateway stopped): (seq, message id).
fn queued(bin: &Path, file: &Path, brokers: &str) -> Vec<(u64, String)> {
    let (code, out, err) = pixgate(bin, file, brokers, &["outbox", "list", TERMINAL]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["seq"].as_u64().unwrap(), j["message_id"].as_str().unwrap().to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_outbox_is_salvaged_and_what_it_lost_is_read_again() {
    let mut rig = Rig::builder("outbox-salvage").start().await;
    rig.publish_registry_file(&pixgate_tests::demo::default_fixtures().join("devices.jsonl")).await;
    let mut message_ids = Vec::new();
    for n in 0..QUEUED {
        let rec = rig.publish_charge(TERMINAL, 100 + n).await;
        let event: serde_json::Value = serde_json::from_slice(&rec.value).unwrap();
        let event_id = event["eventId"].as_str().unwrap();
        message_ids.push(device_protocol::message_id(event_id, TERMINAL, device_protocol::EffectKind::DisplayQr));
    }
    rig.wait_stats(Duration::from_secs(60), |s| s.counters.outbox_jobs >= QUEUED && s.counters.pending_records == 0)
        .await;
    assert!(rig.stop_gateway(Duration::from_secs(30)), "pixgate stopped cleanly");
    let outbox = rig.settings().outbox_path.clone();
    let bin = rig.bin().to_path_buf();
    let brokers = rig.brokers().to_string();
    let before = queued(&bin, &outbox, &brokers);
    let ids: std::collections::BTreeSet<&String> = before.iter().map(|(_, id)| id).collect();
    assert_eq!(ids, message_ids.iter().collect(), "every charge's job is queued once");

    let middle = &message_ids[message_ids.len() / 2];
    let middle_seq = before.iter().find(|(_, id)| id == middle).unwrap().0;
    let damaged = damage_pages_holding(&outbox, middle.as_bytes());
    println!("outbox salvage: {damaged} page(s) holding job {middle} (seq {middle_seq}) overwritten");

    let salvaged = outbox.with_extension("salvaged.redb");
    let args = ["outbox", "salvage", outbox.to_str().unwrap(), salvaged.to_str().unwrap()];
    let (code, report, err) = pixgate(&bin, &outbox, &brokers, &args);
    println!("pixgate outbox salvage: exit {code}\n{report}{err}");
    assert_eq!(code, 2, "written, with losses: {report}{err}");
    let (code, out, err) = pixgate(&bin, &salvaged, &brokers, &["outbox", "check", salvaged.to_str().unwrap()]);
    assert_eq!(code, 0, "the new file is intact: {out}{err}");

    // What it kept is what the damaged file held, row for row; what it names as lost is
    // the rest of the queue, the damaged job among them.
    let kept = queued(&bin, &salvaged, &brokers);
    let lost: Vec<u64> = report
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&format!("lost: device {TERMINAL} seq ")))
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    println!("outbox salvage: {} jobs kept, {} lost {lost:?}", kept.len(), lost.len());
    assert!(lost.contains(&middle_seq), "the damaged job is named: {report}");
    assert!(
        kept.len() + lost.len() == before.len() && !kept.is_empty(),
        "a damaged page costs its jobs alone: {report}"
    );
    for job in &kept {
        assert!(before.contains(job) && !lost.contains(&job.0), "{job:?} kept as it was");
    }
    assert!(report.contains("display_qr from charge.upserted"), "what was lost: {report}");

    // The report's reposition, then a start on the new file: every lost job is queued again.
    let to_time = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("pixgate kafka reposition --to-time ").filter(|t| !t.contains(' ')))
        .unwrap_or_else(|| panic!("no reposition to run: {report}"))
        .to_string();
    std::fs::rename(&salvaged, &outbox).unwrap();
    let mut with_group = Command::new(&bin);
    with_group.env("PIXGATE_KAFKA__GROUP_ID", &rig.settings().group_id);
    let (code, out, err) = pixgate_with(
        with_group,
        &outbox,
        &brokers,
        &["kafka", "reposition", "--no-member-check", "--to-time", &to_time],
    );
    assert_eq!(code, 0, "{out}{err}");
    rig.start_gateway();
    rig.wait_stats(Duration::from_secs(60), |s| s.counters.outbox_jobs >= QUEUED && s.counters.pending_records == 0)
        .await;
    assert!(rig.stop_gateway(Duration::from_secs(30)), "pixgate stopped cleanly");
    let after = queued(&bin, &outbox, &brokers);
    let ids: std::collections::BTreeSet<&String> = after.iter().map(|(_, id)| id).collect();
    println!("outbox salvage: after the reposition, {} jobs queued for {} message ids", after.len(), ids.len());
    assert_eq!(ids, message_ids.iter().collect(), "every job is queued again, nothing new");
    // The kept jobs' dedupe ids are in the new file (put back where the damage took them):
    // the records read again queue the lost jobs alone.
    assert_eq!(after.len(), message_ids.len(), "no job queued twice: {after:?}");
    let seqs: Vec<u64> = after.iter().map(|(s, _)| *s).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs in order, none given twice: {seqs:?}");
    rig.shutdown();
}
