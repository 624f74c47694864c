//! Printers pixgate drives itself: a fixture printer whose registry document says
//! `printer.transport: tcp` (or `serial`) with its `printer.endpoint`, played by
//! `printer-sim listen` on loopback TCP or a pseudo-terminal, switched at run time through
//! its state file. Real tansu broker, pixgate as a child process, the paired card machine
//! as an MQTT client. What the printer printed is read back from its transcript (it
//! dedupes nothing: every byte pixgate wrote is there).

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::harness::{protocol_devices, Rig};
use pixgate_tests::printer_sim::{registry_with_direct_printer, RawSim};
use simulators::capture::{self, CaptureRecord};
use std::time::{Duration, Instant};

/// A card machine of the fixtures and the printer it is paired with (58 mm, CP850).
const TERMINAL: &str = "7f80e222f828767efc2f9162";
const PRINTER: &str = "8baa7196b50ac2f86702824c";
const HEADER: &str = "2ª VIA / REIMPRESSÃO";
const WAIT: Duration = Duration::from_secs(90);

/// A rig whose direct printers are polled and reconnected quickly.
async fn rig(name: &str) -> Rig {
    Rig::builder(name)
        .env("PIXGATE_DIRECT__POLL_MS", "200")
        .env("PIXGATE_DIRECT__RECONNECT_INITIAL_MS", "200")
        .env("PIXGATE_DIRECT__RECONNECT_MAX_MS", "1000")
        .start()
        .await
}

/// Charge `id` created on the card machine and paid: a QR and a "paid" screen on the card
/// machine, a receipt on its printer.
fn paid_charge(id: &str, t: u64) -> [CaptureRecord; 2] {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let template = pixgate_tests::charges::template(&fixtures);
    let rec = |status, v| pixgate_tests::charges::charge_record(&template, TERMINAL, id, status, v, 60, t);
    [rec("ACTIVE", 0), rec("COMPLETED", 1)]
}

/// Publishes the registry with [`PRINTER`] on `transport` at `endpoint`.
async fn publish_registry(rig: &Rig, transport: &str, endpoint: &str) {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let file = rig.dir().join("devices.jsonl");
    registry_with_direct_printer(&fixtures, &file, PRINTER, transport, endpoint);
    rig.publish_registry_file(&file).await;
}

/// Publishes the paid charges `ids`, one record at a time (each read before the next is
/// sent: the receipts are queued in this order).
async fn publish_paid(rig: &Rig, ids: &[String]) {
    let producer = rig.producer();
    let t = chrono::Utc::now().timestamp() as u64;
    let mut read = rig.gateway().stats().unwrap().counters.events_read.get("charge.upserted").copied().unwrap_or(0);
    for id in ids {
        for r in paid_charge(id, t) {
            capture::publish_records(&producer, std::slice::from_ref(&r)).await.unwrap();
            read += 1;
            rig.wait_stats(Duration::from_secs(30), |s| {
                s.counters.events_read.get("charge.upserted").copied() == Some(read) && s.counters.pending_records == 0
            })
            .await;
        }
    }
}

