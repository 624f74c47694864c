//! Golden receipts: every receipt kind (paid, pay-with-Pix slip, expiry notice) × 58 and
//! 80 mm × pt-BR, en-US and es-ES, rendered by `render::receipt` and printed by this
//! crate's ESC/POS decoder.
//!
//! The check is by *decoding*, never by bytes or pixels: the decoder's transcript must hold
//! the kind's labels, the merchant and the amount in the locale's format; the pay-with-Pix
//! slip's QR must be read back by `rqrr` from the printed image as the exact BR Code; the
//! paid receipt (given the BR Code all the same) and the expiry notice must carry no QR at
//! all, and the paid receipt names the payment by its end-to-end id and txid instead. The
//! committed pictures in `tests/golden/` are for people to look at; they are checked for
//! the same QR (or none) and width, not for pixels.
//!
//! `UPDATE_GOLDEN=1 cargo test -p simulators --test golden_receipts` rewrites them.
//!
//! Printers: one fixture model per locale, each with the code page a shop there would set
//! and decoded with that model's `ESC t` numbering (`DecodeOptions::with_model`):
//! pt-BR on a Bematech MP-4200 TH with CP860 (`ESC t 4`, raster QR: the profile does not
//! trust its `GS ( k`), en-US on an Epson TM-T20X with CP850 (`ESC t 2`), es-ES on an
//! Elgin i9 with CP858 (`ESC t 5`). `nativeQr` is set on 80 mm and off on 58 mm, so both QR
//! paths are printed.

// A test: a panic in its helpers is a failed test, as in its #[test] functions.
#![allow(clippy::unwrap_used)]

use chrono::{DateTime, Utc};
use preview::escpos::{decode, qr::scan, DecodeOptions};
use render::brcode::{encode_static, StaticPix};
use render::codepage::CodePage;
use render::locale::Label;
use render::money::format_amount;
use render::receipt::{render_receipt_for, PrinterProfile, Receipt, ReceiptKind};
use render::Locale;
use std::path::{Path, PathBuf};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn brcode() -> String {
    encode_static(&StaticPix {
        key: "padaria.paoeacucar@example.com".into(),
        amount_cents: Some(123_456),
        merchant_name: "Padaria Pão e Açúcar".into(),
        merchant_city: "São Paulo".into(),
        txid: Some("PIXGATEGOLDEN0001".into()),
        description: None,
    })
    .unwrap()
}

