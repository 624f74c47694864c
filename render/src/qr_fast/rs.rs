//! Reed-Solomon error correction over GF(256) with the QR field polynomial
//! x⁸ + x⁴ + x³ + x² + 1 (0x11D) and generator roots α⁰..α^(n-1) (§7.5.2), and the split of
//! data codewords into blocks and their interleaving (§7.6).
//!
//! Speed: polynomial division is run as a 32-byte shift register held in two `u128`s. For
//! each of the 13 EC block lengths the standard uses (7..=30 codewords), a compile-time table
//! holds the divisor multiplied by every possible factor (256 × 32 bytes, 104 KiB in all,
//! 8 KiB touched per symbol), so each data codeword costs one table row XOR and a byte shift
//! instead of one GF multiplication per EC codeword. [`remainder_reference`] is the plain
//! log/antilog version, kept for the tests.

use super::version;
use super::Ec;

const fn build_tables() -> ([u8; 512], [u8; 256]) {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u32 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= 0x11D;
        }
        i += 1;
    }
    (exp, log)
}

const TABLES: ([u8; 512], [u8; 256]) = build_tables();
static EXP: [u8; 512] = TABLES.0;
static LOG: [u8; 256] = TABLES.1;

const fn gf_mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        TABLES.0[TABLES.1[a as usize] as usize + TABLES.1[b as usize] as usize]
    }
}

const MAX_ECC: usize = 30;

/// Divisor (generator) polynomial of each degree 1..=30, coefficients from x^(n-1) down to
/// x^0 (the leading 1 is implicit), stored as logarithms (all coefficients are non-zero).
const fn build_divisors() -> [[u8; MAX_ECC]; MAX_ECC + 1] {
    let mut out = [[0u8; MAX_ECC]; MAX_ECC + 1];
    let mut degree = 1;
    while degree <= MAX_ECC {
        let mut poly = [0u8; MAX_ECC];
        poly[degree - 1] = 1;
        let mut root: u8 = 1;
        let mut i = 0;
        while i < degree {
            let mut j = 0;
            while j < degree {
                poly[j] = gf_mul(poly[j], root);
                if j + 1 < degree {
                    poly[j] ^= poly[j + 1];
                }
                j += 1;
            }
            root = gf_mul(root, 2);
            i += 1;
        }
        let mut j = 0;
        while j < degree {
            out[degree][j] = TABLES.1[poly[j] as usize];
            j += 1;
        }
        degree += 1;
    }
    out
}

static DIVISORS_LOG: [[u8; MAX_ECC]; MAX_ECC + 1] = build_divisors();

/// EC codewords per block that occur in the standard (Table 9).
const DEGREES: [usize; 13] = [7, 10, 13, 15, 16, 17, 18, 20, 22, 24, 26, 28, 30];

const fn degree_index() -> [u8; MAX_ECC + 1] {
    let mut out = [u8::MAX; MAX_ECC + 1];
    let mut i = 0;
    while i < DEGREES.len() {
        out[DEGREES[i]] = i as u8;
        i += 1;
    }
    out
}

static DEGREE_INDEX: [u8; MAX_ECC + 1] = degree_index();

/// `[hi, lo]`: the 32-byte register image (byte 0 = most significant byte of `hi`) of the
/// degree-`d` divisor times each factor, coefficients from x^(d-1) at byte 0.
const fn build_product_tables() -> [[[u128; 2]; 256]; DEGREES.len()] {
    let mut out = [[[0u128; 2]; 256]; DEGREES.len()];
    let divisors = build_divisors();
    let mut di = 0;
    while di < DEGREES.len() {
        let d = DEGREES[di];
        let mut f = 1;
        while f < 256 {
            let mut j = 0;
            while j < d {
                let coef = TABLES.0[divisors[d][j] as usize];
                let p = gf_mul(coef, f as u8) as u128;
                if j < 16 {
                    out[di][f][0] |= p << (8 * (15 - j));
                } else {
                    out[di][f][1] |= p << (8 * (31 - j));
                }
                j += 1;
            }
            f += 1;
        }
        di += 1;
    }
    out
}

static PRODUCTS: [[[u128; 2]; 256]; DEGREES.len()] = build_product_tables();

