//! Anti-aliased shapes and fitted text on RGB pictures, for [`crate::screen`].
//!
//! Coordinates and sizes are in pixels (f32, origin top-left). Coverage is computed per
//! pixel from the signed distance to the shape's edge, so edges are smooth without
//! supersampling.

use crate::font::{self, Face};
use image::{Rgb, RgbImage};

fn blend(img: &mut RgbImage, x: u32, y: u32, c: Rgb<u8>, cov: f32) {
    if cov <= 0.0 || x >= img.width() || y >= img.height() {
        return;
    }
    if cov >= 1.0 {
        // Fully covered (most pixels of a filled shape): the blend below would give `c`.
        img.put_pixel(x, y, c);
        return;
    }
    let d = img.get_pixel_mut(x, y);
    for i in 0..3 {
        let v = d.0[i] as f32;
        d.0[i] = (v + (c.0[i] as f32 - v) * cov).round() as u8;
    }
}

/// Fills the axis-aligned rectangle [x0, x1) × [y0, y1) (clipped to the picture).
pub fn fill_rect(img: &mut RgbImage, x0: i64, y0: i64, x1: i64, y1: i64, c: Rgb<u8>) {
    let (w, h) = (img.width() as i64, img.height() as i64);
    for y in y0.max(0)..y1.min(h) {
        for x in x0.max(0)..x1.min(w) {
            img.put_pixel(x as u32, y as u32, c);
        }
    }
}

/// Applies `coverage(px, py)` (pixel centres) over the bounding box [x0, x1] × [y0, y1].
fn shade(img: &mut RgbImage, bbox: (f32, f32, f32, f32), c: Rgb<u8>, coverage: impl Fn(f32, f32) -> f32) {
    let (x0, y0, x1, y1) = bbox;
    let xs = x0.floor().max(0.0) as u32;
    let ys = y0.floor().max(0.0) as u32;
    let xe = (x1.ceil().max(0.0) as u32).min(img.width());
    let ye = (y1.ceil().max(0.0) as u32).min(img.height());
    for y in ys..ye {
        for x in xs..xe {
            blend(img, x, y, c, coverage(x as f32 + 0.5, y as f32 + 0.5));
        }
    }
}

/// Fills a disc of radius `r` centred at (`cx`, `cy`).
pub fn fill_circle(img: &mut RgbImage, cx: f32, cy: f32, r: f32, c: Rgb<u8>) {
    shade(img, (cx - r - 1.0, cy - r - 1.0, cx + r + 1.0, cy + r + 1.0), c, |x, y| {
        r - ((x - cx).powi(2) + (y - cy).powi(2)).sqrt() + 0.5
    });
}

/// Draws a ring (circle outline) of radius `r` (centre of the stroke) and stroke `width`.
pub fn stroke_circle(img: &mut RgbImage, cx: f32, cy: f32, r: f32, width: f32, c: Rgb<u8>) {
    let e = r + width;
    shade(img, (cx - e, cy - e, cx + e, cy + e), c, |x, y| {
        let d = ((x - cx).powi(2) + (y - cy).powi(2)).sqrt();
        width / 2.0 - (d - r).abs() + 0.5
    });
}

/// Draws a line from (`x0`, `y0`) to (`x1`, `y1`), `width` px thick, with round caps.
pub fn line(img: &mut RgbImage, (x0, y0): (f32, f32), (x1, y1): (f32, f32), width: f32, c: Rgb<u8>) {
    let hw = width / 2.0;
    let bbox = (x0.min(x1) - hw - 1.0, y0.min(y1) - hw - 1.0, x0.max(x1) + hw + 1.0, y0.max(y1) + hw + 1.0);
    let (dx, dy) = (x1 - x0, y1 - y0);
    let len2 = (dx * dx + dy * dy).max(1e-6);
    shade(img, bbox, c, |x, y| {
        let t = (((x - x0) * dx + (y - y0) * dy) / len2).clamp(0.0, 1.0);
        let (px, py) = (x0 + t * dx, y0 + t * dy);
        hw - ((x - px).powi(2) + (y - py).powi(2)).sqrt() + 0.5
    });
}

/// Fills a rectangle with corners rounded to radius `r`.
pub fn fill_rounded_rect(img: &mut RgbImage, x0: f32, y0: f32, x1: f32, y1: f32, r: f32, c: Rgb<u8>) {
    let r = r.min((x1 - x0) / 2.0).min((y1 - y0) / 2.0).max(0.0);
    shade(img, (x0 - 1.0, y0 - 1.0, x1 + 1.0, y1 + 1.0), c, |x, y| {
        // Signed distance to a rounded box.
        let (cx, cy) = ((x0 + x1) / 2.0, (y0 + y1) / 2.0);
        let (hx, hy) = ((x1 - x0) / 2.0 - r, (y1 - y0) / 2.0 - r);
        let qx = (x - cx).abs() - hx;
        let qy = (y - cy).abs() - hy;
        let outside = (qx.max(0.0).powi(2) + qy.max(0.0).powi(2)).sqrt();
        let inside = qx.max(qy).min(0.0);
        -(outside + inside - r) + 0.5
    });
}

