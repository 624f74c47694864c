//! A fast QR code encoder (ISO/IEC 18004:2015, model 2; numeric, alphanumeric and byte
//! modes).
//!
//! [`encode`] splits the data into numeric / alphanumeric / byte segments with the fewest
//! bits ([`segment`], exact dynamic programming over the character-count widths of each
//! version range 1–9, 10–26, 27–40), takes the smallest version (1..=40) that holds them at
//! the requested error-correction level, and the mask with the lowest penalty score (rules
//! in [`mask`]). For the same segments, version and mask the symbol is module for module
//! the one the `qrcode` crate draws (checked in the tests for all masks, versions,
//! levels), and the version is never larger than the one the `qrcode` crate's automatic
//! mode picks (its segmentation is greedy; this one is optimal): a 150-byte static BR
//! Code is version 6 at M, where one byte-mode segment would need version 8. The crate
//! does differ in two ways: it never uses Kanji mode (the `qrcode` crate does for UTF-8
//! bytes that happen to look like Shift JIS, which readers then decode as Shift JIS), and
//! its mask penalty N4 is the standard's 10 × ⌊|dark % − 50| / 5⌋, where the `qrcode`
//! crate scores 2 × |dark % − 50|, so the two can choose different masks.
//!
//! Where the time goes, for a 150-byte payload at M (version 8 in byte mode): choosing the
//! mask (eight masked symbols scored) ≈ 55 %, placing codewords ≈ 20 %, Reed-Solomon ≈ 7 %,
//! the rest small. Each step is word-parallel: rows are 64-bit words ([`matrix`]), penalties
//! are computed with shifts, AND/OR of neighbouring rows and popcounts ([`mask`]), RS uses a
//! per-degree product table and a 32-byte shift register ([`rs`]), and the per-version
//! function patterns and zigzag order are built once per version and cached
//! ([`matrix::Cached`]).
//!
//! Layout: [`segment`] (modes and segmentation), [`bits`] (data codewords), [`rs`]
//! (Reed-Solomon, block interleaving), [`version`] (tables, format/version information),
//! [`matrix`] (function patterns, placement), [`mask`] (masks and penalty).

pub mod bits;
pub mod mask;
pub mod matrix;
pub mod rs;
pub mod segment;
pub mod version;

#[cfg(test)]
mod tests;

use thiserror::Error;

/// Error-correction level (§7.5.1): recovers about 7 %, 15 %, 25 %, 30 % of codewords.
///
/// The discriminant is the row of the level in the [`version`] tables (L, M, Q, H order),
/// not its 2-bit format-information code (§7.9.1, [`version::format_bits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ec {
    /// Level L: about 7 % of codewords recoverable; the most data per version.
    L = 0,
    /// Level M: about 15 % recoverable; what pixgate uses for every Pix QR code.
    M = 1,
    /// Level Q: about 25 % recoverable.
    Q = 2,
    /// Level H: about 30 % recoverable; the least data per version.
    H = 3,
}

/// A QR symbol without quiet zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    /// Modules per side (17 + 4 × version).
    pub width: usize,
    /// Version 1..=40.
    pub version: u8,
    /// Data mask pattern 0..=7 (Table 10 reference).
    pub mask: u8,
    /// `width × width` modules, row-major (`y * width + x`), `true` = dark.
    pub modules: Vec<bool>,
}

impl Symbol {
    /// Whether the module at column `x`, row `y` is dark; `false` outside the symbol.
    pub fn get(&self, x: usize, y: usize) -> bool {
        x < self.width && y < self.width && self.modules[y * self.width + x]
    }
}

/// The data does not fit: its `len` bytes need `bits` data bits (segments as chosen for
/// `version`), and `version` at `ec` holds `max_bits` (version 40, or the version forced
/// with [`Options::version`]). In byte mode alone version 40 holds 2953 / 2331 / 1663 /
/// 1273 bytes at L / M / Q / H; digits and uppercase text fit more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("{len} bytes need {bits} data bits, more than the {max_bits} a version-{version} QR code holds at error correction {ec:?}")]
pub struct TooLong {
    /// Size of the data, in bytes.
    pub len: usize,
    /// Data bits the segments need in `version` (mode indicators, character counts and
    /// payload, before the terminator and padding).
    pub bits: usize,
    /// Data bits `version` holds at `ec` (its data codewords × 8).
    pub max_bits: usize,
    /// The version tried: 40, or the one forced with [`Options::version`].
    pub version: u8,
    /// The error-correction level asked for.
    pub ec: Ec,
}

