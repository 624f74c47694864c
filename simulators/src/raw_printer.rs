//! A simulated receipt printer on a raw byte transport, as a POS application or driver
//! sees a real one: a TCP socket on port 9100 ("raw"/JetDirect printing) or a serial line
//! (a pseudo-terminal standing in for the RS-232/USB-serial port).
//!
//! What comes in is ESC/POS. Each `DLE EOT n` is answered at once with the status byte a
//! TM-T20-class printer sends ([`preview::escpos::status`]), reflecting the simulated
//! [`PrinterCondition`]. Each job, the bytes up to and including a cut (or what is left when
//! the connection closes or the line stays quiet for the idle time), is decoded like an MQTT
//! job: `{out}/{seq:04}-print.png` and its text appended to `{out}/transcript.txt`.
//!
//! The condition comes from the command line and, when a state file is given, from that
//! file, read again whenever the printer needs it (each `DLE EOT`, each job, each idle
//! tick): words `paper-out`, `paper-near-end` (or `near-end`), `cover-open`, `offline`,
//! `slow`, separated by spaces, commas or lines; an empty file or `ready` is a ready
//! printer; a missing file means the command-line condition. A job that ends while the
//! printer cannot print (paper out, cover open, offline) is held and printed, in order,
//! once it can. A `slow` printer reads [`SLOW_READ`] bytes every [`SLOW_PAUSE`] (or
//! [`RawPrinterOptions::slow_pause`]): the
//! sender's flow control (a full TCP window, RTS/CTS on a serial line) holds it back, and
//! nothing is lost. With XON/XOFF (`--xonxoff`, serial only) the printer instead takes bytes
//! off the line as fast as they come into a receive buffer, says XOFF when it fills and XON
//! when it drains ([`serve_xonxoff`]); a sender that ignores XOFF overruns it and loses
//! bytes, as on a real printer.
//!
//! Nothing is deduplicated: a raw printer prints every byte it gets, so a test sees
//! everything the sender wrote, repeats included. The first bytes of each job are reported
//! (`receiving …` on stdout) so a test can cut a job short.

use crate::effect::{append_transcript, write_file, JobError};
use crate::printer::{print_bytes, transcript_text, PrinterSettings};
use preview::escpos::status::{dle_eot_reply, PrinterCondition};
use preview::escpos::stream::{StreamEvent, StreamScanner};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How the printer on a raw transport is built and where its paper goes.
#[derive(Debug, Clone)]
pub struct RawPrinterOptions {
    /// Head width, power-on code page, model numbering.
    pub settings: PrinterSettings,
    /// Where PNGs and `transcript.txt` go.
    pub out: PathBuf,
    /// The condition when no state file says otherwise.
    pub condition: PrinterCondition,
    /// The file to read the condition from at run time (see the module documentation).
    pub state_file: Option<PathBuf>,
    /// Quiet time after which what has arrived is printed as a job, in ms (0: never).
    pub idle_ms: u64,
    /// On a serial line: a receive buffer with XON/XOFF flow control ([`serve_xonxoff`])
    /// instead of reading only as fast as it prints.
    pub xonxoff: bool,
    /// A `slow` printer's pause after each read ([`SLOW_PAUSE`] by default).
    pub slow_pause: Duration,
}

/// Why a state file's content was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("state file word {word:?} is not paper-out, paper-near-end, near-end, cover-open, offline, slow or ready")]
pub struct BadStateWord {
    /// The word that is not a condition.
    pub word: String,
}

/// Reads a state file's text (see the module documentation).
///
/// # Errors
/// [`BadStateWord`] for a word that is not a condition.
pub fn parse_condition(text: &str) -> Result<PrinterCondition, BadStateWord> {
    let mut c = PrinterCondition::default();
    for word in text.split(|ch: char| ch.is_whitespace() || ch == ',').filter(|w| !w.is_empty()) {
        match word.to_ascii_lowercase().replace('_', "-").as_str() {
            "paper-out" => c.paper_out = true,
            "paper-near-end" | "near-end" => c.paper_near_end = true,
            "cover-open" => c.cover_open = true,
            "offline" => c.offline = true,
            "slow" => c.slow = true,
            "ready" => {}
            _ => return Err(BadStateWord { word: word.to_string() }),
        }
    }
    Ok(c)
}

