//! Decoder tests: the public fixture streams, round trips and truncation.

use super::*;
use std::path::{Path, PathBuf};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/escpos");

/// Every `.bin` under the fixture dir.
fn fixture_files() -> Vec<PathBuf> {
    let dir = Path::new(FIXTURES);
    assert!(dir.is_dir(), "fixture dir {FIXTURES} is missing");
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "bin") {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(!out.is_empty(), "no .bin fixtures in {FIXTURES}");
    out
}

fn fixture(rel: &str) -> Vec<u8> {
    let path = Path::new(FIXTURES).join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn opts80() -> DecodeOptions {
    DecodeOptions::mm80()
}

fn black(img: &image::GrayImage) -> usize {
    img.pixels().filter(|p| p.0[0] == 0).count()
}

#[test]
fn every_fixture_decodes_plausibly_and_is_written_as_png() {
    let files = fixture_files();
    let out_dir = Path::new("/tmp/decoder-samples");
    let _ = std::fs::create_dir_all(out_dir);
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        let d = decode(&bytes, &opts80());
        let name = format!(
            "{}-{}",
            f.parent().unwrap().file_name().unwrap().to_string_lossy(),
            f.file_stem().unwrap().to_string_lossy()
        );
        assert_eq!(d.image.width(), 576, "{name}");
        assert!(d.image.height() > 100, "{name}: only {} rows", d.image.height());
        assert!(black(&d.image) > 500, "{name}: almost nothing printed");
        assert!(!d.transcript.trim().is_empty(), "{name}: empty transcript");
        let _ = d.image.save(out_dir.join(format!("{name}.png")));
        // Tall printouts also in parts, to look at them at full resolution.
        if d.image.height() > 1500 {
            for (i, y) in (0..d.image.height()).step_by(1200).enumerate() {
                let h = 1200.min(d.image.height() - y);
                let part = image::imageops::crop_imm(&d.image, 0, y, 576, h).to_image();
                let _ = part.save(out_dir.join(format!("{name}-part{i}.png")));
            }
        }
        let _ = std::fs::write(
            out_dir.join(format!("{name}.txt")),
            format!("{}\n--- skipped: {:?}\n--- warnings: {:#?}\n", d.transcript, d.skipped, d.warnings),
        );
        // Also at 58 mm: must not panic, must stay 384 wide.
        let d58 = decode(&bytes, &DecodeOptions::mm58());
        assert_eq!(d58.image.width(), 384);
    }
}

#[test]
fn receipt_with_logo_matches_the_photo_layout() {
    let bytes = fixture("escpos-tools/receipt-with-logo.bin");
    let d = decode(&bytes, &opts80());
    let t = &d.transcript;
    assert!(t.starts_with("[GRAPHICS 300x236]\n"), "{t}");
    for line in [
        "ExampleMart Ltd.",
        "Shop No. 42.",
        "SALES INVOICE",
        "Example item #1                             4.00",
        "Subtotal                                   12.95",
        "Total            $ 14.25",
        "Thank you for shopping at ExampleMart",
        "Monday 6th of April 2015 02:56:25 PM",
        "[CUT full]",
        "[DRAWER pin2]",
    ] {
        assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
    }
    assert_eq!(d.cuts, 1);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert!(d.skipped.is_empty(), "{:?}", d.skipped);
    // The logo is centred: 300 dots on 576 → starts at x = 138.
    let img = &d.image;
    let first_black_x = (0..576).find(|&x| (0..236).any(|y| img.get_pixel(x, y).0[0] == 0)).unwrap();
    assert!((138..170).contains(&first_black_x), "logo starts at x={first_black_x}");
}

#[test]
fn qr_fixture_symbols_scan_back() {
    let bytes = fixture("escpos-php/qr-code.bin");
    let d = decode(&bytes, &opts80());
    assert!(d.qr_codes.len() >= 5, "{:?}", d.qr_codes);
    for q in &d.qr_codes {
        assert!(d.transcript.contains(&format!("] {q}")), "{q} not in transcript");
    }
    let scanned = qr::scan(&d.image);
    assert_eq!(scanned, d.qr_codes, "scanned vs stored");
}