/// How many jobs the outbox holds for [`PRINTER`] (`GET /outbox/{device}`).
fn printer_jobs(rig: &Rig) -> usize {
    let (status, body) = rig.gateway().get(&format!("/outbox/{PRINTER}")).unwrap();
    assert_eq!(status, 200, "{body}");
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    listed["jobs"].as_array().map_or(0, Vec::len)
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The charge ids (of `ids`) each printed job names, in the order printed.
fn printed_charges(sim: &RawSim, ids: &[String]) -> Vec<String> {
    let collapse = |t: &str| t.split_whitespace().collect::<String>();
    sim.jobs()
        .iter()
        .map(|job| {
            let text = collapse(job);
            let named: Vec<&String> = ids.iter().filter(|id| text.contains(id.as_str())).collect();
            assert_eq!(named.len(), 1, "a job names one charge of the test: {job}");
            named[0].clone()
        })
        .collect()
}

/// Proof 2: a TCP printer out of paper holds its own queue (nothing is written to it, its
/// receipts stay in the outbox) while the card machine keeps getting its screens; paper
/// back, its receipts print in order, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paper_out_on_a_tcp_printer_holds_only_its_queue_and_resumes_in_order() {
    let mut rig = rig("direct-paper-out").await;
    let sim = RawSim::start(&rig.dir().join("printer"), &["--tcp", "127.0.0.1:0"], 58, "paper-out");
    let addr = sim.line("listening tcp");
    let fixtures = pixgate_tests::demo::default_fixtures();
    let terminal = rig.start_fleet(vec![pixgate_tests::fixture_device(&fixtures, TERMINAL)], protocol_devices()).await;
    publish_registry(&rig, "tcp", &format!("tcp://{addr}")).await;

    let ids: Vec<String> = "abcde".chars().map(|c| c.to_string().repeat(24)).collect();
    publish_paid(&rig, &ids).await;

    // The card machine got every "paid" screen; the printer's receipts are all held.
    wait_for("the card machine's paid screens", || {
        terminal.effects().iter().filter(|e| e.kind.as_str() == "payment_confirmed").count() == ids.len()
    })
    .await;
    rig.wait_stats(WAIT, |s| s.counters.outbox_jobs == ids.len() as u64 && s.counters.pending_records == 0).await;
    assert_eq!(printer_jobs(&rig), ids.len(), "the held receipts are the printer's");
    // Its status shows as an MQTT printer's would: on the outbox listing, /stats, /metrics.
    let (_, body) = rig.gateway().get(&format!("/outbox/{PRINTER}")).unwrap();
    assert!(body.contains(r#""held":"paper_out""#), "{body}");
    rig.wait_stats(WAIT, |s| s.counters.held_devices.get("paper_out") == Some(&1)).await;
    let (_, metrics) = rig.gateway().get("/metrics").unwrap();
    let held = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"pixgate_held_devices{reason="paper_out"} "#))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert_eq!(held, Some(1.0), "{metrics}");
    // Held for a while (several status polls): nothing was written to the printer.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(sim.jobs().is_empty(), "printed while out of paper:\n{}", sim.transcript());

    // The paper is back: the receipts print in their order, each once, none a reprint.
    sim.set_state("ready");
    wait_for("the held receipts", || sim.jobs().len() >= ids.len()).await;
    rig.wait_stats(WAIT, |s| s.counters.outbox_jobs == 0 && s.counters.held_devices.is_empty()).await;
    assert_eq!(printed_charges(&sim, &ids), ids, "in order, each once");
    assert!(!sim.transcript().contains(HEADER), "no reprint:\n{}", sim.transcript());
    assert!(sim.transcript().contains("[CUT"), "whole receipts, cut");
    terminal.shutdown().await;
    rig.kill_gateway();
    rig.shutdown();
}

/// Proof 4: the printer is switched off mid-job (the simulator killed while it reads a
/// receipt) and comes back on the same port: that receipt is printed again once, under the
/// reprint header; the others once, without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_printer_killed_mid_job_prints_it_again_once_marked_as_a_reprint() {
    let mut rig = rig("direct-killed").await;
    let first = RawSim::start(&rig.dir().join("printer-1"), &["--tcp", "127.0.0.1:0"], 58, "slow");
    let addr = first.line("listening tcp");
    publish_registry(&rig, "tcp", &format!("tcp://{addr}")).await;

    let ids: Vec<String> = "fgh".chars().map(|c| c.to_string().repeat(24)).collect();
    let mut first = first;
    publish_paid(&rig, &ids[..1]).await;
    first.line("receiving");
    first.kill();
    assert!(first.jobs().is_empty(), "killed before the job was whole:\n{}", first.transcript());
    publish_paid(&rig, &ids[1..]).await;

    let second = RawSim::start(&rig.dir().join("printer-2"), &["--tcp", &addr], 58, "ready");
    wait_for("every receipt", || second.jobs().len() >= ids.len()).await;
    wait_for("the printer's outbox to empty", || printer_jobs(&rig) == 0).await;
    let jobs = second.jobs();
    assert_eq!(printed_charges(&second, &ids), ids, "each once, in order:\n{}", second.transcript());
    assert!(jobs[0].contains(HEADER), "the cut-short receipt is marked as a reprint:\n{}", jobs[0]);
    assert!(jobs[1..].iter().all(|j| !j.contains(HEADER)), "only that one:\n{}", second.transcript());
    let png = second.out.join("0001-print.png");
    assert!(png.is_file(), "{}", png.display());
    println!("reprint PNG: {}", png.display());
    if std::env::var_os("PIXGATE_KEEP_PNG").is_some() {
        let keep = std::env::temp_dir().join("pixgate-direct-reprint.png");
        std::fs::copy(&png, &keep).unwrap();
    }
    rig.kill_gateway();
    rig.shutdown();
}

/// Proof 6: the serial device path disappears (the adapter unplugged) and comes back:
/// the printer's queue is held meanwhile and resumes, nothing lost. The endpoint is a
/// stable path (a link to the pseudo-terminal, as udev gives a USB-serial adapter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serial_path_that_disappears_and_comes_back_holds_then_resumes() {
    let mut rig = rig("direct-serial").await;
    let first = RawSim::start(&rig.dir().join("printer-1"), &["--pty"], 58, "ready");
    let link = rig.dir().join("ttyPRINTER");
    std::os::unix::fs::symlink(first.line("listening pty"), &link).unwrap();
    publish_registry(&rig, "serial", &format!("serial://{}?baud=115200", link.display())).await;

    let ids: Vec<String> = "ijkl".chars().map(|c| c.to_string().repeat(24)).collect();
    publish_paid(&rig, &ids[..1]).await;
    wait_for("the first receipt", || first.jobs().len() == 1).await;

    // Unplugged: the device path is gone; two receipts wait.
    let mut first = first;
    first.kill();
    std::fs::remove_file(&link).unwrap();
    publish_paid(&rig, &ids[1..3]).await;
    wait_for("two receipts held", || printer_jobs(&rig) == 2).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(printer_jobs(&rig), 2, "held, not dropped");

    // Plugged back (a new line at the same path): they print, then one more.
    let second = RawSim::start(&rig.dir().join("printer-2"), &["--pty"], 58, "ready");
    std::os::unix::fs::symlink(second.line("listening pty"), &link).unwrap();
    wait_for("the held receipts", || second.jobs().len() >= 2).await;
    publish_paid(&rig, &ids[3..]).await;
    wait_for("the last receipt", || second.jobs().len() >= 3).await;
    wait_for("the printer's outbox to empty", || printer_jobs(&rig) == 0).await;
    let mut printed = printed_charges(&first, &ids);
    printed.extend(printed_charges(&second, &ids));
    assert_eq!(printed, ids, "each once, in order");
    assert!(!second.transcript().contains(HEADER), "nothing was cut short:\n{}", second.transcript());
    rig.kill_gateway();
    rig.shutdown();
}
