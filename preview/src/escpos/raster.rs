//! The page being printed: a roll of paper as wide as the print head, growing downwards.

use image::{GrayImage, Luma};

/// The most paper one decode prints by default, in dots (about 2.5 m at 203 dpi): a
/// printer's roll, for the simulated printers ([`super::DecodeOptions::mm80`]).
pub const MAX_HEIGHT: u32 = 20_000;

/// A 1-bit picture: `true` is a burnt (black) dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitmap {
    /// Width in dots.
    pub width: u32,
    /// Height in dots.
    pub height: u32,
    bits: Vec<bool>,
}

impl Bitmap {
    /// An all-white bitmap of `width` × `height` dots.
    pub fn new(width: u32, height: u32) -> Bitmap {
        Bitmap { width, height, bits: vec![false; width as usize * height as usize] }
    }

    /// A bitmap from its dots, row by row, `width * height` of them (missing dots are
    /// white, extra ones dropped).
    pub fn from_bits(width: u32, height: u32, mut bits: Vec<bool>) -> Bitmap {
        bits.resize(width as usize * height as usize, false);
        Bitmap { width, height, bits }
    }

    /// Whether the dot at column `x`, row `y` is black; `false` outside the bitmap.
    pub fn get(&self, x: u32, y: u32) -> bool {
        x < self.width && y < self.height && self.bits[(y * self.width + x) as usize]
    }

    /// Makes the dot at column `x`, row `y` black (`v`) or white; ignored outside the
    /// bitmap.
    pub fn set(&mut self, x: u32, y: u32, v: bool) {
        if x < self.width && y < self.height {
            self.bits[(y * self.width + x) as usize] = v;
        }
    }

    /// Makes the `w` × `h` dots from column `x`, row `y` black (`v`) or white, clipped to
    /// the bitmap.
    pub fn fill_rect(&mut self, x: u32, y: u32, w: u32, h: u32, v: bool) {
        for yy in y..y.saturating_add(h).min(self.height) {
            for xx in x..x.saturating_add(w).min(self.width) {
                self.bits[(yy * self.width + xx) as usize] = v;
            }
        }
    }

    /// Decodes MSB-first rows of `row_bytes` bytes each; missing bytes are white.
    pub fn from_rows(width: u32, height: u32, row_bytes: usize, data: &[u8]) -> Bitmap {
        let mut b = Bitmap::new(width, height);
        for y in 0..height {
            for x in 0..width {
                let i = y as usize * row_bytes + (x / 8) as usize;
                if let Some(&byte) = data.get(i) {
                    if byte & (0x80 >> (x % 8)) != 0 {
                        b.bits[(y * width + x) as usize] = true;
                    }
                }
            }
        }
        b
    }

    /// Nearest-neighbour enlargement by whole factors.
    pub fn scaled(&self, sx: u32, sy: u32) -> Bitmap {
        if sx == 1 && sy == 1 {
            return self.clone();
        }
        let (w, sx, sy) = (self.width as usize, sx as usize, sy as usize);
        let mut bits = Vec::with_capacity(w * sx * self.height as usize * sy);
        for row in self.bits.chunks_exact(w.max(1)).take(self.height as usize) {
            let start = bits.len();
            for &dot in row {
                bits.extend(std::iter::repeat_n(dot, sx));
            }
            for _ in 1..sy {
                bits.extend_from_within(start..start + w * sx);
            }
        }
        Bitmap::from_bits(self.width * sx as u32, self.height * sy as u32, bits)
    }

    /// Number of black dots.
    pub fn black_count(&self) -> usize {
        self.bits.iter().filter(|&&b| b).count()
    }
}

/// The paper: white, `width` dots wide, as tall as what has been printed and fed, at most
/// `max_height` dots.
pub struct Page {
    width: u32,
    max_height: u32,
    /// Rows allocated so far (white), each `width` bytes.
    pixels: Vec<u8>,
    /// The print position: the top of the next line.
    pub y: u32,
    /// Set once something had to be dropped at the page's maximum height.
    pub overflowed: bool,
}

impl Page {
    /// Blank paper `width` dots wide and at most `max_height` dots long (each at least 1),
    /// print position at the top.
    pub fn new(width: u32, max_height: u32) -> Page {
        Page { width: width.max(1), max_height: max_height.max(1), pixels: Vec::new(), y: 0, overflowed: false }
    }