/// Writes the `ecc.len()` error-correction codewords of `data` into `ecc`; `ecc.len()` must
/// be one of the standard's block EC lengths (7, 10, 13, 15–18, 20, 22, …, 30).
pub fn remainder(data: &[u8], ecc: &mut [u8]) {
    let degree = ecc.len();
    let di = DEGREE_INDEX.get(degree).copied().unwrap_or(u8::MAX);
    if di == u8::MAX {
        return remainder_reference(data, ecc);
    }
    let table = &PRODUCTS[di as usize];
    let (mut hi, mut lo) = (0u128, 0u128);
    for &b in data {
        let factor = b ^ (hi >> 120) as u8;
        hi = (hi << 8) | (lo >> 120);
        lo <<= 8;
        let row = &table[factor as usize];
        hi ^= row[0];
        lo ^= row[1];
    }
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(&hi.to_be_bytes());
    bytes[16..].copy_from_slice(&lo.to_be_bytes());
    ecc.copy_from_slice(&bytes[..degree]);
}

/// Plain polynomial division with log/antilog tables, any degree 1..=30.
pub fn remainder_reference(data: &[u8], ecc: &mut [u8]) {
    let degree = ecc.len();
    assert!((1..=MAX_ECC).contains(&degree));
    let div = &DIVISORS_LOG[degree][..degree];
    let mut rem = [0u8; MAX_ECC + 1];
    for &b in data {
        let factor = b ^ rem[0];
        rem.copy_within(1..degree, 0);
        rem[degree - 1] = 0;
        if factor != 0 {
            let lf = LOG[factor as usize] as usize;
            for (r, &d) in rem[..degree].iter_mut().zip(div) {
                *r ^= EXP[lf + d as usize];
            }
        }
    }
    ecc.copy_from_slice(&rem[..degree]);
}

/// The final codeword sequence: data split into blocks (short blocks first), each block's
/// EC codewords computed, then data codewords interleaved, then EC codewords interleaved.
pub fn interleave(data: &[u8], version: u8, ec: Ec) -> Vec<u8> {
    let blocks = version::num_blocks(version, ec);
    let ecc_len = version::ecc_per_block(version, ec);
    let total = version::total_codewords(version);
    debug_assert_eq!(data.len(), version::data_codewords(version, ec));
    let short_blocks = blocks - total % blocks;
    let short_data = total / blocks - ecc_len;

    let mut ecc = vec![0u8; blocks * ecc_len];
    let mut out = vec![0u8; total];
    let mut start = 0;
    for b in 0..blocks {
        let len = short_data + usize::from(b >= short_blocks);
        let block = &data[start..start + len];
        remainder(block, &mut ecc[b * ecc_len..(b + 1) * ecc_len]);
        // Data codeword i of block b goes to i × blocks + b, except that the extra last
        // codeword of long blocks comes after all short blocks have ended.
        for (i, &c) in block.iter().enumerate() {
            let pos = if i < short_data { i * blocks + b } else { short_data * blocks + (b - short_blocks) };
            out[pos] = c;
        }
        start += len;
    }
    let data_total = data.len();
    for i in 0..ecc_len {
        for b in 0..blocks {
            out[data_total + i * blocks + b] = ecc[b * ecc_len + i];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qr_fast_rs_annex_i_example() {
        // ISO/IEC 18004 Annex I: "01234567" at 1-M.
        let data = [0x10, 0x20, 0x0C, 0x56, 0x61, 0x80, 0xEC, 0x11, 0xEC, 0x11, 0xEC, 0x11, 0xEC, 0x11, 0xEC, 0x11];
        let mut ecc = [0u8; 10];
        remainder(&data, &mut ecc);
        let mut slow = [0u8; 10];
        remainder_reference(&data, &mut slow);
        assert_eq!(ecc, slow);
        assert_eq!(ecc, [0xA5, 0x24, 0xD4, 0xC1, 0xED, 0x36, 0xC7, 0x87, 0x2C, 0x55]);
    }

    #[test]
    fn qr_fast_rs_matches_qrcode_crate() {
        for degree in [7usize, 10, 13, 15, 16, 17, 18, 20, 22, 24, 26, 28, 30] {
            let data: Vec<u8> = (0..(degree as u32 * 3)).map(|i| (i.wrapping_mul(97) ^ 0x5A) as u8).collect();
            let mut ecc = vec![0u8; degree];
            remainder(&data, &mut ecc);
            assert_eq!(ecc, qrcode::ec::create_error_correction_code(&data, degree), "degree {degree}");
            let mut slow = vec![0u8; degree];
            remainder_reference(&data, &mut slow);
            assert_eq!(ecc, slow, "degree {degree}");
        }
    }
}
