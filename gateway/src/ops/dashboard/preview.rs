//! A job's picture as its device shows it: the paper a printer prints from the job's
//! ESC/POS bytes, or the screen a card machine draws from a screen job, as PNG. Drawn only
//! when a page asks, off the async threads, one at a time, and never on the delivery path:
//! the bytes come from the dashboard's copy of recent jobs ([`crate::telemetry::recent`]) or
//! from the outbox, and the dispatcher never waits for a picture.
//!
//! The printer's decoder (`preview::escpos`, the same one the printer simulator prints
//! with) stops drawing at [`preview::escpos::PREVIEW_MAX_HEIGHT`] dots of paper, so one
//! hostile or broken job costs a bounded time; a few recent pictures are cached.

use cdc::{Device, DeviceKind};
use device_protocol::messages::{CONTENT_ESCPOS, CONTENT_SCREEN};
use device_protocol::Job;
use preview::escpos::{decode, DecodeOptions};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

/// Pictures kept for pages asking again (each some tens of KiB).
const CACHED: usize = 32;

/// Why a picture cannot be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// The job's bytes are not a job (never expected: pixgate wrote them).
    #[error("the job does not parse: {0}")]
    Job(String),
    /// A content type this gateway does not draw.
    #[error("no picture for content type {0}")]
    ContentType(String),
    /// A screen job whose content does not parse.
    #[error("the screen job does not parse: {0}")]
    Screen(String),
    /// The device's registry entry does not say how it draws (not registered any more).
    #[error("device {0} is not in the registry")]
    UnknownDevice(String),
    /// The PNG encoder failed.
    #[error("encoding the PNG: {0}")]
    Png(String),
}

/// Draws `wire` (a job's JSON as its device receives it) for `device` and encodes it as PNG.
///
/// # Errors
/// See [`PreviewError`].
pub fn draw(device: &Device, wire: &[u8], default_time_zone: &str) -> Result<Vec<u8>, PreviewError> {
    let job: Job = serde_json::from_slice(wire).map_err(|e| PreviewError::Job(e.to_string()))?;
    match (&device.kind, job.content_type.as_str()) {
        (DeviceKind::Printer { paper_width_mm, code_page, .. }, CONTENT_ESCPOS) => {
            let bytes = job.payload_bytes().map_err(|e| PreviewError::Job(e.to_string()))?;
            let model = render::profile::profile_for_model(&device.model);
            let opts = DecodeOptions {
                initial_code_page: *code_page,
                ..DecodeOptions::preview(model.dots_per_line(*paper_width_mm))
            }
            .with_model(&device.model);
            png_gray(&decode(&bytes, &opts).image)
        }
        (DeviceKind::Terminal { width_px, height_px, .. }, CONTENT_SCREEN) => {
            let zone = device.time_zone.as_deref().unwrap_or(default_time_zone);
            let img = preview::screen::draw(&job, *width_px, *height_px, &device.locale, zone)
                .map_err(|e| PreviewError::Screen(e.to_string()))?;
            Ok(render::screen::to_png(&img))
        }
        (_, other) => Err(PreviewError::ContentType(other.to_string())),
    }
}

fn png_gray(img: &image::GrayImage) -> Result<Vec<u8>, PreviewError> {
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).map_err(|e| PreviewError::Png(e.to_string()))?;
    Ok(out.into_inner())
}

/// A picture's key: (device id, job seq).
type Key = (String, u64);

/// The last pictures drawn, by (device, seq).
#[derive(Debug, Default)]
pub struct Cache {
    entries: Mutex<VecDeque<(Key, Arc<Vec<u8>>)>>,
}

impl Cache {
    /// The picture of `device`'s job `seq`, if drawn lately.
    pub fn get(&self, device: &str, seq: u64) -> Option<Arc<Vec<u8>>> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.iter().find(|((d, s), _)| d == device && *s == seq).map(|(_, png)| png.clone())
    }

    /// Keeps `png` as the picture of `device`'s job `seq`, letting the oldest go.
    pub fn put(&self, device: &str, seq: u64, png: Arc<Vec<u8>>) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|((d, s), _)| !(d == device && *s == seq));
        entries.push_back(((device.to_string(), seq), png));
        while entries.len() > CACHED {
            entries.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::render::render_job;
    use crate::route::router::PlannedEffect;
    use crate::test_fixtures::documents;
    use device_protocol::EffectKind;

    fn wire(device: &Device, kind: EffectKind) -> Vec<u8> {
        let charge = documents("charges.jsonl", cdc::decode_charge)
            .into_iter()
            .find(|c| c.status == cdc::ChargeStatus::Completed)
            .unwrap();
        let effect = PlannedEffect { kind, device: device.clone() };
        render_job("ev", &charge, &effect, "America/Sao_Paulo").unwrap().to_json()
    }

    /// Every fixture device's picture is a PNG of its own size: a printer's paper as wide
    /// as its print head with dots on it, a card machine's screen at its resolution.
    #[test]
    fn each_device_gets_a_picture_of_its_own_size() {
        let devices = documents("devices.jsonl", cdc::decode_device);
        let (mut printers, mut terminals) = (0, 0);
        for device in &devices {
            let (kind, want_w, want_h) = match device.kind {
                DeviceKind::Printer { paper_width_mm, .. } => {
                    printers += 1;
                    let dots = render::profile::profile_for_model(&device.model).dots_per_line(paper_width_mm);
                    (EffectKind::PrintReceipt, dots, None)
                }
                DeviceKind::Terminal { width_px, height_px, .. } => {
                    terminals += 1;
                    (EffectKind::PaymentConfirmed, width_px, Some(height_px))
                }
            };
            let png = draw(device, &wire(device, kind), "America/Sao_Paulo").unwrap();
            let img = image::load_from_memory(&png).unwrap().to_luma8();
            assert_eq!(img.width(), want_w, "{}", device.id);
            if let Some(h) = want_h {
                assert_eq!(img.height(), h, "{}", device.id);
            } else {
                assert!(img.height() > 200 && img.height() <= preview::escpos::PREVIEW_MAX_HEIGHT, "{}", device.id);
            }
            assert!(img.pixels().any(|p| p.0[0] < 128), "{}: blank", device.id);
        }
        assert!(printers > 0 && terminals > 0, "{printers} printers, {terminals} terminals");
    }

    #[test]
    fn a_job_of_the_wrong_kind_is_refused_not_drawn() {
        let devices = documents("devices.jsonl", cdc::decode_device);
        let printer = devices.iter().find(|d| matches!(d.kind, DeviceKind::Printer { .. })).unwrap();
        let terminal = devices.iter().find(|d| matches!(d.kind, DeviceKind::Terminal { .. })).unwrap();
        let screen = wire(terminal, EffectKind::PaymentConfirmed);
        assert!(matches!(draw(printer, &screen, "UTC"), Err(PreviewError::ContentType(_))));
        assert!(matches!(draw(printer, b"{not json", "UTC"), Err(PreviewError::Job(_))));
    }
}
