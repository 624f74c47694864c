//! Data encoding (ISO/IEC 18004:2015 §7.4): each segment as mode indicator, character
//! count and data (numeric §7.4.3, alphanumeric §7.4.4, byte §7.4.5), then the terminator,
//! zero bits to a byte boundary and the pad codewords `11101100 00010001` alternately up
//! to the version's data capacity (§7.4.9, §7.4.10).

use super::segment::{self, Mode, Segment, ALNUM_VALUE};
use super::version;
use super::Ec;

/// MSB-first bit writer into a byte buffer.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    nbits: u32,
}

impl BitWriter<'_> {
    #[inline]
    fn put(&mut self, value: u32, bits: u32) {
        debug_assert!(bits <= 32);
        self.acc = (self.acc << bits) | (value as u64 & ((1u64 << bits) - 1));
        self.nbits += bits;
        while self.nbits >= 8 {
            self.nbits -= 8;
            self.out.push((self.acc >> self.nbits) as u8);
        }
    }

    /// Pads with zero bits to a byte boundary.
    fn flush(&mut self) {
        if self.nbits > 0 {
            let pad = 8 - self.nbits;
            self.put(0, pad);
        }
    }
}

/// The data codewords of `data` written as `segments` (which cover it in order) in
/// `version` at `ec`; exactly [`version::data_codewords`] bytes. The caller has checked
/// that the segments hold the data and fit ([`segment::total_bits`] ≤ 8 × that).
pub fn data_codewords(data: &[u8], segments: &[Segment], version: u8, ec: Ec) -> Vec<u8> {
    let capacity = version::data_codewords(version, ec);
    debug_assert!(segment::total_bits(segments, version) <= capacity * 8);
    let mut out = Vec::with_capacity(capacity);
    {
        let mut w = BitWriter { out: &mut out, acc: 0, nbits: 0 };
        for s in segments {
            let part = &data[s.start..s.end];
            w.put(s.mode.indicator(), 4);
            w.put(part.len() as u32, s.mode.count_bits(version));
            match s.mode {
                Mode::Numeric => {
                    let mut groups = part.chunks_exact(3);
                    for g in groups.by_ref() {
                        w.put(digits(g), 10);
                    }
                    let rest = groups.remainder();
                    if !rest.is_empty() {
                        w.put(digits(rest), 1 + 3 * rest.len() as u32);
                    }
                }
                Mode::Alphanumeric => {
                    let value = |b: u8| ALNUM_VALUE[b as usize] as u32;
                    let mut pairs = part.chunks_exact(2);
                    for p in pairs.by_ref() {
                        w.put(45 * value(p[0]) + value(p[1]), 11);
                    }
                    if let [last] = pairs.remainder() {
                        w.put(value(*last), 6);
                    }
                }
                Mode::Byte => {
                    for &b in part {
                        w.put(b as u32, 8);
                    }
                }
            }
        }
        // Terminator: up to four zero bits (fewer only if the capacity is reached).
        let used = (w.out.len() * 8) as u32 + w.nbits;
        let room = (capacity * 8) as u32 - used;
        w.put(0, room.min(4));
        w.flush();
    }
    let mut pad = 0xEC;
    while out.len() < capacity {
        out.push(pad);
        pad ^= 0xEC ^ 0x11;
    }
    out
}

/// The decimal value of 1 to 3 ASCII digits.
#[inline(always)]
fn digits(d: &[u8]) -> u32 {
    d.iter().fold(0, |v, &c| v * 10 + (c - b'0') as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qr_fast_bits_layout() {
        // "AB" in 1-M: 0100 00000010 01000001 01000010 0000, then pads.
        let cw = data_codewords(b"AB", &segment::byte_only(b"AB"), 1, Ec::M);
        assert_eq!(cw.len(), 16);
        assert_eq!(&cw[..5], &[0x40, 0x24, 0x14, 0x20, 0xEC]);
        assert_eq!(cw[5], 0x11);
        assert_eq!(cw[15], 0x11);
    }

    #[test]
    fn qr_fast_bits_numeric_and_alphanumeric_examples() {
        // §7.4.3 example: "01234567" in 1-H = 0001 0000001000 0000001100 0101011001 1000011,
        // then the terminator 0000 and one zero bit to the byte boundary.
        let seg = [Segment { mode: Mode::Numeric, start: 0, end: 8 }];
        let cw = data_codewords(b"01234567", &seg, 1, Ec::H);
        assert_eq!(&cw[..6], &[0b0001_0000, 0b0010_0000, 0b0000_1100, 0b0101_0110, 0b0110_0001, 0b1000_0000]);
        assert_eq!(&cw[6..], &[0xEC, 0x11, 0xEC]);
        // Annex I: the same digits at 1-M, and the optimal segmentation picks numeric mode.
        let cw = data_codewords(b"01234567", &segment::optimal(b"01234567", 1), 1, Ec::M);
        assert_eq!(
            cw,
            [0x10, 0x20, 0x0C, 0x56, 0x61, 0x80, 0xEC, 0x11, 0xEC, 0x11, 0xEC, 0x11, 0xEC, 0x11, 0xEC, 0x11]
        );
        // §7.4.4 example: "AC-42" in 1-x = 0010 000000101 00111001110 11100111001 000010.
        let seg = [Segment { mode: Mode::Alphanumeric, start: 0, end: 5 }];
        let cw = data_codewords(b"AC-42", &seg, 1, Ec::H);
        let bits: String = cw.iter().map(|b| format!("{b:08b}")).collect();
        assert!(bits.starts_with("0010000000101001110011101110011100100001000000"), "{bits}");
    }
}
