//! The module matrix as bit rows, function patterns (§6.3: finder, separators, timing,
//! alignment, dark module, reserved format/version areas) and codeword placement (§7.7.3).
//!
//! A row is `[u64; N]`, bit `x % 64` of word `x / 64` is column `x`, 1 = dark; `N` is 1 for
//! widths ≤ 64 (versions 1..=11), 2 up to 128 (..=27), 3 up to 177. Bits at or beyond the
//! width are always 0. Rows are stored with [`PAD_TOP`] zero rows above and [`PAD_BOTTOM`]
//! below the symbol so that the penalty scan can look 4 rows up and 10 rows down without
//! bounds checks (the padding reads as light, i.e. quiet zone).

use super::version;
use super::Ec;
use std::sync::OnceLock;

/// Largest symbol width (version 40).
pub const MAX_WIDTH: usize = 177;
/// Zero rows stored above row 0.
pub const PAD_TOP: usize = 4;
/// Zero rows stored below the last row.
pub const PAD_BOTTOM: usize = 11;
const ROWS: usize = PAD_TOP + MAX_WIDTH + PAD_BOTTOM;

/// One row of modules.
pub type Row<const N: usize> = [u64; N];

/// A square bit matrix of `size` × `size` modules.
#[derive(Clone)]
pub struct Grid<const N: usize> {
    /// Modules per side (the symbol width, 21..=177); columns at or beyond it stay 0.
    pub size: usize,
    rows: [Row<N>; ROWS],
}

impl<const N: usize> Grid<N> {
    /// An all-light grid of `size` × `size` modules.
    ///
    /// # Panics
    /// If `size` does not fit `N` words per row (`size > 64 × N`) or exceeds [`MAX_WIDTH`].
    pub fn new(size: usize) -> Self {
        assert!(size <= 64 * N && size <= MAX_WIDTH);
        Grid { size, rows: [[0; N]; ROWS] }
    }

    /// Row `y` (0-based), or a padding row for `y` in `-PAD_TOP..0` and `size..size+PAD_BOTTOM`
    /// (pass `y + PAD_TOP` as `padded`).
    #[inline(always)]
    pub fn padded_row(&self, padded: usize) -> &Row<N> {
        &self.rows[padded]
    }

    /// Row `y` (0-based, `y < size`) of the symbol.
    #[inline(always)]
    pub fn row(&self, y: usize) -> &Row<N> {
        &self.rows[y + PAD_TOP]
    }

    /// Row `y` (0-based, `y < size`) of the symbol, for writing; keep bits at or beyond
    /// `size` at 0.
    #[inline(always)]
    pub fn row_mut(&mut self, y: usize) -> &mut Row<N> {
        &mut self.rows[y + PAD_TOP]
    }

    /// Whether the module at column `x`, row `y` (both `< size`) is dark.
    #[inline(always)]
    pub fn get(&self, x: usize, y: usize) -> bool {
        (self.rows[y + PAD_TOP][x / 64] >> (x % 64)) & 1 != 0
    }

    /// Makes the module at column `x`, row `y` (both `< size`) dark or light.
    #[inline(always)]
    pub fn set(&mut self, x: usize, y: usize, dark: bool) {
        let w = &mut self.rows[y + PAD_TOP][x / 64];
        let bit = 1u64 << (x % 64);
        if dark {
            *w |= bit;
        } else {
            *w &= !bit;
        }
    }

    /// Row-major `Vec<bool>`, `true` = dark.
    pub fn to_bools(&self) -> Vec<bool> {
        let size = self.size;
        let mut out = vec![false; size * size];
        for (y, line) in out.chunks_exact_mut(size).enumerate() {
            let row = self.row(y);
            let mut chunks = line.chunks_exact_mut(8);
            for (i, chunk) in chunks.by_ref().enumerate() {
                let x = i * 8;
                let byte = (row[x / 64] >> (x % 64)) as u8;
                chunk.copy_from_slice(&BYTE_TO_BOOLS[byte as usize]);
            }
            let rest = chunks.into_remainder();
            let x = size - rest.len();
            let byte = (row[x / 64] >> (x % 64)) as u8;
            for (k, b) in rest.iter_mut().enumerate() {
                *b = (byte >> k) & 1 != 0;
            }
        }
        out
    }
}

