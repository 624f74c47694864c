//! A full disk recovers by itself: pixgate's outbox on a small tmpfs (mounted by the test,
//! as root, like the Debian package test), the file system filled up while charge events
//! arrive, then given room again. pixgate must hold reading while the disk refuses its
//! writes, say so on `/readyz` with the disk's own words (`No space left on device`, not
//! redb's latched `Previous I/O error`), and once there is room go on by itself, without
//! a restart: every charge's QR shown, the same process, ready again, and its place in
//! the consumer group kept however long the disk stays full. With the low-space
//! watermark (`outbox.min_free_bytes`) it stops reading before the disk refuses anything.
//!
//! Real parts: tansu, the `pixgate` binary, a simulated card machine, a real file system
//! that runs out of space.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::gateway::count;
use pixgate_tests::harness::{protocol_devices, Rig};
use simulators::fleet::FleetHandle;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A card machine of the fixtures.
const TERMINAL: &str = "7f80e222f828767efc2f9162";
const WAIT: Duration = Duration::from_secs(90);

/// A tmpfs of `mib` MiB mounted at a new folder named after `name` (each test its own);
/// unmounted on drop.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(name: &str, mib: u32) -> SmallDisk {
        let dir = std::env::temp_dir().join(format!("pixgate-small-disk-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a tmpfs at {} (the test runs as root, as the Debian package test)", dir.display());
        SmallDisk(dir)
    }

    /// Fills the file system with `filler` until it refuses a write, then gives `left`
    /// bytes back (the filler cut short).
    fn fill_leaving(&self, left: u64) -> PathBuf {
        let path = self.fill();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(left)).unwrap();
        path
    }

    /// Fills the file system with `filler` until it refuses a write.
    fn fill(&self) -> PathBuf {
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0xA5u8; 64 * 1024];
        loop {
            if let Err(e) = f.write_all(&chunk).and_then(|()| f.sync_all()) {
                assert_eq!(e.raw_os_error(), Some(28), "ENOSPC: {e}");
                break;
            }
        }
        // And the last bytes a smaller write still finds.
        let _ = f.write_all(&[0u8; 512]);
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

fn qr_shown(rig: &Rig) -> u64 {
    let s = rig.gateway().stats().unwrap();
    count(&s.counters.effects_done, "display_qr") + s.counters.superseded
}

