//! The pay-with-Pix slip and the expiry notice as a printer receives them: the gateway
//! sends them to printers with `printer.printPixSlip` as `display_qr` and `charge_expired`
//! ESC/POS jobs. Here the first charge of `fixtures/cdc/charges.jsonl` is rendered by
//! `render::receipt` for two fixture printers (80 mm Elgin i9 with native `GS ( k`, 58 mm
//! Bematech with a raster QR), wrapped in a job, and carried out by the simulated printer
//! (`print_job`, the MQTT mode's path): the transcript must hold the amount and the txid,
//! the slip's printed QR must scan (rqrr, from the PNG on disk) as the charge's BR Code,
//! and the notice must have no QR at all.

// A test: a panic in its helpers is a failed test, as in its #[test] functions.
#![allow(clippy::unwrap_used)]

mod common;

use device_protocol::messages::{CONTENT_ESCPOS, VERSION};
use device_protocol::{EffectKind, Job};
use render::codepage::CodePage;
use render::locale::Label;
use render::money::format_amount;
use render::receipt::{render_receipt_for, PrinterProfile, Receipt, ReceiptKind};
use render::Locale;
use serde_json::Value;
use simulators::printer::{print_job, PrinterSettings};

const CHARGES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/cdc/charges.jsonl");

/// The fields of the first fixture charge (dynamic, `brCode` present) a slip prints.
struct Charge {
    id: String,
    value_cents: u64,
    txid: String,
    brcode: String,
    merchant: String,
    city: String,
    expires: chrono::DateTime<chrono::Utc>,
}

fn first_charge() -> Charge {
    let line = std::fs::read_to_string(CHARGES).unwrap().lines().next().unwrap().to_string();
    let v: Value = serde_json::from_str(&line).unwrap();
    let d = &v["value"]["fullDocument"];
    Charge {
        id: d["_id"]["$oid"].as_str().unwrap().into(),
        value_cents: d["value"]["$numberLong"].as_str().unwrap().parse().unwrap(),
        txid: d["transactionID"].as_str().unwrap().into(),
        brcode: d["brCode"].as_str().unwrap().into(),
        merchant: d["merchant"]["name"].as_str().unwrap().into(),
        city: d["merchant"]["city"].as_str().unwrap().into(),
        expires: d["expiresDate"]["$date"].as_str().unwrap().parse().unwrap(),
    }
}

fn job(kind: EffectKind, c: &Charge, seq: u64, bytes: &[u8]) -> Job {
    Job {
        v: VERSION,
        message_id: format!("m{seq}"),
        seq,
        kind,
        event_id: format!("Charge:{}:{seq}", c.id),
        charge_id: c.id.clone(),
        content_type: CONTENT_ESCPOS.into(),
        payload: Job::encode_payload(bytes),
        expires_at: None,
    }
}

fn flat(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn slip_and_notice_print_amount_txid_and_only_the_slip_has_the_qr() {
    let c = first_charge();
    let printers = [("Elgin i9", 80u8, true), ("Bematech MP-4200 TH", 58, false)];
    for (model, mm, native_qr) in printers {
        let dir = common::temp_dir("pix-slip");
        let setup = PrinterProfile { paper_width_mm: mm, code_page: CodePage::Cp860, native_qr }.on_model(model);
        let settings = PrinterSettings::for_paper(mm, CodePage::Cp437).with_model(model);
        let receipt = |kind, brcode: Option<String>| Receipt {
            kind,
            merchant_name: c.merchant.clone(),
            merchant_city: c.city.clone(),
            amount_cents: c.value_cents,
            items: vec![("Pão de queijo".into(), "3x".into())],
            comment: None,
            payer_name: None,
            paid_at: None,
            time_zone: chrono_tz::America::Sao_Paulo,
            end_to_end_id: None,
            charge_id: c.id.clone(),
            txid: Some(c.txid.clone()),
            brcode,
            locale: Locale::PtBr,
        };
        let slip = render_receipt_for(
            &receipt(ReceiptKind::PayWithPix { expires_at: Some(c.expires) }, Some(c.brcode.clone())),
            &setup,
        )
        .unwrap();
        // The gateway never gives the notice a payload, but even with one it must not print it.
        let notice = render_receipt_for(
            &receipt(ReceiptKind::Expired { expired_at: Some(c.expires) }, Some(c.brcode.clone())),
            &setup,
        )
        .unwrap();

        let slip_png = print_job(&settings, &job(EffectKind::DisplayQr, &c, 1, &slip), &dir).unwrap();
        let notice_png = print_job(&settings, &job(EffectKind::ChargeExpired, &c, 2, &notice), &dir).unwrap();
        let transcript = std::fs::read_to_string(dir.join("transcript.txt")).unwrap();
        let (slip_text, notice_text) =
            transcript.split_once("===== seq 0002 charge_expired").expect("two jobs in the transcript");
        assert!(slip_text.contains("===== seq 0001 display_qr"), "{transcript}");

        let amount = format_amount(c.value_cents as i64, Locale::PtBr);
        for (name, text) in [("slip", slip_text), ("notice", notice_text)] {
            let t = flat(text);
            assert!(t.contains(&amount), "{model} {name}: no amount {amount}\n{text}");
            assert!(t.contains(&c.txid), "{model} {name}: no txid\n{text}");
            assert!(t.contains(&c.id), "{model} {name}: no charge id\n{text}");
        }
        assert!(flat(slip_text).contains(&Locale::PtBr.label(Label::PayWithPix).to_uppercase()), "{slip_text}");
        assert!(flat(notice_text).contains(&Locale::PtBr.label(Label::ChargeExpired).to_uppercase()), "{notice_text}");

        let scanned = common::qr_codes_in_png(&slip_png);
        assert_eq!(scanned, std::slice::from_ref(&c.brcode), "{model}: slip QR");
        let parsed = render::brcode::parse(&scanned[0]).unwrap();
        assert_eq!(parsed.amount_cents(), Some(c.value_cents));
        assert_eq!(common::qr_codes_in_png(&notice_png), Vec::<String>::new(), "{model}: the notice printed a QR");
        assert!(!notice_text.contains("[QR") && !notice_text.contains("[RASTER"), "{notice_text}");
    }
}
