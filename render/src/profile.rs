//! What a receipt printer *model* can do: paper widths, dots per line, font columns, which
//! character code tables it has under which `ESC t n` number, native QR, and how it cuts.
//!
//! The device registry says how one printer is *set up* (paper, code page, `nativeQr`:
//! [`crate::receipt::PrinterProfile`]); this module says what its model *is*. The two meet
//! in [`crate::receipt::render_receipt_for`].
//!
//! Why per model: the `n` of `ESC t n` is vendor specific. Epson's numbering (CP860 = 3)
//! is the Epson ESC/POS Command Reference's (`ESC t`) and what almost every clone uses, but the
//! Brazilian Bematech and Elgin firmwares number their tables differently (CP860 = 4 on
//! both, per `grandchef/escpos-buffer`, a Brazilian ESC/POS library). Sending
//! Epson's 3 to a Bematech selects CP437 there, and every `ã` prints as a wrong letter.
//!
//! Sources, per fact, are in each entry's `source` field and in the doc comments below.
//! Geometry is at 203 dpi (8 dots/mm; notes §c).

use crate::codepage::CodePage;

/// Width of a font A character cell, in dots (12 × 24; notes §b `ESC M`, §c).
pub const FONT_A_DOTS: u32 = 12;
/// Width of a font B character cell, in dots (9 × 17 on TM-T20, 9 × 24 on clones; notes §b).
///
/// Columns = ⌊dots per line / 9⌋: 64 on 80 mm (576 dots: notes §c, TM-T20II / TM-P80 /
/// RP-F10-80 / TH230 rows; escpos-buffer's Elgin I9 profile also says 64), 42 on 58 mm
/// (384 dots: notes §c, POS-5890 class). Uncertain: Epson models that run 58 mm paper at 360
/// or 420 dots (notes §c) have 40 or 46 font B columns there, and clones whose font B is
/// 9 × 24 have the same columns but taller lines; none of the fixture models is checked on
/// hardware for its 58 mm font B.
pub const FONT_B_DOTS: u32 = 9;

/// How the model's autocutter cuts, i.e. which `GS V` function B command a job ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CutStyle {
    /// Full cut: `GS V A n` (`1D 56 41 n`).
    Full,
    /// Partial cut, one point left: `GS V B n` (`1D 56 42 n`).
    Partial,
}

impl CutStyle {
    /// The `m` of `GS V m n` (function B): 65 (`'A'`) full, 66 (`'B'`) partial.
    pub fn gs_v_m(self) -> u8 {
        match self {
            CutStyle::Full => 65,
            CutStyle::Partial => 66,
        }
    }
}

/// One character code table a model has, and the `n` that selects it with `ESC t n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeTable {
    /// The table's contents.
    pub page: CodePage,
    /// The `n` of `ESC t n` on this model.
    pub esc_t: u8,
    /// Where the number comes from (a note section or a repository path).
    pub source: &'static str,
}

/// What a printer model can do (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelProfile {
    /// The model's name as the device registry spells it (`"Epson TM-T20X"`), or
    /// `"generic"`.
    pub model: &'static str,
    /// Paper roll widths the model takes, in millimetres.
    pub paper_widths_mm: &'static [u8],
    /// Printable dots per line on 58 mm paper (203 dpi).
    pub dots_58mm: u32,
    /// Printable dots per line on 80 mm paper (203 dpi).
    pub dots_80mm: u32,
    /// Code tables the model has, with their `ESC t` numbers on this model.
    pub code_tables: &'static [CodeTable],
    /// Whether the model prints QR codes from `GS ( k` (cn = 49) in ESC/POS mode. When
    /// false, receipts send a `GS v 0` raster QR whatever the device's `nativeQr` says.
    pub native_qr: bool,
    /// Whether the model's `GS v 0` takes m = 3 (quadruple: each bit prints as 2 × 2 dots,
    /// 101 × 101 dpi), per its programmer's manual. Then a raster QR whose module is an
    /// even number of dots goes at half resolution with m = 3: the same dots on paper from
    /// a quarter of the bytes (a version 9 QR at 6-dot modules: 16.8 → 4.2 KB, 13 s
    /// less on a 9600-baud serial line). False where unchecked: a printer that ignored m
    /// would print the QR at half size.
    pub raster_quadruple: bool,
    /// How its cutter cuts.
    pub cut: CutStyle,
    /// Where the geometry, QR and cut facts come from.
    pub source: &'static str,
}

impl ModelProfile {
    /// Printable dots per line for `paper_width_mm` (≥ 70 counts as 80 mm, else 58 mm,
    /// like [`crate::receipt::PrinterProfile::dots`]).
    pub fn dots_per_line(&self, paper_width_mm: u8) -> u32 {
        if paper_width_mm >= 70 {
            self.dots_80mm
        } else {
            self.dots_58mm
        }
    }

    /// Font A columns (12-dot cells) on `paper_width_mm`: 32 on 58 mm, 48 on 80 mm for a
    /// 384/576-dot head.
    pub fn columns_font_a(&self, paper_width_mm: u8) -> usize {
        (self.dots_per_line(paper_width_mm) / FONT_A_DOTS) as usize
    }