/// A rig named `name` whose outbox is on `disk` with `outbox.min_free_bytes` =
/// `min_free` and the settings `env`, the fixtures' registry, one card machine, and its
/// first charge's QR shown; returns the rig, pixgate's pid and the fleet.
async fn started_on(
    disk: &SmallDisk,
    name: &str,
    min_free: u64,
    env: &[(&'static str, &str)],
) -> (Rig, u32, FleetHandle) {
    let outbox: &Path = &disk.0.join("outbox.redb");
    let mut builder = Rig::builder(name)
        .env("PIXGATE_OUTBOX__PATH", outbox.display().to_string())
        .env("PIXGATE_OUTBOX__MIN_FREE_BYTES", min_free.to_string());
    for (k, v) in env {
        builder = builder.env(k, v.to_string());
    }
    let rig = builder.start().await;
    let pid = rig.gateway().pid();
    let fixtures = pixgate_tests::demo::default_fixtures();
    rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;
    let fleet = rig.start_fleet(vec![pixgate_tests::fixture_device(&fixtures, TERMINAL)], protocol_devices()).await;
    rig.publish_charge(TERMINAL, 0).await;
    rig.wait_stats(WAIT, |s| count(&s.counters.effects_done, "display_qr") == 1).await;
    (rig, pid, fleet)
}

/// Waits until `held` more QR jobs are shown (or superseded) and nothing is left, then for
/// `/readyz` to be ready, in process `pid` still; returns pixgate's log.
async fn all_shown_and_ready(rig: &Rig, held: u64, pid: u32) -> String {
    rig.wait_stats(WAIT, |s| {
        count(&s.counters.effects_done, "display_qr") + s.counters.superseded == 1 + held
            && s.counters.outbox_jobs == 0
            && s.counters.pending_records == 0
    })
    .await;
    rig.gateway().readyz_until("ready again", WAIT, |c, _| c == 200).await;
    assert_eq!(rig.gateway().pid(), pid, "the same process: no restart");
    std::fs::read_to_string(rig.gateway().log()).unwrap()
}

/// Fills `disk`, publishes the charges numbered `charges` for the card machine, and waits
/// until `/readyz` says the disk is full; returns the filler and what `/readyz` said.
async fn filled_while_charges_arrive(
    rig: &Rig,
    disk: &SmallDisk,
    charges: std::ops::RangeInclusive<u64>,
) -> (PathBuf, String) {
    let filler = disk.fill();
    for n in charges {
        rig.publish_charge(TERMINAL, n).await;
    }
    let body = rig
        .gateway()
        .readyz_until("said the disk is full", WAIT, |c, b| c == 503 && b.contains("No space left on device"))
        .await;
    (filler, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_holds_reading_and_recovers_once_there_is_room() {
    assert!(is_root(), "this test mounts a tmpfs: run it as root (as CI does)");
    let disk = SmallDisk::mount("full", 8);
    // The watermark off: the disk fills up under pixgate, as when another writer is faster
    // than its looks. A short poll interval: the disk stays full for longer. Small
    // batches: the charges that arrive meanwhile fill the next batch behind the held
    // write, as a busy box's would.
    const MAX_POLL_MS: u64 = 10_000;
    let poll = MAX_POLL_MS.to_string();
    // (At least the session timeout, 10 s by default: librdkafka refuses less.)
    let env = [("PIXGATE_KAFKA__MAX_POLL_INTERVAL_MS", poll.as_str()), ("PIXGATE_OUTBOX__BATCH_MAX_RECORDS", "4")];
    let (rig, pid, fleet) = started_on(&disk, "disk-full", 0, &env).await;

    // The disk fills up; charge events go on arriving, more than two batches of them.
    const HELD: u64 = 20;
    let (filler, body) = filled_while_charges_arrive(&rig, &disk, 1..=HELD).await;
    println!("disk full: /readyz said:\n{}", body.trim());
    assert!(!body.contains("Previous I/O error"), "the disk's own error, not redb's latch: {body}");
    assert_eq!(qr_shown(&rig), 1, "nothing read past what the outbox could not take");
    // Full for longer than `kafka.max_poll_interval_ms`: the consumer goes on polling, so
    // librdkafka keeps its place in the group.
    tokio::time::sleep(Duration::from_millis(MAX_POLL_MS + 5_000)).await;
    assert_eq!(qr_shown(&rig), 1, "still nothing read past it");

    // Room again: pixgate goes on by itself.
    std::fs::remove_file(&filler).unwrap();
    let log = all_shown_and_ready(&rig, HELD, pid).await;
    assert!(log.contains("outbox opened again after an I/O error"), "the handle was reopened");
    assert!(!log.contains("maximum poll interval"), "the consumer kept polling while the write was held");
    assert!(log.contains("pausing all partitions until it lands"), "the next batch filled behind the held write");
    println!("disk full: {} QR jobs shown or superseded after the disk had room again, same process", qr_shown(&rig));
    fleet.shutdown().await;
    rig.shutdown();
    drop(disk);
}

/// Below `outbox.min_free_bytes` every partition pauses before the disk refuses anything,
/// `/readyz` names the file system at once, and reading resumes by itself once there is
/// room: the charges published meanwhile are all shown, the disk never said
/// `No space left on device`, the same process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_watermark_reading_pauses_before_the_disk_is_full_and_resumes_with_room() {
    assert!(is_root(), "this test mounts a tmpfs: run it as root (as CI does)");
    const MIB: u64 = 1024 * 1024;
    let disk = SmallDisk::mount("low", 16);
    let (rig, pid, fleet) = started_on(&disk, "low-space", 4 * MIB, &[]).await;

    // 2 MiB left: below the watermark, far from full.
    let filler = disk.fill_leaving(2 * MIB);
    let body =
        rig.gateway().readyz_until("named the low space", WAIT, |c, b| c == 503 && b.contains("low on space")).await;
    println!("low space: /readyz said:\n{}", body.trim());
    assert!(body.contains("outbox.min_free_bytes (4194304)"), "{body}");
    const HELD: u64 = 5;
    for n in 1..=HELD {
        rig.publish_charge(TERMINAL, n).await;
    }
    // Paused: given time to be read (the consumer polls every few ms), none is.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(qr_shown(&rig), 1, "nothing read while the file system is low on space");

    std::fs::remove_file(&filler).unwrap();
    let log = all_shown_and_ready(&rig, HELD, pid).await;
    assert!(log.contains("the outbox's file system is low on space: pausing every partition"), "the pause logged");
    assert!(log.contains("the outbox's file system has room again: resuming"), "the resume logged");
    assert!(!log.contains("No space left on device"), "the disk never refused a write");
    println!("low space: {} QR jobs shown or superseded once there was room, same process", qr_shown(&rig));
    fleet.shutdown().await;
    rig.shutdown();
    drop(disk);
}

/// The disk full and a batch held: the jobs the card machine then finishes are removed
/// from the outbox apart from the held batch, and the pages they free inside the file take
/// it. pixgate goes on by itself with no room given back on the file system.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_takes_the_held_batch_once_devices_finish_their_jobs() {
    assert!(is_root(), "this test mounts a tmpfs: run it as root (as CI does)");
    let disk = SmallDisk::mount("drain", 8);
    let (rig, pid, fleet) = started_on(&disk, "disk-drain", 0, &[]).await;
    fleet.shutdown().await;
    // Queued while the card machine is away.
    const QUEUED: u64 = 40;
    for n in 1..=QUEUED {
        rig.publish_charge(TERMINAL, n).await;
    }
    rig.wait_stats(WAIT, |s| s.counters.outbox_jobs == QUEUED && s.counters.pending_records == 0).await;

    const HELD: u64 = 5;
    let (filler, body) = filled_while_charges_arrive(&rig, &disk, QUEUED + 1..=QUEUED + HELD).await;
    println!("disk full, jobs queued: /readyz said:\n{}", body.trim());

    // The card machine is back: it takes its queued jobs, and their removals make room.
    let fixtures = pixgate_tests::demo::default_fixtures();
    let fleet = rig.start_fleet(vec![pixgate_tests::fixture_device(&fixtures, TERMINAL)], protocol_devices()).await;
    let log = all_shown_and_ready(&rig, QUEUED + HELD, pid).await;
    assert!(
        log.contains("finished jobs removed from the outbox apart from the held batch"),
        "the removals were written apart"
    );
    assert!(filler.exists(), "no room was given back on the file system");
    println!("disk full: {} QR jobs shown or superseded with the disk still full, same process", qr_shown(&rig));
    fleet.shutdown().await;
    rig.shutdown();
    drop(disk);
}

/// The disk full and a batch held, a queued job expires: its dead letter, refused by the
/// disk too, waits beside the loop instead of in it, so the consumer goes on polling Kafka
/// longer than `kafka.max_poll_interval_ms`, and the dead letter is written once there
/// is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_expires_while_the_disk_is_full_does_not_stop_the_consumer() {
    assert!(is_root(), "this test mounts a tmpfs: run it as root (as CI does)");
    let disk = SmallDisk::mount("expiry", 8);
    const MAX_POLL_MS: u64 = 10_000;
    let poll = MAX_POLL_MS.to_string();
    let env = [("PIXGATE_KAFKA__MAX_POLL_INTERVAL_MS", poll.as_str())];
    let (rig, pid, fleet) = started_on(&disk, "disk-expiry", 0, &env).await;
    fleet.shutdown().await;
    // A QR that expires in a minute, queued while the card machine is away.
    let fixtures = pixgate_tests::demo::default_fixtures();
    let tpl = pixgate_tests::charges::template(&fixtures);
    let t = chrono::Utc::now().timestamp() as u64;
    let short = pixgate_tests::charges::charge_record(&tpl, TERMINAL, &"e".repeat(24), "ACTIVE", 0, 1, t);
    simulators::capture::publish_records(&rig.producer(), std::slice::from_ref(&short)).await.unwrap();
    rig.wait_stats(WAIT, |s| s.counters.outbox_jobs == 1 && s.counters.pending_records == 0).await;

    const HELD: u64 = 3;
    let (filler, _) = filled_while_charges_arrive(&rig, &disk, 1..=HELD).await;
    // The QR expires meanwhile; its dead letter is refused, and waits.
    let log_has = |what: &str| std::fs::read_to_string(rig.gateway().log()).unwrap().contains(what);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !log_has("cannot store a dead letter in the outbox") {
        assert!(std::time::Instant::now() < deadline, "the expired job's dead letter was never tried");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(MAX_POLL_MS + 5_000)).await;

    std::fs::remove_file(&filler).unwrap();
    let fleet = rig.start_fleet(vec![pixgate_tests::fixture_device(&fixtures, TERMINAL)], protocol_devices()).await;
    rig.wait_stats(WAIT, |s| {
        count(&s.counters.expired, "display_qr") == 1
            && count(&s.counters.effects_done, "display_qr") + s.counters.superseded == 1 + HELD
            && s.counters.outbox_jobs == 0
            && s.counters.pending_records == 0
    })
    .await;
    rig.gateway().readyz_until("ready again", WAIT, |c, _| c == 200).await;
    assert_eq!(rig.gateway().pid(), pid, "the same process: no restart");
    let log = std::fs::read_to_string(rig.gateway().log()).unwrap();
    assert!(!log.contains("maximum poll interval"), "the consumer kept polling while the dead letter waited");
    let (code, body) = rig.gateway().get("/deadletters").unwrap();
    println!("disk full, a job expired: /deadletters answered {code}: {}", &body[..body.len().min(300)]);
    fleet.shutdown().await;
    rig.shutdown();
    drop(disk);
}
