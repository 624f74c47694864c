//! A fast QR code encoder (ISO/IEC 18004:2015, model 2, byte mode).
//!
//! [`encode`] picks the smallest version (1..=40) whose byte-mode capacity at the requested
//! error-correction level holds the data, and the mask with the lowest penalty score
//! (rules in [`mask`]). For the same bits, version and mask the symbol is module for module
//! the one the `qrcode` crate draws (checked in the tests for all masks, versions, levels).
//!
//! Note: this encoder writes one **byte-mode** segment. The `qrcode` crate's automatic
//! mode (`QrCode::with_error_correction_level`, used by [`crate::qr`]) splits the data into
//! numeric / alphanumeric / byte segments, which for BR Codes (long digit runs, uppercase
//! name and city) often gives a smaller version: a 150-byte static BR Code is version 8
//! here and version 6 there.
//!
//! Where the time goes, for a 150-byte payload at M (version 8): choosing the mask (eight
//! masked symbols scored) ≈ 55 %, placing codewords ≈ 20 %, Reed-Solomon ≈ 7 %, the rest
//! small. Each step is word-parallel: rows are 64-bit words ([`matrix`]), penalties are
//! computed with shifts, AND/OR of neighbouring rows and popcounts ([`mask`]), RS uses a
//! per-degree product table and a 32-byte shift register ([`rs`]), and the per-version
//! function patterns and zigzag order are built once per version and cached
//! ([`matrix::Cached`]).
//!
//! Layout: [`bits`] (data codewords), [`rs`] (Reed-Solomon, block interleaving),
//! [`version`] (tables, format/version information), [`matrix`] (function patterns,
//! placement), [`mask`] (masks and penalty).

pub mod bits;
pub mod mask;
pub mod matrix;
pub mod rs;
pub mod version;

#[cfg(test)]
mod tests;

use thiserror::Error;

/// Error-correction level (§7.5.1): recovers about 7 %, 15 %, 25 %, 30 % of codewords.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ec {
    L = 0,
    M = 1,
    Q = 2,
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

/// The data does not fit: `len` bytes given, `max` bytes fit in byte mode (in version 40,
/// or in the version asked for by [`encode_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("{len} bytes do not fit a QR code at error correction {ec:?}: at most {max} bytes")]
pub struct TooLong {
    pub len: usize,
    pub max: usize,
    pub ec: Ec,
}

/// Encodes `data` as one byte-mode segment at level `ec` in the smallest version that holds
/// it, with the lowest-penalty mask.
///
/// # Errors
/// [`TooLong`] past the version-40 capacity (2953 / 2331 / 1663 / 1273 bytes for L/M/Q/H).
pub fn encode(data: &[u8], ec: Ec) -> Result<Symbol, TooLong> {
    encode_with(data, ec, None, None)
}

/// [`encode`] with the version and/or the mask forced (`None` = choose as [`encode`] does).
/// A forced version must hold the data.
///
/// # Errors
/// [`TooLong`] if the data does not fit the forced version (or version 40).
///
/// # Panics
/// If a forced version is outside 1..=40 or a forced mask outside 0..=7.
pub fn encode_with(data: &[u8], ec: Ec, version: Option<u8>, mask: Option<u8>) -> Result<Symbol, TooLong> {
    let version = match version {
        Some(v) => {
            assert!((1..=40).contains(&v), "QR version {v} is not in 1..=40");
            let max = version::byte_capacity(v, ec);
            if data.len() > max {
                return Err(TooLong { len: data.len(), max, ec });
            }
            v
        }
        None => version::smallest_version(data.len(), ec).ok_or(TooLong { len: data.len(), max: version::byte_capacity(40, ec), ec })?,
    };
    if let Some(m) = mask {
        assert!(m < 8, "QR mask {m} is not in 0..=7");
    }
    let data_cw = bits::data_codewords(data, version, ec);
    let codewords = rs::interleave(&data_cw, version, ec);
    let width = version::width(version);
    let (mask, modules) = if width <= 64 {
        build::<1>(&codewords, version, ec, mask)
    } else if width <= 128 {
        build::<2>(&codewords, version, ec, mask)
    } else {
        build::<3>(&codewords, version, ec, mask)
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
