//! A small ESC/POS command writer into an in-memory `Vec<u8>`.
//!
//! Why not the `escpos` crate (fabienbellanger, 0.20.1)? Its text path silently falls back
//! to UTF-8 for characters outside the selected page and its `cash_drawer` sends a 3-byte
//! `ESC p` that swallows the next command. pixgate needs byte-exact control of text encoding (every string through
//! [`CodePage::encode_lossy`]) and of `GS ( k` lengths, and only about ten commands, each
//! documented below with its bytes (Epson ESC/POS Command Reference).

use crate::codepage::CodePage;

/// Horizontal alignment for `ESC a n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// n = 0.
    Left = 0,
    /// n = 1.
    Center = 1,
    /// n = 2.
    Right = 2,
}

/// Character font for `ESC M n`: the cell sizes are the printer's (TM-T20 class: A 12 × 24,
/// B 9 × 17 dots; see [`crate::profile::FONT_A_DOTS`], [`crate::profile::FONT_B_DOTS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Font {
    /// n = 0: the default after `ESC @`; 48 columns on 80 mm, 32 on 58 mm.
    A = 0,
    /// n = 1: the small font; 64 columns on 80 mm, 42 on 58 mm.
    B = 1,
}

/// The `m` of `GS v 0` (Epson ESC/POS Command Reference, `GS v 0`): how many dots each bit of a raster
/// prints as. 203 dpi printers print quadruple at 101 × 101 dpi.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RasterScale {
    /// m = 0: one bit, one dot.
    Normal = 0,
    /// m = 3: one bit, 2 × 2 dots.
    Quadruple = 3,
}

/// Writes ESC/POS commands and code-page text into a byte buffer.
#[derive(Debug, Clone)]
pub struct EscPos {
    buf: Vec<u8>,
    page: CodePage,
    /// The `n` sent with `ESC t` by [`EscPos::init`].
    table: u8,
    replaced: usize,
}

impl EscPos {
    /// An empty job whose text will be encoded for `page`. Nothing is written yet: start
    /// with [`EscPos::init`].
    /// `ESC t` will select `page` by its Epson number ([`CodePage::epson_table`]).
    pub fn new(page: CodePage) -> Self {
        EscPos::with_table(page, page.epson_table())
    }

    /// Like [`EscPos::new`], but `ESC t` sends `esc_t`: the number that selects `page` on
    /// the target model (vendors number tables differently; see [`crate::profile`]).
    pub fn with_table(page: CodePage, esc_t: u8) -> Self {
        EscPos::with_buffer(Vec::with_capacity(2048), page, esc_t)
    }

    /// Like [`EscPos::with_table`], writing after what `buf` already holds (a caller's
    /// buffer, reused across jobs); [`EscPos::into_bytes`] gives it back.
    pub fn with_buffer(buf: Vec<u8>, page: CodePage, esc_t: u8) -> Self {
        EscPos { buf, page, table: esc_t, replaced: 0 }
    }

    /// `ESC @` (`1B 40`), initialize, immediately followed by `ESC t n` (`1B 74 n`) for
    /// this job's page (the number given to [`EscPos::with_table`], Epson's by default):
    /// `ESC @` resets the code table to the power-on default.
    pub fn init(&mut self) -> &mut Self {
        self.buf.extend_from_slice(&[0x1B, 0x40, 0x1B, 0x74, self.table]);
        self
    }

    /// `ESC a n` (`1B 61 n`): justification, effective at the start of a line.
    pub fn align(&mut self, a: Align) -> &mut Self {
        self.buf.extend_from_slice(&[0x1B, 0x61, a as u8]);
        self
    }

    /// `ESC E n` (`1B 45 n`): emphasized (bold) on (n = 1) or off (n = 0).
    pub fn bold(&mut self, on: bool) -> &mut Self {
        self.buf.extend_from_slice(&[0x1B, 0x45, on as u8]);
        self
    }

    /// `ESC M n` (`1B 4D n`): select character font A (n = 0) or B (n = 1), for the text
    /// that follows (what is already in the line buffer is printed in the font in force
    /// when the line is printed, so switch at line starts). `ESC @` selects font A.
    pub fn font(&mut self, f: Font) -> &mut Self {
        self.buf.extend_from_slice(&[0x1B, 0x4D, f as u8]);
        self
    }