/// Choices [`encode_with`] can force; the default chooses everything as [`encode`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// Use this version (1..=40) instead of the smallest that holds the data.
    pub version: Option<u8>,
    /// Use this mask (0..=7) instead of the lowest-penalty one.
    pub mask: Option<u8>,
    /// Write the data as one byte-mode segment instead of the optimal segmentation.
    pub byte_mode_only: bool,
}

/// Encodes `data` at level `ec` with the optimal segmentation, in the smallest version
/// that holds it, with the lowest-penalty mask.
///
/// # Errors
/// [`TooLong`] when not even version 40 holds the data.
pub fn encode(data: &[u8], ec: Ec) -> Result<Symbol, TooLong> {
    encode_with(data, ec, Options::default())
}

/// [`encode`] with the version, the mask and/or the segmentation forced (see [`Options`]).
///
/// # Errors
/// [`TooLong`] if the data does not fit the forced version (or version 40).
///
/// # Panics
/// If a forced version is outside 1..=40 or a forced mask outside 0..=7.
pub fn encode_with(data: &[u8], ec: Ec, opts: Options) -> Result<Symbol, TooLong> {
    if let Some(v) = opts.version {
        assert!((1..=40).contains(&v), "QR version {v} is not in 1..=40");
    }
    if let Some(m) = opts.mask {
        assert!(m < 8, "QR mask {m} is not in 0..=7");
    }
    let segment_for = |v: u8| if opts.byte_mode_only { segment::byte_only(data) } else { segment::optimal(data, v) };
    let (version, segments) = match opts.version {
        Some(v) => (v, segment_for(v)),
        // One segmentation per version range (count widths differ); the cost only grows
        // from one range to the next, so the first range with a fitting version has the
        // smallest one.
        None => {
            let mut chosen = None;
            for (first, last) in [(1u8, 9u8), (10, 26), (27, 40)] {
                let segs = segment_for(first);
                let bits = segment::total_bits(&segs, first);
                let fits = (first..=last).find(|&v| version::data_codewords(v, ec) * 8 >= bits);
                // Past version 40 this is (40, segs), refused just below.
                chosen = Some((fits.unwrap_or(last), segs));
                if fits.is_some() {
                    break;
                }
            }
            chosen.expect("three version ranges")
        }
    };
    let bits = segment::total_bits(&segments, version);
    let max_bits = version::data_codewords(version, ec) * 8;
    if bits > max_bits {
        return Err(TooLong { len: data.len(), bits, max_bits, version, ec });
    }
    let data_cw = bits::data_codewords(data, &segments, version, ec);
    let codewords = rs::interleave(&data_cw, version, ec);
    let width = version::width(version);
    let (mask, modules) = if width <= 64 {
        build::<1>(&codewords, version, ec, opts.mask)
    } else if width <= 128 {
        build::<2>(&codewords, version, ec, opts.mask)
    } else {
        build::<3>(&codewords, version, ec, opts.mask)
    };
    Ok(Symbol { width, version, mask, modules })
}

fn build<const N: usize>(codewords: &[u8], version: u8, ec: Ec, mask: Option<u8>) -> (u8, Vec<bool>)
where
    matrix::Template<N>: matrix::Cached,
{
    let template = <matrix::Template<N> as matrix::Cached>::cached(version);
    let placed = template.place(codewords);
    let (m, grid) = match mask {
        Some(m) => (m, mask::apply(&placed, template, ec, m)),
        None => mask::choose(&placed, template, ec),
    };
    (m, grid.to_bools())
}

/// The penalty score (rules in [`mask`]) of a finished symbol, computed with the fast
/// bit-parallel scorer the encoder uses.
pub fn penalty(symbol: &Symbol) -> u32 {
    fn run<const N: usize>(s: &Symbol) -> u32 {
        let mut g = matrix::Grid::<N>::new(s.width);
        for y in 0..s.width {
            for x in 0..s.width {
                g.set(x, y, s.get(x, y));
            }
        }
        mask::penalty(&g)
    }
    match symbol.width.div_ceil(64) {
        1 => run::<1>(symbol),
        2 => run::<2>(symbol),
        _ => run::<3>(symbol),
    }
}
