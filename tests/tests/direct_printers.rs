//! Printers pixgate drives itself: a fixture printer whose registry document says
//! `printer.transport: tcp` (or `serial`) with its `printer.endpoint`, played by
//! `printer-sim listen` on loopback TCP or a pseudo-terminal, switched at run time through
//! its state file. Real tansu broker, pixgate as a child process, the paired card machine
//! as an MQTT client. What the printer printed is read back from its transcript (it
//! dedupes nothing: every byte pixgate wrote is there).

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::harness::{protocol_devices, replay_devices, wait_for, Rig};
use pixgate_tests::printer_sim::{registry_with_direct_printers, RawSim};
use simulators::capture::{self, CaptureRecord};
use std::collections::BTreeMap;
use std::time::Duration;

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
    registry_with_direct_printers(&fixtures, &file, &[(PRINTER, transport, endpoint)]);
    rig.publish_registry_file(&file).await;
}

/// Publishes the paid charges `ids`, one record at a time (each read before the next is
/// sent: the receipts are queued in this order).
async fn publish_paid(rig: &Rig, ids: &[String]) {
    let t = chrono::Utc::now().timestamp() as u64;
    let records: Vec<CaptureRecord> = ids.iter().flat_map(|id| paid_charge(id, t)).collect();
    rig.publish_charges_in_order(&records).await;
}

/// How many jobs the outbox holds for [`PRINTER`] (`GET /outbox/{device}`).
fn printer_jobs(rig: &Rig) -> usize {
    let (status, body) = rig.gateway().get(&format!("/outbox/{PRINTER}")).unwrap();
    assert_eq!(status, 200, "{body}");
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    listed["jobs"].as_array().map_or(0, Vec::len)
}