fn kinds() -> [(&'static str, ReceiptKind); 3] {
    [
        ("paid", ReceiptKind::Paid),
        ("pay", ReceiptKind::PayWithPix { expires_at: Some(t("2026-11-27T15:30:00Z")) }),
        ("expired", ReceiptKind::Expired { expired_at: Some(t("2026-11-27T15:30:00Z")) }),
    ]
}

fn receipt(kind: ReceiptKind, locale: Locale) -> Receipt {
    Receipt {
        kind,
        merchant_name: "Padaria Pão e Açúcar".into(),
        merchant_city: "São Paulo".into(),
        amount_cents: 123_456,
        items: vec![("Pão de queijo".into(), "3x".into()), ("Café coado".into(), "2x".into())],
        comment: Some("Sem açúcar, por favor".into()),
        payer_name: Some("José da Conceição".into()),
        paid_at: Some(t("2026-11-27T12:01:07Z")),
        time_zone: chrono_tz::America::Sao_Paulo,
        end_to_end_id: Some("E25328704202611271201yxv2kgafrfw".into()),
        charge_id: "6748a1f0c2b3d4e5f6a7b8c9".into(),
        txid: Some("PIXGATEGOLDEN0001".into()),
        brcode: Some(brcode()),
        locale,
    }
}

/// The printer model and code page used for `locale` (see the module documentation).
fn printer_for(locale: Locale) -> (&'static str, CodePage) {
    match locale {
        Locale::PtBr => ("Bematech MP-4200 TH", CodePage::Cp860),
        Locale::EnUs => ("Epson TM-T20X", CodePage::Cp850),
        Locale::EsEs => ("Elgin i9", CodePage::Cp858),
    }
}

/// Lines joined with spaces and runs of spaces collapsed, so wrapped and column-padded
/// text compares as words.
fn flat(transcript: &str) -> String {
    transcript.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What the transcript must contain for `kind` in `loc`.
fn expected(kind: ReceiptKind, loc: Locale, r: &Receipt) -> Vec<String> {
    let tz = r.time_zone;
    let at = |d: DateTime<Utc>| loc.format_datetime(&d.with_timezone(&tz));
    let mut v = vec![
        r.merchant_name.clone(),
        r.merchant_city.clone(),
        loc.label(Label::Total).into(),
        format_amount(r.amount_cents as i64, loc),
    ];
    match kind {
        ReceiptKind::Paid => {
            v.push(format!("{} - {}", loc.label(Label::PixReceipt), loc.label(Label::Paid)).to_uppercase());
            v.push("Pão de queijo 3x".into());
            v.push(format!("{}: {}", loc.label(Label::Comment), r.comment.as_ref().unwrap()));
            v.push(format!("{}: {}", loc.label(Label::Payer), r.payer_name.as_ref().unwrap()));
            v.push(format!("{}: {}", loc.label(Label::Date), at(r.paid_at.unwrap())));
            v.push(format!("{}: {}", loc.label(Label::EndToEndId), r.end_to_end_id.as_ref().unwrap()));
            v.push(format!("{}: {}", loc.label(Label::Charge), r.charge_id));
            v.push(format!("{}: {}", loc.label(Label::Txid), r.txid.as_ref().unwrap()));
            v.push(loc.label(Label::ThankYou).into());
        }
        ReceiptKind::PayWithPix { expires_at } => {
            v.push(loc.label(Label::PayWithPix).to_uppercase());
            v.push("Café coado 2x".into());
            v.push(format!("{}: {}", loc.label(Label::Txid), r.txid.as_ref().unwrap()));
            v.push(loc.label(Label::ScanHint).into());
            v.push(format!("{}: {}", loc.label(Label::ValidUntil), at(expires_at.unwrap())));
        }
        ReceiptKind::Expired { expired_at } => {
            v.push(loc.label(Label::ChargeExpired).to_uppercase());
            v.push(format!("{}: {}", loc.label(Label::ExpiredAt), at(expired_at.unwrap())));
            v.push(format!("{}: {}", loc.label(Label::Txid), r.txid.as_ref().unwrap()));
            v.push(loc.label(Label::NotPaid).into());
            v.push(loc.label(Label::NewChargeHint).into());
        }
    }
    v
}

fn golden_path(name: &str) -> PathBuf {
    Path::new(GOLDEN).join(format!("{name}.png"))
}

#[test]
fn every_kind_width_and_locale_decodes_to_its_labels_amount_and_qr() {
    let update = std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1");
    if update {
        std::fs::create_dir_all(GOLDEN).unwrap();
    }
    let payload = brcode();
    let mut failures = vec![];
    for (kind_name, kind) in kinds() {
        for mm in [58u8, 80] {
            for loc in [Locale::PtBr, Locale::EnUs, Locale::EsEs] {
                let name = format!("{kind_name}-{mm}mm-{}", loc.tag());
                let r = receipt(kind, loc);
                let (model, page) = printer_for(loc);
                let setup = PrinterProfile { paper_width_mm: mm, code_page: page, native_qr: mm == 80 }.on_model(model);
                let bytes = render_receipt_for(&r, &setup).unwrap_or_else(|e| panic!("{name}: {e}"));
                let opts = DecodeOptions {
                    width_dots: setup.dots(),
                    initial_code_page: CodePage::Cp437,
                    ..DecodeOptions::mm80()
                }
                .with_model(model);
                let d = decode(&bytes, &opts);
                let text = flat(&d.transcript);

                for want in expected(kind, loc, &r) {
                    if !text.contains(&flat(&want)) {
                        failures.push(format!("{name}: transcript lacks {want:?}"));
                    }
                }
                if !d.warnings.is_empty() {
                    failures.push(format!("{name}: decoder warnings {:?}", d.warnings));
                }
                if d.cuts != 1 {
                    failures.push(format!("{name}: {} cuts", d.cuts));
                }
                let scanned = scan(&d.image);
                match kind {
                    ReceiptKind::Paid | ReceiptKind::Expired { .. } => {
                        if !scanned.is_empty()
                            || !d.qr_codes.is_empty()
                            || text.contains("[QR")
                            || text.contains("[RASTER")
                        {
                            failures
                                .push(format!("{name}: printed a QR (scanned {scanned:?}, native {:?})", d.qr_codes));
                        }
                    }
                    ReceiptKind::PayWithPix { .. } => {
                        if scanned != [payload.clone()] {
                            failures.push(format!("{name}: QR scanned as {scanned:?}"));
                        }
                        if setup.native_qr() && d.qr_codes != [payload.clone()] {
                            failures.push(format!("{name}: native QR data {:?}", d.qr_codes));
                        }
                    }
                }

                let path = golden_path(&name);
                if update {
                    d.image.save(&path).unwrap();
                } else if path.exists() {
                    // The committed picture: right width, and its QR (if any) still the payload.
                    let img = image::open(&path).unwrap().to_luma8();
                    if img.width() != setup.dots() {
                        failures.push(format!("{name}: golden PNG is {} dots wide", img.width()));
                    }
                    let qr = scan(&img);
                    let want: Vec<String> =
                        if matches!(kind, ReceiptKind::PayWithPix { .. }) { vec![payload.clone()] } else { vec![] };
                    if qr != want {
                        failures.push(format!("{name}: golden PNG QR {qr:?}"));
                    }
                } else {
                    failures.push(format!("{name}: {} missing; run with UPDATE_GOLDEN=1", path.display()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} problems:\n{}", failures.len(), failures.join("\n"));
}

/// The three fixture models (and an unknown one) each get their own `ESC t` number for the
/// same CP860 setting, and a model without the page refuses to print instead of printing
/// wrong letters. (The decoder follows Epson numbering, so only Epson-numbered models are
/// decoded above.)
#[test]
fn fixture_models_send_their_own_code_table_numbers() {
    let r = receipt(ReceiptKind::Paid, Locale::PtBr);
    for (model, n) in [("Bematech MP-4200 TH", 4u8), ("Elgin i9", 4), ("Epson TM-T20X", 3), ("Some Other Printer", 3)] {
        let setup = PrinterProfile { paper_width_mm: 80, code_page: CodePage::Cp860, native_qr: true }.on_model(model);
        let b = render_receipt_for(&r, &setup).unwrap();
        assert_eq!(b[..5], [0x1B, 0x40, 0x1B, 0x74, n], "{model}");
    }
    let setup = PrinterProfile { paper_width_mm: 80, code_page: CodePage::Wpc1252, native_qr: true }
        .on_model("Bematech MP-4200 TH");
    assert!(render_receipt_for(&r, &setup).is_err());
}

/// Why the numbering matters: a Bematech job decoded by a printer that reads `ESC t` the
/// Epson way (table 4 = CP863 there) prints the wrong letters; read the Bematech way it
/// prints "Pão". Conversely Epson's number for CP860 (3) selects CP437 on a Bematech.
#[test]
fn decoding_with_the_wrong_numbering_prints_wrong_letters() {
    let r = receipt(ReceiptKind::Paid, Locale::PtBr);
    let bema = PrinterProfile { paper_width_mm: 80, code_page: CodePage::Cp860, native_qr: true }
        .on_model("Bematech MP-4200 TH");
    let bytes = render_receipt_for(&r, &bema).unwrap();
    let right = decode(&bytes, &DecodeOptions::mm80().with_model("Bematech MP-4200 TH"));
    let wrong = decode(&bytes, &DecodeOptions::mm80());
    assert!(right.transcript.contains("Pão de queijo"), "{}", right.transcript);
    assert!(!wrong.transcript.contains("Pão de queijo"), "{}", wrong.transcript);

    let epson_numbers = render_receipt_for(&r, &bema.printer.generic()).unwrap();
    let on_bematech = decode(&epson_numbers, &DecodeOptions::mm80().with_model("Bematech MP-4200 TH"));
    assert!(!on_bematech.transcript.contains("Pão de queijo"), "{}", on_bematech.transcript);
}