/// The printer: turns received bytes into status replies and printed jobs.
pub struct RawPrinter {
    opts: RawPrinterOptions,
    scanner: StreamScanner,
    condition: PrinterCondition,
    /// Decoded jobs waiting for the printer to be able to print.
    held: VecDeque<Printed>,
    seq: u64,
}

impl RawPrinter {
    /// A printer with `opts`, nothing received yet.
    pub fn new(opts: RawPrinterOptions) -> Self {
        let condition = opts.condition;
        RawPrinter { opts, scanner: StreamScanner::new(), condition, held: VecDeque::new(), seq: 0 }
    }

    /// The condition now: the state file's if there is one (a file that cannot be read or
    /// parsed keeps the last condition, with a warning), else the command line's.
    pub fn condition(&mut self) -> PrinterCondition {
        if let Some(path) = &self.opts.state_file {
            match std::fs::read_to_string(path) {
                Ok(text) => match parse_condition(&text) {
                    Ok(c) => self.condition = c,
                    Err(e) => tracing::warn!(file = %path.display(), "{e}; keeping {:?}", self.condition),
                },
                Err(e) if e.kind() == ErrorKind::NotFound => self.condition = self.opts.condition,
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "cannot read the state file; keeping {:?}", self.condition)
                }
            }
        }
        self.condition
    }

    /// Takes bytes received from `source` (e.g. `tcp 127.0.0.1:40312`). Returns the status
    /// bytes to send back now, in order, and the PNGs printed meanwhile.
    ///
    /// # Errors
    /// Writing a PNG or the transcript failed.
    pub fn receive(&mut self, bytes: &[u8], source: &str) -> Result<(Vec<u8>, Vec<PathBuf>), JobError> {
        let mut printed = self.print_held()?;
        let mut replies = Vec::new();
        for event in self.scanner.push(bytes) {
            match event {
                StreamEvent::StatusRequest(n) => {
                    let condition = self.condition();
                    match dle_eot_reply(n, &condition) {
                        Some(b) => {
                            tracing::debug!(n, reply = format_args!("{b:#04x}"), ?condition, "DLE EOT");
                            replies.push(b);
                        }
                        None => tracing::info!(n, "DLE EOT {n}: not answered (no such sensor on this model)"),
                    }
                }
                StreamEvent::Job(job) => printed.extend(self.job(job, source)?),
            }
        }
        Ok((replies, printed))
    }

    /// The stream ended or went quiet: what has arrived since the last cut is a job.
    ///
    /// # Errors
    /// Writing a PNG or the transcript failed.
    pub fn end_of_stream(&mut self, source: &str) -> Result<Vec<PathBuf>, JobError> {
        let rest = self.scanner.finish();
        let mut printed = self.print_held()?;
        printed.extend(self.job(rest, source)?);
        Ok(printed)
    }

    /// Whether bytes since the last job are waiting for a cut.
    pub fn has_partial_job(&self) -> bool {
        !self.scanner.is_empty()
    }

    /// Whether a job has begun arriving: more than status requests since the last job.
    pub fn job_started(&self) -> bool {
        self.scanner.has_content()
    }

    /// Prints held jobs if the printer can print now.
    ///
    /// # Errors
    /// Writing a PNG or the transcript failed.
    pub fn print_held(&mut self) -> Result<Vec<PathBuf>, JobError> {
        let mut printed = Vec::new();
        while !self.held.is_empty() && self.condition().can_print() {
            let job = self.held.pop_front().expect("not empty");
            printed.push(self.write(job)?);
        }
        Ok(printed)
    }

    /// Decodes a job; prints it now, or holds it while the printer cannot print. A job that
    /// prints nothing (only status requests or settings) is no paper and is dropped.
    fn job(&mut self, bytes: Vec<u8>, source: &str) -> Result<Option<PathBuf>, JobError> {
        if bytes.is_empty() {
            return Ok(None);
        }
        let (decoded, png) = print_bytes(&bytes, &self.opts.settings);
        let blank = decoded.transcript.trim().is_empty() && !decoded.image.pixels().any(|p| p.0[0] < 128);
        let (Some(png), false) = (png, blank) else {
            tracing::debug!(bytes = bytes.len(), "nothing printed");
            return Ok(None);
        };
        let job = Printed { png, text: transcript_text(&decoded), bytes: bytes.len(), source: source.to_string() };
        if !self.held.is_empty() || !self.condition().can_print() {
            tracing::info!(bytes = bytes.len(), condition = ?self.condition, "cannot print now: job held");
            self.held.push_back(job);
            return Ok(None);
        }
        self.write(job).map(Some)
    }

    /// Writes a decoded job: `{out}/{seq:04}-print.png` and its transcript.
    fn write(&mut self, job: Printed) -> Result<PathBuf, JobError> {
        self.seq += 1;
        let path = self.opts.out.join(format!("{:04}-print.png", self.seq));
        write_file(&path, &job.png)?;
        let header = format!("===== seq {:04} print via {} ({} bytes) =====", self.seq, job.source, job.bytes);
        append_transcript(&self.opts.out, &format!("{header}\n{}", job.text))?;
        Ok(path)
    }
}