#[test]
fn gateway_style_receipt_with_pix_qr() {
    let payload = "00020126580014br.gov.bcb.pix0136123e4567-e12b-12d1-a456-4266554400005204000053039865802BR5913Fulano de Tal6008BRASILIA62070503***63041D3D";
    let mut s = vec![0x1B, b'@', 0x1B, b't', 3, 0x1B, b'a', 1, 0x1D, b'!', 0x11];
    s.extend(b"PAGAMENTO PIX\n");
    s.extend([0x1D, b'!', 0, 0x1B, b'E', 1]);
    s.extend(b"Total R$ 12,50\n");
    s.extend([0x1B, b'E', 0]);
    s.extend([0x1D, 0x28, 0x6B, 4, 0, 0x31, 0x41, 50, 0]);
    s.extend([0x1D, 0x28, 0x6B, 3, 0, 0x31, 0x43, 6]);
    s.extend([0x1D, 0x28, 0x6B, 3, 0, 0x31, 0x45, 49]);
    let k = payload.len() + 3;
    s.extend([0x1D, 0x28, 0x6B, (k & 0xFF) as u8, (k >> 8) as u8, 0x31, 0x50, 0x30]);
    s.extend(payload.as_bytes());
    s.extend([0x1D, 0x28, 0x6B, 3, 0, 0x31, 0x51, 0x30]);
    s.extend([0x1B, b'd', 3, 0x1D, b'V', 66, 0]);
    s.extend([0x10, 0x04, 1]);
    for width in [384, 576] {
        let d = decode(
            &s,
            &DecodeOptions { width_dots: width, initial_code_page: CodePage::Cp437, ..DecodeOptions::mm80() },
        );
        assert_eq!(d.image.width(), width);
        assert_eq!(d.qr_codes, vec![payload.to_string()]);
        assert!(d.transcript.contains(&format!("[QR model2 ec=M module=6] {payload}")), "{}", d.transcript);
        assert!(d.transcript.contains("[CUT partial]"));
        assert_eq!(d.status_requests, vec![1]);
        assert_eq!(qr::scan(&d.image), vec![payload.to_string()]);
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    }
}

#[test]
fn cp860_text_round_trips_with_accents() {
    let text = "São João — Pão";
    let (enc, _) = CodePage::Cp860.encode_lossy(text);
    let mut s = vec![0x1B, b'@', 0x1B, b't', 3];
    s.extend(&enc);
    s.push(b'\n');
    let d = decode(&s, &DecodeOptions::mm58());
    assert_eq!(d.transcript, "São João - Pão\n");
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    // Same bytes without ESC t: CP437 has no ã, so the line differs.
    let d = decode(&enc, &DecodeOptions::mm58());
    assert!(!d.transcript.contains("São"));
}

#[test]
fn code_page_switch_mid_line() {
    // 0x84 is ã in CP860 and ä in CP437; switched in the middle of one line.
    let s = b"\x1bt\x03\x84\x1bt\x00\x84\x1bt\x10\xe3\n";
    let d = decode(s, &DecodeOptions::mm58());
    assert_eq!(d.transcript, "ãäã\n");
}

#[test]
fn raw_utf8_text_is_flagged() {
    let d = decode("Pão\n".as_bytes(), &DecodeOptions::mm58());
    assert!(d.warnings.iter().any(|w| w.contains("UTF-8")), "{:?}", d.warnings);
    // Legitimate CP860 bytes are not flagged.
    let (enc, _) = CodePage::Cp860.encode_lossy("Ação São João ÇÃO");
    let mut s = b"\x1bt\x03".to_vec();
    s.extend(enc);
    assert!(decode(&s, &DecodeOptions::mm58()).warnings.iter().all(|w| !w.contains("UTF-8")));
}

#[test]
fn raster_203_dots_round_trips_pixel_exact() {
    let (w, h) = (203u32, 40u32);
    let pix = |x: u32, y: u32| (x * 7 + y * 13).is_multiple_of(5) || x == 202 || y == 0;
    let xb = w.div_ceil(8) as usize;
    let mut data = vec![0u8; xb * h as usize];
    for y in 0..h {
        for x in 0..w {
            if pix(x, y) {
                data[y as usize * xb + (x / 8) as usize] |= 0x80 >> (x % 8);
            }
        }
    }
    let mut s = vec![0x1B, b'@', 0x1D, b'v', b'0', 0, xb as u8, 0, h as u8, 0];
    s.extend(&data);
    let d = decode(&s, &DecodeOptions::mm58());
    assert_eq!(d.transcript, "[RASTER 208x40]\n");
    assert_eq!(d.image.height(), h);
    for y in 0..h {
        for x in 0..384 {
            let want = x < w && pix(x, y);
            assert_eq!(d.image.get_pixel(x, y).0[0] == 0, want, "pixel {x},{y}");
        }
    }
    // Centred and double-size variants print at the expected place and size.
    let mut c = vec![0x1B, b'a', 1, 0x1D, b'v', b'0', 3, xb as u8, 0, h as u8, 0];
    c.extend(&data);
    let d = decode(&c, &DecodeOptions::mm58());
    assert_eq!(d.transcript, "[RASTER 416x80]\n");
    assert_eq!(d.image.height(), 80);
    assert!(d.warnings.iter().any(|w| w.contains("clipped")), "{:?}", d.warnings);
}

