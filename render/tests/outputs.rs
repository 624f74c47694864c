//! End-to-end checks of what devices receive, built from real fixture charges
//! (`fixtures/cdc/charges.jsonl`) and checked with independent decoders: `rqrr` for every
//! QR (from the screen PNG, and from the printer's raster bytes), a minimal ESC/POS walker
//! written here for the receipt bytes. Sample outputs go to `/tmp/render-samples/`.

// A test: a panic in its helpers is a failed test, as in its #[test] functions.
#![allow(clippy::unwrap_used)]

use chrono::{DateTime, Utc};
use image::GrayImage;
use render::brcode::{self, StaticPix};
use render::codepage::CodePage;
use render::receipt::{render_receipt, PrinterProfile, Receipt, ReceiptKind};
use render::screen::{render_screen, to_png, Screen};
use render::{qr, Locale};
use serde_json::Value;

const CHARGES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/cdc/charges.jsonl");
const SAMPLES: &str = "/tmp/render-samples";

/// The last document of each charge id in charges.jsonl.
fn charge(id: &str) -> Value {
    let text = std::fs::read_to_string(CHARGES).expect("fixtures/cdc/charges.jsonl is in the repo");
    let mut last = None;
    for l in text.lines() {
        let e: Value = serde_json::from_str(l).unwrap();
        if e["key"] == id && e["value"]["fullDocument"].is_object() {
            last = Some(e["value"]["fullDocument"].clone());
        }
    }
    last.unwrap_or_else(|| panic!("charge {id} not in fixtures"))
}

fn cents(doc: &Value) -> u64 {
    let v = &doc["value"];
    v.as_u64().or_else(|| v["$numberLong"].as_str().and_then(|s| s.parse().ok())).expect("value")
}

fn date(v: &Value) -> Option<DateTime<Utc>> {
    v["$date"].as_str().map(|s| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc))
}

fn s(v: &Value) -> Option<String> {
    v.as_str().map(str::to_string)
}

/// The charge's Pix payload: `brCode` for dynamic charges, otherwise the static BR Code.
fn payload(doc: &Value) -> String {
    s(&doc["brCode"]).unwrap_or_else(|| {
        brcode::encode_static(&StaticPix {
            key: s(&doc["pixKey"]).unwrap(),
            amount_cents: Some(cents(doc)),
            merchant_name: s(&doc["merchant"]["name"]).unwrap(),
            merchant_city: s(&doc["merchant"]["city"]).unwrap(),
            txid: s(&doc["transactionID"]),
            description: None,
        })
        .unwrap()
    })
}

fn receipt(doc: &Value, locale: Locale) -> Receipt {
    Receipt {
        kind: ReceiptKind::Paid,
        merchant_name: s(&doc["merchant"]["name"]).unwrap(),
        merchant_city: s(&doc["merchant"]["city"]).unwrap(),
        amount_cents: cents(doc),
        items: doc["additionalInfo"]
            .as_array()
            .map(|a| a.iter().map(|i| (s(&i["key"]).unwrap(), s(&i["value"]).unwrap())).collect())
            .unwrap_or_default(),
        comment: s(&doc["comment"]),
        payer_name: s(&doc["payer"]["name"]),
        paid_at: date(&doc["paidAt"]),
        time_zone: chrono_tz::America::Sao_Paulo,
        end_to_end_id: s(&doc["endToEndId"]),
        charge_id: s(&doc["_id"]["$oid"]).unwrap(),
        txid: s(&doc["transactionID"]),
        brcode: Some(payload(doc)),
        locale,
    }
}

fn decode_qrs(img: GrayImage) -> Vec<String> {
    let mut p = rqrr::PreparedImage::prepare(img);
    p.detect_grids().iter().filter_map(|g| g.decode().ok().map(|(_, t)| t)).collect()
}

const DYNAMIC: &str = "86ce10cd79e048c07dd7753e"; // Café Tropical, R$ 12.345,67, brCode
const STATIC: &str = "212b62c376631129f34369aa"; // Padaria Pão Dourado, static key
const EXTREME: &str = "482df9cb07f0f5eefb37e6a1"; // emoji name, 60-char city, huge comment

