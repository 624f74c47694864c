//! The effect of a job on a simulated receipt printer: the ESC/POS payload goes through the
//! [`preview::escpos`] decoder and the printed paper is written as a PNG, its text appended to
//! the printer's transcript.

use crate::effect::{append_transcript, png_path, transcript_header, write_file, JobError};
use device_protocol::messages::CONTENT_ESCPOS;
use device_protocol::Job;
use image::{GrayImage, ImageEncoder};
use preview::escpos::{decode, DecodeOptions, Decoded};
use render::codepage::CodePage;
use render::profile::{profile_for_model, ModelProfile, GENERIC};
use std::path::{Path, PathBuf};

/// How a simulated printer is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrinterSettings {
    /// Print head width in dots (384 for 58 mm, 576 for 80 mm).
    pub width_dots: u32,
    /// Code table in force at power-on and after `ESC @`.
    pub code_page: CodePage,
    /// The model whose `ESC t n` numbering the printer follows (generic = Epson's).
    pub model: &'static ModelProfile,
}

impl PrinterSettings {
    /// Settings for a paper width in mm (≥ 70 → 576 dots, else 384).
    pub fn for_paper(paper_width_mm: u8, code_page: CodePage) -> Self {
        PrinterSettings { width_dots: if paper_width_mm >= 70 { 576 } else { 384 }, code_page, model: &GENERIC }
    }

    /// These settings on the model named `model` (a registry `model` string; unknown →
    /// generic): the printer then reads `ESC t n` with that model's numbering.
    pub fn with_model(self, model: &str) -> Self {
        PrinterSettings { model: profile_for_model(model), ..self }
    }

    /// The decoder options for these settings.
    pub fn decode_options(&self) -> DecodeOptions {
        DecodeOptions {
            width_dots: self.width_dots,
            initial_code_page: self.code_page,
            model: self.model,
            ..DecodeOptions::mm80()
        }
    }
}

/// A grey image as PNG bytes.
pub fn gray_png(img: &GrayImage) -> Vec<u8> {
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out)
        .write_image(img.as_raw(), img.width(), img.height(), image::ExtendedColorType::L8)
        .expect("encoding a PNG into memory cannot fail");
    out
}

/// The transcript of a decoded stream plus its skipped commands and warnings, one per line.
pub fn transcript_text(d: &Decoded) -> String {
    let mut t = d.transcript.trim_end_matches('\n').to_string();
    for (cmd, n) in &d.skipped {
        t.push_str(&format!("\n[SKIPPED {cmd} x{n}]"));
    }
    for w in &d.warnings {
        t.push_str(&format!("\n[WARNING] {w}"));
    }
    t
}

/// Decodes a raw ESC/POS stream offline. Returns the decoded print and its PNG (`None`
/// when nothing was printed: a zero-height image has no PNG).
pub fn print_bytes(bytes: &[u8], settings: &PrinterSettings) -> (Decoded, Option<Vec<u8>>) {
    let d = decode(bytes, &settings.decode_options());
    let png = (d.image.height() > 0 && d.image.width() > 0).then(|| gray_png(&d.image));
    (d, png)
}

/// Carries out a print job: checks the content type, decodes the base64 ESC/POS payload,
/// writes `{dir}/{seq:04}-{kind}-{charge}.png` and appends a header line plus the transcript
/// to `{dir}/transcript.txt`. Returns the PNG path.
///
/// # Errors
/// Permanent: wrong content type, payload not base64, nothing printed. Transient: I/O.
pub fn print_job(settings: &PrinterSettings, job: &Job, dir: &Path) -> Result<PathBuf, JobError> {
    let bytes = crate::effect::payload_for(job, CONTENT_ESCPOS, "a printer")?;
    let (decoded, png) = print_bytes(&bytes, settings);
    let Some(png) = png else {
        return Err(JobError::permanent(format!("ESC/POS stream of {} bytes printed nothing", bytes.len())));
    };
    let path = png_path(dir, job);
    write_file(&path, &png)?;
    append_transcript(dir, &format!("{}\n{}", transcript_header(job), transcript_text(&decoded)))?;
    Ok(path)
}
