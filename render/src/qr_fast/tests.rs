//! Correctness of the fast encoder against independent implementations:
//!
//! - `rqrr` (a decoder) reads every symbol back to exactly the input bytes;
//! - the `qrcode` crate, driven through its low-level API with the same segments (byte
//!   mode alone, or the optimal mixed segmentation), version and mask, draws the same
//!   symbol module for module, for all eight masks;
//! - the `qrcode` crate's bit budget accepts the chosen version and refuses the one below;
//! - with the optimal segmentation the version is never larger than the one the `qrcode`
//!   crate's automatic mode picks (`QrCode::with_error_correction_level`, what
//!   `render::qr` used before), except where that crate uses Kanji mode, which this
//!   encoder deliberately never does; where both pick the same segments, the `qrcode`
//!   crate's own automatic symbol is one of ours, and its mask is the one its penalty
//!   (ISO's except for N4) prefers;
//! - the chosen mask is the lowest-penalty one under a slow, literal reference scorer, and
//!   the fast scorer agrees with that reference on every masked symbol.

use super::segment::{self, Mode, Segment};
use super::{encode, encode_with, penalty, version, Ec, Options, Symbol, TooLong};
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

fn forced(version: u8, mask: u8) -> Options {
    Options { version: Some(version), mask: Some(mask), byte_mode_only: false }
}

/// 4-module quiet zone, `px` pixels per module, dark = 0.
fn to_image(s: &Symbol, px: u32) -> GrayImage {
    let quiet = 4u32;
    let side = (s.width as u32 + 2 * quiet) * px;
    GrayImage::from_fn(side, side, |x, y| {
        let mx = (x / px) as i64 - quiet as i64;
        let my = (y / px) as i64 - quiet as i64;
        let dark = mx >= 0 && my >= 0 && s.get(mx as usize, my as usize);
        Luma([if dark { 0 } else { 255 }])
    })
}

/// What rqrr reads from the symbol drawn at 4 px per module, or, when its sampler fails
/// there, at 1 px per module (exact sampling). rqrr misreads a few correct symbols at
/// some scales: e.g. one version 12-H BR Code with mask 3 (module for module the `qrcode`
/// crate's) decodes at 1 px per module and fails with `FormatEcc` / `DataEcc` at 2..=8,
/// while its seven other masks decode at every scale (and zxing-cpp, tried by hand, reads
/// it at every scale).
fn rqrr_decode(s: &Symbol) -> Vec<u8> {
    let read = |px: u32| {
        let mut img = rqrr::PreparedImage::prepare(to_image(s, px));
        let grids = img.detect_grids();
        assert_eq!(
            grids.len(),
            1,
            "rqrr found {} grids (version {}, mask {}, {px} px)",
            grids.len(),
            s.version,
            s.mask
        );
        let mut out = Vec::new();
        let meta = grids[0].decode_to(&mut out).map_err(|e| format!("{e:?} at {px} px"))?;
        assert_eq!(meta.version.0, s.version as usize);
        assert_eq!(meta.mask, s.mask as u16);
        Ok::<_, String>(out)
    };
    read(4)
        .or_else(|e4| read(1).map_err(|e1| format!("{e4}, {e1}")))
        .unwrap_or_else(|e| panic!("rqrr failed: {e} (version {}, mask {})", s.version, s.mask))
}