#[test]
fn pay_with_pix_screen_qr_decodes_to_the_exact_payload() {
    std::fs::create_dir_all(SAMPLES).unwrap();
    for (id, size, locale) in [
        (DYNAMIC, (720, 1280), Locale::PtBr),
        (STATIC, (720, 1280), Locale::EnUs),
        (EXTREME, (720, 1280), Locale::PtBr),
        (STATIC, (480, 800), Locale::EsEs),
        (DYNAMIC, (320, 480), Locale::PtBr),
    ] {
        let doc = charge(id);
        let code = payload(&doc);
        let screen = Screen::PayWithPix {
            merchant_name: s(&doc["merchant"]["name"]).unwrap(),
            amount_cents: cents(&doc),
            brcode: code.clone(),
            expires_at: date(&doc["expiresDate"]),
        };
        let img = render_screen(&screen, size.0, size.1, locale, chrono_tz::America::Sao_Paulo);
        assert_eq!(img.dimensions(), size);
        let png = to_png(&img);
        std::fs::write(format!("{SAMPLES}/screen-pay-{id}-{}x{}-{}.png", size.0, size.1, locale.tag()), &png).unwrap();
        // Decode from the PNG bytes, as a camera would see the screen.
        let back = image::load_from_memory(&png).unwrap().to_luma8();
        let found = decode_qrs(back);
        assert_eq!(found, vec![code.clone()], "{id} at {size:?}");
        let parsed = brcode::parse(&found[0]).unwrap();
        assert_eq!(parsed.amount_cents(), Some(cents(&doc)), "QR amount equals the charge's value");
    }
}

#[test]
fn paid_and_expired_screens() {
    std::fs::create_dir_all(SAMPLES).unwrap();
    let doc = charge(STATIC);
    for locale in [Locale::PtBr, Locale::EnUs] {
        let paid = Screen::Paid {
            merchant_name: s(&doc["merchant"]["name"]).unwrap(),
            amount_cents: cents(&doc),
            payer_name: s(&doc["payer"]["name"]),
            paid_at: date(&doc["paidAt"]),
        };
        let expired =
            Screen::Expired { merchant_name: s(&doc["merchant"]["name"]).unwrap(), amount_cents: cents(&doc) };
        let tz = chrono_tz::America::Sao_Paulo;
        let p = render_screen(&paid, 720, 1280, locale, tz);
        let x = render_screen(&expired, 720, 1280, locale, tz);
        std::fs::write(format!("{SAMPLES}/screen-paid-{}.png", locale.tag()), to_png(&p)).unwrap();
        std::fs::write(format!("{SAMPLES}/screen-expired-{}.png", locale.tag()), to_png(&x)).unwrap();
        let greenish = |img: &image::RgbImage| {
            img.pixels()
                .filter(|p| p.0[1] > 120 && p.0[1] as i32 - p.0[0] as i32 > 60 && p.0[1] as i32 - p.0[2] as i32 > 40)
                .count()
        };
        assert!(greenish(&p) > 50_000, "paid screen is visibly green");
        assert_eq!(greenish(&x), 0, "expired screen has no green");
        // No QR on either: a stale QR must never stay on screen.
        assert!(decode_qrs(image::DynamicImage::ImageRgb8(p).to_luma8()).is_empty());
        assert!(decode_qrs(image::DynamicImage::ImageRgb8(x).to_luma8()).is_empty());
    }
    // Extreme merchant name still renders (shrunk/ellipsised), in every size.
    let e = charge(EXTREME);
    for (w, h) in [(720, 1280), (240, 320), (1280, 720)] {
        let img = render_screen(
            &Screen::Paid {
                merchant_name: s(&e["merchant"]["name"]).unwrap(),
                amount_cents: u64::MAX / 2,
                payer_name: None,
                paid_at: None,
            },
            w,
            h,
            Locale::PtBr,
            chrono_tz::UTC,
        );
        assert_eq!(img.dimensions(), (w, h));
    }
}

/// One parsed piece of a receipt job.
#[derive(Debug)]
enum Piece {
    Text(Vec<u8>),
    #[allow(dead_code)]
    CodeTable(u8),
    QrStore {
        declared: usize,
        data: Vec<u8>,
    },
    QrModule(u8),
    QrEcc(u8),
    QrPrint,
    Raster {
        x_bytes: usize,
        rows: usize,
        data: Vec<u8>,
    },
    /// `ESC M n`: 0 font A, 1 font B.
    Font(u8),
    Cut,
    Other,
}

