//! Printer code pages: which byte a thermal printer prints as which character.
//!
//! An ESC/POS printer has no idea of UTF-8. Text bytes `0x20..=0xFF` are looked up in the
//! character code table selected with `ESC t n`; the table numbers are vendor specific
//! (Epson's are used here: Epson ESC/POS Command Reference, `ESC t`). pixgate encodes every
//! string to the page the device is configured for and never sends raw UTF-8: a character
//! the page lacks goes through [`fallback`], a documented transliteration, and only if that
//! fails too it becomes `?`.
//!
//! Tables come from the `oem_cp` crate (IBM/MS code pages) and `encoding_rs` (WPC1252).

use oem_cp::code_table::{
    DECODING_TABLE_CP437, DECODING_TABLE_CP850, DECODING_TABLE_CP858, DECODING_TABLE_CP860, DECODING_TABLE_CP863,
    DECODING_TABLE_CP865, ENCODING_TABLE_CP437, ENCODING_TABLE_CP850, ENCODING_TABLE_CP858, ENCODING_TABLE_CP860,
    ENCODING_TABLE_CP863, ENCODING_TABLE_CP865,
};
use serde::{Deserialize, Serialize};

/// A character code table a receipt printer can select with `ESC t n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum CodePage {
    /// PC437 (USA, standard Europe): Epson table 0, the usual power-on default.
    Cp437,
    /// PC850 (Multilingual): Epson table 2. Has every Portuguese and Spanish letter.
    Cp850,
    /// PC860 (Portuguese): Epson table 3. pixgate's default for Brazilian printers, hence
    /// [`Default`].
    #[default]
    Cp860,
    /// PC863 (Canadian-French): Epson table 4.
    Cp863,
    /// PC865 (Nordic): Epson table 5.
    Cp865,
    /// WPC1252 (Windows Latin-1): Epson table 16.
    Wpc1252,
    /// PC858 (PC850 with the euro sign): Epson table 19.
    Cp858,
}

impl CodePage {
    /// Every page this module knows.
    pub const ALL: [CodePage; 7] = [
        CodePage::Cp437,
        CodePage::Cp850,
        CodePage::Cp860,
        CodePage::Cp863,
        CodePage::Cp865,
        CodePage::Wpc1252,
        CodePage::Cp858,
    ];

    /// Parses a registry name such as `"CP860"`, `"PC860"`, `"cp850"` or `"WPC1252"`.
    pub fn from_name(name: &str) -> Option<CodePage> {
        let n = name.trim().to_ascii_uppercase();
        let digits = n.trim_start_matches("WPC").trim_start_matches("CP").trim_start_matches("PC");
        match digits {
            "437" => Some(CodePage::Cp437),
            "850" => Some(CodePage::Cp850),
            "860" => Some(CodePage::Cp860),
            "863" => Some(CodePage::Cp863),
            "865" => Some(CodePage::Cp865),
            "1252" => Some(CodePage::Wpc1252),
            "858" => Some(CodePage::Cp858),
            _ => None,
        }
    }

