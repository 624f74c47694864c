//! `pixgate print`: a receipt as pixgate renders it, sent by hand to a printer on raw TCP
//! (port 9100) and on a serial line, with the printer's `DLE EOT` status read back. The
//! printer is `printer-sim listen` (`--tcp`, `--pty`: a real pseudo-terminal), switched
//! through its state file; what it printed is read back from its transcript.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::printer_sim::RawSim;
use render::codepage::CodePage;
use render::receipt::{render_receipt, PrinterProfile, Receipt, ReceiptKind};
use render::Locale;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `printer-sim listen TRANSPORT…` (an Epson TM-T20X with 80 mm paper, ready) in a
/// scratch folder of its own, removed afterwards unless the test failed.
struct Sim(RawSim);

impl Sim {
    fn start(name: &str, transport: &[&str]) -> Sim {
        let out = std::env::temp_dir().join(format!("pixgate-direct-print-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        Sim(RawSim::start(&out, transport, "Epson TM-T20X", 80, "ready"))
    }
}

impl std::ops::Deref for Sim {
    type Target = RawSim;
    fn deref(&self) -> &RawSim {
        &self.0
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.0.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0.out);
        }
    }
}

/// A paid receipt as pixgate renders it, written to `dir/receipt.bin`.
fn receipt(dir: &Path, payer: &str) -> PathBuf {
    let receipt = Receipt {
        kind: ReceiptKind::Paid,
        merchant_name: "Padaria São João".into(),
        merchant_city: "Recife".into(),
        amount_cents: 1990,
        items: vec![("Pão de queijo".into(), "3x".into())],
        comment: None,
        payer_name: Some(payer.into()),
        paid_at: Some(chrono::Utc::now()),
        time_zone: "America/Recife".parse().unwrap(),
        end_to_end_id: Some("E25328704202611271201yxv2kgafrfw".into()),
        charge_id: "a".repeat(24),
        txid: Some("TX123".into()),
        brcode: None,
        locale: Locale::PtBr,
    };
    let profile = PrinterProfile { paper_width_mm: 80, code_page: CodePage::Cp860, native_qr: true };
    let path = dir.join(format!("{payer}.bin"));
    std::fs::write(&path, render_receipt(&receipt, &profile).unwrap()).unwrap();
    path
}

/// `pixgate print ARGS`: exit code and the JSON it printed.
fn print(args: &[&str]) -> (i32, Value, String) {
    let out = Command::new(pixgate_tests::gateway::find_binary().unwrap())
        .arg("print")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), json, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_receipt_by_hand_over_tcp_9100_with_the_printers_status() {
    let sim = Sim::start("tcp", &["--tcp", "127.0.0.1:0"]);
    let to = format!("tcp://{}", sim.line("listening tcp"));

    let file = receipt(&sim.out, "Maria Souza");
    let (code, json, err) = print(&["--to", &to, file.to_str().unwrap()]);
    assert_eq!(code, 0, "{json} {err}");
    assert_eq!(json["before"]["summary"], "ready");
    assert_eq!(json["before"]["replies"], serde_json::json!(["0x12", "0x12", "0x12", "0x12"]));
    assert_eq!(json["written"], std::fs::metadata(&file).unwrap().len());
    let png = sim.line("printed");
    assert!(Path::new(&png).is_file(), "{png}");
    assert!(sim.transcript().contains("Maria Souza"), "the receipt came out:\n{}", sim.transcript());

    // Paper out: nothing is written, exit 2, and the status says why.
    std::fs::write(sim.out.join("state"), "paper-out").unwrap();
    let other = receipt(&sim.out, "Joao Lima");
    let (code, json, err) = print(&["--to", &to, other.to_str().unwrap()]);
    assert_eq!(code, 2, "{json} {err}");
    assert_eq!((json["before"]["summary"].as_str(), json["written"].as_u64()), (Some("paper_out"), Some(0)));
    assert!(err.contains("paper_out"), "{err}");
    let (code, json, _) = print(&["--to", &to, "--status"]);
    assert_eq!((code, json["before"]["paper_out"].as_bool()), (0, Some(true)));
    std::fs::write(sim.out.join("state"), "cover-open").unwrap();
    let (_, json, _) = print(&["--to", &to, "--status"]);
    assert_eq!(json["before"]["summary"], "cover_open");
    std::fs::write(sim.out.join("state"), "ready near-end").unwrap();
    let (code, json, _) = print(&["--to", &to, other.to_str().unwrap()]);
    assert_eq!((code, json["before"]["summary"].as_str()), (0, Some("paper_near_end")), "near end still prints");
    sim.line("printed");
    assert!(sim.transcript().contains("Joao Lima"));
}

