//! QR codes for Pix payloads: the module matrix, a PNG of it, and how big a module can be
//! on a given paper or screen.
//!
//! Encoding uses [`crate::qr_fast`] (ISO/IEC 18004 model 2, numeric / alphanumeric / byte
//! segments chosen for the fewest bits, so a BR Code's digit runs and uppercase name take
//! fewer modules; never Kanji mode) at error correction level **M** (15 % recovery), the
//! level pixgate uses everywhere: the printer's native `GS ( k` QR is asked for M too
//! (`fn 169`, n = 49). The payload's bytes are encoded as given (BR Codes written by
//! [`crate::brcode`] are ASCII); a reader gets exactly those bytes back.

use crate::qr_fast::{self, Ec};
use image::{GrayImage, ImageEncoder, Luma};
use thiserror::Error;

/// Why a payload could not become a QR code.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QrError {
    /// The payload does not fit a version-40 symbol at level M (2331 bytes of arbitrary
    /// text; up to 5596 digits or 3391 uppercase characters).
    #[error("payload of {len} bytes is too long for a QR code at error correction M")]
    DataTooLong {
        /// Size of the payload, in bytes.
        len: usize,
    },
    /// Any other refusal by the encoder, with its message. ([`crate::qr_fast`] has no other
    /// refusal; kept so that callers matching on it keep compiling.)
    #[error("QR encoder failed: {0}")]
    Encoder(String),
}

/// A QR symbol as a square of modules, without quiet zone.
///
/// `modules` holds `width × width` entries, row-major (`y * width + x`), `true` = dark.
/// `width` = 17 + 4 × version (21 for version 1, 45 for version 7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QrMatrix {
    /// Modules per side.
    pub width: usize,
    /// Row-major modules, `true` = dark.
    pub modules: Vec<bool>,
}

impl QrMatrix {
    /// Whether the module at column `x`, row `y` is dark; `false` outside the symbol (the
    /// quiet zone is light).
    pub fn get(&self, x: usize, y: usize) -> bool {
        x < self.width && y < self.width && self.modules[y * self.width + x]
    }

    /// The QR version (1..=40) derived from the width.
    pub fn version(&self) -> usize {
        (self.width - 17) / 4
    }

    /// Renders the symbol as a grayscale picture: `module_px` pixels per module and
    /// `quiet_modules` light modules around it; side = (width + 2 × quiet) × module_px.
    /// Dark = 0, light = 255.
    pub fn to_gray(&self, module_px: u32, quiet_modules: u32) -> GrayImage {
        let side = (self.width as u32 + 2 * quiet_modules) * module_px;
        GrayImage::from_fn(side, side, |px, py| {
            let mx = (px / module_px.max(1)) as i64 - quiet_modules as i64;
            let my = (py / module_px.max(1)) as i64 - quiet_modules as i64;
            let dark = mx >= 0 && my >= 0 && self.get(mx as usize, my as usize);
            Luma([if dark { 0 } else { 255 }])
        })
    }

    /// The symbol with `quiet_modules` light modules around it as a 1-bit raster of
    /// `module_dots` dots per module (clamped to 1..=16, the range `GS ( k` allows), in the
    /// data layout of ESC/POS `GS v 0`: returns the side in dots and `side` rows of
    /// ⌈side / 8⌉ bytes each, most significant bit = leftmost dot, 1 = dark, padding bits 0.
    ///
    /// Built a module row at a time, without a branch per module: each module shifts
    /// `module_dots` copies of its bit into an accumulator that is emitted a byte at a
    /// time, then the row is repeated `module_dots` times. Branching on each module (the
    /// previous run-length loop) mispredicted on a QR's random modules: 2.7% of the
    /// gateway's CPU in the load harness. A per-dot callback costs about 30x more.
    pub fn to_raster(&self, module_dots: u32, quiet_modules: u32) -> (u32, Vec<u8>) {
        let m = module_dots.clamp(1, 16) as usize;
        let q = quiet_modules as usize;
        let side = (self.width + 2 * q) * m;
        let row_bytes = side.div_ceil(8);
        let mut out = Vec::with_capacity(row_bytes * side);
        out.resize(row_bytes * q * m, 0);
        let ones = (1u64 << m) - 1;
        let lead = q * m;
        let mut line = vec![0u8; row_bytes];
        for modules in self.modules.chunks_exact(self.width) {
            line.fill(0);
            // `pending` bits not yet emitted sit at the bottom of `acc`, oldest highest;
            // the quiet zone's whole bytes stay 0, its remainder starts as pending zeros.
            let (mut at, mut pending, mut acc) = (lead / 8, lead % 8, 0u64);
            for &dark in modules {
                acc = (acc << m) | (ones & 0u64.wrapping_sub(u64::from(dark)));
                pending += m;
                while pending >= 8 {
                    pending -= 8;
                    line[at] = (acc >> pending) as u8;
                    at += 1;
                }
            }
            if pending > 0 {
                line[at] = (acc << (8 - pending)) as u8;
            }
            for _ in 0..m {
                out.extend_from_slice(&line);
            }
        }
        out.resize(row_bytes * side, 0);
        (side as u32, out)
    }
}

