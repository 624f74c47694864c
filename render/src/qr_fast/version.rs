//! Version and error-correction tables (ISO/IEC 18004:2015 §7.4.10 Table 7, §7.5.1 Table 9),
//! alignment-pattern positions (Annex E) and the BCH-coded format (§7.9) and version (§7.10)
//! information.

use super::Ec;

/// Error-correction codewords per block, by level (L, M, Q, H) then version (index 0 unused).
const ECC_PER_BLOCK: [[u8; 41]; 4] = [
    [
        0, 7, 10, 15, 20, 26, 18, 20, 24, 30, 18, 20, 24, 26, 30, 22, 24, 28, 30, 28, 28, 28, 28, 30, 30, 26, 28, 30,
        30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30,
    ],
    [
        0, 10, 16, 26, 18, 24, 16, 18, 22, 22, 26, 30, 22, 22, 24, 24, 28, 28, 26, 26, 26, 26, 28, 28, 28, 28, 28, 28,
        28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    ],
    [
        0, 13, 22, 18, 26, 18, 24, 18, 22, 20, 24, 28, 26, 24, 20, 30, 24, 28, 28, 26, 30, 28, 30, 30, 30, 30, 28, 30,
        30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30,
    ],
    [
        0, 17, 28, 22, 16, 22, 28, 26, 26, 24, 28, 24, 28, 22, 24, 24, 30, 28, 28, 26, 28, 30, 24, 30, 30, 30, 30, 30,
        30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30,
    ],
];

/// Number of error-correction blocks, by level (L, M, Q, H) then version (index 0 unused).
const NUM_BLOCKS: [[u8; 41]; 4] = [
    [
        0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 4, 4, 6, 6, 6, 6, 7, 8, 8, 9, 9, 10, 12, 12, 12, 13, 14, 15, 16, 17, 18,
        19, 19, 20, 21, 22, 24, 25,
    ],
    [
        0, 1, 1, 1, 2, 2, 4, 4, 4, 5, 5, 5, 8, 9, 9, 10, 10, 11, 13, 14, 16, 17, 17, 18, 20, 21, 23, 25, 26, 28, 29,
        31, 33, 35, 37, 38, 40, 43, 45, 47, 49,
    ],
    [
        0, 1, 1, 2, 2, 4, 4, 6, 6, 8, 8, 8, 10, 12, 16, 12, 17, 16, 18, 21, 20, 23, 23, 25, 27, 29, 34, 34, 35, 38, 40,
        43, 45, 48, 51, 53, 56, 59, 62, 65, 68,
    ],
    [
        0, 1, 1, 2, 4, 4, 4, 5, 6, 8, 8, 11, 11, 16, 16, 18, 16, 19, 21, 25, 25, 25, 34, 30, 32, 35, 37, 40, 42, 45,
        48, 51, 54, 57, 60, 63, 66, 70, 74, 77, 81,
    ],
];

/// Modules per side: 17 + 4 × version.
pub const fn width(version: u8) -> usize {
    17 + 4 * version as usize
}

/// Modules available for data and error correction (everything but function patterns,
/// format and version information).
pub const fn raw_data_modules(version: u8) -> usize {
    let v = version as usize;
    let mut r = (16 * v + 128) * v + 64;
    if v >= 2 {
        let align = v / 7 + 2;
        r -= (25 * align - 10) * align - 55;
        if v >= 7 {
            r -= 36;
        }
    }
    r
}

/// Codewords in the symbol (data + error correction); remainder bits are dropped.
pub const fn total_codewords(version: u8) -> usize {
    raw_data_modules(version) / 8
}

/// Error-correction codewords per block.
pub fn ecc_per_block(version: u8, ec: Ec) -> usize {
    ECC_PER_BLOCK[ec as usize][version as usize] as usize
}

/// Number of error-correction blocks.
pub fn num_blocks(version: u8, ec: Ec) -> usize {
    NUM_BLOCKS[ec as usize][version as usize] as usize
}

/// Data codewords (before error correction).
pub fn data_codewords(version: u8, ec: Ec) -> usize {
    total_codewords(version) - ecc_per_block(version, ec) * num_blocks(version, ec)
}

