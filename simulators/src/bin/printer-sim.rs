//! printer-sim: a simulated ESC/POS receipt printer.
//!
//! - `printer-sim decode FILE.bin --png OUT.png --text OUT.txt [--width-dots 576] [--code-page CP437] [--model NAME]`
//!   decodes a raw ESC/POS stream offline.
//! - `printer-sim run --id ID --mqtt HOST:PORT --out DIR [--paper 80] [--code-page CP860]
//!   [--mqtt-ca CA.crt (--mqtt-cert-dir DIR | --mqtt-secrets FILE)]` joins the broker as
//!   device `ID` until Ctrl-C (over TLS with a client certificate or a secret when
//!   `--mqtt-ca` is given).
//! - `printer-sim listen (--tcp 127.0.0.1:9100 | --pty) --out DIR [--paper-out] [--paper-near-end]
//!   [--cover-open] [--state-file FILE] [--slow-pause-ms 20]` is a printer on a raw byte transport that answers
//!   `DLE EOT` (`simulators::raw_printer`) until killed. It prints `listening tcp ADDR` or
//!   `listening pty /dev/pts/N` first, then `printed PATH` for each job.
//! - `printer-sim cloudprnt --url URL --mac MAC --out DIR [--user ID (--password-file FILE |
//!   --secrets FILE)] [--ca CA.crt] [--poll-ms 5000] [--state-file FILE] [--skip-confirm N]
//!   [--paper 80] [--duplicate-code "200 OK"] [--confirm-delay-ms 0]` is a Star CloudPRNT printer until killed: it
//!   asks the server for its setting (`cloudprnt-setting.json` beside URL), then polls URL
//!   (HTTP method, `simulators::cloudprnt`) or, when the server offers MQTT, takes its jobs
//!   from the broker the setting names (`simulators::cloudprnt_mqtt`). It prints `polling
//!   URL` when polling starts (on MQTT: after every subscription), then `printed PATH
//!   token=TOKEN`, `duplicate TOKEN` and `refused STATUS` as they happen.
//! - `printer-sim sdp --url URL --id ID --user USER (--password-file FILE | --secrets FILE)
//!   [--ca CA.crt] [--poll-ms 5000] [--paper 80] [--out DIR] [--skip-confirm N]
//!   [--status-ms MS]` is an Epson TM printer (TM-T88VI, TM-m30) using Server Direct Print
//!   until killed (`simulators::sdp`): it polls URL with HTTP Digest authentication, prints
//!   the ESC/POS of the jobs (`{out}/NNNN-print.png` and `.bin`) and posts their results;
//!   the condition comes from `{out}/state`. It prints `polling URL` when the first poll is
//!   answered 200, then `printed PATH token=PRINTJOBID` and `refused STATUS` as they happen.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use preview::escpos::status::PrinterCondition;
use render::codepage::CodePage;
use render::profile::profile_for_model;
use simulators::cli::{init_tracing, run_single_device, DeviceArgs};
use simulators::cloudprnt::{BasicAuth, CloudPrinter, CloudPrntOptions};
use simulators::cloudprnt_mqtt::CloudPrntMqttOptions;
use simulators::printer::{print_bytes, transcript_text, PrinterSettings};
use simulators::raw_printer::{Pty, RawPrinter, RawPrinterOptions, StdoutReport};
use simulators::registry::DeviceSpec;
use simulators::sdp::{SdpOptions, SdpPrinter};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(about = "Simulated ESC/POS receipt printer")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Decode a raw ESC/POS file into a PNG and a text transcript (no MQTT needed).
    Decode {
        /// The ESC/POS byte stream.
        file: PathBuf,
        /// Where to write the printed paper.
        #[arg(long)]
        png: PathBuf,
        /// Where to write the transcript.
        #[arg(long)]
        text: Option<PathBuf>,
        /// Print head width: 576 (80 mm) or 384 (58 mm).
        #[arg(long, default_value_t = 576)]
        width_dots: u32,
        /// Code page at power-on.
        #[arg(long, default_value = "CP437")]
        code_page: String,
        /// Printer model whose `ESC t` numbering to follow (e.g. "Bematech MP-4200 TH");
        /// unknown or "generic" → Epson numbering.
        #[arg(long, default_value = "generic")]
        model: String,
    },
    /// Be device ID on the MQTT broker until Ctrl-C (plain TCP, or TLS with --mqtt-ca and
    /// --mqtt-cert-dir or --mqtt-secrets).
    Run {
        #[command(flatten)]
        device: DeviceArgs,
        /// Paper width in mm (58 or 80).
        #[arg(long, default_value_t = 80)]
        paper: u8,
        /// Code page at power-on.
        #[arg(long, default_value = "CP860")]
        code_page: String,
        /// Printer model whose `ESC t` numbering to follow (empty: generic ESC/POS).
        #[arg(long, default_value = "")]
        model: String,
    },
    /// Be a printer on a raw TCP port or a serial line (pseudo-terminal): print what
    /// arrives, answer `DLE EOT n` with the status byte, until killed.
    #[command(group(clap::ArgGroup::new("transport").required(true).args(["tcp", "pty"])))]
    Listen {
        /// Listen on this TCP address (raw port 9100 style; port 0 picks a free one). Keep
        /// it on loopback: an open raw port prints, and kicks drawers, for anyone.
        #[arg(long)]
        tcp: Option<String>,
        /// Open a pseudo-terminal and serve its master side; clients open the printed
        /// `/dev/pts/N` as a serial port.
        #[arg(long)]
        pty: bool,
        /// Where PNGs (`NNNN-print.png`) and `transcript.txt` go.
        #[arg(long)]
        out: PathBuf,
        /// Paper width in mm (58 or 80).
        #[arg(long, default_value_t = 80)]
        paper: u8,
        /// Code page at power-on and after `ESC @`.
        #[arg(long, default_value = "CP437")]
        code_page: String,
        /// Printer model whose `ESC t` numbering to follow (empty: generic ESC/POS).
        #[arg(long, default_value = "")]
        model: String,
        /// Start with the roll-paper end sensor seeing no paper (offline).
        #[arg(long)]
        paper_out: bool,
        /// Start with the near-end sensor seeing a thin roll (still prints).
        #[arg(long)]
        paper_near_end: bool,
        /// Start with the cover open (offline).
        #[arg(long)]
        cover_open: bool,
        /// Read the condition from this file at run time (words `paper-out`,
        /// `paper-near-end`, `cover-open`, `offline`, `slow`; empty or `ready`: ready;
        /// missing: the flags above).
        #[arg(long)]
        state_file: Option<PathBuf>,
        /// Print what has arrived when the line has been quiet this long without a cut, ms (0: only at cuts and when a connection closes).
        #[arg(long, default_value_t = 1000)]
        idle_ms: u64,
        /// With `--pty`: XON/XOFF flow control with a 128 KiB receive buffer (XOFF at 16 KiB,
        /// XON at 4 KiB); bytes a sender sends past a full buffer are lost and reported as
        /// `overrun N`.
        #[arg(long, requires = "pty")]
        xonxoff: bool,
        /// A `slow` printer's pause after each read of 256 bytes, ms.
        #[arg(long, value_name = "MS", default_value_t = 20)]
        slow_pause_ms: u64,
    },
    /// Be a Star CloudPRNT printer: ask the server for its setting, then poll URL (HTTP
    /// method) or take jobs from the MQTT broker the setting names (MQTT method); fetch jobs
    /// as image/png, save them, confirm them; until killed.
    #[command(group(clap::ArgGroup::new("password").args(["password_file", "secrets"]).requires("user")))]
    Cloudprnt {
        /// The CloudPRNT server URL the printer polls (POST) and, unless the poll answer
        /// names others, fetches (GET) and confirms (DELETE) jobs at.
        #[arg(long)]
        url: String,
        /// The MAC address the printer reports (`printerMAC`, `mac=`), e.g. 00:11:62:0a:1b:2c.
        #[arg(long)]
        mac: String,
        /// Where PNGs (`NNNN-print.png`) and `jobs.jsonl` go.
        #[arg(long)]
        out: PathBuf,
        /// HTTP Basic authentication user name; needs --password-file or --secrets.
        #[arg(long, requires = "password")]
        user: Option<String>,
        /// File holding the password (trimmed).
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
        /// A JSON object {"<id>": "<secret>", ...} (the --mqtt-secrets format); the
        /// password is the entry of --user.
        #[arg(long, value_name = "FILE")]
        secrets: Option<PathBuf>,
        /// Verify https servers (and, on MQTT with `useTls`, the broker) against this CA
        /// file (PEM), the only root trusted.
        #[arg(long, value_name = "FILE")]
        ca: Option<PathBuf>,
        /// Time between polls, ms (also the wait before asking for the server setting or
        /// connecting to the broker again after a refusal or failure).
        #[arg(long, default_value_t = 5000)]
        poll_ms: u64,
        /// Read the condition from this file before each poll (words `paper-out`,
        /// `paper-near-end`, `cover-open`, `offline`; empty, missing or `ready`: ready).
        #[arg(long)]
        state_file: Option<PathBuf>,
        /// Print the first N jobs but do not confirm them (a lost confirmation: no DELETE on
        /// HTTP, no print-result on MQTT).
        #[arg(long, value_name = "N", default_value_t = 0)]
        skip_confirm: u64,
        /// Paper width in mm (58, 80 or 112).
        #[arg(long, default_value_t = 80)]
        paper: u8,
        /// MQTT method: the print-result status code of a print-job whose jobToken was
        /// printed already (Star does not document the value); printSucceeded is true when
        /// it starts with 2.
        #[arg(long, value_name = "CODE", default_value = simulators::cloudprnt_mqtt::DEFAULT_DUPLICATE_CODE)]
        duplicate_code: String,
        /// HTTP method: how long after printing a job the printer confirms it (DELETE), ms.
        #[arg(long, value_name = "MS", default_value_t = 0)]
        confirm_delay_ms: u64,
    },
    /// Be an Epson TM printer (TM-T88VI, TM-m30) using Server Direct Print: poll URL for
    /// print data (ePOS-Print XML with ESC/POS `<command>`s), print it, send the results
    /// (and, with --status-ms, the status); HTTP Digest authentication; until killed.
    #[command(group(clap::ArgGroup::new("password").args(["password_file", "secrets"]).required(true)))]
    Sdp {
        /// The Server Direct Print URL the printer posts GetRequest, SetResponse and
        /// SetStatus to.
        #[arg(long)]
        url: String,
        /// The printer's ID (`ID=` of every request).
        #[arg(long)]
        id: String,
        /// HTTP Digest authentication user name.
        #[arg(long)]
        user: String,
        /// File holding the password (trimmed).
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
        /// A JSON object {"<id>": "<secret>", ...} (the --mqtt-secrets format); the
        /// password is the entry of --user.
        #[arg(long, value_name = "FILE")]
        secrets: Option<PathBuf>,
        /// Verify https servers against this CA file (PEM), the only root trusted.
        #[arg(long, value_name = "FILE")]
        ca: Option<PathBuf>,
        /// The interval between polls, ms (also the wait before trying a failed or refused
        /// request again).
        #[arg(long, default_value_t = 5000)]
        poll_ms: u64,
        /// Paper width in mm (58 or 80).
        #[arg(long, default_value_t = 80)]
        paper: u8,
        /// Where PNGs (`NNNN-print.png`), the ESC/POS beside them (`NNNN-print.bin`) and
        /// `jobs.jsonl` go; the condition is read from `DIR/state` (words `paper-out`,
        /// `paper-near-end`, `cover-open`, `offline`; empty, missing or `ready`: ready).
        #[arg(long, default_value = ".")]
        out: PathBuf,
        /// Print the jobs of the first N answers that print something but do not send
        /// their SetResponse (a lost result).
        #[arg(long, value_name = "N", default_value_t = 0)]
        skip_confirm: u64,
        /// Status notification: send SetStatus at start, every MS ms and when the
        /// condition changes (default: off).
        #[arg(long, value_name = "MS")]
        status_ms: Option<u64>,
    },
}