/// Encodes `payload` (its UTF-8 bytes) as a QR code at error correction level M, in the
/// smallest version that holds it with the fewest-bit segmentation, and the mask with the
/// lowest ISO/IEC 18004 §7.8.3 penalty ([`crate::qr_fast::encode`]).
///
/// # Errors
/// [`QrError::DataTooLong`] when the payload exceeds version 40-M.
pub fn encode(payload: &str) -> Result<QrMatrix, QrError> {
    let symbol = qr_fast::encode(payload.as_bytes(), Ec::M).map_err(|e| QrError::DataTooLong { len: e.len })?;
    Ok(QrMatrix { width: symbol.width, modules: symbol.modules })
}

/// Modules per side of the smallest model-2 symbol at level M that holds `len` bytes in
/// **byte mode** (what printer firmware typically uses for `GS ( k` data), or `None` past
/// version 40 (2331 bytes). Used to size a native printer QR, which the printer encodes
/// itself.
pub fn byte_mode_width(len: usize) -> Option<usize> {
    qr_fast::version::smallest_version(len, Ec::M).map(qr_fast::version::width)
}

/// A PNG (8-bit grayscale) of the symbol with `module_px` pixels per module and a quiet zone
/// of `quiet_modules` modules (ISO/IEC 18004 asks for 4). `module_px` 0 is treated as 1.
pub fn to_png(m: &QrMatrix, module_px: u32, quiet_modules: u32) -> Vec<u8> {
    let img = m.to_gray(module_px.max(1), quiet_modules);
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out)
        .write_image(img.as_raw(), img.width(), img.height(), image::ExtendedColorType::L8)
        .expect("encoding a PNG into memory cannot fail");
    out
}

