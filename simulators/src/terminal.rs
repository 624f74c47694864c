//! The effect of a job on a simulated card machine: the [`ScreenContent`] JSON payload is
//! drawn by [`preview::screen`] at the machine's resolution, written as a PNG, and one line
//! describing it is appended to the machine's transcript.

use crate::effect::{append_transcript, png_path, write_file, JobError};
use device_protocol::{Job, ScreenContent, ScreenKind};
use render::screen::to_png;
use render::Locale;
use std::path::{Path, PathBuf};

/// How a simulated card machine is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalSettings {
    /// Screen width in pixels.
    pub width_px: u32,
    /// Screen height in pixels.
    pub height_px: u32,
    /// The device's own locale, used when a job carries none.
    pub locale: String,
    /// The device's own IANA time zone, used when a job carries none or an unknown one.
    pub time_zone: String,
}

/// Parses a screen job's payload (base64 of UTF-8 JSON).
///
/// # Errors
/// Permanent: wrong content type, not base64, not a [`ScreenContent`].
pub fn parse_screen_job(job: &Job) -> Result<ScreenContent, JobError> {
    preview::screen::parse_screen_job(job).map_err(|e| JobError::permanent(e.to_string()))
}

/// One transcript line for a shown screen: seq, job kind, screen, merchant, amount (and the
/// BR Code for a QR screen).
pub fn transcript_line(job: &Job, c: &ScreenContent, locale: Locale) -> String {
    let screen = match c.screen {
        ScreenKind::PayWithPix => "pay_with_pix",
        ScreenKind::Paid => "paid",
        ScreenKind::Expired => "expired",
    };
    let mut line = format!(
        "{:04} {} screen={} merchant={:?} amount={:?} charge={} message={}",
        job.seq,
        job.kind.as_str(),
        screen,
        c.merchant_name,
        render::money::format_amount(c.amount_cents as i64, locale),
        job.charge_id,
        job.message_id
    );
    if let Some(b) = &c.brcode {
        line.push_str(&format!(" brcode={b:?}"));
    }
    if let Some(p) = &c.payer_name {
        line.push_str(&format!(" payer={p:?}"));
    }
    line
}

/// Carries out a screen job: draws it, writes `{dir}/{seq:04}-{kind}-{charge}.png` and
/// appends one line to `{dir}/transcript.txt`. Returns the PNG path.
///
/// # Errors
/// Permanent for undecodable content, transient for I/O.
pub fn show_job(settings: &TerminalSettings, job: &Job, dir: &Path) -> Result<PathBuf, JobError> {
    let content = parse_screen_job(job)?;
    let (img, locale) = preview::screen::draw_content(
        &content,
        settings.width_px,
        settings.height_px,
        &settings.locale,
        &settings.time_zone,
    )
    .map_err(|e| JobError::permanent(e.to_string()))?;
    let path = png_path(dir, job);
    write_file(&path, &to_png(&img))?;
    append_transcript(dir, &transcript_line(job, &content, locale))?;
    Ok(path)
}
