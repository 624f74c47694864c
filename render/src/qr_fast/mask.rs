//! Data masks (ISO/IEC 18004:2015 §7.8.2, Table 10) and mask selection by penalty score
//! (§7.8.3.1, Table 11), evaluated on the whole symbol including format and version
//! information.
//!
//! # Penalty rules as implemented
//!
//! - **N1 = 3**: each run of ≥ 5 same-coloured modules in a row or column scores
//!   3 + (run − 5).
//! - **N2 = 3**: each 2 × 2 block of one colour (overlapping blocks each count), which is
//!   the same as 3 × (m − 1) × (n − 1) for an m × n block.
//! - **N3 = 40**: each occurrence in a row or column of dark-light-dark-dark-dark-light-dark
//!   (1:1:3:1:1) that has 4 light modules immediately before it **or** after it (once per
//!   occurrence, like ZXing and libqrencode); modules outside the symbol count as light
//!   (quiet zone).
//! - **N4 = 10**: 10 × k where k = ⌊|dark% − 50| / 5⌋, computed exactly in integers as
//!   ⌊|20 · dark − 10 · total| / total⌋ (again as ZXing does).
//!
//! The lowest total wins; ties go to the lowest mask number.
//!
//! # Speed
//!
//! Everything is bit-parallel on 64-bit words: row rules use shifts within a row, column
//! rules AND/OR whole neighbouring rows (so 64 columns are scored at once and the matrix is
//! never transposed). Runs: a bit set in `d5 = r & r>>1 & … & r>>4` marks a window of five
//! equal modules; a run of length L contributes L − 4 such bits and one "start" bit
//! (`d5 & !(d5<<1)`), so N1 = popcount(d5) + 2 · popcount(starts). Mask patterns are a
//! compile-time table indexed by `y mod 12`, ANDed with the non-function modules.

use super::matrix::{draw_format, Grid, Row, Template, PAD_TOP};
use super::Ec;

/// Whether mask `m` inverts module (column `x`, row `y`) — Table 10 (i = row, j = column).
// Written as in the standard's table, with `%`.
#[allow(clippy::manual_is_multiple_of)]
pub const fn mask_bit(m: u8, x: usize, y: usize) -> bool {
    match m {
        0 => (x + y) % 2 == 0,
        1 => y % 2 == 0,
        2 => x % 3 == 0,
        3 => (x + y) % 3 == 0,
        4 => (y / 2 + x / 3) % 2 == 0,
        5 => (x * y) % 2 + (x * y) % 3 == 0,
        6 => ((x * y) % 2 + (x * y) % 3) % 2 == 0,
        _ => ((x + y) % 2 + (x * y) % 3) % 2 == 0,
    }
}

/// Every mask pattern repeats every 12 rows (lcm of the periods 2, 3, 4, 6).
const MASK_ROW_PERIOD: usize = 12;
const MASK_WORDS: usize = 3;

const fn build_mask_rows() -> [[[u64; MASK_WORDS]; MASK_ROW_PERIOD]; 8] {
    let mut out = [[[0u64; MASK_WORDS]; MASK_ROW_PERIOD]; 8];
    let mut m = 0;
    while m < 8 {
        let mut y = 0;
        while y < MASK_ROW_PERIOD {
            let mut x = 0;
            while x < 64 * MASK_WORDS {
                if mask_bit(m as u8, x, y) {
                    out[m][y][x / 64] |= 1 << (x % 64);
                }
                x += 1;
            }
            y += 1;
        }
        m += 1;
    }
    out
}

static MASK_ROWS: [[[u64; MASK_WORDS]; MASK_ROW_PERIOD]; 8] = build_mask_rows();

// ---- row (bit-set) helpers --------------------------------------------------------------

/// `r >> k` across words: bit x of the result is bit x + k of `r` (0 past the end).
#[inline(always)]
fn shr<const N: usize>(r: &Row<N>, k: u32) -> Row<N> {
    let mut o = [0u64; N];
    for w in 0..N {
        o[w] = r[w] >> k;
        if w + 1 < N {
            o[w] |= r[w + 1] << (64 - k);
        }
    }
    o
}

/// `r << k` across words: bit x of the result is bit x − k of `r` (0 before the start).
#[inline(always)]
fn shl<const N: usize>(r: &Row<N>, k: u32) -> Row<N> {
    let mut o = [0u64; N];
    for w in 0..N {
        o[w] = r[w] << k;
        if w > 0 {
            o[w] |= r[w - 1] >> (64 - k);
        }
    }
    o
}