    /// Font B columns (9-dot cells) on `paper_width_mm`: 42 on 58 mm, 64 on 80 mm for a
    /// 384/576-dot head.
    pub fn columns_font_b(&self, paper_width_mm: u8) -> usize {
        (self.dots_per_line(paper_width_mm) / FONT_B_DOTS) as usize
    }

    /// Whether the model takes paper this wide (exact match on [`Self::paper_widths_mm`]).
    pub fn takes_paper(&self, paper_width_mm: u8) -> bool {
        self.paper_widths_mm.contains(&paper_width_mm)
    }

    /// The `ESC t n` that selects `page` on this model, or `None` if the model lacks it.
    pub fn esc_t(&self, page: CodePage) -> Option<u8> {
        self.code_tables.iter().find(|t| t.page == page).map(|t| t.esc_t)
    }

    /// The page this model selects for `ESC t n`, if known (the inverse of [`Self::esc_t`];
    /// for a printer simulator that follows a model's numbering).
    pub fn page_for_esc_t(&self, n: u8) -> Option<CodePage> {
        self.code_tables.iter().find(|t| t.esc_t == n).map(|t| t.page)
    }
}

const NOTES_B: &str =
    "Epson ESC/POS Command Reference, ESC t (Epson numbering; python-escpos capabilities.json: same on Epson and most clones)";
const ESCPOS_BUFFER: &str = "grandchef/escpos-buffer:src/capabilities.ts (commit c947483), not in python-escpos capabilities.json, not verified on hardware";

/// Epson's numbering, every page [`CodePage`] knows (notes §b): built from
/// [`CodePage::epson_table`], the one place that numbering is written down.
const EPSON_TABLES: &[CodeTable] = &{
    let mut tables = [CodeTable { page: CodePage::Cp437, esc_t: 0, source: NOTES_B }; CodePage::ALL.len()];
    let mut i = 0;
    while i < tables.len() {
        let page = CodePage::ALL[i];
        tables[i] = CodeTable { page, esc_t: page.epson_table(), source: NOTES_B };
        i += 1;
    }
    tables
};

// Bematech's and Elgin's tables below agree on four of their numbers, but they are two
// vendors' facts, each from its own escpos-buffer profile (`bematech` stands alone;
// `elgin` overrides `epson`): kept apart on purpose, so that correcting one vendor's
// numbering (e.g. after checking a self-test page) cannot change the other's.

/// Bematech MP-4200 TH tables (escpos-buffer `bematech` profile): no CP863, CP865, WPC1252.
const BEMATECH_TABLES: &[CodeTable] = &[
    CodeTable { page: CodePage::Cp850, esc_t: 2, source: ESCPOS_BUFFER },
    CodeTable { page: CodePage::Cp437, esc_t: 3, source: ESCPOS_BUFFER },
    CodeTable { page: CodePage::Cp860, esc_t: 4, source: ESCPOS_BUFFER },
    CodeTable { page: CodePage::Cp858, esc_t: 5, source: ESCPOS_BUFFER },
];

/// Elgin i9 tables (escpos-buffer `elgin` profile, which overrides Epson's): no CP863, CP865.
const ELGIN_TABLES: &[CodeTable] = &[
    CodeTable { page: CodePage::Wpc1252, esc_t: 1, source: ESCPOS_BUFFER },
    CodeTable { page: CodePage::Cp850, esc_t: 2, source: ESCPOS_BUFFER },
    CodeTable { page: CodePage::Cp437, esc_t: 3, source: ESCPOS_BUFFER },
    CodeTable { page: CodePage::Cp860, esc_t: 4, source: ESCPOS_BUFFER },
    CodeTable { page: CodePage::Cp858, esc_t: 5, source: ESCPOS_BUFFER },
];

/// A generic ESC/POS printer: Epson numbering, 384/576 dots, native QR, full cut. Exactly
/// what pixgate sent before model profiles existed.
pub static GENERIC: ModelProfile = ModelProfile {
    model: "generic",
    paper_widths_mm: &[58, 80],
    dots_58mm: 384,
    dots_80mm: 576,
    code_tables: EPSON_TABLES,
    native_qr: true,
    raster_quadruple: false,
    cut: CutStyle::Full,
    source: "Epson ESC/POS Command Reference (commands; GS V A n as mike42/escpos-php sends it); python-escpos capabilities.json (384/576 dots)",
};

/// Epson TM-T20X.
pub static EPSON_TM_T20X: ModelProfile = ModelProfile {
    model: "Epson TM-T20X",
    paper_widths_mm: &[58, 80],
    // 576 on 80 mm: notes §c (TM-T20II row). 58 mm: notes §c warn that some Epson models
    // use 360 or 420 dots there; 384 is assumed, not checked for the TM-T20X.
    dots_58mm: 384,
    dots_80mm: 576,
    code_tables: EPSON_TABLES,
    native_qr: true,
    raster_quadruple: true,
    cut: CutStyle::Partial,
    source: "tables: notes §b; dots: notes §c; GS ( k and GS v 0 m = 0–3: notes §b (Epson reference); partial cut: escpos-buffer's epson profile cuts with ESC m (partial), notes §b say most cutters leave one point",
};

