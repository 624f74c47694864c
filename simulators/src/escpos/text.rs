//! Character cells: a glyph drawn in font A (12 × 24) or font B (9 × 17) with the bundled
//! DejaVu Sans Mono, then scaled, underlined and reversed as the print modes say.

use super::raster::Bitmap;
use super::state::{Font, TextStyle};
use image::{GrayImage, Luma};
use render::font::{draw_mono, mono_px_for_cell_width, Face};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex, OnceLock};

/// Glyph cells are the same for every decode: rasterise each (char, font, bold) once per process.
type CellCache = Mutex<HashMap<(char, Font, bool), Arc<Bitmap>>>;

fn cell_cache() -> &'static CellCache {
    static CACHE: OnceLock<CellCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// DejaVu Sans Mono's ascender and descender as fractions of the em.
const ASCENT: f32 = 1901.0 / 2048.0;
const DESCENT: f32 = 483.0 / 2048.0;

fn rasterise(c: char, font: Font, bold: bool) -> Bitmap {
    let (w, h) = font.cell();
    let px = mono_px_for_cell_width(w as f32);
    // Centre the font's full height (ascender + descender) in the cell.
    let top = ((h as f32 - (ASCENT + DESCENT) * px) / 2.0).floor();
    let mut img = GrayImage::from_pixel(w, h, Luma([255]));
    if !c.is_whitespace() && !c.is_control() {
        let face = if bold { Face::MonoBold } else { Face::Mono };
        draw_mono(&mut img, face, px, 0.0, top, &c.to_string());
    }
    let mut b = Bitmap::new(w, h);
    for (x, y, p) in img.enumerate_pixels() {
        if p.0[0] < 128 {
            b.set(x, y, true);
        }
    }
    b
}

#[derive(Default)]
pub struct Glyphs {
    cache: HashMap<(char, Font, bool), Arc<Bitmap>>,
    styled: HashMap<(char, TextStyle), Rc<Bitmap>>,
}

impl Glyphs {
    /// The 1 × 1 cell of `c`, without spacing, underline or reverse.
    pub fn cell(&mut self, c: char, font: Font, bold: bool) -> &Bitmap {
        self.cache.entry((c, font, bold)).or_insert_with(|| {
            let key = (c, font, bold);
            if let Some(b) = cell_cache().lock().ok().and_then(|m| m.get(&key).cloned()) {
                return b;
            }
            let b = Arc::new(rasterise(c, font, bold));
            if let Ok(mut m) = cell_cache().lock() {
                if m.len() < 8192 {
                    m.insert(key, b.clone());
                }
            }
            b
        })
    }


    /// The finished character as it goes on paper: scaled by the size multipliers, with
    /// right-side spacing, underline and reverse applied.
    pub fn render(&mut self, c: char, style: &TextStyle) -> Rc<Bitmap> {
        if let Some(b) = self.styled.get(&(c, *style)) {
            return b.clone();
        }
        let b = Rc::new(self.render_uncached(c, style));
        if self.styled.len() < 4096 {
            self.styled.insert((c, *style), b.clone());
        }
        b
    }

    fn render_uncached(&mut self, c: char, style: &TextStyle) -> Bitmap {
        let (cw, ch) = style.font.cell();
        let spacing = style.right_spacing;
        let base = self.cell(c, style.font, style.bold).clone();
        let mut b = Bitmap::new(cw + spacing, ch);
        for y in 0..ch {
            for x in 0..cw {
                if base.get(x, y) {
                    b.set(x, y, true);
                }
            }
        }
        let mut b = b.scaled(style.width_mul, style.height_mul);
        if style.underline > 0 {
            let t = style.underline.min(2) as u32;
            b.fill_rect(0, b.height - t, b.width, t, true);
        }
        if style.reverse {
            for y in 0..b.height {
                for x in 0..b.width {
                    let v = b.get(x, y);
                    b.set(x, y, !v);
                }
            }
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_have_ink_and_scale() {
        let mut g = Glyphs::default();
        let style = TextStyle {
            font: Font::A,
            bold: false,
            underline: 0,
            width_mul: 2,
            height_mul: 3,
            reverse: false,
            right_spacing: 0,
        };
        let b = g.render('M', &style);
        assert_eq!((b.width, b.height), (24, 72));
        assert!(b.black_count() > 100);
        let bold = g.cell('M', Font::A, true).black_count();
        assert!(bold > g.cell('M', Font::A, false).black_count());
        assert_eq!(g.cell(' ', Font::B, false).black_count(), 0);
        assert!(g.cell('g', Font::B, false).black_count() > 10);
    }
}
