//! `printer-sim listen` on real transports, driven the way a POS application drives a
//! printer: a TCP client on the raw port, and a serial client (the `serialport` crate) on
//! the pseudo-terminal the simulator opens. Each sends pixgate receipts and `DLE EOT n`
//! queries and reads the one-byte replies, while the test changes the simulated condition
//! through the state file. The printed jobs are checked by decoding: the slip's QR read back
//! from the PNG with rqrr is the BR Code sent, the paid receipt has no QR at all, and the
//! transcript holds the amount and the txid.
//!
//! Ordering makes it deterministic, without timing: the simulator handles bytes in arrival
//! order and answers a query only after everything before it, so once a reply is read,
//! every job sent before the query has been printed (or held).

// A test: a panic in its helpers is a failed test, as in its #[test] functions.
#![allow(clippy::unwrap_used)]

mod common;

use render::brcode::{encode_static, StaticPix};
use render::codepage::CodePage;
use render::money::format_amount;
use render::receipt::{render_receipt_for, PrinterProfile, Receipt, ReceiptKind};
use render::Locale;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Deadlock guard for reads (a failing simulator must not hang the test), not a timing check.
const GUARD: Duration = Duration::from_secs(60);

/// A running `printer-sim listen` and the lines it prints on stdout.
struct Sim {
    child: Child,
    lines: mpsc::Receiver<String>,
    out: common::TempDir,
}

impl Sim {
    fn start(transport: &[&str], model: &str, paper: u8) -> Sim {
        let out = common::temp_dir("raw");
        let paper = paper.to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_printer-sim"))
            .arg("listen")
            .args(transport)
            .args(["--out", out.to_str().unwrap(), "--state-file", out.join("state").to_str().unwrap()])
            .args(["--model", model, "--paper", &paper, "--idle-ms", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("printer-sim starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Sim { child, lines, out }
    }

    /// The rest of the next stdout line that starts with `prefix`.
    fn line(&self, prefix: &str) -> String {
        loop {
            let l = self
                .lines
                .recv_timeout(GUARD)
                .unwrap_or_else(|e| panic!("printer-sim said nothing starting with {prefix:?}: {e}"));
            if let Some(rest) = l.strip_prefix(prefix) {
                return rest.trim().to_string();
            }
        }
    }

    fn set_state(&self, words: &str) {
        std::fs::write(self.out.join("state"), words).unwrap();
    }

    fn pngs(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&*self.out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".png"))
            .collect();
        v.sort();
        v
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // `out` goes after the child is gone (kept if the test failed).
    }
}

fn payload(txid: &str) -> String {
    encode_static(&StaticPix {
        key: "padaria@example.com".into(),
        amount_cents: Some(4_321),
        merchant_name: "Padaria Pão e Açúcar".into(),
        merchant_city: "São Paulo".into(),
        txid: Some(txid.into()),
        description: None,
    })
    .unwrap()
}

fn receipt(kind: ReceiptKind, txid: &str, model: &str, paper: u8, native_qr: bool) -> Vec<u8> {
    let r = Receipt {
        kind,
        merchant_name: "Padaria Pão e Açúcar".into(),
        merchant_city: "São Paulo".into(),
        amount_cents: 4_321,
        items: vec![("Pão de queijo".into(), "3x".into())],
        comment: None,
        payer_name: Some("Maria".into()),
        paid_at: None,
        time_zone: chrono_tz::America::Sao_Paulo,
        end_to_end_id: None,
        charge_id: "6748a1f0c2b3d4e5f6a7b8c9".into(),
        txid: Some(txid.into()),
        brcode: Some(payload(txid)),
        locale: Locale::PtBr,
    };
    render_receipt_for(
        &r,
        &PrinterProfile { paper_width_mm: paper, code_page: CodePage::Cp860, native_qr }.on_model(model),
    )
    .unwrap()
}

/// Sends `bytes`, then reads exactly `replies` bytes.
fn ask<T: Read + Write>(io: &mut T, bytes: &[u8], replies: usize) -> Vec<u8> {
    io.write_all(bytes).unwrap();
    io.flush().unwrap();
    let mut got = vec![0u8; replies];
    io.read_exact(&mut got).unwrap();
    got
}

const DLE_EOT: [[u8; 3]; 4] = [[0x10, 0x04, 1], [0x10, 0x04, 2], [0x10, 0x04, 3], [0x10, 0x04, 4]];

fn queries(ns: &[u8]) -> Vec<u8> {
    ns.iter().flat_map(|&n| DLE_EOT[n as usize - 1]).collect()
}

/// Checks a printed job: its PNG's QRs are `qr` (one BR Code, or none), and the
/// transcript's last job has the amount and `txid` after its label.
fn check_printed(sim: &Sim, png: &Path, qr: Option<&str>, txid: &str) {
    let want: Vec<String> = qr.into_iter().map(str::to_string).collect();
    assert_eq!(common::qr_codes_in_png(png), want, "{}", png.display());
    let t = std::fs::read_to_string(sim.out.join("transcript.txt")).unwrap();
    let last = t.rsplit("===== seq").next().unwrap();
    assert!(last.contains(&format_amount(4_321, Locale::PtBr)), "{last}");
    let flat = last.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains(&format!("ID da transação: {txid}")), "{last}");
    if qr.is_none() {
        assert!(!last.contains("[QR") && !last.contains("[RASTER"), "{last}");
    }
}