    /// `GS ! n` (`1D 21 n`): character size, `width` and `height` multipliers 1..=8
    /// (n = (width − 1) << 4 | (height − 1)); out-of-range values are clamped.
    pub fn size(&mut self, width: u8, height: u8) -> &mut Self {
        let w = width.clamp(1, 8) - 1;
        let h = height.clamp(1, 8) - 1;
        self.buf.extend_from_slice(&[0x1D, 0x21, (w << 4) | h]);
        self
    }

    /// Text encoded with [`CodePage::encode_lossy`] for this job's page (never UTF-8),
    /// after [`printable`] (control characters become spaces, pictographs are dropped).
    pub fn text(&mut self, s: &str) -> &mut Self {
        let EscPos { buf, page, replaced, .. } = self;
        encode_into(*page, replaced, s, buf);
        self
    }

    /// Bytes already encoded for this page (from [`EscPos::encode`]), written as they are.
    pub fn raw_text(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(bytes);
        self
    }

    /// `n` copies of `byte` (already a code-page byte, e.g. `b'-'` for a rule line or
    /// `b' '` for padding).
    pub fn fill(&mut self, byte: u8, n: usize) -> &mut Self {
        self.buf.resize(self.buf.len() + n, byte);
        self
    }

    /// Encodes text for this page without writing it (for measuring and wrapping: one byte
    /// is one printed character cell), after [`printable`].
    pub fn encode(&mut self, s: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(s.len());
        encode_into(self.page, &mut self.replaced, s, &mut out);
        out
    }

    /// [`EscPos::encode`] appended to `out` (a caller's scratch buffer) instead of a new
    /// vector.
    pub fn encode_into(&mut self, s: &str, out: &mut Vec<u8>) {
        encode_into(self.page, &mut self.replaced, s, out);
    }

    /// [`EscPos::encode_into`] of `s` in upper case (`str::to_uppercase`, character by
    /// character: `ç` → `Ç`, `ß` → `SS`).
    pub fn encode_upper_into(&mut self, s: &str, out: &mut Vec<u8>) {
        if s.bytes().all(|b| (0x20..0x7F).contains(&b)) {
            out.extend(s.bytes().map(|b| b.to_ascii_uppercase()));
            return;
        }
        let composed = composed(s);
        for c in composed.as_deref().unwrap_or(s).chars().flat_map(char::to_uppercase) {
            self.replaced += encode_char_into(self.page, c, out);
        }
    }

    /// `LF` (`0A`): print the line buffer and feed one line.
    pub fn lf(&mut self) -> &mut Self {
        self.buf.push(0x0A);
        self
    }

    /// `ESC d n` (`1B 64 n`): print and feed `n` lines.
    pub fn feed_lines(&mut self, n: u8) -> &mut Self {
        self.buf.extend_from_slice(&[0x1B, 0x64, n]);
        self
    }

    /// `GS V A n` (`1D 56 41 n`, function B): feed to the cutting position plus `n`
    /// vertical units, then full cut (cutters that only do partial cuts do that).
    pub fn cut(&mut self, n: u8) -> &mut Self {
        self.buf.extend_from_slice(&[0x1D, 0x56, 0x41, n]);
        self
    }

    /// `GS V m n` (`1D 56 m n`, function B) with `m` from `style`: 65 full
    /// (same as [`EscPos::cut`]) or 66 partial, after feeding `n` vertical units.
    pub fn cut_with(&mut self, style: crate::profile::CutStyle, n: u8) -> &mut Self {
        self.buf.extend_from_slice(&[0x1D, 0x56, style.gs_v_m(), n]);
        self
    }

