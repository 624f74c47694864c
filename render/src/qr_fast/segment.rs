//! Splitting the data into numeric, alphanumeric and byte segments with the fewest bits
//! (ISO/IEC 18004:2015 §7.4.2–§7.4.5; the optimisation is the one Annex J describes,
//! done exactly by dynamic programming instead of Annex J's rules of thumb).
//!
//! A segment costs its 4-bit mode indicator, a character count indicator whose width
//! depends on the mode and the version range 1–9 / 10–26 / 27–40 (§7.4.1 Table 3), and
//! its data: numeric 10 bits per 3 digits (4 or 7 for a last group of 1 or 2), alphanumeric
//! 11 bits per 2 characters (6 for a last single one), byte 8 bits per byte.
//!
//! The program walks the data once. For each of the three modes it keeps the cheapest cost
//! of the data so far given that the segment still open is in that mode, in sixths of a bit
//! (a digit is 20/6 bits, an alphanumeric character 33/6, a byte 48/6): the cost of a
//! finished segment is that sum rounded up to whole bits, which is exactly the formula
//! above, and since later characters add the same amount to every candidate, keeping the
//! minimum per mode is exact (the same scheme as Nayuki's QR Code generator). At each
//! boundary a new segment of another mode may start, paying its header. Kanji mode (§7.4.6,
//! Shift JIS) is never used: pixgate's payloads are UTF-8, and a reader would turn a
//! Kanji-mode pair of UTF-8 bytes into a Shift JIS character.

/// Data encoding mode (§7.4.1 Table 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Digits `0`–`9`.
    Numeric = 0,
    /// `0`–`9`, `A`–`Z`, space and `$ % * + - . / :` (§7.4.4 Table 5).
    Alphanumeric = 1,
    /// Any byte (ISO/IEC 8859-1 by default; pixgate's bytes are UTF-8).
    Byte = 2,
}

const MODES: [Mode; 3] = [Mode::Numeric, Mode::Alphanumeric, Mode::Byte];

impl Mode {
    /// The 4-bit mode indicator: `0001`, `0010`, `0100`.
    pub const fn indicator(self) -> u32 {
        match self {
            Mode::Numeric => 0b0001,
            Mode::Alphanumeric => 0b0010,
            Mode::Byte => 0b0100,
        }
    }

    /// Bits of the character count indicator in `version` (§7.4.1 Table 3).
    pub const fn count_bits(self, version: u8) -> u32 {
        let range = if version <= 9 {
            0
        } else if version <= 26 {
            1
        } else {
            2
        };
        match self {
            Mode::Numeric => [10, 12, 14][range],
            Mode::Alphanumeric => [9, 11, 13][range],
            Mode::Byte => [8, 16, 16][range],
        }
    }

    /// Data bits of `chars` characters (bytes) in this mode, without the header.
    pub const fn data_bits(self, chars: usize) -> usize {
        match self {
            Mode::Numeric => 10 * (chars / 3) + [0, 4, 7][chars % 3],
            Mode::Alphanumeric => 11 * (chars / 2) + 6 * (chars % 2),
            Mode::Byte => 8 * chars,
        }
    }

    /// Whether byte `b` can be written in this mode.
    #[inline(always)]
    pub fn holds(self, b: u8) -> bool {
        CLASS[b as usize] & (1 << self as u8) != 0
    }
}

