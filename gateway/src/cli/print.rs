//! `pixgate print --to URL FILE`: a raw ESC/POS stream sent to a printer by hand, with the
//! status the printer answered before and after (what a technician does first at a shop).
//! `--device ID` instead of `--to` looks the printer up as the gateway would: its registry
//! document in the outbox (`outbox.path`; the gateway must be stopped, it holds that file),
//! else the local printers file (`direct.printers_file`).
//!
//! Prints one JSON object on stdout: `endpoint`, `before` and `after` (the decoded
//! `DLE EOT` replies, `null` over USB, which cannot answer), `written` (bytes). Exit status:
//! 0 written; 2 not written because the printer said it cannot print (paper out, cover
//! open, error, offline, no answer; `--anyway` writes regardless); 1 the file, the
//! connection or the write failed (the error on stderr).

use crate::config::Config;
use crate::deliver::direct::{Endpoint, Link, PrinterStatus};
use crate::model::{DirectPrinters, DirectSettings};
use crate::store::Outbox;
use anyhow::Context;
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

/// `pixgate print …`.
#[derive(Debug, clap::Args)]
pub struct PrintCmd {
    /// The printer: tcp://HOST[:9100], serial:///dev/ttyUSB0?baud=19200&flow=rtscts, or
    /// usb:///dev/usb/lp0.
    #[arg(long, required_unless_present = "device", conflicts_with = "device")]
    pub to: Option<String>,
    /// The printer by its device id, as the gateway reaches it (registry, then
    /// `direct.printers_file`).
    #[arg(long)]
    pub device: Option<String>,
    /// The stream to send (e.g. a receipt as pixgate renders it); omitted with --status.
    pub file: Option<PathBuf>,
    /// Only ask the printer's status.
    #[arg(long)]
    pub status: bool,
    /// Write even when the printer says it cannot print.
    #[arg(long)]
    pub anyway: bool,
    /// Longest wait to connect, for each status reply, and without write progress, ms.
    #[arg(long, default_value_t = 5_000)]
    pub timeout_ms: u64,
}

fn status_json(s: &Option<PrinterStatus>) -> serde_json::Value {
    match s {
        Some(s) => json!({
            "summary": s.summary(),
            "can_print": s.can_print(),
            "replies": s.replies.map(|r| r.map(|b| format!("{b:#04x}"))),
            "offline": s.offline,
            "cover_open": s.cover_open,
            "paper_out": s.paper_out,
            "paper_near_end": s.paper_near_end,
            "error": s.error,
        }),
        None => serde_json::Value::Null,
    }
}

/// Runs `cmd`, loading the configuration with `config` only for `--device`; returns the
/// exit status (see the module docs).
pub fn run(cmd: &PrintCmd, config: impl FnOnce() -> anyhow::Result<Config>) -> i32 {
    match print(cmd, config) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pixgate print: {e:#}");
            1
        }
    }
}

/// Where the gateway reaches `device`: its registry document, else the local printers file.
///
/// # Errors
/// The outbox cannot be opened (the gateway is running), the printers file is bad, or the
/// device is not a direct printer.
pub fn device_endpoint(cfg: &Config, device: &str) -> anyhow::Result<Endpoint> {
    if cfg.outbox.path.exists() {
        let outbox = Outbox::open(&cfg.outbox.path).with_context(|| {
            format!("opening the outbox {} (stop pixgate first, or give --to)", cfg.outbox.path.display())
        })?;
        if let Some((_, _, doc)) = outbox.devices()?.into_iter().find(|(id, _, _)| id == device) {
            let doc = doc.with_context(|| format!("device {device} was deleted from the registry"))?;
            let d = cdc::decode_device(&doc)?;
            if let Some(s) = DirectSettings::of_device(&d)? {
                return Ok(s.endpoint);
            }
        }
    }
    if let Some(path) = &cfg.direct.printers_file {
        if let Some(s) = DirectPrinters::load_file(path)?.remove(device) {
            return Ok(s.endpoint);
        }
    }
    anyhow::bail!("device {device} is not a direct printer (neither its registry document nor direct.printers_file give it an endpoint)")
}

fn print(cmd: &PrintCmd, config: impl FnOnce() -> anyhow::Result<Config>) -> anyhow::Result<i32> {
    let endpoint = match (&cmd.to, &cmd.device) {
        (Some(to), _) => Endpoint::parse(to)?,
        (None, Some(device)) => device_endpoint(&config()?, device)?,
        (None, None) => anyhow::bail!("give --to URL or --device ID"),
    };
    let bytes = match (&cmd.file, cmd.status) {
        (_, true) => None,
        (Some(f), false) => Some(std::fs::read(f).map_err(|e| anyhow::anyhow!("reading {}: {e}", f.display()))?),
        (None, false) => anyhow::bail!("give FILE to print, or --status"),
    };
    let timeout = Duration::from_millis(cmd.timeout_ms.max(1));
    let mut link = Link::open(&endpoint, timeout)?;
    let before = link.status()?;
    let refused = before.as_ref().is_some_and(|s| !s.can_print()) && !cmd.anyway;
    let mut written = 0;
    let mut after = None;
    if let Some(bytes) = bytes.as_deref().filter(|_| !refused) {
        link.write_job(bytes, timeout)?;
        written = bytes.len();
        after = link.status()?;
    }
    let out = json!({
        "endpoint": endpoint.to_string(),
        "before": status_json(&before),
        "written": written,
        "after": status_json(&after),
    });
    println!("{out}");
    if refused && bytes.is_some() {
        eprintln!(
            "pixgate print: not written: the printer says {} (--anyway writes regardless)",
            before.as_ref().map_or("", PrinterStatus::summary)
        );
        return Ok(2);
    }
    Ok(0)
}
