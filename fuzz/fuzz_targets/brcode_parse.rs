//! `render::brcode::parse` on arbitrary bytes, plus what an accepted payload promises.
//!
//! Input: any bytes, read as UTF-8 (invalid sequences become U+FFFD, which the parser sees
//! as ordinary multibyte characters; valid UTF-8 is passed through unchanged). When the text
//! ends in `6304` and 4 more characters, it is parsed a second time with those 4 replaced
//! by the right CRC16, so that mutations get past the CRC check to the field rules.
//!
//! Properties checked on a payload `parse` accepts (module docs of `render/src/brcode.rs`):
//! - field `63` is the CRC16 of the payload's UTF-8 bytes through `6304`, recomputed here;
//! - `amount_cents()` reads every amount the parser accepted, and it is non-zero;
//! - **re-encoding**: the parsed fields fed back to `encode_static` (key payloads) or
//!   `encode_dynamic` (URL payloads) give a payload that parses to the same key/URL, amount
//!   and txid, and to the name and city folded by `fold_upper` (the encoder's documented
//!   canonical form); re-encoding that payload's fields again gives the same bytes (the
//!   canonical form is a fixed point). The encoder may refuse only for the documented
//!   reasons listed in `allowed_refusal`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use render::brcode::{crc16, encode_dynamic, encode_static, fold_upper, parse, BrCode, BrCodeError, StaticPix};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    check(&text);
    if let Some(fixed) = with_crc_fixed(&text) {
        check(&fixed);
    }
});

/// `text` with its last 4 characters replaced by the CRC16 of everything before them, when
/// they follow `6304`: mutations then reach the field rules behind the CRC check without
/// having to solve the CRC.
fn with_crc_fixed(text: &str) -> Option<String> {
    let (cut, _) = text.char_indices().rev().nth(3)?;
    let body = &text[..cut];
    body.ends_with("6304").then(|| format!("{body}{:04X}", crc16(body.as_bytes())))
}

fn check(text: &str) {
    let Ok(b) = parse(text) else { return };

    let bytes = text.as_bytes();
    assert_eq!(format!("{:04X}", crc16(&bytes[..bytes.len() - 4])), b.crc, "CRC field of an accepted payload");
    assert!(text.ends_with(&format!("6304{}", b.crc)));
    if b.amount.is_some() {
        assert!(matches!(b.amount_cents(), Some(c) if c > 0), "accepted amount {:?} unreadable", b.amount);
    }

    if b.key.is_some() {
        reencode_static(&b);
    } else {
        reencode_dynamic(&b);
    }
}

fn static_of(b: &BrCode) -> StaticPix {
    StaticPix {
        key: b.key.clone().expect("static payload"),
        amount_cents: b.amount_cents(),
        merchant_name: b.merchant_name.clone(),
        merchant_city: b.merchant_city.clone(),
        txid: Some(b.txid.clone()),
        description: b.description.clone(),
    }
}

fn reencode_static(b: &BrCode) {
    let p = static_of(b);
    let out = match encode_static(&p) {
        Ok(out) => out,
        Err(e) => return allowed_refusal(b, &e),
    };
    let b2 = parse(&out).unwrap_or_else(|e| panic!("encode_static wrote a payload parse rejects: {e}\n{out}"));
    assert_eq!(b2.key.as_deref(), Some(p.key.trim()), "key");
    assert_eq!(b2.url, None);
    assert_eq!(b2.amount_cents(), b.amount_cents(), "amount");
    assert_eq!(b2.txid, b.txid, "txid");
    assert_eq!(b2.merchant_name, fold_upper(&b.merchant_name, 25), "name");
    assert_eq!(b2.merchant_city, fold_upper(&b.merchant_city, 15), "city");
    if let Some(d) = &b.description {
        // Printable ASCII without surrounding spaces is already in the encoder's form, and
        // fits: it fitted template 26 beside the same key in the input.
        if d.trim() == d && d.chars().all(|c| (' '..='~').contains(&c)) {
            assert_eq!(b2.description.as_deref(), Some(d.as_str()), "description");
        }
    }
    let again = encode_static(&static_of(&b2)).expect("re-encoding canonical output");
    assert_eq!(again, out, "canonical output is not a fixed point");
}

fn reencode_dynamic(b: &BrCode) {
    let url = b.url.as_deref().expect("a parsed payload has a key or a URL");
    let out = match encode_dynamic(url, b.amount_cents(), &b.merchant_name, &b.merchant_city) {
        Ok(out) => out,
        Err(e) => return allowed_refusal(b, &e),
    };
    let b2 = parse(&out).unwrap_or_else(|e| panic!("encode_dynamic wrote a payload parse rejects: {e}\n{out}"));
    // A parsed URL carries no "://", so the encoder's scheme stripping never applies.
    assert_eq!(b2.url.as_deref(), Some(url.trim()), "url");
    assert_eq!(b2.key, None);
    assert_eq!(b2.amount_cents(), b.amount_cents(), "amount");
    assert_eq!(b2.txid, "***");
    assert_eq!(b2.point_of_initiation.as_deref(), Some("12"));
    assert_eq!(b2.merchant_name, fold_upper(&b.merchant_name, 25), "name");
    assert_eq!(b2.merchant_city, fold_upper(&b.merchant_city, 15), "city");
    let again = encode_dynamic(b2.url.as_deref().unwrap(), b2.amount_cents(), &b2.merchant_name, &b2.merchant_city)
        .expect("re-encoding canonical output");
    assert_eq!(again, out, "canonical output is not a fixed point");
}

/// The encoder's documented refusals for fields that a reader accepts: a key or URL that is
/// only spaces, a name or city with nothing left after folding to the BR Code character
/// set, and an amount whose canonical two-decimal form exceeds field 54's 13 characters
/// (R$ 10,000,000,000.00 and up; the reader accepts `9999999999999` without decimals).
fn allowed_refusal(b: &BrCode, e: &BrCodeError) {
    let ok = match e {
        BrCodeError::InvalidValue { tag, .. } if tag == "26-01" => b.key.as_deref().is_some_and(|k| k.trim().is_empty()),
        BrCodeError::InvalidValue { tag, .. } if tag == "26-25" => b.url.as_deref().is_some_and(|u| u.trim().is_empty()),
        BrCodeError::InvalidValue { tag, .. } if tag == "59" => fold_upper(&b.merchant_name, 25).is_empty(),
        BrCodeError::InvalidValue { tag, .. } if tag == "60" => fold_upper(&b.merchant_city, 15).is_empty(),
        BrCodeError::FieldTooLong { tag, .. } if tag == "54" => b.amount_cents().is_some_and(|c| c >= 1_000_000_000_000),
        _ => false,
    };
    assert!(ok, "encoder refused the fields of an accepted payload: {e:?}\nfields: {b:?}");
}