#[inline(always)]
fn zip<const N: usize>(a: &Row<N>, b: &Row<N>, f: impl Fn(u64, u64) -> u64) -> Row<N> {
    let mut o = [0u64; N];
    for w in 0..N {
        o[w] = f(a[w], b[w]);
    }
    o
}

#[inline(always)]
fn popcount<const N: usize>(r: &Row<N>) -> u32 {
    r.iter().map(|w| w.count_ones()).sum()
}

fn width_mask<const N: usize>(size: usize) -> Row<N> {
    let mut o = [0u64; N];
    for (w, word) in o.iter_mut().enumerate() {
        let lo = w * 64;
        *word = if size >= lo + 64 {
            !0
        } else if size > lo {
            (1u64 << (size - lo)) - 1
        } else {
            0
        };
    }
    o
}

/// For one line given as a bit set of one colour (bits outside the line 0): the 5-windows
/// (`d5`) and the run starts (`d5 & !(d5 << 1)`); N1 = popcount(d5) + 2 · popcount(starts).
#[inline(always)]
fn run_windows<const N: usize>(r: &Row<N>) -> (Row<N>, Row<N>) {
    let d2 = zip(r, &shr(r, 1), |a, b| a & b);
    let d4 = zip(&d2, &shr(&d2, 2), |a, b| a & b);
    let d5 = zip(&d4, &shr(r, 4), |a, b| a & b);
    let starts = zip(&d5, &shl(&d5, 1), |a, b| a & !b);
    (d5, starts)
}

/// Penalty score of a finished symbol (see the module docs for the rules).
pub fn penalty<const N: usize>(g: &Grid<N>) -> u32 {
    penalty_impl(g)
}

#[inline(always)]
fn penalty_impl<const N: usize>(g: &Grid<N>) -> u32 {
    let size = g.size;
    let wmask = width_mask::<N>(size);
    let wmask2 = width_mask::<N>(size - 1);
    let mut n1 = 0u32;
    let mut n2 = 0u32;
    let mut n3 = 0u32;
    let mut dark = 0u32;

    // Rows: N1, N3 horizontally, N2 on row pairs, dark count.
    for y in 0..size {
        let a = g.row(y);
        dark += popcount(a);
        let light = zip(&wmask, a, |m, a| m & !a);
        // Dark and light windows never overlap: count them together.
        let (dd, ds) = run_windows(a);
        let (ld, ls) = run_windows(&light);
        for w in 0..N {
            n1 += (dd[w] | ld[w]).count_ones() + 2 * (ds[w] | ls[w]).count_ones();
        }

        // N3: pattern 1011101 starting at x, light (or outside) on x-4..x or x+7..x+11.
        let s1 = shr(a, 1);
        let s2 = shr(a, 2);
        let s3 = shr(a, 3);
        let s4 = shr(a, 4);
        let s5 = shr(a, 5);
        let s6 = shr(a, 6);
        let mut core = [0u64; N];
        for w in 0..N {
            core[w] = a[w] & !s1[w] & s2[w] & s3[w] & s4[w] & !s5[w] & s6[w];
        }
        if core.iter().any(|&w| w != 0) {
            let before = {
                let (b1, b2, b3, b4) = (shl(a, 1), shl(a, 2), shl(a, 3), shl(a, 4));
                let mut o = [0u64; N];
                for w in 0..N {
                    o[w] = !(b1[w] | b2[w] | b3[w] | b4[w]);
                }
                o
            };
            let after = {
                let (c7, c8, c9, c10) = (shr(a, 7), shr(a, 8), shr(a, 9), shr(a, 10));
                let mut o = [0u64; N];
                for w in 0..N {
                    o[w] = !(c7[w] | c8[w] | c9[w] | c10[w]);
                }
                o
            };
            for w in 0..N {
                n3 += (core[w] & (before[w] | after[w])).count_ones();
            }
        }

        // N2: 2×2 blocks with top-left corner at (x, y).
        if y + 1 < size {
            let b = g.row(y + 1);
            let mut blk = 0u32;
            let mut same_v = [0u64; N];
            for w in 0..N {
                same_v[w] = !(a[w] ^ b[w]);
            }
            let same_v1 = shr(&same_v, 1);
            for w in 0..N {
                let same_h = !(a[w] ^ s1[w]);
                blk += (same_v[w] & same_v1[w] & same_h & wmask2[w]).count_ones();
            }
            n2 += blk;
        }
    }

    // Columns, 64 at a time. Padded row index p = y + PAD_TOP.
    let r = |y: usize| g.padded_row(y);
    let mut prev_d5 = [0u64; N];
    let mut prev_l5 = [0u64; N];
    for y in 0..=size - 5 {
        let p = y + PAD_TOP;
        let mut d5 = [0u64; N];
        let mut l5 = [0u64; N];
        for w in 0..N {
            let (a, b, c, d, e) = (r(p)[w], r(p + 1)[w], r(p + 2)[w], r(p + 3)[w], r(p + 4)[w]);
            d5[w] = a & b & c & d & e;
            l5[w] = wmask[w] & !(a | b | c | d | e);
        }
        for w in 0..N {
            let starts = (d5[w] & !prev_d5[w]) | (l5[w] & !prev_l5[w]);
            n1 += (d5[w] | l5[w]).count_ones() + 2 * starts.count_ones();
        }
        prev_d5 = d5;
        prev_l5 = l5;
    }
    for y in 0..=size - 7 {
        let p = y + PAD_TOP;
        for w in 0..N {
            let core = r(p)[w] & !r(p + 1)[w] & r(p + 2)[w] & r(p + 3)[w] & r(p + 4)[w] & !r(p + 5)[w] & r(p + 6)[w];
            if core != 0 {
                let before = !(r(p - 1)[w] | r(p - 2)[w] | r(p - 3)[w] | r(p - 4)[w]);
                let after = !(r(p + 7)[w] | r(p + 8)[w] | r(p + 9)[w] | r(p + 10)[w]);
                n3 += (core & (before | after)).count_ones();
            }
        }
    }

    let total = (size * size) as u32;
    let k = (20 * dark).abs_diff(10 * total) / total;
    n1 + 3 * n2 + 40 * n3 + 10 * k
}