/// A decoded job waiting to be written.
struct Printed {
    png: Vec<u8>,
    text: String,
    bytes: usize,
    source: String,
}

/// What the transport loop reports to its caller.
pub trait Report {
    /// A PNG was written.
    fn printed(&mut self, path: &Path);
    /// The first bytes of a new job arrived from `source`.
    fn receiving(&mut self, source: &str);
    /// `bytes` arrived while the receive buffer was full and were lost (XON/XOFF ignored).
    fn overrun(&mut self, bytes: usize) {
        tracing::warn!(bytes, "receive buffer overrun: the sender ignored XOFF");
    }
}

/// Prints `printed <path>`, `receiving <source>` and `overrun <bytes>` on stdout (one line
/// each, for scripts and tests).
pub struct StdoutReport;

impl Report for StdoutReport {
    fn printed(&mut self, path: &Path) {
        println!("printed {}", path.display());
    }
    fn receiving(&mut self, source: &str) {
        println!("receiving {source}");
    }
    fn overrun(&mut self, bytes: usize) {
        tracing::warn!(bytes, "receive buffer overrun: the sender ignored XOFF");
        println!("overrun {bytes}");
    }
}

/// How long one read waits before the loop checks idle time and held jobs.
const POLL: Duration = Duration::from_millis(100);

/// Bytes a `slow` printer takes per read.
pub const SLOW_READ: usize = 256;

/// A `slow` printer's pause after each read, by default.
pub const SLOW_PAUSE: Duration = Duration::from_millis(20);

/// Reads `io` until it ends (`Ok(0)`) or fails, answering status requests on it and
/// printing jobs: the loop shared by TCP connections and the serial line. Read timeouts
/// (`WouldBlock`/`TimedOut`, set by the caller to about [`POLL`]) are idle ticks.
///
/// # Errors
/// A read or write on the transport failed (other than a timeout), or a job could not be
/// written to disk.
pub fn serve<T: Read + Write>(
    printer: &mut RawPrinter,
    io: &mut T,
    source: &str,
    report: &mut dyn Report,
) -> anyhow::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_byte = Instant::now();
    loop {
        let slow = printer.condition().slow;
        let want = if slow { SLOW_READ } else { buf.len() };
        match io.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => {
                last_byte = Instant::now();
                take(printer, &buf[..n], source, io, report)?;
                if slow {
                    std::thread::sleep(printer.opts.slow_pause);
                }
            }
            Err(e) if is_quiet(&e) => quiet(printer, last_byte, source, report)?,
            Err(e) => return Err(e.into()),
        }
    }
    printer.end_of_stream(source)?.iter().for_each(|p| report.printed(p));
    Ok(())
}

/// Takes `bytes` from `source`: reports the first bytes of a job, answers its status
/// requests on `io`, reports what it printed.
fn take(
    printer: &mut RawPrinter,
    bytes: &[u8],
    source: &str,
    io: &mut impl Write,
    report: &mut dyn Report,
) -> anyhow::Result<()> {
    let fresh = !printer.job_started();
    let (replies, printed) = printer.receive(bytes, source)?;
    if fresh && (printer.job_started() || !printed.is_empty()) {
        report.receiving(source);
    }
    if !replies.is_empty() {
        io.write_all(&replies)?;
        io.flush()?;
    }
    printed.iter().for_each(|p| report.printed(p));
    Ok(())
}