#[test]
fn text_styles_change_the_ink() {
    let plain = decode(b"HELLO\n", &DecodeOptions::mm58());
    let bold = decode(b"\x1bE\x01HELLO\n", &DecodeOptions::mm58());
    let big = decode(b"\x1d!\x11HELLO\n", &DecodeOptions::mm58());
    let under = decode(b"\x1b-\x02HELLO\n", &DecodeOptions::mm58());
    let font_b = decode(b"\x1bM\x01HELLO\n", &DecodeOptions::mm58());
    let esc_bang = decode(b"\x1b!\x30HELLO\n", &DecodeOptions::mm58());
    let (p, b, g, u, f) =
        (black(&plain.image), black(&bold.image), black(&big.image), black(&under.image), black(&font_b.image));
    assert!(b > p && u > p && f < p, "{p} {b} {u} {f}");
    assert!(g > 3 * p, "{g} vs {p}");
    assert_eq!(black(&esc_bang.image), g);
    assert!(big.image.height() >= 48);
    for d in [&plain, &bold, &big, &under, &font_b] {
        assert_eq!(d.transcript, "HELLO\n");
    }
}

/// Font B is drawn in its real 9 × 17-dot cell, font A in 12 × 24: 64 font B characters
/// fill an 80 mm line exactly (48 in font A, the 49th wraps), and the ink of a line of
/// capitals spans 9 dots per character and fits 17 dots of height.
#[test]
fn font_b_cells_are_9_by_17_dots() {
    let ink_box = |img: &image::GrayImage| {
        let inked: Vec<(u32, u32)> = img.enumerate_pixels().filter(|p| p.2 .0[0] == 0).map(|p| (p.0, p.1)).collect();
        let xs = inked.iter().map(|p| p.0);
        let ys = inked.iter().map(|p| p.1);
        (xs.clone().min().unwrap(), xs.max().unwrap(), ys.clone().min().unwrap(), ys.max().unwrap())
    };
    let b64 = format!("\x1bM\x01{}\n", "H".repeat(64));
    let d = decode(b64.as_bytes(), &opts80());
    assert_eq!(d.transcript, format!("{}\n", "H".repeat(64)), "64 font B cells on one 576-dot line");
    let (x0, x1, y0, y1) = ink_box(&d.image);
    assert!(x0 < 9 && x1 >= 576 - 9, "ink spans the line: {x0}..{x1}");
    assert!(y1 - y0 < 17, "font B capitals within 17 dots: {}", y1 - y0 + 1);

    let a = decode(format!("{}\n", "H".repeat(49)).as_bytes(), &opts80());
    assert_eq!(a.transcript, format!("{}\nH\n", "H".repeat(48)), "font A: 48 columns");
    let (_, _, ay0, ay1) = ink_box(&a.image);
    let a1 = decode(b"HHHH\n", &opts80());
    let (_, _, a1y0, a1y1) = ink_box(&a1.image);
    assert!(a1y1 - a1y0 > y1 - y0, "font A capitals taller ({}) than font B ({})", a1y1 - a1y0 + 1, y1 - y0 + 1);
    assert!(ay1 > ay0);

    // ESC @ goes back to font A; ESC ! bit 0 selects B as well.
    let reset = decode(format!("\x1bM\x01\x1b@{}\n", "H".repeat(49)).as_bytes(), &opts80());
    assert_eq!(reset.transcript.lines().count(), 2);
    let bang = decode(format!("\x1b!\x01{}\n", "H".repeat(64)).as_bytes(), &opts80());
    assert_eq!(bang.transcript.lines().count(), 1);
}

#[test]
fn justification_applies_per_line() {
    let d = decode(b"\x1ba\x02R\n\x1ba\x01C\n\x1ba\x00L\n", &DecodeOptions::mm58());
    let img = &d.image;
    let ink_x = |y0: u32| {
        let xs: Vec<u32> = (0..384).filter(|&x| (y0..y0 + 24).any(|y| img.get_pixel(x, y).0[0] == 0)).collect();
        (*xs.first().unwrap(), *xs.last().unwrap())
    };
    let (r0, _) = ink_x(0);
    let (c0, c1) = ink_x(30);
    let (l0, _) = ink_x(60);
    assert!(r0 >= 372, "right {r0}");
    assert!(c0 >= 186 && c1 < 198, "centre {c0}..{c1}");
    assert!(l0 < 12, "left {l0}");
}

