//! Text rasterising for the pictures pixgate and its simulators make.
//!
//! The fonts are DejaVu Sans and DejaVu Sans Mono (Bitstream Vera licence, in
//! `render/assets/fonts/LICENSE`), compiled into the binary so that a picture looks the same
//! on every machine and no font has to be installed. Glyphs are drawn with `ab_glyph`;
//! sizes are in pixels (for the printer simulator, pixels are printer dots at 203 dpi).

use ab_glyph::{Font, FontRef, PxScale, ScaleFont};
use image::{GrayImage, Luma, Rgb, RgbImage};
use std::sync::OnceLock;

/// A typeface pixgate draws with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    /// DejaVu Sans, for screens.
    Sans,
    /// DejaVu Sans Bold, for screen headings.
    SansBold,
    /// DejaVu Sans Mono, for receipts (every character one cell wide, like a printer font).
    Mono,
    /// DejaVu Sans Mono Bold, for emphasised receipt text (`ESC E 1`).
    MonoBold,
}

static SANS: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");
static SANS_BOLD: &[u8] = include_bytes!("../assets/fonts/DejaVuSans-Bold.ttf");
static MONO: &[u8] = include_bytes!("../assets/fonts/DejaVuSansMono.ttf");
static MONO_BOLD: &[u8] = include_bytes!("../assets/fonts/DejaVuSansMono-Bold.ttf");

fn font(face: Face) -> &'static FontRef<'static> {
    static FONTS: OnceLock<[FontRef<'static>; 4]> = OnceLock::new();
    let fonts = FONTS.get_or_init(|| {
        // The bytes are compiled in and known good: a parse failure is a build defect.
        let load = |b: &'static [u8]| FontRef::try_from_slice(b).expect("bundled font parses");
        [load(SANS), load(SANS_BOLD), load(MONO), load(MONO_BOLD)]
    });
    &fonts[face as usize]
}

/// Width in pixels of `text` set at `px` pixels (the font's em size) in `face`.
pub fn text_width(face: Face, px: f32, text: &str) -> f32 {
    let f = font(face).as_scaled(PxScale::from(px));
    let mut w = 0.0;
    let mut prev = None;
    for c in text.chars() {
        let id = f.glyph_id(c);
        if let Some(p) = prev {
            w += f.kern(p, id);
        }
        w += f.h_advance(id);
        prev = Some(id);
    }
    w
}

/// Whether `face` has a glyph for `c` (otherwise it would draw the "missing glyph" box).
/// Screens drop such characters, e.g. emoji in a merchant name.
pub fn has_glyph(face: Face, c: char) -> bool {
    font(face).glyph_id(c).0 != 0
}

/// The pixel size at which one DejaVu Sans Mono cell is `cell_width` pixels wide.
///
/// The printer simulator uses it to fit font A (12 dots) and font B (9 dots) cells.
pub fn mono_px_for_cell_width(cell_width: f32) -> f32 {
    let one_px_advance = text_width(Face::Mono, 100.0, "M") / 100.0;
    cell_width / one_px_advance
}

/// Rasterises `text` with its top-left corner at (`x`, `y`) and calls `plot(x, y, coverage)`
/// for every covered pixel inside `width` × `height`, coverage in `0.0..=1.0`.
/// Returns the advance width in pixels.
pub fn draw_with(
    face: Face,
    px: f32,
    x: f32,
    y: f32,
    text: &str,
    (width, height): (u32, u32),
    mut plot: impl FnMut(u32, u32, f32),
) -> f32 {
    let f = font(face).as_scaled(PxScale::from(px));
    let baseline = y + f.ascent();
    let mut caret = x;
    let mut prev = None;
    for c in text.chars() {
        let id = f.glyph_id(c);
        if let Some(p) = prev {
            caret += f.kern(p, id);
        }
        let glyph = id.with_scale_and_position(px, ab_glyph::point(caret, baseline));
        caret += f.h_advance(id);
        prev = Some(id);
        if let Some(outlined) = font(face).outline_glyph(glyph) {
            let b = outlined.px_bounds();
            outlined.draw(|gx, gy, cov| {
                let px_x = b.min.x as i64 + gx as i64;
                let px_y = b.min.y as i64 + gy as i64;
                if px_x >= 0 && px_y >= 0 && (px_x as u32) < width && (px_y as u32) < height {
                    plot(px_x as u32, px_y as u32, cov.clamp(0.0, 1.0));
                }
            });
        }
    }
    caret - x
}

/// Draws anti-aliased `text` in `color` onto an RGB picture (for screens).
pub fn draw_rgb(img: &mut RgbImage, face: Face, px: f32, x: f32, y: f32, text: &str, color: Rgb<u8>) -> f32 {
    let dims = img.dimensions();
    draw_with(face, px, x, y, text, dims, |px_x, px_y, cov| {
        let dst = img.get_pixel_mut(px_x, px_y);
        for i in 0..3 {
            let d = dst.0[i] as f32;
            dst.0[i] = (d + (color.0[i] as f32 - d) * cov).round() as u8;
        }
    })
}

/// Draws `text` in black onto a 1-bit-style picture (for paper): a pixel is inked when the
/// glyph covers at least half of it, as a thermal head either burns a dot or does not.
pub fn draw_mono(img: &mut GrayImage, face: Face, px: f32, x: f32, y: f32, text: &str) -> f32 {
    let dims = img.dimensions();
    draw_with(face, px, x, y, text, dims, |px_x, px_y, cov| {
        if cov >= 0.5 {
            img.put_pixel(px_x, px_y, Luma([0]));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mono_cells_are_uniform_and_sizable() {
        let px = mono_px_for_cell_width(12.0);
        assert!((text_width(Face::Mono, px, "ãçW1") - 48.0).abs() < 0.01);
        assert!(text_width(Face::Sans, 40.0, "Pago") > text_width(Face::Sans, 20.0, "Pago"));
    }

    #[test]
    fn drawing_inks_pixels_inside_the_box_only() {
        let mut img = GrayImage::from_pixel(60, 30, Luma([255]));
        draw_mono(&mut img, Face::MonoBold, 24.0, 2.0, 0.0, "São");
        let inked = img.pixels().filter(|p| p.0[0] == 0).count();
        assert!(inked > 50, "text left {inked} dots");
        // Drawing far outside the picture must not panic.
        draw_mono(&mut img, Face::Mono, 24.0, -500.0, 500.0, "x");
    }
}
