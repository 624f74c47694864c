//! The ESC/POS decoder (`preview::escpos::decode`, the printer simulator's paper and the
//! dashboard's preview) on arbitrary bytes.
//!
//! Input: one selector byte, then the stream as the printer receives it. The selector picks
//! the printer: bit 0 the paper (0 → 80 mm / 576 dots, 1 → 58 mm / 384 dots), bits 1-2 the
//! model whose `ESC t` numbering applies (`render::profile::ALL`), bits 3-5 the code page in
//! force at power-on (`CodePage::ALL`, wrapping). Seeds carry selector 0 (80 mm, the first
//! model, CP437) or 1 (58 mm) in front of the fixture stream.
//!
//! Properties (module docs of `preview/src/escpos/mod.rs`): never panics; the paper is
//! exactly as wide as the print head and at most `raster::MAX_HEIGHT` dots long; warnings
//! are capped. Bounded memory and time are enforced by the run's `-rss_limit_mb`,
//! `-malloc_limit_mb` and `-timeout` (see `scripts/fuzz.sh`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use render::codepage::CodePage;
use render::profile::ALL as MODELS;
use preview::escpos::{decode, raster::MAX_HEIGHT, DecodeOptions};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, stream)) = data.split_first() else { return };
    let base = if selector & 1 == 0 { DecodeOptions::mm80() } else { DecodeOptions::mm58() };
    let opts = DecodeOptions {
        model: MODELS[((selector >> 1) & 3) as usize % MODELS.len()],
        initial_code_page: CodePage::ALL[((selector >> 3) & 7) as usize % CodePage::ALL.len()],
        ..base
    };
    let d = decode(stream, &opts);
    assert_eq!(d.image.width(), opts.width_dots, "paper width");
    assert!(d.image.height() >= 1 && d.image.height() <= MAX_HEIGHT, "paper length {}", d.image.height());
    assert!(d.warnings.len() <= 201, "{} warnings: the cap is 200 plus a summary line", d.warnings.len());
    assert!(d.qr_codes.len() <= stream.len(), "more QR symbols than bytes");
});