#[test]
fn line_spacing_and_feeds() {
    let h = |s: &[u8]| decode(s, &DecodeOptions::mm58()).image.height();
    assert_eq!(h(b"A\n"), 30);
    assert_eq!(h(b"\x1b3\x40A\n"), 64);
    assert_eq!(h(b"\x1bd\x03"), 90);
    assert_eq!(h(b"\x1bJ\x50"), 80);
    assert_eq!(h(b"\x1b3\x10\x1b2A\n"), 30);
}

#[test]
fn barcodes_render_and_are_listed() {
    let s = b"\x1dH\x02\x1dh\x50\x1dw\x02\x1dkI\x0d{B012ABCDabcd\x1dkC\x0c012345678901\x1dk\x04CODE39\x00\x1dV\x00";
    let d = decode(s, &DecodeOptions::mm58());
    let t = &d.transcript;
    assert!(t.contains("[BARCODE CODE128] 012ABCDabcd"), "{t}");
    assert!(t.contains("[BARCODE EAN13] 0123456789012"), "{t}");
    assert!(t.contains("[BARCODE CODE39] CODE39"), "{t}");
    assert!(t.contains("[CUT full]"));
    assert_eq!(d.cuts, 1);
    assert!(d.image.height() > 3 * 80);
    assert_eq!(d.skipped.get("GS k CODE39 (placeholder)"), Some(&1));
}

/// A cut's row is where the paper above it ends: everything printed lies above it, the
/// cut's dashed line below it.
#[test]
fn a_cut_row_ends_the_printed_paper() {
    let d = decode(b"AAAA\n\x1dVA\x00BBBB\n\x1dV\x01", &DecodeOptions::mm58());
    assert_eq!(d.cut_rows.len(), 2);
    let (first, second) = (d.cut_rows[0], d.cut_rows[1]);
    let ink = |rows: std::ops::Range<u32>| {
        rows.flat_map(|y| (0..384).map(move |x| (x, y))).filter(|&(x, y)| d.image.get_pixel(x, y).0[0] == 0).count()
    };
    assert!(ink(0..first) > 0, "the first line is above the first cut");
    assert_eq!(ink(first..first + 3), 0, "nothing printed at the cut itself");
    assert!(ink(first + 3..first + 7) > 0, "the first cut's dashes");
    assert!(ink(first + 7..second) > 0, "the second line is between the cuts");
    assert!(second < d.image.height());
}

#[test]
fn graphics_store_and_print() {
    // 10 × 2 graphic: first row all black.
    let mut s = vec![0x1D, b'(', b'L', 14, 0, 0x30, 0x70, 0x30, 1, 1, 0x31, 10, 0, 2, 0];
    s.extend([0xFF, 0xC0, 0, 0]);
    s.extend([0x1D, b'(', b'L', 2, 0, 0x30, 0x32]);
    let d = decode(&s, &DecodeOptions::mm58());
    assert_eq!(d.transcript, "[GRAPHICS 10x2]\n");
    assert!((0..10).all(|x| d.image.get_pixel(x, 0).0[0] == 0));
    assert!(d.image.get_pixel(10, 0).0[0] == 255 && d.image.get_pixel(0, 1).0[0] == 255);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
}

#[test]
fn drawer_status_and_skips() {
    let s = b"\x1bp\x00\x19\xfa\x10\x04\x04\x1dL\x10\x00\x1b{\x01\x1bR\x02\x1b\x07X\n";
    let d = decode(s, &DecodeOptions::mm58());
    assert_eq!(d.transcript, "[DRAWER pin2]\nX\n");
    assert_eq!(d.status_requests, vec![4]);
    assert_eq!(d.skipped.get("GS L"), Some(&1));
    assert_eq!(d.skipped.get("ESC {"), Some(&1));
    assert_eq!(d.skipped.get("ESC R"), Some(&1));
    assert_eq!(d.skipped.get("ESC 0x07"), Some(&1));
    // escpos 0.20.1's 3-byte ESC p swallows the cut that follows it.
    let d = decode(b"\x1bp\x00\x1dVA\x01", &DecodeOptions::mm58());
    assert!(d.warnings.iter().any(|w| w.contains("missing t1/t2")), "{:?}", d.warnings);
    assert_eq!(d.cuts, 0);
}