    /// Paper width in dots.
    pub fn width(&self) -> u32 {
        self.width
    }

    fn rows(&self) -> u32 {
        (self.pixels.len() / self.width as usize) as u32
    }

    /// Makes sure rows `0..h` exist (capped at the maximum height).
    fn ensure_rows(&mut self, h: u32) {
        let h = if h > self.max_height {
            self.overflowed = true;
            self.max_height
        } else {
            h
        };
        if h > self.rows() {
            self.pixels.resize(h as usize * self.width as usize, 255);
        }
    }

    /// Feeds the paper by `dots`.
    pub fn feed(&mut self, dots: u32) {
        let y = self.y.saturating_add(dots);
        if y > self.max_height {
            self.overflowed = true;
        }
        self.y = y.min(self.max_height);
    }

    /// Burns the dot at column `x`, row `y`; ignored beyond the paper width, and past
    /// the maximum height recorded in [`Page::overflowed`] instead.
    pub fn set_black(&mut self, x: u32, y: u32) {
        if x >= self.width || y >= self.max_height {
            if y >= self.max_height {
                self.overflowed = true;
            }
            return;
        }
        self.ensure_rows(y + 1);
        let i = y as usize * self.width as usize + x as usize;
        self.pixels[i] = 0;
    }

    /// Draws the black dots of `b` with its top-left corner at (`x`, `y`), clipped to the paper.
    pub fn blit(&mut self, b: &Bitmap, x: u32, y: u32) {
        if b.height == 0 || b.width == 0 || x >= self.width {
            return;
        }
        let bottom = y.saturating_add(b.height);
        self.ensure_rows(bottom);
        let rows = self.rows();
        let (pw, bw) = (self.width as usize, b.width as usize);
        // Row by row over slices: this is most of a decode's time (text is blitted cell by cell).
        let cols = bw.min(pw - x as usize);
        for by in 0..b.height.min(rows.saturating_sub(y)) as usize {
            let src = &b.bits[by * bw..by * bw + cols];
            let start = (y as usize + by) * pw + x as usize;
            for (dot, &black) in self.pixels[start..start + cols].iter_mut().zip(src) {
                if black {
                    *dot = 0;
                }
            }
        }
    }

    /// A dashed line across the paper at `y`, two dots thick: where the cutter cut.
    pub fn dashed_line(&mut self, y: u32) {
        for yy in y..y + 2 {
            for x in 0..self.width {
                if (x / 8) % 2 == 0 {
                    self.set_black(x, yy);
                }
            }
        }
    }

    /// The printed paper: at least one row, at least as tall as the paper fed.
    pub fn into_image(mut self) -> GrayImage {
        let h = self.y.max(self.rows()).max(1);
        self.ensure_rows(h);
        let h = self.rows();
        GrayImage::from_raw(self.width, h, self.pixels)
            .unwrap_or_else(|| GrayImage::from_pixel(self.width, 1, Luma([255])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_decode_msb_first_and_pad() {
        let b = Bitmap::from_rows(10, 1, 2, &[0b1000_0001, 0b0100_0000]);
        let bits: Vec<bool> = (0..10).map(|x| b.get(x, 0)).collect();
        assert_eq!(bits, [true, false, false, false, false, false, false, true, false, true]);
    }

    #[test]
    fn page_is_capped() {
        for max in [MAX_HEIGHT, 100] {
            let mut p = Page::new(8, max);
            p.feed(max * 3);
            assert!(p.overflowed);
            p.blit(&Bitmap::new(8, 8), 0, max - 2);
            let img = p.into_image();
            assert_eq!(img.height(), max);
        }
    }

    #[test]
    fn a_block_crossing_the_end_is_cut_and_marks_the_overflow() {
        let mut p = Page::new(4, 10);
        let mut b = Bitmap::new(4, 6);
        b.fill_rect(0, 0, 4, 6, true);
        p.blit(&b, 0, 2);
        assert!(!p.overflowed);
        p.blit(&b, 0, 7);
        assert!(p.overflowed);
        let img = p.into_image();
        assert_eq!(img.height(), 10);
        assert!((0..4).all(|x| img.get_pixel(x, 9).0[0] == 0 && img.get_pixel(x, 1).0[0] == 255));
    }
}