/// A read that timed out: the line is quiet.
fn is_quiet(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted)
}

/// The line is quiet: prints the held jobs that now can, and a job without a cut once the
/// line has been quiet for `idle_ms` since `last_byte`.
fn quiet(printer: &mut RawPrinter, last_byte: Instant, source: &str, report: &mut dyn Report) -> anyhow::Result<()> {
    let mut printed = printer.print_held()?;
    let idle = Duration::from_millis(printer.opts.idle_ms);
    if printer.opts.idle_ms > 0 && printer.has_partial_job() && last_byte.elapsed() >= idle {
        printed.extend(printer.end_of_stream(source)?);
    }
    printed.iter().for_each(|p| report.printed(p));
    Ok(())
}

/// The receive buffer of a printer with XON/XOFF flow control, bytes.
pub const RECEIVE_BUFFER: usize = 128 * 1024;

/// Fill at which the printer sends XOFF (DC3, 0x13).
pub const XOFF_AT: usize = 16 * 1024;

/// Fill at which, after an XOFF, it sends XON (DC1, 0x11).
pub const XON_AT: usize = 4 * 1024;

/// Like [`serve`], for a serial line with software flow control, as a printer with a
/// receive buffer works: bytes are taken off the line as they come, up to
/// [`RECEIVE_BUFFER`], and printed from the buffer ([`SLOW_READ`] every [`SLOW_PAUSE`] when
/// `slow`); XOFF is sent when it holds [`XOFF_AT`] and XON when it is down to [`XON_AT`].
/// The buffer leaves room for what is already on its way when the sender stops (a
/// pseudo-terminal holds up to 64 KiB in flight). Bytes beyond a full buffer are lost and
/// reported ([`Report::overrun`]): the sender did not honour XOFF. `DLE EOT` is answered
/// when the printer reaches it in the buffer.
///
/// # Errors
/// As [`serve`].
pub fn serve_xonxoff(
    printer: &mut RawPrinter,
    port: &mut serialport::TTYPort,
    source: &str,
    report: &mut dyn Report,
) -> anyhow::Result<()> {
    use serialport::SerialPort;
    const XON: u8 = 0x11;
    const XOFF: u8 = 0x13;
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: VecDeque<u8> = VecDeque::new();
    let mut stopped = false;
    let mut last_byte = Instant::now();
    let mut slow = printer.condition().slow;
    let mut condition_read = Instant::now();
    loop {
        port.set_timeout(if pending.is_empty() { POLL } else { Duration::from_millis(1) })?;
        match port.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                last_byte = Instant::now();
                let take = n.min(RECEIVE_BUFFER - pending.len());
                pending.extend(&buf[..take]);
                if take < n {
                    report.overrun(n - take);
                }
            }
            Err(e) if is_quiet(&e) => {
                if pending.is_empty() {
                    quiet(printer, last_byte, source, report)?;
                }
            }
            Err(e) => return Err(e.into()),
        }
        if !stopped && pending.len() >= XOFF_AT {
            port.write_all(&[XOFF])?;
            stopped = true;
        }
        if !pending.is_empty() {
            if condition_read.elapsed() >= POLL {
                slow = printer.condition().slow;
                condition_read = Instant::now();
            }
            let n = if slow { SLOW_READ.min(pending.len()) } else { pending.len() };
            let chunk: Vec<u8> = pending.drain(..n).collect();
            take(printer, &chunk, source, port, report)?;
            if slow {
                std::thread::sleep(printer.opts.slow_pause);
            }
        }
        if stopped && pending.len() <= XON_AT {
            port.write_all(&[XON])?;
            stopped = false;
        }
    }
    printer.end_of_stream(source)?.iter().for_each(|p| report.printed(p));
    Ok(())
}

