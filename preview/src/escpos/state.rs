//! Print modes: everything `ESC @` resets.

use render::codepage::CodePage;

/// Character font (`ESC M`, bit 0 of `ESC !`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Font {
    /// 12 × 24 dots.
    A,
    /// 9 × 17 dots (TM-T20 class).
    B,
}

impl Font {
    /// Cell width and height in dots at 1 × 1.
    pub fn cell(self) -> (u32, u32) {
        match self {
            Font::A => (12, 24),
            Font::B => (9, 17),
        }
    }
}

/// Justification (`ESC a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Justify {
    /// n = 0 or 48, the power-on default.
    Left,
    /// n = 1 or 49.
    Center,
    /// n = 2 or 50.
    Right,
}

impl Justify {
    /// The justification `ESC a n` selects; an undefined `n` gives [`Justify::Left`].
    pub fn from_param(n: u8) -> Justify {
        match n {
            1 | 49 => Justify::Center,
            2 | 50 => Justify::Right,
            _ => Justify::Left,
        }
    }

    /// Left x of a block `w` dots wide on a line `width` dots wide.
    pub fn x(self, w: u32, width: u32) -> u32 {
        let free = width.saturating_sub(w);
        match self {
            Justify::Left => 0,
            Justify::Center => free / 2,
            Justify::Right => free,
        }
    }
}

/// The character style that applies to text as it enters the line buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TextStyle {
    /// Character font (`ESC M`, `ESC !` bit 0).
    pub font: Font,
    /// Emphasized (`ESC E`, `ESC G`, `ESC !` bit 3).
    pub bold: bool,
    /// 0 off, 1 or 2 dots.
    pub underline: u8,
    /// Character width multiplier (`GS !` high nibble, `ESC !` bit 5), 1..=8.
    pub width_mul: u32,
    /// Character height multiplier (`GS !` low nibble, `ESC !` bit 4), 1..=8.
    pub height_mul: u32,
    /// White on black (`GS B`).
    pub reverse: bool,
    /// Extra dots after each character (`ESC SP`), before scaling by the width multiplier.
    pub right_spacing: u32,
}

/// Default line spacing (`ESC 2`) in dots: 3.75 mm at 203 dpi, as on TM-T20-class printers.
pub const DEFAULT_LINE_SPACING: u32 = 30;

/// Every mode `ESC @` resets.
#[derive(Debug, Clone)]
pub struct PrintState {
    /// Style of the next characters.
    pub style: TextStyle,
    /// `ESC a`. A text line takes the one in force when its first item entered the line
    /// buffer; an image or symbol the one in force when it prints.
    pub justify: Justify,
    /// Line feed amount in dots (`ESC 3 n`; `ESC 2` restores [`DEFAULT_LINE_SPACING`]).
    pub line_spacing: u32,
    /// The character code table in force (`ESC t n`, numbered by the printer model).
    pub code_page: CodePage,
    /// Barcode bar height in dots (`GS h n`), at least 1; 162 at power-on.
    pub barcode_height: u32,
    /// Width of a barcode's narrowest module in dots (`GS w n`), 1..=6; 3 at power-on.
    pub barcode_module: u32,
    /// Where the barcode's human-readable text goes (`GS H n`): 0 none, 1 above, 2 below,
    /// 3 both.
    pub hri_position: u8,
    /// Font of the human-readable text under or over a barcode (`GS f n`).
    pub hri_font: Font,
    /// `GS ( k` QR settings and stored data.
    pub qr: QrSettings,
}

/// `GS ( k` QR settings and the symbol storage area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QrSettings {
    /// 1 model 1, 2 model 2, 3 micro QR.
    pub model: u8,
    /// Dots per module, 1..=16.
    pub module: u32,
    /// Error correction level (fn 69): 'L', 'M', 'Q' or 'H'.
    pub ec: char,
    /// The bytes stored with fn 80 (Function 180), printed by fn 81; `None` until data is
    /// stored. Printing does not clear it.
    pub data: Option<Vec<u8>>,
}

impl Default for QrSettings {
    fn default() -> Self {
        QrSettings { model: 2, module: 3, ec: 'L', data: None }
    }
}

impl PrintState {
    /// The modes at power-on and after `ESC @`, with `code_page` as the code table.
    pub fn new(code_page: CodePage) -> Self {
        PrintState {
            style: TextStyle {
                font: Font::A,
                bold: false,
                underline: 0,
                width_mul: 1,
                height_mul: 1,
                reverse: false,
                right_spacing: 0,
            },
            justify: Justify::Left,
            line_spacing: DEFAULT_LINE_SPACING,
            code_page,
            barcode_height: 162,
            barcode_module: 3,
            hri_position: 0,
            hri_font: Font::A,
            qr: QrSettings::default(),
        }
    }

    /// `ESC !`: font, emphasis, double height/width and underline in one byte.
    pub fn apply_print_mode(&mut self, n: u8) {
        self.style.font = if n & 0x01 != 0 { Font::B } else { Font::A };
        self.style.bold = n & 0x08 != 0;
        self.style.height_mul = if n & 0x10 != 0 { 2 } else { 1 };
        self.style.width_mul = if n & 0x20 != 0 { 2 } else { 1 };
        self.style.underline = if n & 0x80 != 0 { 1 } else { 0 };
    }

    /// `GS !`: high nibble width − 1, low nibble height − 1 (values above 7 are invalid and ignored).
    /// Returns `false` when `n` was ignored.
    pub fn apply_char_size(&mut self, n: u8) -> bool {
        let w = (n >> 4) as u32;
        let h = (n & 0x0F) as u32;
        if w > 7 || h > 7 {
            return false;
        }
        self.style.width_mul = w + 1;
        self.style.height_mul = h + 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn esc_bang_and_gs_bang() {
        let mut s = PrintState::new(CodePage::Cp437);
        s.apply_print_mode(0x38);
        assert_eq!((s.style.bold, s.style.width_mul, s.style.height_mul), (true, 2, 2));
        s.apply_print_mode(0x81);
        assert_eq!((s.style.font, s.style.underline, s.style.width_mul), (Font::B, 1, 1));
        assert!(s.apply_char_size(0x70));
        assert_eq!((s.style.width_mul, s.style.height_mul), (8, 1));
        assert!(!s.apply_char_size(0x88));
        assert_eq!(Justify::Center.x(100, 384), 142);
    }
}