/// Elgin i9 (Brazilian, Epson-compatible command set).
pub static ELGIN_I9: ModelProfile = ModelProfile {
    model: "Elgin i9",
    paper_widths_mm: &[58, 80],
    dots_58mm: 384,
    dots_80mm: 576,
    code_tables: ELGIN_TABLES,
    native_qr: true,
    // No Elgin command reference at hand to check GS v 0's m against: m = 0, as before.
    raster_quadruple: false,
    cut: CutStyle::Full,
    source: "escpos-buffer: model I9 has font A 48 / font B 64 columns on 80 mm (= 576 dots), prints QR with Epson's GS ( k, cuts with GS V 0 (full)",
};

/// Bematech MP-4200 TH in ESC/POS mode (it also has an ESC/Bema mode: notes §b, "Which
/// code page for Portuguese"; check the self-test page).
pub static BEMATECH_MP4200TH: ModelProfile = ModelProfile {
    model: "Bematech MP-4200 TH",
    paper_widths_mm: &[58, 80],
    dots_58mm: 384,
    dots_80mm: 576,
    code_tables: BEMATECH_TABLES,
    // escpos-buffer prints Bematech QRs with Bematech's own `GS k Q`, not `GS ( k`: whether
    // the ESC/POS mode prints `GS ( k` is unknown here, so a raster QR is sent (safe).
    native_qr: false,
    raster_quadruple: true,
    cut: CutStyle::Partial,
    source: "escpos-buffer bematech profile: tables, QR via GS k Q, cut via ESC m (partial); dots: notes §c; GS v 0 with m = 0–3 (3 = quadruple, 101 × 101 dpi): MP-4200 TH Programmer's Manual rev. 1.0 (Bematech, 2010), ESC/POS command list",
};

/// Every known profile, generic last.
pub static ALL: [&ModelProfile; 4] = [&BEMATECH_MP4200TH, &ELGIN_I9, &EPSON_TM_T20X, &GENERIC];

fn normalise(s: &str) -> String {
    s.chars().filter(|c| c.is_ascii_alphanumeric()).map(|c| c.to_ascii_lowercase()).collect()
}

/// The profile for a registry `model` string. Matching ignores case, spaces and
/// punctuation (`"bematech mp4200th"` finds the MP-4200 TH); anything unknown, including
/// an empty string, gets [`GENERIC`].
pub fn profile_for_model(model: &str) -> &'static ModelProfile {
    let m = normalise(model);
    ALL.into_iter().find(|p| normalise(p.model) == m).unwrap_or(&GENERIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_is_forgiving_and_defaults_to_generic() {
        assert_eq!(profile_for_model("Bematech MP-4200 TH").model, "Bematech MP-4200 TH");
        assert_eq!(profile_for_model("bematech mp4200th").model, "Bematech MP-4200 TH");
        assert_eq!(profile_for_model("ELGIN I9").model, "Elgin i9");
        assert_eq!(profile_for_model("Epson TM-T20X").model, "Epson TM-T20X");
        assert_eq!(profile_for_model("Daruma DR800").model, "generic");
        assert_eq!(profile_for_model("").model, "generic");
    }

    #[test]
    fn geometry_matches_the_notes() {
        for p in ALL {
            assert_eq!((p.columns_font_a(58), p.columns_font_b(58)), (32, 42), "{}", p.model);
            assert_eq!((p.columns_font_a(80), p.columns_font_b(80)), (48, 64), "{}", p.model);
            assert!(p.takes_paper(58) && p.takes_paper(80));
        }
    }

    #[test]
    fn code_tables_differ_by_vendor() {
        assert_eq!(GENERIC.esc_t(CodePage::Cp860), Some(3));
        assert_eq!(EPSON_TM_T20X.esc_t(CodePage::Cp860), Some(3));
        assert_eq!(ELGIN_I9.esc_t(CodePage::Cp860), Some(4));
        assert_eq!(BEMATECH_MP4200TH.esc_t(CodePage::Cp860), Some(4));
        assert_eq!(BEMATECH_MP4200TH.esc_t(CodePage::Cp850), Some(2));
        assert_eq!(BEMATECH_MP4200TH.esc_t(CodePage::Wpc1252), None);
        assert_eq!(ELGIN_I9.esc_t(CodePage::Wpc1252), Some(1));
        for p in ALL {
            // Numbers are unique per model, and the inverse lookup agrees.
            for t in p.code_tables {
                assert_eq!(p.page_for_esc_t(t.esc_t), Some(t.page), "{}", p.model);
            }
        }
        // Generic is exactly the Epson numbering CodePage has always used.
        for page in CodePage::ALL {
            assert_eq!(GENERIC.esc_t(page), Some(page.epson_table()));
        }
    }
}