/// A minimal ESC/POS walker for the commands a receipt may contain; panics on anything
/// unknown so that the test notices a command it does not check.
fn walk(b: &[u8]) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut text = Vec::new();
    while i < b.len() {
        let flush = |text: &mut Vec<u8>, out: &mut Vec<Piece>| {
            if !text.is_empty() {
                out.push(Piece::Text(std::mem::take(text)));
            }
        };
        match b[i] {
            0x1B => {
                flush(&mut text, &mut out);
                match b[i + 1] {
                    0x40 => {
                        out.push(Piece::Other);
                        i += 2;
                    }
                    0x74 => {
                        out.push(Piece::CodeTable(b[i + 2]));
                        i += 3;
                    }
                    0x61 | 0x45 | 0x64 => {
                        out.push(Piece::Other);
                        i += 3;
                    }
                    0x4D => {
                        assert!(b[i + 2] <= 1, "ESC M 0 or 1");
                        out.push(Piece::Font(b[i + 2]));
                        i += 3;
                    }
                    c => panic!("unexpected ESC {c:#x} at {i}"),
                }
            }
            0x1D => {
                flush(&mut text, &mut out);
                match b[i + 1] {
                    0x21 => {
                        out.push(Piece::Other);
                        i += 3;
                    }
                    0x56 => {
                        assert_eq!(b[i + 2], 0x41, "GS V A n");
                        out.push(Piece::Cut);
                        i += 4;
                    }
                    0x28 => {
                        assert_eq!(b[i + 2], 0x6B, "GS ( k");
                        let len = b[i + 3] as usize + 256 * b[i + 4] as usize;
                        let body = &b[i + 5..i + 5 + len];
                        assert_eq!(body[0], 0x31, "cn = QR");
                        out.push(match body[1] {
                            0x41 => {
                                assert_eq!(&body[2..], &[0x32, 0x00], "model 2");
                                Piece::Other
                            }
                            0x43 => Piece::QrModule(body[2]),
                            0x45 => Piece::QrEcc(body[2]),
                            0x50 => {
                                assert_eq!(body[2], 0x30);
                                Piece::QrStore { declared: len, data: body[3..].to_vec() }
                            }
                            0x51 => Piece::QrPrint,
                            f => panic!("unexpected GS ( k fn {f:#x}"),
                        });
                        i += 5 + len;
                    }
                    0x76 => {
                        assert_eq!(&b[i + 2..i + 4], &[0x30, 0x00], "GS v 0, m = 0");
                        let x = b[i + 4] as usize + 256 * b[i + 5] as usize;
                        let y = b[i + 6] as usize + 256 * b[i + 7] as usize;
                        let start = i + 8;
                        assert!(start + x * y <= b.len(), "raster header promises more data than the job has");
                        out.push(Piece::Raster { x_bytes: x, rows: y, data: b[start..start + x * y].to_vec() });
                        i = start + x * y;
                    }
                    c => panic!("unexpected GS {c:#x} at {i}"),
                }
            }
            0x0A => {
                text.push(b'\n');
                i += 1;
            }
            c if c < 0x20 => panic!("unexpected control byte {c:#x} at {i}"),
            c => {
                text.push(c);
                i += 1;
            }
        }
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    out
}

fn has_utf8_accent(text: &[u8]) -> bool {
    // UTF-8 for U+0080..U+07FF (every accented Latin letter): lead 0xC2..0xDF, then 0x80..0xBF.
    text.windows(2).any(|w| (0xC2..=0xDF).contains(&w[0]) && (0x80..=0xBF).contains(&w[1]))
}