/// Serves TCP connections on `listener` one at a time, as a printer's raw port does (the
/// next client waits in the backlog), until accepting fails. A connection that fails is
/// logged and the next one served.
///
/// # Errors
/// Accepting a connection failed.
pub fn serve_tcp(printer: &mut RawPrinter, listener: &TcpListener, report: &mut dyn Report) -> anyhow::Result<()> {
    loop {
        let (mut stream, peer) = listener.accept()?;
        let source = format!("tcp {peer}");
        tracing::info!(%peer, "connection");
        stream.set_read_timeout(Some(POLL))?;
        if let Err(e) = serve(printer, &mut stream, &source, report) {
            tracing::warn!(%peer, error = %e, "connection ended with an error");
        }
    }
}

/// A pseudo-terminal standing in for the printer's serial port: the printer reads and
/// answers on the master side; a client opens [`Pty::path`] (`/dev/pts/N`) as a serial
/// port. The slave side stays open here too, in raw mode (no echo, no line editing, no
/// CR/LF translation: ESC/POS is binary), so the line survives clients coming and going.
pub struct Pty {
    master: serialport::TTYPort,
    _slave: serialport::TTYPort,
    path: String,
}

impl Pty {
    /// Opens a new pseudo-terminal pair (`posix_openpt`, via the `serialport` crate's
    /// `TTYPort::pair`, which also puts the slave in raw mode).
    ///
    /// # Errors
    /// The system has no free pseudo-terminal, or its name cannot be read.
    pub fn open() -> anyhow::Result<Pty> {
        use serialport::SerialPort;
        let (mut master, slave) = serialport::TTYPort::pair()?;
        master.set_timeout(POLL)?;
        let path = slave.name().ok_or_else(|| anyhow::anyhow!("the pseudo-terminal has no slave path"))?;
        Ok(Pty { master, _slave: slave, path })
    }

    /// The path a client opens as its serial port.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Serves the line until reading it fails (it never ends on its own).
    ///
    /// # Errors
    /// As [`serve`].
    pub fn serve(&mut self, printer: &mut RawPrinter, report: &mut dyn Report) -> anyhow::Result<()> {
        let source = format!("serial {}", self.path);
        if printer.opts.xonxoff {
            return serve_xonxoff(printer, &mut self.master, &source, report);
        }
        serve(printer, &mut self.master, &source, report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_words() {
        assert_eq!(parse_condition("").unwrap(), PrinterCondition::default());
        assert_eq!(parse_condition("ready\n").unwrap(), PrinterCondition::default());
        let c = parse_condition("paper-out, cover_open\nNEAR-END").unwrap();
        assert!(c.paper_out && c.cover_open && c.paper_near_end);
        assert_eq!(parse_condition("jammed").unwrap_err().word, "jammed");
    }

    fn printer(dir: &Path) -> RawPrinter {
        RawPrinter::new(RawPrinterOptions {
            settings: PrinterSettings::for_paper(80, render::codepage::CodePage::Cp437),
            out: dir.to_path_buf(),
            condition: PrinterCondition::default(),
            state_file: Some(dir.join("state")),
            idle_ms: 0,
            xonxoff: false,
            slow_pause: SLOW_PAUSE,
        })
    }

    /// A job arriving with the paper out is held, answered as offline, and printed when
    /// the state file says the paper is back.
    #[test]
    fn held_while_paper_out_printed_when_ready() {
        let dir = std::env::temp_dir().join(format!("pixgate-raw-printer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut p = printer(&dir);
        std::fs::write(dir.join("state"), "paper-out").unwrap();
        let (replies, printed) = p.receive(b"\x1b@Hello\n\x1dVA\x03\x10\x04\x01\x10\x04\x04", "test").unwrap();
        assert_eq!((replies, printed), (vec![0x1A, 0x7E], vec![]));
        std::fs::write(dir.join("state"), "").unwrap();
        let (replies, printed) = p.receive(b"\x10\x04\x01", "test").unwrap();
        assert_eq!((replies, printed.len()), (vec![0x12], 1));
        let t = std::fs::read_to_string(dir.join("transcript.txt")).unwrap();
        assert!(t.contains("===== seq 0001 print via test") && t.contains("Hello") && t.contains("[CUT full]"), "{t}");
        // Status requests alone print nothing.
        assert!(p.end_of_stream("test").unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