/// Waits until the printer's transcript names every charge of `ids` and the outbox holds
/// no job for it.
async fn every_receipt_printed(rig: &Rig, sim: &RawSim, ids: &[String]) {
    wait_for("every receipt", WAIT, || {
        let text: String = sim.transcript().split_whitespace().collect();
        ids.iter().all(|id| text.contains(id.as_str()))
    })
    .await;
    wait_for("the printer's outbox to empty", WAIT, || printer_jobs(rig) == 0).await;
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
    let sim = RawSim::start(&rig.dir().join("printer"), &["--tcp", "127.0.0.1:0"], "Epson TM-T20X", 58, "paper-out");
    let addr = sim.line("listening tcp");
    let fixtures = pixgate_tests::demo::default_fixtures();
    let terminal = rig.start_fleet(vec![pixgate_tests::fixture_device(&fixtures, TERMINAL)], protocol_devices()).await;
    publish_registry(&rig, "tcp", &format!("tcp://{addr}")).await;

    let ids: Vec<String> = "abcde".chars().map(|c| c.to_string().repeat(24)).collect();
    publish_paid(&rig, &ids).await;

    // The card machine got every "paid" screen; the printer's receipts are all held.
    wait_for("the card machine's paid screens", WAIT, || {
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
    wait_for("the held receipts", WAIT, || sim.jobs().len() >= ids.len()).await;
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
    let first = RawSim::start(&rig.dir().join("printer-1"), &["--tcp", "127.0.0.1:0"], "Epson TM-T20X", 58, "slow");
    let addr = first.line("listening tcp");
    publish_registry(&rig, "tcp", &format!("tcp://{addr}")).await;

    let ids: Vec<String> = "fgh".chars().map(|c| c.to_string().repeat(24)).collect();
    let mut first = first;
    publish_paid(&rig, &ids[..1]).await;
    first.line("receiving");
    first.kill();
    assert!(first.jobs().is_empty(), "killed before the job was whole:\n{}", first.transcript());
    publish_paid(&rig, &ids[1..]).await;

    let second = RawSim::start(&rig.dir().join("printer-2"), &["--tcp", &addr], "Epson TM-T20X", 58, "ready");
    wait_for("every receipt", WAIT, || second.jobs().len() >= ids.len()).await;
    wait_for("the printer's outbox to empty", WAIT, || printer_jobs(&rig) == 0).await;
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
    let first = RawSim::start(&rig.dir().join("printer-1"), &["--pty"], "Epson TM-T20X", 58, "ready");
    let link = rig.dir().join("ttyPRINTER");
    std::os::unix::fs::symlink(first.line("listening pty"), &link).unwrap();
    publish_registry(&rig, "serial", &format!("serial://{}?baud=115200", link.display())).await;

    let ids: Vec<String> = "ijkl".chars().map(|c| c.to_string().repeat(24)).collect();
    publish_paid(&rig, &ids[..1]).await;
    wait_for("the first receipt", WAIT, || first.jobs().len() == 1).await;

    // Unplugged: the device path is gone; two receipts wait.
    let mut first = first;
    first.kill();
    std::fs::remove_file(&link).unwrap();
    publish_paid(&rig, &ids[1..3]).await;
    wait_for("two receipts held", WAIT, || printer_jobs(&rig) == 2).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(printer_jobs(&rig), 2, "held, not dropped");

    // Plugged back (a new line at the same path): they print, then one more.
    let second = RawSim::start(&rig.dir().join("printer-2"), &["--pty"], "Epson TM-T20X", 58, "ready");
    std::os::unix::fs::symlink(second.line("listening pty"), &link).unwrap();
    wait_for("the held receipts", WAIT, || second.jobs().len() >= 2).await;
    publish_paid(&rig, &ids[3..]).await;
    wait_for("the last receipt", WAIT, || second.jobs().len() >= 3).await;
    wait_for("the printer's outbox to empty", WAIT, || printer_jobs(&rig) == 0).await;
    let mut printed = printed_charges(&first, &ids);
    printed.extend(printed_charges(&second, &ids));
    assert_eq!(printed, ids, "each once, in order");
    assert!(!second.transcript().contains(HEADER), "nothing was cut short:\n{}", second.transcript());
    rig.kill_gateway();
    rig.shutdown();
}

/// Proof 1: the bundled fixtures with one printer on raw TCP 9100 and one on a serial
/// line, every other device on MQTT: every effect of `expected.json` is carried out once,
/// on its device, in order; each direct printer's pages decode to its receipts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fixtures_with_a_tcp_and_a_serial_printer_give_every_expected_effect() {
    const TCP: &str = "8940f1f836f99eee3692f09e"; // Epson TM-T20X, 80 mm
    const SERIAL: &str = "0fb23c6f5da2cec255404e4f"; // Bematech MP-4200 TH, 80 mm
    let fixtures = pixgate_tests::demo::default_fixtures();
    let mut rig = Rig::builder("direct-fixtures")
        .envs(pixgate_tests::replay_clock_env(&fixtures))
        .env("PIXGATE_DIRECT__POLL_MS", "200")
        .start()
        .await;
    let tcp = RawSim::start(&rig.dir().join("tcp"), &["--tcp", "127.0.0.1:0"], "Epson TM-T20X", 80, "ready");
    let serial = RawSim::start(&rig.dir().join("serial"), &["--pty"], "Bematech MP-4200 TH", 80, "ready");
    let (tcp_at, serial_at) = (
        format!("tcp://{}", tcp.line("listening tcp")),
        format!("serial://{}?baud=115200", serial.line("listening pty")),
    );
    let registry = rig.dir().join("devices.jsonl");
    registry_with_direct_printers(&fixtures, &registry, &[(TCP, "tcp", &tcp_at), (SERIAL, "serial", &serial_at)]);
    let mqtt_devices: Vec<_> =
        pixgate_tests::fixture_devices(&fixtures).into_iter().filter(|d| d.id() != TCP && d.id() != SERIAL).collect();
    let fleet = rig.start_fleet(mqtt_devices, replay_devices()).await;
    let published = rig.publish_registry_file(&registry).await;

    // Keeping up, as the demo does: a batch without a repeated charge, then everything done.
    let charges = capture::read_records(&fixtures.join("charges.jsonl")).unwrap();
    rig.replay_charges_keeping_up(charges, published, WAIT).await;

    let want_order = pixgate_tests::expected_effects(&fixtures);
    let mut got: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for e in fleet.effects() {
        got.entry((e.device.clone(), e.charge.clone())).or_default().push(e.kind.as_str().to_string());
    }
    for (device, sim) in [(TCP, &tcp), (SERIAL, &serial)] {
        let mine: Vec<String> =
            want_order.keys().filter(|(d, _)| d == device).map(|(_, charge)| charge.clone()).collect();
        assert!(mine.len() >= 10, "{device}: {} receipts expected", mine.len());
        for charge in printed_charges(sim, &mine) {
            got.entry((device.to_string(), charge)).or_default().push("print_receipt".into());
        }
        // Each page is a picture of a receipt: as tall as one, ink on it.
        let pngs: Vec<_> = std::fs::read_dir(&sim.out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "png"))
            .collect();
        assert_eq!(pngs.len(), mine.len(), "{device}: one page per receipt");
        for png in pngs {
            let img = image::open(&png).unwrap().to_luma8();
            assert_eq!(img.width(), 576, "{}: 80 mm at 203 dpi", png.display());
            assert!(img.height() > 300 && img.pixels().any(|p| p.0[0] < 128), "{}", png.display());
        }
        assert!(!sim.transcript().contains(HEADER), "{device}: no reprint");
    }
    assert_eq!(got, want_order, "effects carried out differ from expected.json");
    fleet.shutdown().await;
    rig.kill_gateway();
    rig.shutdown();
}