    /// Native QR through `GS ( k` (`1D 28 6B pL pH cn fn …`, cn = `0x31`):
    /// `fn 165` model 2 (`04 00 31 41 32 00`), `fn 167` module size `module` dots
    /// (`03 00 31 43 n`, 1..=16), `fn 169` error correction M (`03 00 31 45 31`),
    /// `fn 180` store (`pL pH 31 50 30 data`, pL + 256·pH = data length + 3), `fn 181` print
    /// (`03 00 31 51 30`). `data` is sent as bytes unchanged (a BR Code is ASCII).
    /// Panics never; data over 65 532 bytes is the caller's bug and is truncated.
    pub fn qr_native(&mut self, data: &[u8], module: u8) -> &mut Self {
        let data = &data[..data.len().min(0xFFFF - 3)];
        let k = data.len() + 3;
        self.buf.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x04, 0x00, 0x31, 0x41, 0x32, 0x00]);
        self.buf.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x03, 0x00, 0x31, 0x43, module.clamp(1, 16)]);
        self.buf.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x03, 0x00, 0x31, 0x45, 0x31]);
        self.buf.extend_from_slice(&[0x1D, 0x28, 0x6B, (k & 0xFF) as u8, (k >> 8) as u8, 0x31, 0x50, 0x30]);
        self.buf.extend_from_slice(data);
        self.buf.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x03, 0x00, 0x31, 0x51, 0x30]);
        self
    }

    /// Raster bit image `GS v 0` (`1D 76 30 m xL xH yL yH d1…dk`), m = 0 (normal):
    /// x = bytes per row = ⌈width_dots / 8⌉, y = rows, k = x·y; MSB first, 1 = black, rows
    /// padded with 0 bits. `dark(x, y)` says whether dot (x, y) is black.
    /// Images taller than 2047 rows would need banding; callers keep QRs well below that.
    pub fn raster(&mut self, width_dots: u32, height: u32, dark: impl Fn(u32, u32) -> bool) -> &mut Self {
        let x_bytes = width_dots.div_ceil(8);
        let mut rows = Vec::with_capacity((x_bytes * height) as usize);
        for y in 0..height {
            for bx in 0..x_bytes {
                let mut byte = 0u8;
                for bit in 0..8 {
                    let x = bx * 8 + bit;
                    if x < width_dots && dark(x, y) {
                        byte |= 0x80 >> bit;
                    }
                }
                rows.push(byte);
            }
        }
        self.raster_packed(width_dots, height, &rows)
    }

    /// [`EscPos::raster`] with the dots already packed in its layout: `rows` is `height` rows
    /// of ⌈width_dots / 8⌉ bytes (e.g. [`crate::qr::QrMatrix::to_raster`]). Bytes past
    /// x·y are ignored, missing ones sent as 0 (white), so the command's length is always
    /// what its header says.
    pub fn raster_packed(&mut self, width_dots: u32, height: u32, rows: &[u8]) -> &mut Self {
        self.raster_packed_scaled(RasterScale::Normal, width_dots, height, rows)
    }

    /// [`EscPos::raster_packed`] printed at `scale` (the `m` of `GS v 0`): with
    /// [`RasterScale::Quadruple`] each bit prints as 2 × 2 dots, so `width_dots` × `height`
    /// bits cover twice that on paper. Only for models whose `GS v 0` takes m = 3
    /// ([`crate::profile::ModelProfile::raster_quadruple`]).
    pub fn raster_packed_scaled(&mut self, scale: RasterScale, width_dots: u32, height: u32, rows: &[u8]) -> &mut Self {
        let x_bytes = width_dots.div_ceil(8);
        self.buf.extend_from_slice(&[
            0x1D,
            0x76,
            0x30,
            scale as u8,
            (x_bytes & 0xFF) as u8,
            (x_bytes >> 8) as u8,
            (height & 0xFF) as u8,
            (height >> 8) as u8,
        ]);
        let k = (x_bytes * height) as usize;
        let given = &rows[..k.min(rows.len())];
        self.buf.extend_from_slice(given);
        self.buf.resize(self.buf.len() + (k - given.len()), 0);
        self
    }

    /// How many characters so far needed a code-page fallback (see [`CodePage::encode_lossy`]).
    pub fn replaced(&self) -> usize {
        self.replaced
    }

    /// The finished job's bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// [`printable`] then [`CodePage::encode_lossy_into`] `out`, counting fallbacks in
/// `replaced`: both work character by character, so this does the two per character,
/// without the intermediate string. Runs of printable ASCII (most text) are copied as
/// they are; only the other characters are looked at one by one.
fn encode_into(page: CodePage, replaced: &mut usize, s: &str, out: &mut Vec<u8>) {
    match composed(s) {
        Some(composed) => encode_composed_into(page, replaced, &composed, out),
        None => encode_composed_into(page, replaced, s, out),
    }
}