/// Bits 0..8 of each byte value as booleans, bit 0 first.
static BYTE_TO_BOOLS: [[bool; 8]; 256] = {
    let mut t = [[false; 8]; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 8 {
            t[b][i] = (b >> i) & 1 != 0;
            i += 1;
        }
        b += 1;
    }
    t
};

/// The fixed part of a symbol of one version: `modules` holds the function patterns (and
/// the version information, which does not depend on the mask); `function` marks every
/// module that is not data (function patterns plus the reserved format-information areas);
/// `visits` is the placement order (§7.7.3) as one entry per row visited by a two-column
/// strip: `(flat word index << 8) | (bit of the first module << 2) | modules (1 or 2)`, the
/// second module (if any) being the bit just below the first in the same word.
pub struct Template<const N: usize> {
    /// The function patterns and version information as drawn, data modules light.
    pub modules: Grid<N>,
    /// 1 for every module that is not data: masks and placement leave these alone.
    pub function: Grid<N>,
    visits: Vec<u32>,
}

/// One template per version, built on first use and kept (a few KiB each; 130 KiB for
/// version 40), so repeated encodes skip drawing function patterns and walking the zigzag.
pub trait Cached: Sized + 'static {
    /// The template of `version` (1..=40), built on the first call for that version.
    ///
    /// # Panics
    /// If `version` is above 40.
    fn cached(version: u8) -> &'static Self;
}

macro_rules! cached_templates {
    ($($n:literal),*) => {$(
        impl Cached for Template<$n> {
            fn cached(version: u8) -> &'static Self {
                static CACHE: [OnceLock<Template<$n>>; 41] = [const { OnceLock::new() }; 41];
                CACHE[version as usize].get_or_init(|| Template::new(version))
            }
        }
    )*};
}
cached_templates!(1, 2, 3);

impl<const N: usize> Template<N> {
    /// Draws the function patterns of `version` (1..=40) and computes its placement order;
    /// [`Cached::cached`] keeps the result, so encoders call that instead.
    ///
    /// # Panics
    /// If `version` is not in 1..=40 or its width does not fit `N` words per row.
    pub fn new(version: u8) -> Self {
        let size = version::width(version);
        let mut t = Template { modules: Grid::new(size), function: Grid::new(size), visits: Vec::new() };
        // Timing patterns (row 6 and column 6), dark at even indices.
        for i in 0..size {
            t.put(6, i, i % 2 == 0);
            t.put(i, 6, i % 2 == 0);
        }
        // Finder patterns with their separators.
        t.finder(3, 3);
        t.finder(size - 4, 3);
        t.finder(3, size - 4);
        // Alignment patterns, except where they would overlap a finder.
        let (pos, n) = version::alignment_positions(version);
        for i in 0..n {
            for j in 0..n {
                // Skip the three finder corners: (first, first), (first, last), (last, first).
                let corner = (i == 0 || j == 0) && (i + j == 0 || i + j == n - 1);
                if !corner {
                    t.alignment(pos[i], pos[j]);
                }
            }
        }
        // Reserve both format-information areas (written per mask) and the dark module.
        for i in 0..9 {
            t.reserve(8, i);
            t.reserve(i, 8);
        }
        for i in 0..8 {
            t.reserve(size - 1 - i, 8);
            t.reserve(8, size - 1 - i);
        }
        t.put(8, size - 8, true);
        // Version information (versions ≥ 7): two 6×3 blocks.
        if version >= 7 {
            let bits = version::version_bits(version);
            for i in 0..18 {
                let dark = (bits >> i) & 1 != 0;
                let a = size - 11 + i % 3;
                let b = i / 3;
                t.put(a, b, dark);
                t.put(b, a, dark);
            }
        }
        t.visits = t.zigzag();
        t
    }