/// The whole conversation: a receipt and all four queries while ready; near end; cover
/// open; a slip sent with the paper out is held (answered offline, not printed) and printed
/// once the paper is back.
fn session<T: Read + Write>(sim: &Sim, io: &mut T, model: &str, paper: u8, native_qr: bool) {
    let mut first = receipt(ReceiptKind::Paid, "RAWTRANSPORT1", model, paper, native_qr);
    first.extend(queries(&[1, 2, 3, 4]));
    assert_eq!(ask(io, &first, 4), [0x12, 0x12, 0x12, 0x12], "ready: 0x12 to every n");
    let png = PathBuf::from(sim.line("printed"));
    assert!(png.ends_with("0001-print.png"), "{}", png.display());
    // A paid receipt, given the BR Code like the gateway gives it: no QR.
    check_printed(sim, &png, None, "RAWTRANSPORT1");

    sim.set_state("paper-near-end");
    assert_eq!(ask(io, &queries(&[4, 1, 2]), 3), [0x1E, 0x12, 0x12], "near end: still online");
    sim.set_state("cover-open");
    assert_eq!(ask(io, &queries(&[1, 2, 4]), 3), [0x1A, 0x16, 0x12], "cover open: offline");

    sim.set_state("paper-out");
    let mut slip = receipt(ReceiptKind::PayWithPix { expires_at: None }, "RAWTRANSPORT2", model, paper, native_qr);
    slip.extend(queries(&[1, 2, 3, 4]));
    assert_eq!(ask(io, &slip, 4), [0x1A, 0x32, 0x12, 0x7E], "paper out");
    assert_eq!(sim.pngs(), ["0001-print.png"], "a job sent with the paper out is held");

    sim.set_state("ready");
    assert_eq!(ask(io, &queries(&[1]), 1), [0x12]);
    let png = PathBuf::from(sim.line("printed"));
    assert!(png.ends_with("0002-print.png"), "{}", png.display());
    check_printed(sim, &png, Some(&payload("RAWTRANSPORT2")), "RAWTRANSPORT2");
}

#[test]
fn tcp_client_prints_and_reads_dle_eot_replies() {
    let sim = Sim::start(&["--tcp", "127.0.0.1:0"], "Epson TM-T20X", 80);
    let addr = sim.line("listening tcp");
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    stream.set_read_timeout(Some(GUARD)).unwrap();
    session(&sim, &mut stream, "Epson TM-T20X", 80, true);

    // A job without a cut is printed when its connection closes.
    let mut s2 = std::net::TcpStream::connect(&addr).unwrap();
    drop(stream);
    s2.write_all(b"\x1b@No cut here\n").unwrap();
    drop(s2);
    let png = PathBuf::from(sim.line("printed"));
    assert!(png.ends_with("0003-print.png"));
    assert!(std::fs::read_to_string(sim.out.join("transcript.txt")).unwrap().ends_with("No cut here\n"));
}

#[test]
fn serial_client_on_the_pty_prints_and_reads_dle_eot_replies() {
    // 58 mm Bematech: the slip's raster QR, a stream several times the pty's buffer.
    let sim = Sim::start(&["--pty"], "Bematech MP-4200 TH", 58);
    let path = sim.line("listening pty");
    assert!(path.starts_with("/dev/"), "{path}");
    let mut port =
        serialport::new(&path, 115_200).timeout(GUARD).open().unwrap_or_else(|e| panic!("opening {path}: {e}"));
    session(&sim, &mut port, "Bematech MP-4200 TH", 58, false);
}
