//! Correctness of the fast encoder against independent implementations:
//!
//! - `rqrr` (a decoder) reads every symbol back to exactly the input bytes;
//! - the `qrcode` crate, driven through its low-level API with the same byte-mode bits,
//!   version and mask, draws the same symbol module for module, for all eight masks;
//! - the version is the smallest that the `qrcode` crate's byte-mode bit budget accepts;
//! - the chosen mask is the lowest-penalty one under a slow, literal reference scorer, and
//!   the fast scorer agrees with that reference on every masked symbol.

use super::{encode, encode_with, penalty, Ec, Symbol, TooLong};
use image::{GrayImage, Luma};

const ALL_EC: [Ec; 4] = [Ec::L, Ec::M, Ec::Q, Ec::H];

fn qrcode_ec(ec: Ec) -> qrcode::EcLevel {
    match ec {
        Ec::L => qrcode::EcLevel::L,
        Ec::M => qrcode::EcLevel::M,
        Ec::Q => qrcode::EcLevel::Q,
        Ec::H => qrcode::EcLevel::H,
    }
}

/// 4-module quiet zone, 4 px per module, dark = 0.
fn to_image(s: &Symbol) -> GrayImage {
    let (px, quiet) = (4u32, 4u32);
    let side = (s.width as u32 + 2 * quiet) * px;
    GrayImage::from_fn(side, side, |x, y| {
        let mx = (x / px) as i64 - quiet as i64;
        let my = (y / px) as i64 - quiet as i64;
        let dark = mx >= 0 && my >= 0 && s.get(mx as usize, my as usize);
        Luma([if dark { 0 } else { 255 }])
    })
}

fn rqrr_decode(s: &Symbol) -> Vec<u8> {
    let mut img = rqrr::PreparedImage::prepare(to_image(s));
    let grids = img.detect_grids();
    assert_eq!(grids.len(), 1, "rqrr found {} grids (version {}, mask {})", grids.len(), s.version, s.mask);
    let mut out = Vec::new();
    let meta = grids[0].decode_to(&mut out).unwrap_or_else(|e| panic!("rqrr failed: {e:?} (version {}, mask {})", s.version, s.mask));
    assert_eq!(meta.version.0, s.version as usize);
    assert_eq!(meta.mask, s.mask as u16);
    out
}

/// The `qrcode` crate's symbol for one byte-mode segment of `data` in `version` with
/// `mask`, or `None` if its bit budget refuses the data in that version.
fn qrcode_symbol(data: &[u8], ec: Ec, version: u8, mask: u8) -> Option<Vec<bool>> {
    use qrcode::canvas::{Canvas, MaskPattern};
    let v = qrcode::Version::Normal(version as i16);
    let mut bits = qrcode::bits::Bits::new(v);
    bits.push_byte_data(data).ok()?;
    bits.push_terminator(qrcode_ec(ec)).ok()?;
    let (data_cw, ec_cw) = qrcode::ec::construct_codewords(&bits.into_bytes(), v, qrcode_ec(ec)).unwrap();
    let mut canvas = Canvas::new(v, qrcode_ec(ec));
    canvas.draw_all_functional_patterns();
    canvas.draw_data(&data_cw, &ec_cw);
    let pattern = [
        MaskPattern::Checkerboard,
        MaskPattern::HorizontalLines,
        MaskPattern::VerticalLines,
        MaskPattern::DiagonalLines,
        MaskPattern::LargeCheckerboard,
        MaskPattern::Fields,
        MaskPattern::Diamonds,
        MaskPattern::Meadow,
    ][mask as usize];
    canvas.apply_mask(pattern);
    Some(canvas.into_colors().into_iter().map(|c| c == qrcode::Color::Dark).collect())
}

/// Literal, module-by-module penalty (ISO/IEC 18004:2015 §7.8.3.1, Table 11) with the
/// interpretation documented in `mask.rs`.
fn reference_penalty(s: &Symbol) -> u32 {
    let n = s.width;
    let rows: Vec<Vec<bool>> = (0..n).map(|y| (0..n).map(|x| s.get(x, y)).collect()).collect();
    let cols: Vec<Vec<bool>> = (0..n).map(|x| (0..n).map(|y| s.get(x, y)).collect()).collect();
    let mut score = 0u32;
    for line in rows.iter().chain(cols.iter()) {
        // N1: runs of 5 or more.
        let mut run = 1;
        for i in 1..=n {
            if i < n && line[i] == line[i - 1] {
                run += 1;
            } else {
                if run >= 5 {
                    score += 3 + (run - 5);
                }
                run = 1;
            }
        }
        // N3: 1:1:3:1:1 with 4 light modules (or the quiet zone) before or after.
        let light = |i: isize| i < 0 || i >= n as isize || !line[i as usize];
        for start in 0..=n - 7 {
            if line[start..start + 7] == [true, false, true, true, true, false, true] {
                let st = start as isize;
                if (st - 4..st).all(light) || (st + 7..st + 11).all(light) {
                    score += 40;
                }
            }
        }
    }
    // N2: 2×2 blocks.
    for y in 0..n - 1 {
        for x in 0..n - 1 {
            let c = rows[y][x];
            if rows[y][x + 1] == c && rows[y + 1][x] == c && rows[y + 1][x + 1] == c {
                score += 3;
            }
        }
    }
    // N4: the largest k with |dark% − 50| ≥ 5k, i.e. 5k · total ≤ |100 · dark − 50 · total|.
    let dark = s.modules.iter().filter(|&&d| d).count() as i64;
    let total = (n * n) as i64;
    let dev = (100 * dark - 50 * total).abs();
    let mut k = 0;
    while 5 * (k + 1) * total <= dev {
        k += 1;
    }
    score + 10 * k as u32
}

