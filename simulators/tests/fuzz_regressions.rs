//! Streams found while fuzzing the ESC/POS decoder (`fuzz/fuzz_targets/escpos_decode.rs`),
//! kept as ordinary tests: each must decode to the outcome asserted here.

use preview::escpos::raster::MAX_HEIGHT;
use preview::escpos::{decode, DecodeOptions};

/// `GS ! 0x77` (8 × 8) and `GS B 1` (reverse), then `ESC SP n` before every character with
/// a new `n`: each character is a new style up to (12 + 255) × 8 = 2,136 dots wide. Drawn
/// dot by dot at full width and kept in the glyph cache, this 16 KB stream takes 43 s and
/// 880 MB in printer-sim (debug build) and times out under the fuzzer, so characters are cut
/// at the paper width and the cache has a size budget (`escpos::text`, where the bound
/// itself is tested).
fn spacing_per_character() -> Vec<u8> {
    let mut s = b"\x1d!\x77\x1dB\x01".to_vec();
    for n in 0..=255u8 {
        for c in 0x21..0x31u8 {
            s.extend([0x1B, b' ', n, c]);
        }
    }
    s
}

#[test]
fn a_new_character_spacing_before_every_character_prints_and_is_cut_off() {
    let d = decode(&spacing_per_character(), &DecodeOptions::mm80());
    assert_eq!(d.image.width(), 576);
    // 4,096 lines of 192-dot characters are far longer than the 20,000 dots one decode prints.
    assert_eq!(d.image.height(), MAX_HEIGHT);
    assert!(d.warnings.iter().any(|w| w.contains("cut off")), "{:?}", d.warnings);
    // Spacing 0: 96-dot characters, six to a 576-dot line.
    assert_eq!(d.transcript.lines().next(), Some("!\"#$%&"));
}

#[test]
fn characters_wider_than_the_paper_print_one_per_line_from_the_left_edge() {
    // 8 × 8, reverse, right-side spacing 100: (12 + 100) × 8 = 896 dots, wider than 576.
    let d = decode(b"\x1d!\x77\x1dB\x01\x1b \x64ABC\n", &DecodeOptions::mm80());
    assert_eq!(d.transcript, "A\nB\nC\n");
    assert_eq!(d.image.width(), 576);
    let black = |x: u32, y: u32| d.image.get_pixel(x, y).0[0] == 0;
    // In reverse mode the spacing is black right up to the paper's edge: the last column
    // shows one 192-dot run per character, i.e. one line each.
    let mut runs: Vec<(u32, u32)> = vec![];
    for y in 0..d.image.height() {
        if black(575, y) {
            match runs.last_mut() {
                Some((top, len)) if *top + *len == y => *len += 1,
                _ => runs.push((y, 1)),
            }
        }
    }
    assert_eq!(runs.iter().map(|r| r.1).collect::<Vec<_>>(), [192, 192, 192], "{runs:?}");
    for (top, _) in runs {
        assert!(
            (96..576).all(|x| (top..top + 192).all(|y| black(x, y))),
            "line at {top}: spacing not black to the edge"
        );
        assert!((0..96).any(|x| (top..top + 192).any(|y| !black(x, y))), "line at {top}: no glyph in the cell");
    }
}