/// The largest whole module size, in dots (or px), such that the symbol plus
/// `quiet_modules` on each side fits in `max_dots`: ⌊max_dots / (width + 2 × quiet)⌋.
/// Returns 0 when not even 1 dot per module fits; callers must treat 0 as "cannot print".
/// Example: a version-7 symbol (45 modules) with quiet zone 4 on 384 dots → 7.
pub fn module_size_for_width(m: &QrMatrix, max_dots: u32, quiet_modules: u32) -> u32 {
    max_dots / (m.width as u32 + 2 * quiet_modules)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const DYN: &str = "00020101021226760014br.gov.bcb.pix2554pix.example.com/qr/v2/635956be31135de9953857d7f18bde0e52040000530398654049.905802BR5918PAGAMENTOS EXEMPLO6009SAO PAULO62070503***63042666";

    #[test]
    fn encodes_at_m_and_round_trips_through_png() {
        let m = encode(DYN).unwrap();
        assert_eq!(m.modules.len(), m.width * m.width);
        assert_eq!((m.width - 17) % 4, 0);
        let png = to_png(&m, 4, 4);
        let img = image::load_from_memory(&png).unwrap().to_luma8();
        assert_eq!(img.width(), (m.width as u32 + 8) * 4);
        let mut prepared = rqrr::PreparedImage::prepare(img);
        let grids = prepared.detect_grids();
        assert_eq!(grids.len(), 1);
        let (meta, text) = grids[0].decode().unwrap();
        assert_eq!(text, DYN);
        assert_eq!(meta.ecc_level, 0, "rqrr reports ECC M as 0 (format bits 00)");
        assert_eq!(meta.version.0, m.version());
    }

    #[test]
    fn module_size_fits() {
        let m = encode(DYN).unwrap();
        let q = 4;
        for dots in [384u32, 576, 720] {
            let s = module_size_for_width(&m, dots, q);
            assert!(s >= 1);
            assert!((m.width as u32 + 2 * q) * s <= dots);
            assert!((m.width as u32 + 2 * q) * (s + 1) > dots);
        }
        assert_eq!(module_size_for_width(&m, 10, 4), 0);
    }

    #[test]
    fn byte_mode_is_never_smaller_than_optimal() {
        let m = encode(DYN).unwrap();
        let w = byte_mode_width(DYN.len()).unwrap();
        assert!(w >= m.width);
        assert_eq!(byte_mode_width(14), Some(21), "version 1-M holds 14 bytes");
        assert_eq!(byte_mode_width(15), Some(25));
        assert_eq!(byte_mode_width(3000), None);
    }

    #[test]
    fn byte_mode_width_matches_the_qrcode_crate_budget() {
        // Independent oracle: the qrcode crate's byte-mode bit budget at M.
        let theirs = |len: usize| {
            let data = vec![b'a'; len];
            (1..=40i16).find_map(|v| {
                let mut bits = qrcode::bits::Bits::new(qrcode::Version::Normal(v));
                let fits = bits.push_byte_data(&data).is_ok() && bits.push_terminator(qrcode::EcLevel::M).is_ok();
                fits.then_some(17 + 4 * v as usize)
            })
        };
        for len in (0..=2340).step_by(7).chain([14, 15, 2330, 2331, 2332]) {
            assert_eq!(byte_mode_width(len), theirs(len), "{len} bytes");
        }
    }

    #[test]
    fn br_codes_use_mixed_modes() {
        // A fixture's dynamic BR Code (175 bytes): a smaller version than one byte-mode
        // segment needs, and the version the qrcode crate's automatic mode (the previous
        // encoder) picks.
        let m = encode(DYN).unwrap();
        let theirs = qrcode::QrCode::with_error_correction_level(DYN, qrcode::EcLevel::M).unwrap();
        assert_eq!(qrcode::Version::Normal(m.version() as i16), theirs.version());
        assert!(m.width < byte_mode_width(DYN.len()).unwrap());
    }

    #[test]
    fn raster_is_the_grey_picture_packed() {
        let m = encode(DYN).unwrap();
        for (module, quiet) in [(1u32, 0u32), (1, 3), (3, 4), (6, 4), (7, 2), (8, 1), (13, 4), (16, 0), (5, 17)] {
            let (side, rows) = m.to_raster(module, quiet);
            let img = m.to_gray(module, quiet);
            assert_eq!((side, side), img.dimensions());
            let row_bytes = side.div_ceil(8) as usize;
            assert_eq!(rows.len(), row_bytes * side as usize);
            for y in 0..side {
                for x in 0..row_bytes as u32 * 8 {
                    let bit = rows[y as usize * row_bytes + x as usize / 8] & (0x80 >> (x % 8)) != 0;
                    let dark = x < side && img.get_pixel(x, y)[0] == 0;
                    assert_eq!(bit, dark, "module {module} quiet {quiet} at ({x}, {y})");
                }
            }
        }
    }

    #[test]
    fn too_long() {
        assert!(matches!(encode(&"x".repeat(3000)), Err(QrError::DataTooLong { len: 3000 })));
        assert!(matches!(encode(&"x".repeat(2332)), Err(QrError::DataTooLong { len: 2332 })));
        assert_eq!(encode(&"x".repeat(2331)).unwrap().version(), 40);
        assert_eq!(encode(&"7".repeat(5596)).unwrap().version(), 40, "40-M holds 5596 digits");
        assert!(encode(&"7".repeat(5597)).is_err());
    }
}