/// pixgate stopped (SIGTERM) five times, each while a receipt is going to a slow TCP
/// printer: the receipt being written is let finish before the exit, so every receipt
/// prints exactly once and none as a reprint (a job cut short by the exit would print
/// again under the reprint header, or with `interruptedJob = hold` become a dead letter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pixgate_stopped_mid_job_lets_it_finish_and_prints_no_reprint() {
    let mut rig = rig("direct-sigterm").await;
    // 256 bytes every 400 ms: a receipt of about 500 bytes takes a second to write, the
    // window each stop lands in.
    let transport = ["--tcp", "127.0.0.1:0", "--slow-pause-ms", "400"];
    let mut sim = RawSim::start(&rig.dir().join("printer"), &transport, "Epson TM-T20X", 58, "slow");
    let addr = sim.line("listening tcp");
    publish_registry(&rig, "tcp", &format!("tcp://{addr}")).await;
    // "4040…" to "4d4d…": no id is found inside another's receipt text. More than the
    // stops can take: a stop may come a receipt or two after the restart.
    let ids: Vec<String> = (0x40..0x4e).map(|i| format!("{i:02x}").repeat(12)).collect();
    let t = chrono::Utc::now().timestamp() as u64;
    let records: Vec<CaptureRecord> = ids.iter().flat_map(|id| paid_charge(id, t)).collect();
    capture::publish_records(&rig.producer(), &records).await.unwrap();

    for stop in 0..5 {
        sim.line("receiving");
        assert!(rig.stop_gateway(Duration::from_secs(30)), "stop {}: a clean exit", stop + 1);
        let log = match stop {
            0 => "pixgate.log".to_string(),
            n => format!("pixgate-{n}.log"),
        };
        let log = std::fs::read_to_string(rig.dir().join(log)).unwrap();
        assert!(
            log.contains("waiting for direct printers to finish writing their jobs"),
            "stop {}: stopped while a receipt was being written",
            stop + 1
        );
        assert!(!log.contains("still writing this job at shutdown"), "stop {}: it finished in time", stop + 1);
        rig.start_gateway();
        // Said while it got ready: the next stop waits for a receipt starting from now.
        sim.lines_now();
    }
    every_receipt_printed(&rig, &sim, &ids).await;
    assert!(!sim.transcript().contains(HEADER), "no reprint");
    let mut printed = printed_charges(&sim, &ids);
    printed.sort();
    assert_eq!(printed, ids, "every receipt exactly once");
    sim.kill();
    rig.kill_gateway();
    rig.shutdown();
}

/// Proof 5: pixgate SIGKILLed 20 times, each while a receipt is going to a TCP printer
/// (a slow one, so every receipt takes a while): every receipt is printed at least once,
/// and every repeat of a receipt is marked as a reprint. A page cut short by the kill
/// (what a real printer does with half a job) names no charge or names it once, before its
/// reprint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pixgate_killed_20_times_mid_job_repeats_only_marked_reprints() {
    let mut rig = rig("direct-sigkill").await;
    let mut sim = RawSim::start(&rig.dir().join("printer"), &["--tcp", "127.0.0.1:0"], "Epson TM-T20X", 58, "slow");
    let addr = sim.line("listening tcp");
    publish_registry(&rig, "tcp", &format!("tcp://{addr}")).await;
    // "1010…", "1111…" to "3c3c…": no id is found inside another's receipt text.
    let ids: Vec<String> = (0x10..0x10 + 45).map(|i| format!("{i:02x}").repeat(12)).collect();
    let producer = rig.producer();
    let t = chrono::Utc::now().timestamp() as u64;
    let records: Vec<CaptureRecord> = ids.iter().flat_map(|id| paid_charge(id, t)).collect();
    capture::publish_records(&producer, &records).await.unwrap();

    for kill in 0..20 {
        // The first, second or third receipt after a start: a reprint, or the next ones.
        for _ in 0..=kill % 3 {
            sim.line("receiving");
        }
        rig.kill_gateway();
        println!("SIGKILL {} while a receipt was being written", kill + 1);
        rig.start_gateway();
    }
    every_receipt_printed(&rig, &sim, &ids).await;

    let collapse = |t: &str| t.split_whitespace().collect::<String>();
    let mut printed: BTreeMap<&str, usize> = BTreeMap::new();
    let mut reprints = 0;
    for job in sim.jobs() {
        let text = collapse(&job);
        let named: Vec<&str> = ids.iter().map(String::as_str).filter(|id| text.contains(id)).collect();
        assert!(named.len() <= 1, "one receipt per page: {job}");
        let reprint = job.contains(HEADER);
        reprints += usize::from(reprint);
        if let Some(id) = named.first() {
            let n = printed.entry(id).or_default();
            assert!(*n == 0 || reprint, "receipt {id} printed again without the reprint header:\n{job}");
            *n += 1;
        }
    }
    assert_eq!(printed.len(), ids.len(), "every receipt at least once");
    let repeats: usize = printed.values().map(|n| n - 1).sum();
    println!(
        "{} receipts, {} pages, {reprints} marked reprints, {repeats} receipts printed more than once",
        ids.len(),
        sim.jobs().len()
    );
    assert!(reprints >= 1, "a kill mid-job leaves a job to reprint");
    sim.kill();
    rig.kill_gateway();
    rig.shutdown();
}