/// The value of an alphanumeric character (§7.4.4 Table 5), or 0xFF if it is not one.
pub static ALNUM_VALUE: [u8; 256] = {
    let mut t = [0xFFu8; 256];
    let chars = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ $%*+-./:";
    let mut i = 0;
    while i < chars.len() {
        t[chars[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// Per byte, a bit per mode that can hold it (bit 0 numeric, 1 alphanumeric, 2 byte).
static CLASS: [u8; 256] = {
    let mut t = [0b100u8; 256];
    let mut b = 0;
    while b < 256 {
        if ALNUM_VALUE[b] != 0xFF {
            t[b] |= 0b010;
        }
        if b >= b'0' as usize && b <= b'9' as usize {
            t[b] |= 0b001;
        }
        b += 1;
    }
    t
};

/// A run of the data written in one mode: bytes `start..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Segment {
    /// How these bytes are written.
    pub mode: Mode,
    /// Offset of the first byte in the data, in bytes.
    pub start: usize,
    /// Offset just past the last byte (exclusive), in bytes; the character count
    /// indicator holds `end - start`.
    pub end: usize,
}

impl Segment {
    /// Mode indicator, character count indicator and data, in bits, in `version`.
    pub const fn bits(&self, version: u8) -> usize {
        4 + self.mode.count_bits(version) as usize + self.mode.data_bits(self.end - self.start)
    }
}

/// Total bits of `segments` in `version` (before terminator and padding).
pub fn total_bits(segments: &[Segment], version: u8) -> usize {
    segments.iter().map(|s| s.bits(version)).sum()
}

/// The whole of `data` as one byte-mode segment (none for empty data).
pub fn byte_only(data: &[u8]) -> Vec<Segment> {
    if data.is_empty() {
        Vec::new()
    } else {
        vec![Segment { mode: Mode::Byte, start: 0, end: data.len() }]
    }
}

/// The segmentation of `data` with the fewest bits under the character-count widths of
/// `version` (only its range 1–9, 10–26 or 27–40 matters). Empty data → no segments.
/// Adjacent segments always differ in mode.
pub fn optimal(data: &[u8], version: u8) -> Vec<Segment> {
    if data.is_empty() {
        return Vec::new();
    }
    const INF: u32 = u32::MAX / 4;
    let head = MODES.map(|m| 6 * (4 + m.count_bits(version)));
    // `prev[m]`: cheapest cost (sixths of a bit) of the data before this byte with a segment
    // of mode `m` open (possibly still empty). `via[i]` packs, per state mode after byte i
    // (2 bits each), the mode byte i itself was written in.
    let mut prev = head;
    let mut via = vec![0u8; data.len()];
    for (i, &b) in data.iter().enumerate() {
        let class = CLASS[b as usize];
        // Continue the open segment (byte mode holds every byte; INF + anything stays
        // far above every real cost and never overflows).
        let mut cur = [
            if class & 1 != 0 { prev[0] + 20 } else { INF },
            if class & 2 != 0 { prev[1] + 33 } else { INF },
            prev[2] + 48,
        ];
        let mut from = [0u8, 1, 2];
        // Or close it after this byte (whole bits) and open one of another mode.
        let closed = cur.map(|c| c.div_ceil(6) * 6);
        for to in 0..3 {
            for k in 0..3 {
                if k != to && closed[k] + head[to] < cur[to] {
                    cur[to] = closed[k] + head[to];
                    from[to] = from[k];
                }
            }
        }
        via[i] = from[0] | from[1] << 2 | from[2] << 4;
        prev = cur;
    }
    // Best final state, then walk back: the byte's mode is the open segment's before it.
    let mut state = (0..3).min_by_key(|&m| prev[m].div_ceil(6)).unwrap_or(2);
    let mut out: Vec<Segment> = Vec::new();
    for i in (0..data.len()).rev() {
        state = ((via[i] >> (2 * state)) & 3) as usize;
        match out.last_mut() {
            Some(s) if s.mode == MODES[state] => s.start = i,
            _ => out.push(Segment { mode: MODES[state], start: i, end: i + 1 }),
        }
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// All segmentations of short data by brute force: every assignment of a mode per byte
    /// (maximal runs form the segments), cheapest total.
    fn brute_force_bits(data: &[u8], version: u8) -> usize {
        let n = data.len();
        let mut best = usize::MAX;
        let mut assign = vec![0usize; n];
        loop {
            if assign.iter().zip(data).all(|(&m, &b)| MODES[m].holds(b)) {
                let mut segs: Vec<Segment> = Vec::new();
                for (i, &m) in assign.iter().enumerate() {
                    match segs.last_mut() {
                        Some(s) if s.mode == MODES[m] => s.end = i + 1,
                        _ => segs.push(Segment { mode: MODES[m], start: i, end: i + 1 }),
                    }
                }
                best = best.min(total_bits(&segs, version));
            }
            // Next assignment (base-3 counter).
            let mut i = 0;
            while i < n && assign[i] == 2 {
                assign[i] = 0;
                i += 1;
            }
            if i == n {
                break;
            }
            assign[i] += 1;
        }
        if n == 0 {
            0
        } else {
            best
        }
    }

    fn check_valid(data: &[u8], segs: &[Segment]) {
        let mut at = 0;
        for (k, s) in segs.iter().enumerate() {
            assert_eq!(s.start, at);
            assert!(s.end > s.start);
            assert!(
                data[s.start..s.end].iter().all(|&b| s.mode.holds(b)),
                "{s:?} on {:?}",
                String::from_utf8_lossy(data)
            );
            if k > 0 {
                assert_ne!(segs[k - 1].mode, s.mode);
            }
            at = s.end;
        }
        assert_eq!(at, data.len());
    }

    #[test]
    fn qr_fast_segment_tables() {
        assert!(Mode::Numeric.holds(b'7') && !Mode::Numeric.holds(b'A'));
        assert!(Mode::Alphanumeric.holds(b'Z') && Mode::Alphanumeric.holds(b':') && !Mode::Alphanumeric.holds(b'a'));
        assert!(!Mode::Alphanumeric.holds(b'#') && Mode::Byte.holds(0xFF));
        assert_eq!(ALNUM_VALUE[b' ' as usize], 36);
        assert_eq!(ALNUM_VALUE[b':' as usize], 44);
        // §7.4.3 example: "01234567" → 10 + 10 + 7 data bits; §7.4.4: "AC-42" → 11 + 11 + 6.
        assert_eq!(Mode::Numeric.data_bits(8), 27);
        assert_eq!(Mode::Alphanumeric.data_bits(5), 28);
        assert_eq!((Mode::Byte.count_bits(9), Mode::Byte.count_bits(10), Mode::Numeric.count_bits(27)), (8, 16, 14));
    }

    #[test]
    fn qr_fast_segment_optimal_equals_brute_force() {
        // Short strings over a small alphabet that mixes the three classes.
        let alphabet = b"0123AZ $a\xC3";
        let mut seed = 0x1234_5678_9ABC_DEF0u64;
        for _ in 0..600 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 9) as usize;
            let data: Vec<u8> =
                (0..len).map(|k| alphabet[((seed >> (5 + 3 * k)) % alphabet.len() as u64) as usize]).collect();
            for version in [1u8, 10, 27] {
                let segs = optimal(&data, version);
                check_valid(&data, &segs);
                assert_eq!(
                    total_bits(&segs, version),
                    brute_force_bits(&data, version),
                    "{:?} v{version}: {segs:?}",
                    String::from_utf8_lossy(&data)
                );
            }
        }
    }

    #[test]
    fn qr_fast_segment_examples() {
        assert_eq!(optimal(b"", 1), vec![]);
        assert_eq!(optimal(b"12345", 1), vec![Segment { mode: Mode::Numeric, start: 0, end: 5 }]);
        assert_eq!(optimal(b"hello", 1), vec![Segment { mode: Mode::Byte, start: 0, end: 5 }]);
        // A long digit run inside text gets its own segment; a short one does not.
        let d = b"abc0123456789012345xyz";
        assert_eq!(
            optimal(d, 1).iter().map(|s| s.mode).collect::<Vec<_>>(),
            vec![Mode::Byte, Mode::Numeric, Mode::Byte]
        );
        assert_eq!(optimal(b"abc12xyz", 1).len(), 1);
        // BR Code shape: digits, then an uppercase name, then digits.
        let s = optimal(b"5303986540512.345802BR5913FULANO DE TAL6008BRASILIA", 1);
        check_valid(b"5303986540512.345802BR5913FULANO DE TAL6008BRASILIA", &s);
        assert!(s.iter().all(|s| s.mode != Mode::Byte), "{s:?}");
    }
}