/// The `qrcode` crate's symbol for `data` written as `segments` in `version` with `mask`,
/// or `None` if its bit budget refuses them in that version.
fn qrcode_symbol(data: &[u8], segments: &[Segment], ec: Ec, version: u8, mask: u8) -> Option<Vec<bool>> {
    use qrcode::canvas::{Canvas, MaskPattern};
    let v = qrcode::Version::Normal(version as i16);
    let mut bits = qrcode::bits::Bits::new(v);
    for s in segments {
        let part = &data[s.start..s.end];
        match s.mode {
            Mode::Numeric => bits.push_numeric_data(part),
            Mode::Alphanumeric => bits.push_alphanumeric_data(part),
            Mode::Byte => bits.push_byte_data(part),
        }
        .ok()?;
    }
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

/// What the `qrcode` crate's automatic mode does with `data` (a copy of
/// `qrcode::bits::encode_auto`, whose segments are not public): its version and segments
/// (`None` for a Kanji segment). The version is checked against the real thing.
fn qrcode_auto(data: &[u8], ec: Ec) -> Option<(u8, Vec<Option<Segment>>)> {
    use qrcode::optimize::{total_encoded_len, Optimizer, Parser};
    let parsed: Vec<_> = Parser::new(data).collect();
    for top in [9i16, 26, 40] {
        let v = qrcode::Version::Normal(top);
        let opt: Vec<_> = Optimizer::new(parsed.iter().copied(), v).collect();
        let bits = total_encoded_len(&opt, v);
        if bits <= version::data_codewords(top as u8, ec) * 8 {
            let chosen = (1..=40u8).find(|&x| version::data_codewords(x, ec) * 8 >= bits).unwrap();
            let real = qrcode::QrCode::with_error_correction_level(data, qrcode_ec(ec)).unwrap();
            assert_eq!(real.version(), qrcode::Version::Normal(chosen as i16), "replica of encode_auto drifted");
            let segs = opt
                .iter()
                .map(|s| {
                    let mode = match s.mode {
                        qrcode::types::Mode::Numeric => Mode::Numeric,
                        qrcode::types::Mode::Alphanumeric => Mode::Alphanumeric,
                        qrcode::types::Mode::Byte => Mode::Byte,
                        qrcode::types::Mode::Kanji => return None,
                    };
                    Some(Segment { mode, start: s.begin, end: s.end })
                })
                .collect();
            return Some((chosen, segs));
        }
    }
    None
}

/// N1 + N2 + N3 of the literal, module-by-module penalty (ISO/IEC 18004:2015 §7.8.3.1,
/// Table 11, with the interpretation documented in `mask.rs`) and the dark-module count.
fn penalty_without_n4(s: &Symbol) -> (u32, i64) {
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
    (score, s.modules.iter().filter(|&&d| d).count() as i64)
}

/// The reference penalty: N4 is the largest k with |dark% − 50| ≥ 5k, i.e.
/// 5k · total ≤ |100 · dark − 50 · total|, scored 10 k.
fn reference_penalty(s: &Symbol) -> u32 {
    let (score, dark) = penalty_without_n4(s);
    let total = (s.width * s.width) as i64;
    let dev = (100 * dark - 50 * total).abs();
    let mut k = 0;
    while 5 * (k + 1) * total <= dev {
        k += 1;
    }
    score + 10 * k as u32
}

/// The `qrcode` crate's penalty (`Canvas::compute_total_penalty_scores`): N1–N3 as above
/// (up to a constant), N4 = |⌊200 · dark / total⌋ − 100|.
fn qrcode_crate_penalty(s: &Symbol) -> u32 {
    let (score, dark) = penalty_without_n4(s);
    let total = (s.width * s.width) as i64;
    score + (200 * dark / total - 100).unsigned_abs() as u32
}

/// The eight masks of `data` as `segments` in `sym.version`: same modules as the qrcode
/// crate; fast penalty = reference penalty; `sym` is the lowest-penalty one. Returns the
/// eight symbols.
fn check_masks(data: &[u8], segments: &[Segment], ec: Ec, sym: &Symbol, opts: Options) -> Vec<Symbol> {
    let mut penalties = [0u32; 8];
    let mut all = Vec::new();
    for m in 0..8u8 {
        let f = encode_with(data, ec, Options { version: Some(sym.version), mask: Some(m), ..opts }).unwrap();
        assert_eq!((f.mask, f.version), (m, sym.version));
        let theirs = qrcode_symbol(data, segments, ec, sym.version, m).unwrap();
        assert!(
            f.modules == theirs,
            "modules differ from qrcode crate: len {} {ec:?} v{} mask {m} {segments:?}",
            data.len(),
            sym.version
        );
        penalties[m as usize] = reference_penalty(&f);
        assert_eq!(penalty(&f), penalties[m as usize], "fast penalty, mask {m}");
        if m == sym.mask {
            assert!(&f == sym);
        }
        all.push(f);
    }
    let best = (0..8u8).min_by_key(|&m| (penalties[m as usize], m)).unwrap();
    assert_eq!(sym.mask, best, "penalties {penalties:?}");
    all
}

/// Full check of one payload at one level as one byte-mode segment; returns the symbol.
fn check_byte_mode(data: &[u8], ec: Ec) -> Symbol {
    let opts = Options { byte_mode_only: true, ..Options::default() };
    let sym = encode_with(data, ec, opts).unwrap();
    assert_eq!(sym.width, 17 + 4 * sym.version as usize);
    assert_eq!(sym.modules.len(), sym.width * sym.width);
    let segs = segment::byte_only(data);

    // Smallest version: the qrcode crate accepts this version and refuses the one below.
    assert!(qrcode_symbol(data, &segs, ec, sym.version, 0).is_some());
    if sym.version > 1 {
        assert!(qrcode_symbol(data, &segs, ec, sym.version - 1, 0).is_none(), "version {} would do", sym.version - 1);
    }
    check_masks(data, &segs, ec, &sym, opts);
    assert_eq!(rqrr_decode(&sym), data, "rqrr read-back, {ec:?}");
    sym
}

/// How one payload compared with the `qrcode` crate's automatic mode.
#[derive(Debug, Default, Clone, Copy)]
struct Versus {
    /// Payloads checked.
    n: usize,
    /// Our version smaller than the crate's.
    smaller: usize,
    /// The crate used Kanji mode (no version comparison made).
    kanji: usize,
    /// Same segments as the crate: its automatic symbol was compared module for module.
    same_segments: usize,
    /// Of those, the crate chose the same mask.
    same_mask: usize,
}

impl std::ops::AddAssign for Versus {
    fn add_assign(&mut self, o: Versus) {
        self.n += o.n;
        self.smaller += o.smaller;
        self.kanji += o.kanji;
        self.same_segments += o.same_segments;
        self.same_mask += o.same_mask;
    }
}

/// Full check of one payload at one level with the optimal segmentation.
fn check(data: &[u8], ec: Ec) -> Versus {
    let sym = encode(data, ec).unwrap();
    assert_eq!(sym.width, 17 + 4 * sym.version as usize);
    assert_eq!(sym.modules.len(), sym.width * sym.width);
    let segs = segment::optimal(data, sym.version);

    // Smallest version: the qrcode crate accepts our segments in this version, and the
    // optimal segments for the version below do not fit there.
    assert!(qrcode_symbol(data, &segs, ec, sym.version, 0).is_some());
    if sym.version > 1 {
        let below = segment::optimal(data, sym.version - 1);
        assert!(qrcode_symbol(data, &below, ec, sym.version - 1, 0).is_none(), "version {} would do", sym.version - 1);
    }
    let masked = check_masks(data, &segs, ec, &sym, Options::default());
    assert_eq!(rqrr_decode(&sym), data, "rqrr read-back, {ec:?}");

    let mut out = Versus { n: 1, ..Versus::default() };
    let (their_version, their_segs) = qrcode_auto(data, ec).expect("the qrcode crate encodes what we encode");
    if their_segs.iter().any(Option::is_none) {
        out.kanji = 1;
        return out;
    }
    assert!(
        sym.version <= their_version,
        "qr_fast v{} > qrcode v{their_version} for {:?} {ec:?}",
        sym.version,
        String::from_utf8_lossy(data)
    );
    out.smaller = (sym.version < their_version) as usize;
    let their_segs: Vec<Segment> = their_segs.into_iter().flatten().collect();
    if sym.version == their_version && their_segs == segs {
        out.same_segments = 1;
        let theirs = qrcode::QrCode::with_error_correction_level(data, qrcode_ec(ec)).unwrap();
        let theirs: Vec<bool> = theirs.to_colors().into_iter().map(|c| c == qrcode::Color::Dark).collect();
        // Its symbol is ours with the mask its own penalty prefers (first on a tie).
        let their_mask = (0..8u8).min_by_key(|&m| (qrcode_crate_penalty(&masked[m as usize]), m)).unwrap();
        assert!(
            masked[their_mask as usize].modules == theirs,
            "qrcode's automatic symbol is not ours with mask {their_mask}"
        );
        out.same_mask = (their_mask == sym.mask) as usize;
    }
    out
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
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
    /// Text shaped like what ends up in payloads: runs of digits, uppercase words,
    /// lowercase words, punctuation, Portuguese accented letters, now and then an emoji.
    /// `payload_like` favours digits and uppercase (BR Code fields); `japanese` adds
    /// Japanese (whose UTF-8 the qrcode crate may write in Kanji mode).
    fn text(&mut self, len: usize, payload_like: bool, japanese: bool) -> String {
        const PICK: [&[&str]; 7] = [
            &["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"],
            &["A", "B", "C", "D", "E", "J", "O", "P", "S", "X", "Z", " ", ".", "-", "/", ":", "$", "%", "*", "+"],
            &["a", "b", "c", "e", "o", "x", "z", "@", "_", "#", "?", "&", "="],
            &["ã", "ç", "é", "Ã", "Ç", "É", "Í", "ô", "ú"],
            &["€", "🍞", "ñ", "ß"],
            &["こ", "ん", "に", "ち", "は", "日", "本"],
            &[" ", "."],
        ];
        // Cumulative weights per class, out of 100.
        let weights: [usize; 7] =
            if payload_like { [45, 80, 92, 95, 96, 96, 100] } else { [25, 50, 82, 88, 90, 90, 100] };
        let mut s = String::new();
        while s.len() < len {
            let roll = self.below(100);
            let mut class = weights.iter().position(|&w| roll < w).unwrap_or(6);
            if japanese && self.below(10) == 0 {
                class = 5;
            }
            let run = 1 + self.below(if class == 0 { 16 } else { 8 });
            for _ in 0..run {
                let options = PICK[class];
                s.push_str(options[self.below(options.len())]);
            }
        }
        s
    }
}

fn charges() -> Vec<serde_json::Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/cdc/charges.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["value"]["fullDocument"].clone())
        .collect()
}