/// Each charge's paid receipt and pay-with-Pix slip on 58 and 80 mm printers with and
/// without native QR: code page text within the columns of its font, the charge's details,
/// no QR on the paid receipt (which names the payment by its end-to-end id and txid), and
/// on the slip the BR Code as a native QR or a raster that `rqrr` reads back. The jobs are
/// written to `/tmp/render-samples/receipt-{paid,pay}-<charge>-<mm>mm-<native|raster>.bin`
/// (`scripts/fuzz.sh --seeds` takes them as seeds).
#[test]
fn receipts_for_58_and_80_mm_native_and_raster() {
    std::fs::create_dir_all(SAMPLES).unwrap();
    for id in [STATIC, DYNAMIC, EXTREME] {
        let doc = charge(id);
        let paid = receipt(&doc, Locale::PtBr);
        let slip = Receipt { kind: ReceiptKind::PayWithPix { expires_at: date(&doc["expiresDate"]) }, ..paid.clone() };
        let code = paid.brcode.clone().unwrap();
        for mm in [58u8, 80] {
            for native in [true, false] {
                let p = PrinterProfile { paper_width_mm: mm, code_page: CodePage::Cp860, native_qr: native };
                for (name, r) in [("paid", &paid), ("pay", &slip)] {
                    let what = format!("{name} {id} {mm} mm {}", if native { "native" } else { "raster" });
                    let bytes = render_receipt(r, &p).unwrap();
                    std::fs::write(
                        format!(
                            "{SAMPLES}/receipt-{name}-{id}-{mm}mm-{}.bin",
                            if native { "native" } else { "raster" }
                        ),
                        &bytes,
                    )
                    .unwrap();
                    assert_eq!(&bytes[..5], &[0x1B, 0x40, 0x1B, 0x74, 3], "ESC @ then ESC t 3 (CP860)");
                    let pieces = walk(&bytes);
                    assert!(matches!(pieces.last(), Some(Piece::Cut)), "{what}: ends with a cut");

                    // Text: code page bytes only, lines within the paper, accents printed as CP860.
                    let text: Vec<u8> = pieces
                        .iter()
                        .filter_map(|p| if let Piece::Text(t) = p { Some(t.clone()) } else { None })
                        .flatten()
                        .collect();
                    assert!(!has_utf8_accent(&text), "{what}: UTF-8 leaked into the printer text");
                    let decoded = CodePage::Cp860.decode(&text);
                    let name = s(&doc["merchant"]["name"]).unwrap();
                    let first_word = name.split(' ').next().unwrap();
                    assert!(
                        decoded.contains(first_word),
                        "{what}: merchant {first_word:?} printed as code page text:\n{decoded}"
                    );
                    assert!(decoded.contains("R$ 12.345,67") || decoded.contains("R$ 15,00"), "{decoded}");
                    // Each line within the columns of the font it is printed in (font A 12 dots,
                    // font B 9 dots a cell). Double-size lines count twice; the widest plain line
                    // must fit the columns.
                    let mut font = 0;
                    let mut small_lines = 0;
                    for piece in &pieces {
                        match piece {
                            Piece::Font(n) => font = *n,
                            Piece::Text(t) => {
                                for l in CodePage::Cp860.decode(t).split('\n').filter(|l| !l.is_empty()) {
                                    let cols = if font == 1 { p.columns_font_b() } else { p.columns() };
                                    assert!(
                                        l.chars().count() <= cols,
                                        "{what}: line too long in font {}: {l:?}",
                                        font + 1
                                    );
                                    small_lines += (font == 1) as usize;
                                }
                            }
                            _ => {}
                        }
                    }
                    assert!(small_lines >= 2, "{what}: charge id and txid in font B");
                    assert_eq!(font, 0, "{what}: font A again after the small print");

                    if r.kind == ReceiptKind::Paid {
                        paid_receipt_names_the_payment(&what, &doc, &pieces, &decoded);
                        assert!(
                            !bytes.windows(code.len()).any(|w| w == code.as_bytes()),
                            "{what}: the BR Code's bytes"
                        );
                    } else {
                        slip_qr_is_the_payload(&what, &pieces, &code, &p, native);
                    }
                }
            }
        }
    }
}