    /// The registry name, e.g. `"CP860"`.
    pub fn name(self) -> &'static str {
        match self {
            CodePage::Cp437 => "CP437",
            CodePage::Cp850 => "CP850",
            CodePage::Cp860 => "CP860",
            CodePage::Cp863 => "CP863",
            CodePage::Cp865 => "CP865",
            CodePage::Wpc1252 => "WPC1252",
            CodePage::Cp858 => "CP858",
        }
    }

    /// The `n` of `ESC t n` on Epson-compatible printers (Epson ESC/POS reference, `ESC t`).
    pub const fn epson_table(self) -> u8 {
        match self {
            CodePage::Cp437 => 0,
            CodePage::Cp850 => 2,
            CodePage::Cp860 => 3,
            CodePage::Cp863 => 4,
            CodePage::Cp865 => 5,
            CodePage::Wpc1252 => 16,
            CodePage::Cp858 => 19,
        }
    }

    /// The page an Epson-compatible printer selects for `ESC t n`, if this module knows it.
    pub fn from_epson_table(n: u8) -> Option<CodePage> {
        CodePage::ALL.into_iter().find(|p| p.epson_table() == n)
    }

    /// The character a printer prints for `byte` under this page. Bytes below 0x80 are ASCII.
    pub fn decode_byte(self, byte: u8) -> char {
        if byte < 0x80 {
            return byte as char;
        }
        let i = (byte - 0x80) as usize;
        match self {
            CodePage::Cp437 => DECODING_TABLE_CP437[i],
            CodePage::Cp850 => DECODING_TABLE_CP850[i],
            CodePage::Cp860 => DECODING_TABLE_CP860[i],
            CodePage::Cp863 => DECODING_TABLE_CP863[i],
            CodePage::Cp865 => DECODING_TABLE_CP865[i],
            CodePage::Cp858 => DECODING_TABLE_CP858[i],
            CodePage::Wpc1252 => {
                let buf = [byte];
                let (s, _) = encoding_rs::WINDOWS_1252.decode_without_bom_handling(&buf);
                s.chars().next().unwrap_or('\u{FFFD}')
            }
        }
    }

    /// The byte for `c` under this page, or `None` when the page has no such character.
    /// Latin-1 characters (U+0080..=U+00FF, every Portuguese and Spanish letter) are looked
    /// up in a 128-byte table per page, built on first use from the full tables below;
    /// other characters go to those tables directly.
    pub fn encode_char(self, c: char) -> Option<u8> {
        let u = c as u32;
        if u < 0x80 {
            return Some(c as u8);
        }
        if u < 0x100 {
            let b = LATIN1[self as usize][(u - 0x80) as usize];
            return (b != 0).then_some(b);
        }
        self.encode_char_full(c)
    }

    /// [`CodePage::encode_char`] from the `oem_cp` / `encoding_rs` tables, for any character.
    fn encode_char_full(self, c: char) -> Option<u8> {
        if (c as u32) < 0x80 {
            return Some(c as u8);
        }
        let table = match self {
            CodePage::Cp437 => &ENCODING_TABLE_CP437,
            CodePage::Cp850 => &ENCODING_TABLE_CP850,
            CodePage::Cp860 => &ENCODING_TABLE_CP860,
            CodePage::Cp863 => &ENCODING_TABLE_CP863,
            CodePage::Cp865 => &ENCODING_TABLE_CP865,
            CodePage::Cp858 => &ENCODING_TABLE_CP858,
            CodePage::Wpc1252 => {
                let mut buf = [0u8; 4];
                let (bytes, _, unmappable) = encoding_rs::WINDOWS_1252.encode(c.encode_utf8(&mut buf));
                return (!unmappable && bytes.len() == 1).then(|| bytes[0]);
            }
        };
        table.get(&c).copied()
    }

    /// Encodes `text` for a printer set to this page.
    ///
    /// A character the page lacks is replaced by its [`fallback`] (itself encoded, so a
    /// fallback never introduces an unmappable character), and if there is none, by `?`.
    /// Returns the bytes and how many characters needed a fallback (a count, so callers can
    /// log or test it). Never emits a byte sequence that is not on the page.
    pub fn encode_lossy(self, text: &str) -> (Vec<u8>, usize) {
        let mut out = Vec::with_capacity(text.len());
        let replaced = self.encode_lossy_into(text, &mut out);
        (out, replaced)
    }

    /// [`CodePage::encode_lossy`] appending to `out` (no allocation of its own); returns
    /// how many characters needed a fallback. ASCII text (every page's lower half) is
    /// copied as it is.
    pub fn encode_lossy_into(self, text: &str, out: &mut Vec<u8>) -> usize {
        if text.is_ascii() {
            out.extend_from_slice(text.as_bytes());
            return 0;
        }
        text.chars().map(|c| self.encode_char_lossy_into(c, out)).sum()
    }

    /// One character of [`CodePage::encode_lossy`], appended to `out`: its byte, else its
    /// [`fallback`] encoded, else `?`. Returns 1 when a fallback (or `?`) was needed, else 0.
    #[inline]
    pub fn encode_char_lossy_into(self, c: char, out: &mut Vec<u8>) -> usize {
        if let Some(b) = self.encode_char(c) {
            out.push(b);
            return 0;
        }
        match fallback(c) {
            Some(s) => out.extend(s.chars().map(|f| self.encode_char(f).unwrap_or(b'?'))),
            None => out.push(b'?'),
        }
        1
    }

    /// Decodes printer bytes under this page, control bytes included as they are.
    pub fn decode(self, bytes: &[u8]) -> String {
        bytes.iter().map(|&b| self.decode_byte(b)).collect()
    }
}

/// `LATIN1[page as usize][u - 0x80]`: the byte for U+0080 + `u` on that page, 0 when it has
/// none (a mapped non-ASCII character is never byte 0).
static LATIN1: std::sync::LazyLock<[[u8; 128]; 7]> = std::sync::LazyLock::new(|| {
    let mut t = [[0u8; 128]; 7];
    for page in CodePage::ALL {
        for (i, b) in t[page as usize].iter_mut().enumerate() {
            let c = char::from_u32(0x80 + i as u32).expect("Latin-1 is valid");
            *b = page.encode_char_full(c).unwrap_or(0);
        }
    }
    t
});