    fn put(&mut self, x: usize, y: usize, dark: bool) {
        self.modules.set(x, y, dark);
        self.function.set(x, y, true);
    }

    fn reserve(&mut self, x: usize, y: usize) {
        self.function.set(x, y, true);
    }

    fn finder(&mut self, cx: usize, cy: usize) {
        let size = self.modules.size as isize;
        for dy in -4isize..=4 {
            for dx in -4isize..=4 {
                let (x, y) = (cx as isize + dx, cy as isize + dy);
                if (0..size).contains(&x) && (0..size).contains(&y) {
                    let d = dx.abs().max(dy.abs());
                    self.put(x as usize, y as usize, d != 2 && d != 4);
                }
            }
        }
    }

    fn alignment(&mut self, cx: usize, cy: usize) {
        for dy in -2isize..=2 {
            for dx in -2isize..=2 {
                let d = dx.abs().max(dy.abs());
                self.put((cx as isize + dx) as usize, (cy as isize + dy) as usize, d != 1);
            }
        }
    }

    /// The data modules in the zigzag order of §7.7.3: two-module columns from the right,
    /// alternately upwards and downwards, skipping function modules and the vertical timing
    /// column.
    fn zigzag(&self) -> Vec<u32> {
        let size = self.modules.size;
        let mut visits = Vec::with_capacity(size * size / 2);
        let entry = |x: usize, y: usize, n: u32| {
            let flat = (y + PAD_TOP) * N + x / 64;
            ((flat as u32) << 8) | (((x % 64) as u32) << 2) | n
        };
        let mut right = size - 1;
        loop {
            if right == 6 {
                right = 5;
            }
            let upward = (right + 1) & 2 == 0;
            for vert in 0..size {
                let y = if upward { size - 1 - vert } else { vert };
                let free_r = !self.function.get(right, y);
                let free_l = !self.function.get(right - 1, y);
                if free_r && free_l && !right.is_multiple_of(64) {
                    visits.push(entry(right, y, 2));
                } else {
                    if free_r {
                        visits.push(entry(right, y, 1));
                    }
                    if free_l {
                        visits.push(entry(right - 1, y, 1));
                    }
                }
            }
            if right < 3 {
                break;
            }
            right -= 2;
        }
        visits
    }

    /// Places `codewords` (MSB first) on the data modules in zigzag order; left-over
    /// remainder modules stay light.
    pub fn place(&self, codewords: &[u8]) -> Grid<N> {
        let mut g = self.modules.clone();
        let words = g.rows.as_flattened_mut();
        // Bit stream, most significant bit first: `avail` bits at the top of `acc`; zeros
        // after the last codeword (remainder bits).
        let (mut acc, mut avail) = (0u64, 0u32);
        let mut bytes = codewords.iter();
        for &v in &self.visits {
            let n = v & 3;
            if avail < 2 {
                while avail <= 56 {
                    acc |= (bytes.next().copied().unwrap_or(0) as u64) << (56 - avail);
                    avail += 8;
                }
            }
            let bits = acc >> (64 - n);
            acc <<= n;
            avail -= n;
            words[(v >> 8) as usize] |= bits << (((v >> 2) & 63) + 1 - n);
        }
        g
    }
}

/// Writes the 15 format-information bits for `ec` and `mask` into both copies (§7.9.1).
pub fn draw_format<const N: usize>(g: &mut Grid<N>, ec: Ec, mask: u8) {
    let bits = version::format_bits(ec, mask);
    let size = g.size;
    let bit = |i: usize| (bits >> i) & 1 != 0;
    // First copy, around the top-left finder.
    for i in 0..6 {
        g.set(8, i, bit(i));
    }
    g.set(8, 7, bit(6));
    g.set(8, 8, bit(7));
    g.set(7, 8, bit(8));
    for i in 9..15 {
        g.set(14 - i, 8, bit(i));
    }
    // Second copy, split between the top-right and bottom-left finders.
    for i in 0..8 {
        g.set(size - 1 - i, 8, bit(i));
    }
    for i in 8..15 {
        g.set(8, size - 15 + i, bit(i));
    }
}