#[test]
fn hostile_lengths_are_bounded() {
    let cases: Vec<Vec<u8>> = vec![
        b"\x1dv0\x00\xff\xff\xff\xff\x01\x02\x03".to_vec(),
        b"\x1d(L\xff\xff0p0\x01\x011\xff\xff\xff\xff\xaa".to_vec(),
        b"\x1d8L\xff\xff\xff\xff0p0\x02\x021\xff\xff\xff\xff\xaa".to_vec(),
        b"\x1b*\x21\xff\xff\x01".to_vec(),
        b"\x1d(k\xff\xff1P0abc".to_vec(),
        b"\x1dkI\xffabc".to_vec(),
        b"\x1b3\xff".iter().copied().chain(std::iter::repeat_n(b'\n', 5000)).collect(),
    ];
    for c in cases {
        let d = decode(&c, &DecodeOptions::mm58());
        assert!(d.image.height() <= raster::MAX_HEIGHT);
        assert!(d.image.as_raw().len() <= 384 * raster::MAX_HEIGHT as usize);
        assert!(!d.warnings.is_empty(), "{c:?}");
    }
}

#[test]
fn a_preview_stops_drawing_at_its_cap_but_still_answers_status() {
    // Double-height text at the tallest line spacing: 255 dots a line.
    let mut bytes = b"\x1b3\xff\x1d!\x77".to_vec();
    for _ in 0..20 {
        bytes.extend_from_slice(b"TALL LINE\n");
    }
    bytes.extend_from_slice(b"\x10\x04\x01");
    let full = decode(&bytes, &DecodeOptions::mm80());
    let preview = decode(&bytes, &DecodeOptions::preview(576));
    assert!(full.image.height() > PREVIEW_MAX_HEIGHT, "{}", full.image.height());
    assert_eq!(preview.image.height(), PREVIEW_MAX_HEIGHT);
    // The part drawn is the same paper.
    let n = (576 * PREVIEW_MAX_HEIGHT) as usize;
    assert_eq!(&preview.image.as_raw()[..n], &full.image.as_raw()[..n]);
    assert_eq!(preview.status_requests, vec![1]);
    assert_eq!(full.status_requests, vec![1]);
    let w = preview.warnings.iter().find(|w| w.contains("cut off")).expect("a cut-off warning");
    assert!(w.contains("longer than 4000 dots"), "{w}");
    let skipped: usize = w.split(", ").nth(1).and_then(|t| t.split(' ').next()).and_then(|n| n.parse().ok()).unwrap();
    assert!(skipped > 0, "{w}");
    assert!(!full.warnings.iter().any(|w| w.contains("cut off")), "{:?}", full.warnings);
}

#[test]
fn a_short_receipt_previews_exactly_as_printed() {
    let bytes = b"\x1b@\x1ba\x01Pix\nR$ 12,34\n\x1dV\x00";
    let full = decode(bytes, &DecodeOptions::mm58());
    let preview = decode(bytes, &DecodeOptions::preview(384));
    assert_eq!(preview.image, full.image);
    assert_eq!(preview.transcript, full.transcript);
    assert_eq!(preview.cuts, 1);
}

/// Every fixture cut at many points (every byte for the first 128 bytes and the last 16,
/// about 60 evenly spaced points elsewhere) decodes without panic.
#[test]
fn truncated_fixtures_never_panic() {
    let files = fixture_files();
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        let n = bytes.len();
        let step = (n / 60).max(1);
        let mut cuts: Vec<usize> = (0..n.min(128)).collect();
        cuts.extend((0..n).step_by(step));
        cuts.extend(n.saturating_sub(16)..n);
        for cut in cuts {
            let d = decode(&bytes[..cut], &DecodeOptions::mm58());
            assert_eq!(d.image.width(), 384);
        }
    }
}

/// Random byte corruption (deterministic LCG) never panics.
#[test]
fn corrupted_fixtures_never_panic() {
    let files = fixture_files();
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) as usize
    };
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        for _ in 0..8 {
            let mut b = bytes.clone();
            for _ in 0..8 {
                let i = rnd() % b.len();
                b[i] = match rnd() % 4 {
                    0 => 0x1B,
                    1 => 0x1D,
                    2 => 0xFF,
                    _ => rnd() as u8,
                };
            }
            let d = decode(&b, &DecodeOptions::mm58());
            assert_eq!(d.image.width(), 384);
        }
    }
    // Pure noise.
    for _ in 0..50 {
        let noise: Vec<u8> = (0..2000).map(|_| rnd() as u8).collect();
        decode(&noise, &DecodeOptions::mm58());
    }
}