/// The documented fallback for a character a code page lacks.
///
/// Rules, in order: typographic punctuation becomes its ASCII look-alike (`“”` → `"`,
/// `‘’` → `'`, `–—` → `-`, `…` → `...`, `•` → `*`); currency signs become their codes
/// (`€` → `EUR`, `£` → `GBP`); Spanish `¡`/`¿` become `!`/`?`; a Latin letter with a
/// diacritic loses the diacritic (`ã` → `a`, `Ç` → `C`, `ñ` → `n`); `º`/`ª` become `o`/`a`. Anything else: `None`
/// (the caller prints `?`). Emoji and other scripts have no fallback on purpose: a `?` is
/// visible on paper, a guessed letter would not be.
pub fn fallback(c: char) -> Option<&'static str> {
    Some(match c {
        '\u{201C}' | '\u{201D}' | '\u{201E}' | '«' | '»' => "\"",
        '\u{2018}' | '\u{2019}' | '\u{201A}' | '´' | '`' => "'",
        '\u{2013}' | '\u{2014}' | '\u{2212}' => "-",
        '\u{2026}' => "...",
        '\u{2022}' | '·' => "*",
        '\u{00A0}' | '\u{2007}' | '\u{202F}' => " ",
        '¡' => "!",
        '¿' => "?",
        '€' => "EUR",
        '£' => "GBP",
        'º' => "o",
        'ª' => "a",
        'á' | 'à' | 'â' | 'ã' | 'ä' | 'å' => "a",
        'Á' | 'À' | 'Â' | 'Ã' | 'Ä' | 'Å' => "A",
        'é' | 'è' | 'ê' | 'ë' => "e",
        'É' | 'È' | 'Ê' | 'Ë' => "E",
        'í' | 'ì' | 'î' | 'ï' => "i",
        'Í' | 'Ì' | 'Î' | 'Ï' => "I",
        'ó' | 'ò' | 'ô' | 'õ' | 'ö' => "o",
        'Ó' | 'Ò' | 'Ô' | 'Õ' | 'Ö' => "O",
        'ú' | 'ù' | 'û' | 'ü' => "u",
        'Ú' | 'Ù' | 'Û' | 'Ü' => "U",
        'ç' => "c",
        'Ç' => "C",
        'ñ' => "n",
        'Ñ' => "N",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portuguese_round_trips_on_cp860_and_cp850() {
        let text = "São João — Pão de queijo, açaí, Côco, Ação, ÁÉÍÓÚ ÂÊÔ ÃÕ Ç";
        for page in [CodePage::Cp860, CodePage::Cp850] {
            let (bytes, replaced) = page.encode_lossy(text);
            assert_eq!(replaced, 1, "{page:?}: only the em dash lacks a byte");
            assert_eq!(page.decode(&bytes), text.replace('—', "-"));
            assert!(bytes.iter().all(|&b| b != 0xC3), "no UTF-8 lead byte for Latin-1 letters");
        }
    }

    #[test]
    fn known_bytes_match_the_ibm_tables() {
        // Independent check against the published CP860 table: ã = 0x84, ç = 0x87, Ç = 0x80.
        assert_eq!(CodePage::Cp860.encode_char('ã'), Some(0x84));
        assert_eq!(CodePage::Cp860.encode_char('ç'), Some(0x87));
        assert_eq!(CodePage::Cp860.encode_char('Ç'), Some(0x80));
        // CP850: ã = 0xC6, õ = 0xE4.
        assert_eq!(CodePage::Cp850.encode_char('ã'), Some(0xC6));
        assert_eq!(CodePage::Cp850.encode_char('õ'), Some(0xE4));
        // WPC1252 is Latin-1 above 0xA0 and has the euro at 0x80.
        assert_eq!(CodePage::Wpc1252.encode_char('ã'), Some(0xE3));
        assert_eq!(CodePage::Wpc1252.encode_char('€'), Some(0x80));
        assert_eq!(CodePage::Wpc1252.decode_byte(0x80), '€');
    }

    #[test]
    fn missing_characters_fall_back_never_to_utf8() {
        let (bytes, replaced) = CodePage::Cp437.encode_lossy("Açaí ã €5 🙂");
        // CP437 has ç and í but not ã, €, or emoji.
        assert_eq!(replaced, 3);
        assert_eq!(CodePage::Cp437.decode(&bytes), "Açaí a EUR5 ?");
    }

    /// The Latin-1 fast path gives what the full tables give, for every page and every
    /// character of the Basic Multilingual Plane and a sample beyond it; the table order is
    /// the enum's.
    #[test]
    fn latin1_table_matches_the_full_tables() {
        for (i, page) in CodePage::ALL.into_iter().enumerate() {
            assert_eq!(page as usize, i);
            for u in (0..0x1_0000u32).chain(0x1F300..0x1F400) {
                let Some(c) = char::from_u32(u) else { continue };
                assert_eq!(page.encode_char(c), page.encode_char_full(c), "{page:?} U+{u:04X}");
            }
        }
        assert_eq!(CodePage::Cp860.encode_char('\u{80}'), None);
    }

    #[test]
    fn names_and_table_numbers() {
        assert_eq!(CodePage::from_name("PC860"), Some(CodePage::Cp860));
        assert_eq!(CodePage::from_name("cp850"), Some(CodePage::Cp850));
        assert_eq!(CodePage::from_name("WPC1252"), Some(CodePage::Wpc1252));
        assert_eq!(CodePage::from_name("CP999"), None);
        for p in CodePage::ALL {
            assert_eq!(CodePage::from_epson_table(p.epson_table()), Some(p));
            assert_eq!(CodePage::from_name(p.name()), Some(p));
        }
    }
}