fn fixture_brcodes() -> Vec<String> {
    let mut out: Vec<String> = charges().iter().filter_map(|c| c["brCode"].as_str().map(str::to_string)).collect();
    out.sort();
    out.dedup();
    out
}

/// The static BR Codes pixgate builds for the fixture charges (`gateway::jobs::pix_payload`
/// for charges without `brCode`): key, value, merchant and transactionID of every charge
/// that has a `pixKey`, plus the same with a description.
fn static_brcodes_from_charges() -> Vec<String> {
    let mut out = Vec::new();
    for c in charges() {
        let Some(key) = c["pixKey"].as_str() else { continue };
        let value = c["value"]["$numberLong"].as_str().and_then(|v| v.parse().ok()).or_else(|| c["value"].as_u64());
        for description in [None, Some("Pedido na padaria, obrigado!")] {
            let p = crate::brcode::encode_static(&crate::brcode::StaticPix {
                key: key.into(),
                amount_cents: value.filter(|&v| v > 0),
                merchant_name: c["merchant"]["name"].as_str().unwrap_or("").into(),
                merchant_city: c["merchant"]["city"].as_str().unwrap_or("").into(),
                txid: c["transactionID"].as_str().map(str::to_string),
                description: description.map(str::to_string),
            });
            // Fixtures include charges pixgate refuses (empty merchant, …): not payloads.
            if let Ok(p) = p {
                out.push(p);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// `fixtures/brcode/vectors.json` payloads (valid and invalid BR Codes alike: any byte
/// string must encode).
fn vector_payloads() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/brcode/vectors.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("BR Code vectors at {path}: {e}"));
    let v: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    v.iter().map(|e| e["payload"].as_str().expect("payload is a string").to_string()).collect()
}

#[test]
fn qr_fast_empty_and_one_byte() {
    for ec in ALL_EC {
        assert_eq!(check_byte_mode(b"", ec).version, 1);
        check_byte_mode(b"x", ec);
        check_byte_mode(&[0xFF], ec);
        check_byte_mode(&[0x00], ec);
        for d in [&b""[..], b"x", b"7", b"A", &[0xFF]] {
            check(d, ec);
        }
    }
}

#[test]
fn qr_fast_fixture_pix_payloads() {
    let codes = fixture_brcodes();
    assert!(codes.len() >= 20, "only {} brCodes in the fixtures", codes.len());
    let mut vs = Versus::default();
    for code in &codes {
        for ec in ALL_EC {
            check_byte_mode(code.as_bytes(), ec);
            vs += check(code.as_bytes(), ec);
        }
    }
    eprintln!("fixture brCodes vs qrcode crate: {vs:?}");
    assert_eq!(vs.kanji, 0);
}

#[test]
fn qr_fast_static_brcodes_from_fixture_charges() {
    let codes = static_brcodes_from_charges();
    assert!(codes.len() >= 40, "only {} static BR Codes built", codes.len());
    let mut vs = Versus::default();
    for code in &codes {
        for ec in ALL_EC {
            vs += check(code.as_bytes(), ec);
        }
    }
    eprintln!("static BR Codes vs qrcode crate: {vs:?}");
    assert_eq!(vs.kanji, 0);
}

#[test]
fn qr_fast_brcode_vectors() {
    let payloads = vector_payloads();
    assert!(payloads.len() >= 10);
    let mut vs = Versus::default();
    for p in &payloads {
        for ec in ALL_EC {
            vs += check(p.as_bytes(), ec);
        }
    }
    eprintln!("vectors.json vs qrcode crate: {vs:?}");
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
    let s = check_byte_mode(payload.as_bytes(), Ec::M);
    assert_eq!(Some(s.version), version::smallest_version(payload.len(), Ec::M));
    check(payload.as_bytes(), Ec::M);
    // Mixed modes save versions on a BR Code.
    let mixed = encode(payload.as_bytes(), Ec::M).unwrap();
    assert!(mixed.version < s.version, "mixed v{} byte v{}", mixed.version, s.version);
}

#[test]
fn qr_fast_random_strings() {
    let mut rng = Rng(0x5EED_0FB2_C0DE);
    let mut vs = Versus::default();
    for i in 0..300 {
        let len = rng.below(if i % 10 == 0 { 900 } else { 260 });
        let text = rng.text(len, i % 2 == 0, i % 10 == 3);
        vs += check(text.as_bytes(), ALL_EC[i % 4]);
    }
    eprintln!("random strings vs qrcode crate: {vs:?}");
    // Not vacuous: most payloads were compared, mixed modes won some outright, and many
    // were compared with the qrcode crate's own symbol.
    assert!(vs.n - vs.kanji >= 240, "{vs:?}");
    assert!(vs.smaller >= 3, "{vs:?}");
    assert!(vs.same_segments >= 50, "{vs:?}");
}

#[test]
fn qr_fast_random_payloads() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut masks = std::collections::BTreeSet::new();
    for i in 0..100 {
        let len = (rng.next() % 400) as usize;
        let data = rng.bytes(len);
        masks.insert(check_byte_mode(&data, ALL_EC[i % 4]).mask);
        if i % 4 == 0 {
            check(&data, ALL_EC[i % 4]);
        }
    }
    // The mask check is not vacuous: the choice really varies with the data.
    assert!(masks.len() >= 6, "masks chosen: {masks:?}");
}

#[test]
fn qr_fast_every_version_and_level_at_capacity() {
    // Fill each version exactly to its byte-mode capacity: exercises every table row, all
    // block layouts (short and long blocks), alignment and version-information placement.
    let mut rng = Rng(42);
    let byte_mode = Options { byte_mode_only: true, ..Options::default() };
    for v in 1..=40u8 {
        for ec in ALL_EC {
            let cap = version::byte_capacity(v, ec);
            let data = rng.bytes(cap);
            let segs = segment::byte_only(&data);
            let sym = encode_with(&data, ec, byte_mode).unwrap();
            assert_eq!(sym.version, v, "{ec:?} capacity {cap}");
            let theirs = qrcode_symbol(&data, &segs, ec, v, sym.mask).expect("qrcode crate accepts it");
            assert!(sym.modules == theirs, "v{v} {ec:?}");
            if v < 40 {
                let mut more = data.clone();
                more.push(0);
                assert_ne!(encode_with(&more, ec, byte_mode).unwrap().version, v);
            }
            if v <= 10 || v % 5 == 0 {
                assert_eq!(rqrr_decode(&sym), data, "v{v} {ec:?}");
            }
        }
    }
}

#[test]
fn qr_fast_numeric_and_alphanumeric_at_capacity() {
    // The most digits / alphanumeric characters each version holds (one segment): one
    // more needs the next version. Crosses the count-indicator widths at 9/10 and 26/27.
    let mut rng = Rng(77);
    for (mode, alphabet) in [
        (Mode::Numeric, &b"0123456789"[..]),
        (Mode::Alphanumeric, &b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ $%*+-./:"[..]),
    ] {
        for v in 1..=40u8 {
            let ec = ALL_EC[v as usize % 4];
            let budget = version::data_codewords(v, ec) * 8;
            let header = 4 + mode.count_bits(v) as usize;
            let n = (0..).take_while(|&n| header + mode.data_bits(n) <= budget).last().unwrap();
            let data: Vec<u8> = (0..n).map(|_| alphabet[rng.below(alphabet.len())]).collect();
            let sym = encode(&data, ec).unwrap();
            assert_eq!(sym.version, v, "{mode:?} {ec:?} {n} characters");
            assert_eq!(segment::optimal(&data, v), vec![Segment { mode, start: 0, end: n }]);
            let theirs =
                qrcode_symbol(&data, &segment::optimal(&data, v), ec, v, sym.mask).expect("qrcode crate accepts it");
            assert!(sym.modules == theirs, "{mode:?} v{v} {ec:?}");
            let mut more = data.clone();
            more.push(alphabet[0]);
            match encode(&more, ec) {
                Ok(s) => assert_eq!(s.version, v + 1, "{mode:?} {ec:?} {} characters", n + 1),
                Err(e) => assert_eq!((v, e.version), (40, 40)),
            }
            if v <= 10 || v % 10 == 0 {
                assert_eq!(rqrr_decode(&sym), data, "{mode:?} v{v} {ec:?}");
            }
        }
    }
}

#[test]
fn qr_fast_count_indicators_never_overflow() {
    // A segment's character count must fit its indicator. The largest symbol of each
    // version range (at L) holds fewer characters of any mode than the indicator can count,
    // so a segmentation that fits never overflows one.
    for (last, first) in [(9u8, 1u8), (26, 10), (40, 27)] {
        for mode in [Mode::Numeric, Mode::Alphanumeric, Mode::Byte] {
            let budget = version::data_codewords(last, Ec::L) * 8;
            let header = 4 + mode.count_bits(first) as usize;
            let most = (0..).take_while(|&n| header + mode.data_bits(n) <= budget).last().unwrap();
            assert!(most < 1 << mode.count_bits(first), "{mode:?} v{last}: {most}");
        }
    }
}

#[test]
fn qr_fast_mask_choice_matches_reference_on_large_versions() {
    let mut rng = Rng(7);
    for &len in &[300usize, 700, 1200, 2000] {
        let data = rng.bytes(len);
        check_byte_mode(&data, Ec::L);
    }
    let text = rng.text(1500, true, false);
    check(text.as_bytes(), Ec::M);
}

#[test]
fn qr_fast_never_kanji_mode() {
    // UTF-8 whose bytes look like Shift JIS: the qrcode crate writes Kanji segments (a
    // reader then shows Shift JIS characters, not this text); qr_fast writes bytes. It
    // happens to Portuguese too: the continuation byte of `Ç` (C3 87) followed by the lead
    // byte of the next accented letter is a valid Shift JIS pair.
    for text in ["こんにちは日本のパン屋さん", "CAÍÇÍÍÍÃ@bx"] {
        let (_, theirs) = qrcode_auto(text.as_bytes(), Ec::M).unwrap();
        assert!(theirs.iter().any(Option::is_none), "qrcode crate used no Kanji segment for {text}: {theirs:?}");
        let ours = encode(text.as_bytes(), Ec::M).unwrap();
        assert!(segment::optimal(text.as_bytes(), ours.version).iter().all(|s| s.mode == Mode::Byte));
        assert_eq!(rqrr_decode(&ours), text.as_bytes());
    }
}

#[test]
fn qr_fast_too_long() {
    let e = encode(&vec![b'a'; 2332], Ec::M).unwrap_err();
    assert_eq!(e, TooLong { len: 2332, bits: 4 + 16 + 8 * 2332, max_bits: 8 * 2334, version: 40, ec: Ec::M });
    assert_eq!(encode(&vec![b'a'; 2331], Ec::M).unwrap().version, 40);
    assert!(encode(&vec![b'a'; 2954], Ec::L).is_err());
    assert_eq!(encode(&vec![b'a'; 2953], Ec::L).unwrap().version, 40);
    assert!(encode(&vec![b'a'; 1274], Ec::H).is_err());
    // Table 7, version 40-L: 7089 digits, 4296 alphanumeric characters.
    assert_eq!(encode(&vec![b'7'; 7089], Ec::L).unwrap().version, 40);
    assert!(encode(&vec![b'7'; 7090], Ec::L).is_err());
    assert_eq!(encode(&vec![b'Z'; 4296], Ec::L).unwrap().version, 40);
    assert!(encode(&vec![b'Z'; 4297], Ec::L).is_err());
    let e =
        encode_with(b"hello world, too long", Ec::H, Options { version: Some(1), ..Options::default() }).unwrap_err();
    assert_eq!((e.version, e.max_bits), (1, 72));
    // Table 7, version 1-H: 10 alphanumeric characters (17 digits) fit, 11 (18) do not.
    assert!(encode_with(b"HELLO WORL", Ec::H, forced(1, 3)).is_ok());
    assert!(encode_with(b"HELLO WORLD", Ec::H, forced(1, 3)).is_err());
    assert!(encode_with(b"12345678901234567", Ec::H, forced(1, 3)).is_ok());
    assert!(encode_with(b"123456789012345678", Ec::H, forced(1, 3)).is_err());
}