/// Full check of one payload at one level; returns the symbol.
fn check(data: &[u8], ec: Ec) -> Symbol {
    let sym = encode(data, ec).unwrap();
    assert_eq!(sym.width, 17 + 4 * sym.version as usize);
    assert_eq!(sym.modules.len(), sym.width * sym.width);

    // Smallest version: the qrcode crate accepts this version and refuses the one below.
    assert!(qrcode_symbol(data, ec, sym.version, 0).is_some());
    if sym.version > 1 {
        assert!(qrcode_symbol(data, ec, sym.version - 1, 0).is_none(), "version {} would do", sym.version - 1);
    }

    // Every mask: same modules as the qrcode crate; fast penalty = reference penalty.
    let mut penalties = [0u32; 8];
    for m in 0..8u8 {
        let forced = encode_with(data, ec, Some(sym.version), Some(m)).unwrap();
        assert_eq!(forced.mask, m);
        let theirs = qrcode_symbol(data, ec, sym.version, m).unwrap();
        assert!(forced.modules == theirs, "modules differ from qrcode crate: len {} {ec:?} v{} mask {m}", data.len(), sym.version);
        penalties[m as usize] = reference_penalty(&forced);
        assert_eq!(penalty(&forced), penalties[m as usize], "fast penalty, mask {m}");
        if m == sym.mask {
            assert!(forced == sym);
        }
    }
    let best = (0..8u8).min_by_key(|&m| (penalties[m as usize], m)).unwrap();
    assert_eq!(sym.mask, best, "penalties {penalties:?}");

    assert_eq!(rqrr_decode(&sym), data, "rqrr read-back, {ec:?}");
    sym
}

/// xorshift64*: deterministic test data without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

fn fixture_brcodes() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/cdc/charges.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            v["value"]["fullDocument"]["brCode"].as_str().map(str::to_string)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[test]
fn qr_fast_empty_and_one_byte() {
    for ec in ALL_EC {
        let s = check(b"", ec);
        assert_eq!(s.version, 1);
        check(b"x", ec);
        check(&[0xFF], ec);
        check(&[0x00], ec);
    }
}

#[test]
fn qr_fast_fixture_pix_payloads() {
    let codes = fixture_brcodes();
    assert!(codes.len() >= 20, "only {} brCodes in the fixtures", codes.len());
    for code in &codes {
        for ec in ALL_EC {
            check(code.as_bytes(), ec);
        }
    }
}

#[test]
fn qr_fast_static_pix_payload_at_m() {
    let payload = crate::brcode::encode_static(&crate::brcode::StaticPix {
        key: "d1e2a3b4-c5d6-47e8-9f00-112233445566".into(),
        amount_cents: Some(12_345),
        merchant_name: "Padaria Pão Dourado".into(),
        merchant_city: "São Paulo".into(),
        txid: Some("PEDIDO20261127000123".into()),
        description: Some("Pedido 123".into()),
    })
    .unwrap();
    let s = check(payload.as_bytes(), Ec::M);
    // The symbol the current renderer (qrcode crate, automatic segmentation) draws may use
    // other modes; the byte-mode version must be the one its capacity table gives.
    assert_eq!(Some(s.version), super::version::smallest_version(payload.len(), Ec::M));
}

#[test]
fn qr_fast_random_payloads() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut masks = std::collections::BTreeSet::new();
    for i in 0..100 {
        let len = (rng.next() % 400) as usize;
        let data = rng.bytes(len);
        masks.insert(check(&data, ALL_EC[i % 4]).mask);
    }
    // The mask check is not vacuous: the choice really varies with the data.
    assert!(masks.len() >= 6, "masks chosen: {masks:?}");
}

#[test]
fn qr_fast_every_version_and_level_at_capacity() {
    // Fill each version exactly to its byte-mode capacity: exercises every table row, all
    // block layouts (short and long blocks), alignment and version-information placement.
    let mut rng = Rng(42);
    for v in 1..=40u8 {
        for ec in ALL_EC {
            let cap = super::version::byte_capacity(v, ec);
            let data = rng.bytes(cap);
            let sym = encode(&data, ec).unwrap();
            assert_eq!(sym.version, v, "{ec:?} capacity {cap}");
            let theirs = qrcode_symbol(&data, ec, v, sym.mask).expect("qrcode crate accepts it");
            assert!(sym.modules == theirs, "v{v} {ec:?}");
            assert!(qrcode_symbol(&data, ec, v, 0).is_some());
            if v < 40 {
                let mut more = data.clone();
                more.push(0);
                assert_ne!(encode(&more, ec).unwrap().version, v);
            }
            if v <= 10 || v % 5 == 0 {
                assert_eq!(rqrr_decode(&sym), data, "v{v} {ec:?}");
            }
        }
    }
}

#[test]
fn qr_fast_mask_choice_matches_reference_on_large_versions() {
    let mut rng = Rng(7);
    for &len in &[300usize, 700, 1200, 2000] {
        let data = rng.bytes(len);
        check(&data, Ec::L);
    }
}

#[test]
fn qr_fast_too_long() {
    assert_eq!(encode(&vec![b'a'; 2332], Ec::M), Err(TooLong { len: 2332, max: 2331, ec: Ec::M }));
    assert_eq!(encode(&vec![b'a'; 2331], Ec::M).unwrap().version, 40);
    assert_eq!(encode(&vec![b'a'; 2954], Ec::L).unwrap_err().max, 2953);
    assert_eq!(encode(&vec![b'a'; 1274], Ec::H).unwrap_err().max, 1273);
    assert_eq!(encode_with(b"hello world, too long", Ec::H, Some(1), None).unwrap_err().max, 7);
}