/// Applies mask `m` to the data modules of `placed` and draws the format information.
pub fn apply<const N: usize>(placed: &Grid<N>, t: &Template<N>, ec: Ec, m: u8) -> Grid<N> {
    let mut g = Grid::new(placed.size);
    apply_into(placed, t, ec, m, &mut g);
    g
}

/// [`apply`] into `out` (same size; only the symbol's rows are written, padding rows are
/// left as they are, i.e. zero).
#[inline(always)]
fn apply_into<const N: usize>(placed: &Grid<N>, t: &Template<N>, ec: Ec, m: u8, out: &mut Grid<N>) {
    let pat = &MASK_ROWS[m as usize];
    // The pattern table is 192 bits wide: keep bits beyond the width clear.
    let wm = width_mask::<N>(placed.size);
    for y in 0..placed.size {
        let func = t.function.row(y);
        let src = placed.row(y);
        let pr = &pat[y % MASK_ROW_PERIOD];
        let row = out.row_mut(y);
        for w in 0..N {
            row[w] = src[w] ^ (pr[w] & !func[w] & wm[w]);
        }
    }
    draw_format(out, ec, m);
}

/// Tries all eight masks and returns the one with the lowest penalty (lowest number on a
/// tie) with its finished matrix.
pub fn choose<const N: usize>(placed: &Grid<N>, t: &Template<N>, ec: Ec) -> (u8, Grid<N>) {
    #[cfg(target_arch = "x86_64")]
    {
        // The scorer is mostly popcounts; the baseline x86-64 target has no POPCNT
        // instruction, so use it where the CPU has it (all x86-64 CPUs since ~2008).
        if std::arch::is_x86_feature_detected!("popcnt") {
            // SAFETY: `choose_popcnt` is safe code compiled with `popcnt` enabled; its only
            // requirement is that the CPU has that feature, detected just above.
            return unsafe { choose_popcnt(placed, t, ec) };
        }
    }
    choose_impl(placed, t, ec)
}

/// # Safety
/// The CPU must support `popcnt` (the caller checks it at run time).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "popcnt")]
unsafe fn choose_popcnt<const N: usize>(placed: &Grid<N>, t: &Template<N>, ec: Ec) -> (u8, Grid<N>) {
    choose_impl(placed, t, ec)
}

#[inline(always)]
fn choose_impl<const N: usize>(placed: &Grid<N>, t: &Template<N>, ec: Ec) -> (u8, Grid<N>) {
    let mut g = Grid::new(placed.size);
    let (mut best, mut best_mask) = (u32::MAX, 0u8);
    for m in 0..8u8 {
        apply_into(placed, t, ec, m, &mut g);
        let p = penalty_impl(&g);
        if p < best {
            (best, best_mask) = (p, m);
        }
    }
    if best_mask != 7 {
        apply_into(placed, t, ec, best_mask, &mut g);
    }
    (best_mask, g)
}