/// [`encode_into`] of text already composed.
fn encode_composed_into(page: CodePage, replaced: &mut usize, s: &str, out: &mut Vec<u8>) {
    out.reserve(s.len());
    let mut rest = s;
    while !rest.is_empty() {
        let run = rest.bytes().position(|b| !(0x20..0x7F).contains(&b)).unwrap_or(rest.len());
        out.extend_from_slice(&rest.as_bytes()[..run]);
        // `run` ends at an ASCII byte or at a character's first byte: a char boundary.
        rest = &rest[run..];
        let mut chars = rest.chars();
        if let Some(c) = chars.next() {
            *replaced += encode_char_into(page, c, out);
            rest = chars.as_str();
        }
    }
}

/// One character of [`encode_into`]; returns 1 when it needed a code-page fallback.
#[inline]
fn encode_char_into(page: CodePage, c: char, out: &mut Vec<u8>) -> usize {
    match class(c) {
        Class::Keep => page.encode_char_lossy_into(c, out),
        Class::Space => {
            out.push(b' ');
            0
        }
        Class::Drop => 0,
    }
}

/// Prepares text for a printer: control characters (below 0x20, and DEL) become spaces, so
/// that data can never inject a command; emoji and other pictographs (U+1F000..U+1FAFF,
/// U+2600..U+27BF), variation selectors, zero-width characters and soft hyphens are
/// dropped, because no printer code page has them and a `?` in a shop's name looks like a
/// fault; decomposed letters are composed first (`a` + U+0303 → `ã`). Everything
/// else is left for [`CodePage::encode_lossy`] (which prints `?` for an unknown letter).
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let composed = composed(s);
    for c in composed.as_deref().unwrap_or(s).chars() {
        match class(c) {
            Class::Keep => out.push(c),
            Class::Space => out.push(' '),
            Class::Drop => {}
        }
    }
    out
}

/// What [`printable`] does with one character.
#[derive(PartialEq)]
enum Class {
    Keep,
    Space,
    Drop,
}

#[inline]
fn class(c: char) -> Class {
    let u = c as u32;
    if u < 0x20 || u == 0x7F {
        Class::Space
    } else if (0x1F000..=0x1FAFF).contains(&u)
        || (0x2600..=0x27BF).contains(&u)
        || (0xFE00..=0xFE0F).contains(&u)
        || is_combining(c)
        || (0x200B..=0x200F).contains(&u)
        || u == 0x2060
        || u == 0xFEFF
        || u == 0xAD
    {
        // Pictographs, variation selectors and joiners; a combining mark with no
        // precomposed letter left after [`composed`]; zero-width spaces, joiners and marks,
        // the word joiner, a byte-order mark, a soft hyphen: nothing to print.
        Class::Drop
    } else {
        Class::Keep
    }
}

/// A combining diacritical mark (U+0300..U+036F).
fn is_combining(c: char) -> bool {
    ('\u{300}'..='\u{36F}').contains(&c)
}