fn code_page(name: &str) -> Result<CodePage> {
    CodePage::from_name(name).with_context(|| format!("unknown code page {name:?}"))
}

#[tokio::main]
async fn main() -> Result<()> {
    init_tracing();
    match Cli::parse().cmd {
        Cmd::Decode { file, png, text, width_dots, code_page: cp, model } => {
            let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let (decoded, png_bytes) = print_bytes(
                &bytes,
                &PrinterSettings { width_dots, code_page: code_page(&cp)?, model: profile_for_model(&model) },
            );
            let png_bytes = png_bytes.context("nothing was printed")?;
            std::fs::write(&png, png_bytes).with_context(|| format!("writing {}", png.display()))?;
            let t = transcript_text(&decoded);
            match text {
                Some(p) => std::fs::write(&p, t + "\n").with_context(|| format!("writing {}", p.display()))?,
                None => println!("{t}"),
            }
            eprintln!(
                "{}x{} dots, {} QR, {} cuts, {} warnings",
                decoded.image.width(),
                decoded.image.height(),
                decoded.qr_codes.len(),
                decoded.cuts,
                decoded.warnings.len()
            );
        }
        Cmd::Run { device, paper, code_page: cp, model } => {
            let spec = DeviceSpec::Printer {
                id: device.id.clone(),
                paper_width_mm: paper,
                code_page: code_page(&cp)?,
                native_qr: true,
                model,
            };
            run_single_device(&spec, &device).await?;
        }
        Cmd::Listen {
            tcp,
            pty,
            out,
            paper,
            code_page: cp,
            model,
            paper_out,
            paper_near_end,
            cover_open,
            state_file,
            idle_ms,
            xonxoff,
            slow_pause_ms,
        } => {
            let mut printer = RawPrinter::new(RawPrinterOptions {
                settings: PrinterSettings::for_paper(paper, code_page(&cp)?).with_model(&model),
                out,
                condition: PrinterCondition { paper_out, paper_near_end, cover_open, ..PrinterCondition::default() },
                state_file,
                idle_ms,
                xonxoff,
                slow_pause: Duration::from_millis(slow_pause_ms),
            });
            // Blocking I/O on this thread; Ctrl-C or SIGTERM ends the process.
            if let Some(addr) = tcp {
                let listener = std::net::TcpListener::bind(&addr).with_context(|| format!("listening on {addr}"))?;
                println!("listening tcp {}", listener.local_addr()?);
                simulators::raw_printer::serve_tcp(&mut printer, &listener, &mut StdoutReport)?;
            } else if pty {
                let mut line = Pty::open().context("opening a pseudo-terminal")?;
                println!("listening pty {}", line.path());
                line.serve(&mut printer, &mut StdoutReport)?;
            }
        }
        Cmd::Cloudprnt {
            url,
            mac,
            out,
            user,
            password_file,
            secrets,
            ca,
            poll_ms,
            state_file,
            skip_confirm,
            paper,
            duplicate_code,
            confirm_delay_ms,
        } => {
            let url = url.parse().with_context(|| format!("--url {url:?} is not a URL"))?;
            let auth = match (user, password_file, secrets) {
                (Some(user), Some(file), _) => {
                    Some(BasicAuth { password: simulators::cloudprnt::password_from_file(&file)?, user })
                }
                (Some(user), None, Some(file)) => {
                    Some(BasicAuth { password: simulators::cloudprnt::password_from_secrets(&file, &user)?, user })
                }
                _ => None,
            };
            let printer = CloudPrinter::new(CloudPrntOptions {
                url,
                mac,
                out,
                auth,
                ca,
                poll: Duration::from_millis(poll_ms),
                state_file,
                skip_confirm,
                paper_mm: paper,
                confirm_delay: Duration::from_millis(confirm_delay_ms),
            })?;
            // Tests read these lines as they come: flush each.
            let mut report = |event: &simulators::cloudprnt::Event| {
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "{event}");
                let _ = stdout.flush();
            };
            simulators::cloudprnt_mqtt::run(printer, CloudPrntMqttOptions { duplicate_code }, &mut report).await;
        }
        Cmd::Sdp { url, id, user, password_file, secrets, ca, poll_ms, paper, out, skip_confirm, status_ms } => {
            let url = url.parse().with_context(|| format!("--url {url:?} is not a URL"))?;
            let password = match (password_file, secrets) {
                (Some(file), _) => simulators::cloudprnt::password_from_file(&file)?,
                (None, Some(file)) => simulators::cloudprnt::password_from_secrets(&file, &user)?,
                (None, None) => anyhow::bail!("--password-file or --secrets is needed"),
            };
            let printer = SdpPrinter::new(SdpOptions {
                url,
                id,
                credentials: BasicAuth { user, password },
                ca,
                poll: Duration::from_millis(poll_ms),
                paper_mm: paper,
                out,
                skip_confirm,
                status_every: status_ms.map(Duration::from_millis),
            })?;
            // Tests read these lines as they come: flush each.
            let mut report = |event: &simulators::cloudprnt::Event| {
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "{event}");
                let _ = stdout.flush();
            };
            printer.run(&mut report).await;
        }
    }
    Ok(())
}