/// A paid receipt: payer, paid-at, end-to-end id and txid after their pt-BR labels, and
/// no QR command at all (neither `GS ( k` nor a `GS v 0` raster).
fn paid_receipt_names_the_payment(what: &str, doc: &Value, pieces: &[Piece], decoded: &str) {
    let flat = decoded.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some(payer) = s(&doc["payer"]["name"]) {
        assert!(decoded.contains(&payer), "{what}: payer with accents via CP860: {payer}");
    }
    let paid = date(&doc["paidAt"]).unwrap().with_timezone(&chrono_tz::America::Sao_Paulo);
    assert!(decoded.contains(&paid.format("%d/%m/%Y %H:%M").to_string()), "{what}");
    let e2e = format!("ID fim a fim: {}", s(&doc["endToEndId"]).unwrap());
    let txid = format!("ID da transação: {}", s(&doc["transactionID"]).unwrap());
    assert!(flat.contains(&e2e) && flat.contains(&txid), "{what}: no {e2e:?} or {txid:?} in\n{decoded}");
    let qr = pieces
        .iter()
        .filter(|p| {
            matches!(
                p,
                Piece::QrStore { .. } | Piece::QrModule(_) | Piece::QrEcc(_) | Piece::QrPrint | Piece::Raster { .. }
            )
        })
        .count();
    assert_eq!(qr, 0, "{what}: QR commands on a paid receipt");
}

/// A pay-with-Pix slip: the BR Code as a native QR (stored data, error correction M, the
/// largest module that fits, capped) or as a raster that decodes back to it.
fn slip_qr_is_the_payload(what: &str, pieces: &[Piece], code: &str, p: &PrinterProfile, native: bool) {
    if native {
        let store = pieces
            .iter()
            .find_map(
                |p| if let Piece::QrStore { declared, data } = p { Some((*declared, data.clone())) } else { None },
            )
            .expect("fn 180");
        assert_eq!(store.0, store.1.len() + 3, "pL + 256 pH = data + 3");
        assert_eq!(store.1, code.as_bytes(), "{what}");
        assert!(pieces.iter().any(|p| matches!(p, Piece::QrEcc(0x31))), "error correction M");
        assert!(pieces.iter().any(|p| matches!(p, Piece::QrPrint)));
        let module =
            pieces.iter().find_map(|p| if let Piece::QrModule(m) = p { Some(*m as u32) } else { None }).unwrap();
        let width = qr::byte_mode_width(code.len()).unwrap() as u32;
        assert!((width + 8) * module <= p.dots(), "{what}: native QR fits the paper");
        let largest = p.dots() / (width + 8);
        assert_eq!(module, largest.min(render::receipt::MAX_MODULE_DOTS), "{what}: as large as fits, capped");
    } else {
        let (x, y, data) = pieces
            .iter()
            .find_map(|p| {
                if let Piece::Raster { x_bytes, rows, data } = p {
                    Some((*x_bytes, *rows, data.clone()))
                } else {
                    None
                }
            })
            .expect("GS v 0");
        assert_eq!(data.len(), x * y);
        assert!(x * 8 <= p.dots() as usize, "{what}: raster fits the paper");
        // Rebuild the bitmap from the bytes, MSB first, and decode it.
        let img = GrayImage::from_fn((x * 8) as u32, y as u32, |px, py| {
            let byte = data[py as usize * x + px as usize / 8];
            image::Luma([if byte & (0x80 >> (px % 8)) != 0 { 0 } else { 255 }])
        });
        assert_eq!(decode_qrs(img), vec![code.to_string()], "{what}: raster QR decodes");
    }
}

#[test]
fn receipts_never_emit_utf8_on_any_page() {
    let r = receipt(&charge(EXTREME), Locale::EsEs);
    for page in CodePage::ALL {
        let p = PrinterProfile { paper_width_mm: 58, code_page: page, native_qr: true };
        let bytes = render_receipt(&r, &p).unwrap();
        assert_eq!(&bytes[..5], &[0x1B, 0x40, 0x1B, 0x74, page.epson_table()]);
        let text: Vec<u8> = walk(&bytes)
            .into_iter()
            .filter_map(|p| if let Piece::Text(t) = p { Some(t) } else { None })
            .flatten()
            .collect();
        if page != CodePage::Wpc1252 {
            // WPC1252 legitimately uses 0xC3 etc. for Latin-1 letters; skip the UTF-8 heuristic there.
            assert!(!has_utf8_accent(&text), "{page:?}");
        }
        assert!(!text.windows(4).any(|w| w == "🍞".as_bytes()), "{page:?}: emoji bytes");
        assert!(!text.contains(&b'?'), "{page:?}: the emoji is dropped, not printed as '?'");
    }
}