/// `s` composed (Unicode NFC) when it holds a combining mark: text typed on an Apple
/// keyboard may come decomposed (`a` + U+0303 for `ã`), which no code page has, and would
/// print as `a?`. `None` when there is nothing to compose.
fn composed(s: &str) -> Option<String> {
    use unicode_normalization::UnicodeNormalization;
    (!s.is_ascii() && s.chars().any(is_combining)).then(|| s.nfc().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_bytes() {
        let mut e = EscPos::new(CodePage::Cp860);
        e.init().align(Align::Center).bold(true).size(2, 2).text("Pão\n").cut(3);
        assert_eq!(
            e.into_bytes(),
            vec![
                0x1B, 0x40, 0x1B, 0x74, 3, 0x1B, 0x61, 1, 0x1B, 0x45, 1, 0x1D, 0x21, 0x11, b'P', 0x84, b'o', b' ',
                0x1D, 0x56, 0x41, 3
            ]
        );
        let mut e = EscPos::new(CodePage::Cp860);
        e.font(Font::B).font(Font::A);
        assert_eq!(e.into_bytes(), vec![0x1B, 0x4D, 1, 0x1B, 0x4D, 0]);
    }

    #[test]
    fn vendor_table_number_and_partial_cut() {
        let mut e = EscPos::with_table(CodePage::Cp860, 4);
        e.init().text("ã").cut_with(crate::profile::CutStyle::Partial, 3);
        assert_eq!(e.into_bytes(), vec![0x1B, 0x40, 0x1B, 0x74, 4, 0x84, 0x1D, 0x56, 0x42, 3]);
    }

    #[test]
    fn pictographs_are_dropped_controls_neutralised() {
        let mut e = EscPos::new(CodePage::Cp860);
        e.text("Pão 🍞\x1B@!");
        assert_eq!(e.into_bytes(), vec![b'P', 0x84, b'o', b' ', b' ', b'@', b'!']);
    }

    /// Text typed decomposed (an Apple keyboard's `a` + U+0303) prints as the composed
    /// letter, and zero-width characters, a byte-order mark and a soft hyphen print
    /// nothing: never a `?`.
    #[test]
    fn decomposed_letters_are_composed_and_invisible_characters_dropped() {
        for page in CodePage::ALL {
            let mut c = EscPos::new(page);
            let composed = c.encode("Padaria São João, Maria");
            let mut e = EscPos::new(page);
            let decomposed = e.encode("\u{FEFF}Padaria Sa\u{303}o Joa\u{303}o,\u{200B} Mari\u{AD}a\u{2060}");
            assert_eq!(decomposed, composed, "{page:?}");
            assert_eq!(e.replaced(), c.replaced(), "{page:?}: the fallbacks of the composed text only");
            let mut up = Vec::new();
            EscPos::new(page).encode_upper_into("Sa\u{303}o", &mut up);
            assert_eq!(up, EscPos::new(page).encode("SÃO"), "{page:?} upper");
        }
        assert_eq!(printable("Joa\u{303}o\u{200B}"), "João");
    }

    /// The per-character path equals its definition, [`printable`] then
    /// [`CodePage::encode_lossy`], bytes and fallback count, on every page.
    #[test]
    fn encoding_is_printable_then_encode_lossy() {
        let texts = [
            "Padaria São João",
            "plain ascii 123",
            "",
            "Pão 🍞\x1B@!\n\tfim\u{7F}",
            "“Açaí” — €5 … ¡olé! ß Ω 漢 e\u{301}\u{FE0F}\u{200D}",
            "\u{A0}NBSP ÀÉÎÕÜ ñ º ª",
        ];
        for page in CodePage::ALL {
            for t in texts {
                let mut e = EscPos::new(page);
                let got = e.encode(t);
                let (want, replaced) = page.encode_lossy(&printable(t));
                assert_eq!((got, e.replaced()), (want, replaced), "{page:?} {t:?}");
                let mut e = EscPos::new(page);
                let mut up = Vec::new();
                e.encode_upper_into(t, &mut up);
                assert_eq!(up, page.encode_lossy(&printable(&t.to_uppercase())).0, "{page:?} {t:?} upper");
            }
        }
    }

    #[test]
    fn qr_store_length_uses_ph() {
        let data = vec![b'A'; 300];
        let mut e = EscPos::new(CodePage::Cp860);
        e.qr_native(&data, 6);
        let b = e.into_bytes();
        let store = b.windows(8).position(|w| w[..3] == [0x1D, 0x28, 0x6B] && w[5..] == [0x31, 0x50, 0x30]).unwrap();
        let k = b[store + 3] as usize + 256 * b[store + 4] as usize;
        assert_eq!(k, 303);
        assert_eq!(b[store + 4], 1);
    }

    #[test]
    fn raster_rows_are_padded_msb_first() {
        let mut e = EscPos::new(CodePage::Cp860);
        e.raster(10, 1, |x, _| x == 0 || x == 9);
        assert_eq!(e.into_bytes(), vec![0x1D, 0x76, 0x30, 0, 2, 0, 1, 0, 0x80, 0x40]);
        let mut e = EscPos::new(CodePage::Cp860);
        e.raster_packed(10, 2, &[0x80, 0x40, 0xFF]);
        assert_eq!(
            e.into_bytes(),
            vec![0x1D, 0x76, 0x30, 0, 2, 0, 2, 0, 0x80, 0x40, 0xFF, 0],
            "short data padded white"
        );
    }
}
