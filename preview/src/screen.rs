//! A card machine's screen from a screen job (`application/vnd.pixgate.screen+json`: a
//! [`ScreenContent`]), drawn with [`render::screen::render_screen`] at the machine's
//! resolution.

use device_protocol::messages::CONTENT_SCREEN;
use device_protocol::{Job, ScreenContent, ScreenKind};
use image::RgbImage;
use render::screen::{render_screen, Screen};
use render::Locale;

/// Why a screen job cannot be drawn. Every case is permanent: the same job never draws.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScreenError {
    /// Not a screen job.
    #[error("a card machine cannot handle content type {0:?}")]
    ContentType(String),
    /// The payload is not base64.
    #[error("payload is not base64: {0}")]
    Base64(String),
    /// The payload is not a [`ScreenContent`].
    #[error("payload is not screen JSON: {0}")]
    Json(String),
    /// A `pay_with_pix` screen without the BR Code to show.
    #[error("pay_with_pix screen without brcode")]
    NoBrCode,
}

/// Converts wire content into the renderer's [`Screen`].
///
/// # Errors
/// [`ScreenError::NoBrCode`].
pub fn screen_from_content(c: &ScreenContent) -> Result<Screen, ScreenError> {
    Ok(match c.screen {
        ScreenKind::PayWithPix => Screen::PayWithPix {
            merchant_name: c.merchant_name.clone(),
            amount_cents: c.amount_cents,
            brcode: c.brcode.clone().filter(|b| !b.is_empty()).ok_or(ScreenError::NoBrCode)?,
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

/// The locale and time zone to draw `c` in: the job's, else the device's own
/// (`device_locale`, a BCP 47 tag; `device_time_zone`, IANA), else São Paulo.
pub fn locale_and_zone(device_locale: &str, device_time_zone: &str, c: &ScreenContent) -> (Locale, chrono_tz::Tz) {
    let tag = if c.locale.trim().is_empty() { device_locale } else { &c.locale };
    let tz = c
        .time_zone
        .parse::<chrono_tz::Tz>()
        .or_else(|_| device_time_zone.parse::<chrono_tz::Tz>())
        .unwrap_or(chrono_tz::America::Sao_Paulo);
    (Locale::from_tag(tag), tz)
}

/// Parses a screen job's payload (base64 of UTF-8 JSON).
///
/// # Errors
/// Another content type, not base64, not a [`ScreenContent`].
pub fn parse_screen_job(job: &Job) -> Result<ScreenContent, ScreenError> {
    if job.content_type != CONTENT_SCREEN {
        return Err(ScreenError::ContentType(job.content_type.clone()));
    }
    let bytes = job.payload_bytes().map_err(|e| ScreenError::Base64(e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| ScreenError::Json(e.to_string()))
}

/// What a card machine of `width_px` × `height_px` pixels shows for `content`, in the
/// locale and time zone of [`locale_and_zone`] (returned with the picture).
///
/// # Errors
/// [`ScreenError::NoBrCode`].
pub fn draw_content(
    content: &ScreenContent,
    width_px: u32,
    height_px: u32,
    device_locale: &str,
    device_time_zone: &str,
) -> Result<(RgbImage, Locale), ScreenError> {
    let screen = screen_from_content(content)?;
    let (locale, tz) = locale_and_zone(device_locale, device_time_zone, content);
    Ok((render_screen(&screen, width_px, height_px, locale, tz), locale))
}

/// What a card machine of `width_px` × `height_px` pixels shows for screen job `job`
/// ([`parse_screen_job`], then [`draw_content`]).
///
/// # Errors
/// See [`ScreenError`].
pub fn draw(
    job: &Job,
    width_px: u32,
    height_px: u32,
    device_locale: &str,
    device_time_zone: &str,
) -> Result<RgbImage, ScreenError> {
    let content = parse_screen_job(job)?;
    draw_content(&content, width_px, height_px, device_locale, device_time_zone).map(|(img, _)| img)
}
