//! Data encoding (ISO/IEC 18004:2015 §7.4): one byte-mode segment (mode indicator `0100`,
//! character count, the bytes), terminator, zero bits to a byte boundary, then the pad
//! codewords `11101100 00010001` alternately up to the version's data capacity.

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

/// The data codewords of `data` as one byte-mode segment in `version` at `ec`; exactly
/// [`version::data_codewords`] bytes. The caller has checked that the data fits.
pub fn data_codewords(data: &[u8], version: u8, ec: Ec) -> Vec<u8> {
    let capacity = version::data_codewords(version, ec);
    let count_bits = version::byte_count_bits(version) as u32;
    debug_assert!(data.len() <= version::byte_capacity(version, ec));
    let mut out = Vec::with_capacity(capacity);
    {
        let mut w = BitWriter { out: &mut out, acc: 0, nbits: 0 };
        w.put(0b0100, 4);
        w.put(data.len() as u32, count_bits);
        // Header is 12 or 20 bits: every byte straddles two codewords by 4 bits.
        for &b in data {
            w.put(b as u32, 8);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qr_fast_bits_layout() {
        // "AB" in 1-M: 0100 00000010 01000001 01000010 0000, then pads.
        let cw = data_codewords(b"AB", 1, Ec::M);
        assert_eq!(cw.len(), 16);
        assert_eq!(&cw[..5], &[0x40, 0x24, 0x14, 0x20, 0xEC]);
        assert_eq!(cw[5], 0x11);
        assert_eq!(cw[15], 0x11);
    }
}