/// Bits of the byte-mode character count indicator (§7.4.1 Table 3).
pub const fn byte_count_bits(version: u8) -> usize {
    if version <= 9 {
        8
    } else {
        16
    }
}

/// Most bytes a byte-mode segment can hold in `version` at `ec`.
pub fn byte_capacity(version: u8, ec: Ec) -> usize {
    (data_codewords(version, ec) * 8 - 4 - byte_count_bits(version)) / 8
}

/// The smallest version (1..=40) whose byte-mode capacity holds `len` bytes.
pub fn smallest_version(len: usize, ec: Ec) -> Option<u8> {
    (1..=40u8).find(|&v| byte_capacity(v, ec) >= len)
}

/// Centre coordinates of alignment patterns (same list for rows and columns), ascending.
/// Empty for version 1. Returns the count and a fixed array.
pub fn alignment_positions(version: u8) -> ([usize; 7], usize) {
    let mut out = [0usize; 7];
    if version == 1 {
        return (out, 0);
    }
    let v = version as usize;
    let n = v / 7 + 2;
    let step = if v == 32 { 26 } else { (v * 4 + n * 2 + 1) / (n * 2 - 2) * 2 };
    out[0] = 6;
    for (k, slot) in out[1..n].iter_mut().rev().enumerate() {
        *slot = width(version) - 7 - k * step;
    }
    (out, n)
}

/// Two-bit error-correction indicator of the format information (§7.9.1 Table 12).
const fn ec_format_bits(ec: Ec) -> u32 {
    match ec {
        Ec::L => 0b01,
        Ec::M => 0b00,
        Ec::Q => 0b11,
        Ec::H => 0b10,
    }
}

/// The 15-bit format information (BCH(15,5), generator 0x537, XOR mask 0x5412), bit 14 first.
pub const fn format_bits(ec: Ec, mask: u8) -> u32 {
    let data = (ec_format_bits(ec) << 3) | mask as u32;
    let mut rem = data;
    let mut i = 0;
    while i < 10 {
        rem = (rem << 1) ^ ((rem >> 9) * 0x537);
        i += 1;
    }
    ((data << 10) | rem) ^ 0x5412
}

/// The 18-bit version information (BCH(18,6), generator 0x1F25), for versions 7..=40.
pub const fn version_bits(version: u8) -> u32 {
    let data = version as u32;
    let mut rem = data;
    let mut i = 0;
    while i < 12 {
        rem = (rem << 1) ^ ((rem >> 11) * 0x1F25);
        i += 1;
    }
    (data << 12) | rem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qr_fast_version_tables_match_spec_examples() {
        // Annex C example: level M, mask 101 -> 100000011001110.
        assert_eq!(format_bits(Ec::M, 0b101), 0b100000011001110);
        // Annex D example: version 7 -> 000111110010010100.
        assert_eq!(version_bits(7), 0b000111110010010100);
        // Table 7 spot checks (data codewords): 1-L 19, 1-H 9, 7-M 124, 40-L 2956, 40-H 1276.
        assert_eq!(data_codewords(1, Ec::L), 19);
        assert_eq!(data_codewords(1, Ec::H), 9);
        assert_eq!(data_codewords(7, Ec::M), 124);
        assert_eq!(data_codewords(40, Ec::L), 2956);
        assert_eq!(data_codewords(40, Ec::H), 1276);
        // Byte-mode capacities (Table 7): 1-L 17, 7-M 122, 40-L 2953, 40-M 2331.
        assert_eq!(byte_capacity(1, Ec::L), 17);
        assert_eq!(byte_capacity(7, Ec::M), 122);
        assert_eq!(byte_capacity(40, Ec::L), 2953);
        assert_eq!(byte_capacity(40, Ec::M), 2331);
        assert_eq!(total_codewords(40), 3706);
        // Annex E: version 32 -> 6, 34, 60, 86, 112, 138; version 7 -> 6, 22, 38.
        let (p, n) = alignment_positions(32);
        assert_eq!(&p[..n], &[6, 34, 60, 86, 112, 138]);
        let (p, n) = alignment_positions(7);
        assert_eq!(&p[..n], &[6, 22, 38]);
    }
}
