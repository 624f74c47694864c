//! What a CloudPRNT printer is sent: the receipt pixgate rendered as ESC/POS, drawn as the
//! paper it prints (`preview::escpos`, the decoder the printer simulator prints with) and
//! encoded as `image/png`.
//!
//! Star printers take no ESC/POS media type: their command set is Star's own, and
//! `application/octet-stream` passes bytes to an emulation Star advises against (Star
//! CloudPRNT protocol guide, "Content media types"). `image/png` is printed "pixel for
//! pixel, without scaling" by every CloudPRNT printer, so the picture is drawn exactly as
//! wide as the print head ([`CloudSettings::width_dots`]): the text, QR and layout land
//! where the ESC/POS would have put them. The picture ends where the ESC/POS cuts; the
//! printer feeds and cuts after it as its own settings say.

use crate::model::CloudSettings;
use device_protocol::messages::CONTENT_ESCPOS;
use device_protocol::Job;
use preview::escpos::raster::MAX_HEIGHT;
use preview::escpos::{decode, DecodeOptions};

/// The media type served.
pub const PNG: &str = "image/png";

/// Why a job cannot be drawn: the job fails for good (a dead letter with this reason).
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// Not a job pixgate renders as paper (a screen job sent to a printer).
    #[error("a printer that fetches its jobs prints ESC/POS jobs only, not {0}")]
    ContentType(String),
    /// The job's bytes or payload do not decode.
    #[error("the job does not decode: {0}")]
    Job(String),
    /// The PNG encoder failed.
    #[error("encoding the PNG: {0}")]
    Png(String),
}

/// The ESC/POS bytes of `wire` (a job's JSON as stored), what a paper job carries.
///
/// # Errors
/// [`MediaError::Job`] (it does not decode), [`MediaError::ContentType`] (not ESC/POS).
pub fn escpos(wire: &[u8]) -> Result<Vec<u8>, MediaError> {
    let job: Job = serde_json::from_slice(wire).map_err(|e| MediaError::Job(e.to_string()))?;
    if job.content_type != CONTENT_ESCPOS {
        return Err(MediaError::ContentType(job.content_type));
    }
    job.payload_bytes().map_err(|e| MediaError::Job(e.to_string()))
}

/// `wire` (a job's JSON as stored) drawn for `printer` as a greyscale PNG (black on white), at most
/// [`MAX_HEIGHT`] dots long. CPU-bound (tens of ms for a receipt): call it off the async
/// threads.
///
/// # Errors
/// [`MediaError`].
pub fn png(wire: &[u8], printer: &CloudSettings) -> Result<Vec<u8>, MediaError> {
    let bytes = escpos(wire)?;
    let opts = DecodeOptions { initial_code_page: printer.code_page, ..DecodeOptions::preview(printer.width_dots) }
        .with_model(&printer.model)
        .with_max_height(MAX_HEIGHT);
    let decoded = decode(&bytes, &opts);
    // The printer cuts after the picture itself; the decoder's cut mark (a dashed line)
    // must not print, so the picture ends at the job's last cut.
    let mut paper = decoded.image;
    if let Some(&row) = decoded.cut_rows.last() {
        let height = row.clamp(1, paper.height());
        paper = image::imageops::crop_imm(&paper, 0, 0, paper.width(), height).to_image();
    }
    let mut out = std::io::Cursor::new(Vec::new());
    paper.write_to(&mut out, image::ImageFormat::Png).map_err(|e| MediaError::Png(e.to_string()))?;
    Ok(out.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use device_protocol::EffectKind;
    use render::codepage::CodePage;

    /// The picture is as wide as the head and has the job's text on it (the integration
    /// test decodes a printed QR from such a picture); a screen job is refused.
    #[test]
    fn a_receipt_is_drawn_as_wide_as_the_head() {
        let mut job = crate::test_fixtures::job("m1", EffectKind::PrintReceipt, "c");
        job.content_type = CONTENT_ESCPOS.into();
        job.payload = Job::encode_payload(b"\x1b@\x1bt\x03PAGO\n\n\n\x1dVA\x03");
        let settings = CloudSettings {
            mac: Some("00:11:62:00:00:01".into()),
            method: cdc::CloudMethod::Http,
            width_dots: 384,
            code_page: CodePage::Cp860,
            model: String::new(),
        };
        let png = png(&job.to_json(), &settings).unwrap();
        let img = image::load_from_memory(&png).unwrap().to_luma8();
        assert_eq!(img.width(), 384);
        assert!(img.height() >= 24, "a line of text and the feed: {}", img.height());
        let ink = img.pixels().filter(|p| p.0[0] < 128).count();
        assert!(ink > 50, "the text is drawn: {ink} dark pixels");
        let cut = decode(&job.payload_bytes().unwrap(), &DecodeOptions::preview(384)).cut_rows;
        assert_eq!(img.height(), cut[0], "the picture ends at the cut, without the cut's mark");

        job.content_type = "application/vnd.pixgate.screen+json".into();
        assert!(matches!(super::png(&job.to_json(), &settings), Err(MediaError::ContentType(_))));
    }
}