/// The largest size ≤ `max_px` (down to `min_px`) at which `text` is at most `max_width`
/// wide, and the text to draw: ellipsised with `…` if it does not fit even at `min_px`.
pub fn fit_text(face: Face, text: &str, max_px: f32, min_px: f32, max_width: f32) -> (f32, String) {
    // A name from a charge may be any length: what is measured is bounded (far more than
    // fits any screen), and the ellipsis point is searched, not walked back to.
    let mut chars: Vec<char> = text.chars().take(FIT_MAX_CHARS + 1).collect();
    let cut = chars.len() > FIT_MAX_CHARS;
    chars.truncate(FIT_MAX_CHARS);
    let text: String = chars.iter().collect();
    let mut px = max_px;
    while px > min_px && font::text_width(face, px, &text) > max_width {
        px -= 1.0;
    }
    if !cut && font::text_width(face, px, &text) <= max_width {
        return (px, text);
    }
    let ellipsised = |n: usize| chars[..n].iter().collect::<String>().trim_end().to_string() + "…";
    // The longest prefix that fits with its ellipsis: widths grow with the prefix.
    let (mut fits, mut over) = (0usize, chars.len());
    if font::text_width(face, px, &ellipsised(0)) > max_width {
        return (px, String::new());
    }
    while over - fits > 1 {
        let mid = (fits + over) / 2;
        if font::text_width(face, px, &ellipsised(mid)) <= max_width {
            fits = mid;
        } else {
            over = mid;
        }
    }
    if font::text_width(face, px, &ellipsised(over)) <= max_width {
        fits = over;
    }
    (px, ellipsised(fits))
}

/// Characters of a text [`fit_text`] measures at most.
const FIT_MAX_CHARS: usize = 512;

/// Draws `text` horizontally centred on `cx` with its top at `y`, shrunk (down to `min_px`)
/// or ellipsised to fit `max_width`. Returns the pixel size used.
#[allow(clippy::too_many_arguments)]
pub fn text_centered(
    img: &mut RgbImage,
    face: Face,
    px: f32,
    min_px: f32,
    cx: f32,
    y: f32,
    max_width: f32,
    text: &str,
    c: Rgb<u8>,
) -> f32 {
    let (px, t) = fit_text(face, text, px, min_px, max_width);
    let w = font::text_width(face, px, &t);
    font::draw_rgb(img, face, px, cx - w / 2.0, y, &t, c);
    px
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_cover_what_they_should() {
        let mut img = RgbImage::from_pixel(100, 100, Rgb([255, 255, 255]));
        fill_circle(&mut img, 50.0, 50.0, 20.0, Rgb([0, 0, 0]));
        assert_eq!(img.get_pixel(50, 50).0, [0, 0, 0]);
        assert_eq!(img.get_pixel(50, 75).0, [255, 255, 255]);
        line(&mut img, (0.0, 5.0), (99.0, 5.0), 4.0, Rgb([255, 0, 0]));
        assert_eq!(img.get_pixel(60, 5).0, [255, 0, 0]);
        assert_eq!(img.get_pixel(60, 12).0, [255, 255, 255]);
        fill_rounded_rect(&mut img, 10.0, 80.0, 90.0, 98.0, 5.0, Rgb([0, 0, 255]));
        assert_eq!(img.get_pixel(50, 90).0, [0, 0, 255]);
        assert_eq!(img.get_pixel(10, 80).0, [255, 255, 255], "corner stays clear");
        // Off-picture shapes do not panic.
        fill_circle(&mut img, -500.0, 900.0, 30.0, Rgb([0, 0, 0]));
    }

    #[test]
    fn fitting_shrinks_then_ellipsises() {
        let (px, t) = fit_text(Face::Sans, "Pagamento confirmado", 60.0, 20.0, 300.0);
        assert!(px < 60.0 && font::text_width(Face::Sans, px, &t) <= 300.0);
        let (_, t) = fit_text(Face::Sans, &"W".repeat(100), 40.0, 30.0, 200.0);
        assert!(t.ends_with('…'));
        // The longest prefix that fits: one character more does not.
        let n = t.chars().count() - 1;
        let longer = "W".repeat(n + 1) + "…";
        assert!(font::text_width(Face::Sans, 30.0, &t) <= 200.0);
        assert!(font::text_width(Face::Sans, 30.0, &longer) > 200.0, "{t}");
    }

    /// A payer name of any length (a charge's field) is cut to what fits, with its
    /// ellipsis; a text that fits comes back whole.
    #[test]
    fn a_name_of_any_length_is_cut_to_what_fits() {
        let name = "Maria da Silva ".repeat(10_000);
        let (px, t) = fit_text(Face::SansBold, &name, 34.0, 16.0, 600.0);
        assert_eq!(px, 16.0);
        assert!(t.ends_with('…') && name.starts_with(t.trim_end_matches('…')), "{t}");
        assert!(font::text_width(Face::SansBold, px, &t) <= 600.0);
        let (_, whole) = fit_text(Face::SansBold, "Maria", 34.0, 16.0, 600.0);
        assert_eq!(whole, "Maria");
    }
}