#[test]
fn a_receipt_by_hand_over_a_serial_line() {
    let sim = Sim::start("pty", &["--pty"]);
    let path = sim.line("listening pty");
    let file = receipt(&sim.out, "Ana Costa");
    let to = format!("serial://{path}?baud=115200");
    let (code, json, err) = print(&["--to", &to, file.to_str().unwrap()]);
    assert_eq!(code, 0, "{json} {err}");
    assert_eq!(json["before"]["summary"], "ready");
    assert_eq!(json["after"]["summary"], "ready");
    sim.line("printed");
    assert!(sim.transcript().contains("Ana Costa"), "{}", sim.transcript());
}

#[test]
fn a_printer_that_is_not_there_is_a_clear_error() {
    let port = pixgate_tests::net::free_port();
    let dir = std::env::temp_dir();
    let file = receipt(&dir, &format!("nobody-{}", std::process::id()));
    let (code, _, err) =
        print(&["--to", &format!("tcp://127.0.0.1:{port}"), "--timeout-ms", "2000", file.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("opening tcp://127.0.0.1") && err.contains("refused"), "{err}");
    let (code, _, err) = print(&["--to", "lpt://x", file.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("unknown scheme"), "{err}");
    let _ = std::fs::remove_file(file);
}

/// A tall raster job (`GS v 0`, 200 KB) over a serial line to a printer that takes its
/// input slowly (`slow`: 256 bytes every 20 ms, so the line's buffer fills and the writer
/// waits): every byte arrives, in order. Each raster row carries its own number in its
/// first 16 dots, read back from the PNG the printer made.
#[test]
fn a_tall_raster_over_a_slow_serial_line_arrives_whole_and_in_order() {
    let sim = Sim::start("slow-pty", &["--pty"]);
    std::fs::write(sim.out.join("state"), "slow").unwrap();
    let path = sim.line("listening pty");
    let rows = 2778usize;
    let job = numbered_raster(72, rows);
    assert!(job.len() > 200_000);
    let file = sim.out.join("raster.bin");
    std::fs::write(&file, &job).unwrap();
    let to = format!("serial://{path}?baud=115200&flow=rtscts");
    let (code, json, err) = print(&["--to", &to, "--timeout-ms", "10000", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{json} {err}");
    assert_eq!(json["written"].as_u64(), Some(job.len() as u64));
    let png = sim.line("printed");
    // The printer counts the four `DLE EOT` queries asked before the job (3 bytes each)
    // into the job's bytes.
    assert!(sim.transcript().contains(&format!("({} bytes)", job.len() + 12)), "{}", sim.transcript());

    let img = image::open(&png).unwrap().to_luma8();
    let black = |x: u32, y: u32| img.get_pixel(x, y).0[0] < 128;
    // The marker byte (dots 16 to 23) is black on every raster row: where it starts is row 0.
    let y0 = (0..img.height()).find(|&y| (0..img.width()).any(|x| black(x, y))).expect("something printed");
    let x0 = (0..img.width()).find(|&x| black(x, y0)).unwrap() - 16;
    for r in 0..rows as u32 {
        let n = (0..16).fold(0u32, |n, i| n << 1 | u32::from(black(x0 + i, y0 + r)));
        assert_eq!(n, r, "raster row {r} at y {}", y0 + r);
        assert!(black(x0 + 16, y0 + r), "row {r}'s marker");
    }
    assert!(!black(x0 + 16, y0 + rows as u32), "no row after the last");
}

/// A raster job of `rows` rows of `width_bytes`, each row starting with its number (16
/// bits) and a marker byte, so that a PNG of it shows whether every row arrived in order.
fn numbered_raster(width_bytes: usize, rows: usize) -> Vec<u8> {
    let mut job =
        vec![0x1B, 0x40, 0x1D, 0x76, 0x30, 0x00, width_bytes as u8, 0, (rows & 0xFF) as u8, (rows >> 8) as u8];
    for r in 0..rows {
        let mut row = vec![0u8; width_bytes];
        row[..3].copy_from_slice(&[(r >> 8) as u8, r as u8, 0xFF]);
        job.extend_from_slice(&row);
    }
    job.extend_from_slice(b"\n\x1dVA\x03");
    job
}

/// XON/XOFF on a serial line: a printer with a receive buffer that says XOFF when it
/// fills (`printer-sim listen --pty --xonxoff`, slow) gets every byte of a 200 KB raster
/// from `pixgate print` with `flow=xonxoff` (the line's driver stops at XOFF), and no
/// overrun. The same job with `flow=none` overruns its buffer: the printer's flow control
/// is what keeps the bytes, and the simulator tells when it is not honoured.
#[test]
fn xon_xoff_keeps_a_slow_printers_buffer_from_overrunning() {
    let job = numbered_raster(72, 2778);
    assert!(job.len() > 200_000);
    let start = |flow: &str| {
        let sim = Sim::start(&format!("xonxoff-{flow}"), &["--pty", "--xonxoff"]);
        std::fs::write(sim.out.join("state"), "slow").unwrap();
        let path = sim.line("listening pty");
        let file = sim.out.join("raster.bin");
        std::fs::write(&file, &job).unwrap();
        (sim, format!("serial://{path}?baud=115200&flow={flow}"), file)
    };

    let (sim, to, file) = start("xonxoff");
    let (code, json, err) = print(&["--to", &to, "--timeout-ms", "20000", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{json} {err}");
    assert_eq!(json["written"].as_u64(), Some(job.len() as u64));
    let lines = sim.lines_until("printed");
    assert!(!lines.iter().any(|l| l.starts_with("overrun")), "nothing lost: {lines:?}");
    // The four `DLE EOT` queries asked before the job (3 bytes each) count in.
    assert!(sim.transcript().contains(&format!("({} bytes)", job.len() + 12)), "{}", sim.transcript());

    // A sender that ignores XOFF loses bytes at the printer; stopped once that shows.
    let (sim, to, file) = start("none");
    let mut sender = Command::new(pixgate_tests::gateway::find_binary().unwrap())
        .args(["print", "--to", &to, "--timeout-ms", "20000", file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = sim.lines_until("overrun");
    let lost: usize = lines.last().and_then(|l| l.strip_prefix("overrun ")).unwrap().trim().parse().unwrap();
    assert!(lost > 0, "{lines:?}");
    let _ = sender.kill();
    let _ = sender.wait();
}

/// `pixgate print --device ID` finds the printer where the gateway would: here in the
/// local printers file (`direct.printers_file`), no outbox yet. A device it does not know
/// is a clear error.
#[test]
fn a_receipt_by_device_id_from_the_printers_file() {
    let sim = Sim::start("by-device", &["--tcp", "127.0.0.1:0"]);
    let addr = sim.line("listening tcp");
    let printers = sim.out.join("printers.toml");
    std::fs::write(&printers, format!("[printers.p1]\nendpoint = \"tcp://{addr}\"\n")).unwrap();
    let file = receipt(&sim.out, "Rita Alves");
    let by_device = |device: &str| {
        let out = Command::new(pixgate_tests::gateway::find_binary().unwrap())
            .args(["print", "--device", device, file.to_str().unwrap()])
            .env("PIXGATE_DIRECT__PRINTERS_FILE", &printers)
            .env("PIXGATE_OUTBOX__PATH", sim.out.join("no-outbox.redb"))
            .output()
            .unwrap();
        let json: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.code(), json, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, json, err) = by_device("p1");
    assert_eq!(code, Some(0), "{json} {err}");
    assert_eq!(json["endpoint"], format!("tcp://{addr}"));
    sim.line("printed");
    assert!(sim.transcript().contains("Rita Alves"), "{}", sim.transcript());
    let (code, _, err) = by_device("p2");
    assert_eq!(code, Some(1));
    assert!(err.contains("device p2 is not a direct printer"), "{err}");
}
