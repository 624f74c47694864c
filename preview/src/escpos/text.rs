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

/// How many dots the finished characters cached by one [`Glyphs`] may hold in all (one
/// byte each). Ordinary receipts use a few hundred thousand; a stream that changes the style
/// before every character (`ESC SP n`, `GS !`) would otherwise fill the cache with
/// characters of up to ~400,000 dots each.
const STYLED_CACHE_DOTS: usize = 4 << 20;

/// The character cells of one decode, for a print head `max_width` dots wide.
pub struct Glyphs {
    cache: HashMap<(char, Font, bool), Arc<Bitmap>>,
    styled: HashMap<(char, TextStyle), Rc<Bitmap>>,
    /// Dots held by `styled`, at most [`STYLED_CACHE_DOTS`].
    styled_dots: usize,
    /// The paper width in dots: no character is drawn wider.
    max_width: u32,
}

impl Glyphs {
    /// Glyphs for a print head `max_width` dots wide.
    pub fn new(max_width: u32) -> Glyphs {
        Glyphs { cache: HashMap::new(), styled: HashMap::new(), styled_dots: 0, max_width }
    }

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
    /// right-side spacing, underline and reverse applied, cut at the paper width. (A
    /// character wider than the paper (`ESC SP 255` at 8 × width is 2,136 dots) prints alone
    /// on its line from the left edge, so the cut part would never reach the paper.)
    pub fn render(&mut self, c: char, style: &TextStyle) -> Rc<Bitmap> {
        if let Some(b) = self.styled.get(&(c, *style)) {
            return b.clone();
        }
        let b = Rc::new(self.render_uncached(c, style));
        let dots = b.width as usize * b.height as usize;
        if self.styled.len() < 4096 && self.styled_dots + dots <= STYLED_CACHE_DOTS {
            self.styled_dots += dots;
            self.styled.insert((c, *style), b.clone());
        }
        b
    }

    /// Builds each scaled row once from the 1 × 1 cell (each dot repeated `width_mul` times,
    /// then the spacing filled in) and copies it `height_mul` times: the work per character
    /// is the cell's dots plus plain memory fills, not every dot of the scaled area.
    fn render_uncached(&mut self, c: char, style: &TextStyle) -> Bitmap {
        let (cw, ch) = style.font.cell();
        let (sx, sy) = (style.width_mul.max(1), style.height_mul.max(1));
        let width = ((cw + style.right_spacing) * sx).min(self.max_width);
        let height = ch * sy;
        let base = self.cell(c, style.font, style.bold).clone();
        let row_len = width as usize;
        let mut bits = Vec::with_capacity(row_len * height as usize);
        for y in 0..ch {
            let start = bits.len();
            for x in 0..cw {
                bits.extend(std::iter::repeat_n(base.get(x, y) != style.reverse, sx as usize));
            }
            // The right-side spacing is blank; `resize` also cuts the row at the paper width.
            bits.resize(start + row_len, style.reverse);
            for _ in 1..sy {
                bits.extend_from_within(start..start + row_len);
            }
        }
        if style.underline > 0 {
            // The bottom 1 or 2 dot rows, across the spacing too.
            let t = style.underline.min(2) as usize;
            bits[(height as usize - t) * row_len..].fill(!style.reverse);
        }
        Bitmap::from_bits(width, height, bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_have_ink_and_scale() {
        let mut g = Glyphs::new(576);
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

    /// The character as the ESC/POS rules define it, dot by dot: the cell plus blank
    /// spacing, scaled, the bottom rows underlined, everything inverted in reverse mode.
    fn reference(g: &mut Glyphs, c: char, s: &TextStyle) -> Bitmap {
        let (cw, ch) = s.font.cell();
        let cell = g.cell(c, s.font, s.bold).clone();
        let (w, h) = ((cw + s.right_spacing) * s.width_mul, ch * s.height_mul);
        let mut b = Bitmap::new(w, h);
        for y in 0..h {
            for x in 0..w {
                let ink = y >= h - s.underline.min(2) as u32 || cell.get(x / s.width_mul, y / s.height_mul);
                b.set(x, y, ink != s.reverse);
            }
        }
        b
    }

    #[test]
    fn every_style_matches_the_dot_by_dot_definition() {
        let mut g = Glyphs::new(576);
        for font in [Font::A, Font::B] {
            for (width_mul, height_mul) in [(1, 1), (2, 1), (1, 3), (8, 8)] {
                for (underline, reverse, bold, right_spacing) in
                    [(0, false, false, 0), (1, false, true, 3), (2, true, false, 0), (1, true, true, 7)]
                {
                    let style = TextStyle { font, bold, underline, width_mul, height_mul, reverse, right_spacing };
                    for c in ['M', 'g', ' ', 'Ç'] {
                        assert_eq!(*g.render(c, &style), reference(&mut g, c, &style), "{c:?} {style:?}");
                    }
                }
            }
        }
    }

    /// Found while fuzzing `escpos_decode`: `ESC SP n` before each character made each one a
    /// new style of up to 2,136 × 192 dots, all drawn dot by dot and cached (a 16 KB stream
    /// took 43 s and 880 MB in printer-sim).
    #[test]
    fn wide_characters_are_cut_at_the_paper_and_the_cache_is_bounded() {
        let wide = TextStyle {
            font: Font::A,
            bold: false,
            underline: 1,
            width_mul: 8,
            height_mul: 8,
            reverse: true,
            right_spacing: 255,
        };
        // 50 dots cuts through the character itself (96 dots at 8 ×), 384 through its spacing.
        for paper in [50, 384] {
            let mut g = Glyphs::new(paper);
            let b = g.render('W', &wide);
            assert_eq!((b.width, b.height), (paper, 192));
            let full = reference(&mut g, 'W', &wide);
            for y in 0..b.height {
                for x in 0..b.width {
                    assert_eq!(b.get(x, y), full.get(x, y), "paper {paper}: ({x}, {y})");
                }
            }
        }
        let mut g = Glyphs::new(384);
        for right_spacing in 0..=255 {
            for c in ['A', 'B', 'C', 'D'] {
                g.render(c, &TextStyle { right_spacing, ..wide });
            }
        }
        assert!(g.styled_dots <= STYLED_CACHE_DOTS, "{} dots cached", g.styled_dots);
        let held: usize = g.styled.values().map(|b| b.width as usize * b.height as usize).sum();
        assert_eq!(held, g.styled_dots);
    }
}
