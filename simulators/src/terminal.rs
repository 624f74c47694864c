//! The effect of a job on a simulated card machine: the [`ScreenContent`] JSON payload is
//! drawn with [`render::screen::render_screen`] at the machine's resolution, written as a
//! PNG, and one line describing it is appended to the machine's transcript.

use crate::effect::{append_transcript, png_path, write_file, JobError};
use device_protocol::messages::CONTENT_SCREEN;
use device_protocol::{Job, ScreenContent, ScreenKind};
use render::screen::{render_screen, to_png, Screen};
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

/// Converts wire content into the renderer's [`Screen`].
///
/// # Errors
/// A `pay_with_pix` screen without a BR Code (permanent).
pub fn screen_from_content(c: &ScreenContent) -> Result<Screen, JobError> {
    Ok(match c.screen {
        ScreenKind::PayWithPix => Screen::PayWithPix {
            merchant_name: c.merchant_name.clone(),
            amount_cents: c.amount_cents,
            brcode: c
                .brcode
                .clone()
                .filter(|b| !b.is_empty())
                .ok_or_else(|| JobError::permanent("pay_with_pix screen without brcode"))?,
            expires_at: c.expires_at,
        },
        ScreenKind::Paid => Screen::Paid {
            merchant_name: c.merchant_name.clone(),
            amount_cents: c.amount_cents,
            payer_name: c.payer_name.clone(),
            paid_at: c.paid_at,
        },
        ScreenKind::Expired => Screen::Expired { merchant_name: c.merchant_name.clone(), amount_cents: c.amount_cents },
    })
}

/// The locale and time zone to draw `c` in: the job's, else the device's, else São Paulo.
pub fn locale_and_zone(settings: &TerminalSettings, c: &ScreenContent) -> (Locale, chrono_tz::Tz) {
    let tag = if c.locale.trim().is_empty() { &settings.locale } else { &c.locale };
    let tz = c
        .time_zone
        .parse::<chrono_tz::Tz>()
        .or_else(|_| settings.time_zone.parse::<chrono_tz::Tz>())
        .unwrap_or(chrono_tz::America::Sao_Paulo);
    (Locale::from_tag(tag), tz)
}

/// Parses a screen job's payload (base64 of UTF-8 JSON).
///
/// # Errors
/// Permanent: wrong content type, not base64, not a [`ScreenContent`].
pub fn parse_screen_job(job: &Job) -> Result<ScreenContent, JobError> {
    let bytes = crate::effect::payload_for(job, CONTENT_SCREEN, "a card machine")?;
    serde_json::from_slice(&bytes).map_err(|e| JobError::permanent(format!("payload is not screen JSON: {e}")))
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
    let screen = screen_from_content(&content)?;
    let (locale, tz) = locale_and_zone(settings, &content);
    let img = render_screen(&screen, settings.width_px, settings.height_px, locale, tz);
    let path = png_path(dir, job);
    write_file(&path, &to_png(&img))?;
    append_transcript(dir, &transcript_line(job, &content, locale))?;
    Ok(path)
}
