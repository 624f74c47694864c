//! Every payload of `fixtures/brcode/vectors.json` through `render::brcode::parse`:
//! accept/reject must match `expect`, decoded fields must match `fields`, and a rejection
//! must be for the rule the fixture names (`expect_rule`).

use render::brcode::{crc16, parse, BrCode, BrCodeError};
use vectors::{expectation, load, Rule};

#[path = "support/brcode_vectors.rs"]
mod vectors;

fn field<'a>(b: &'a BrCode, name: &str) -> Option<&'a str> {
    match name {
        "point_of_initiation" => b.point_of_initiation.as_deref(),
        "gui" => Some(&b.gui),
        "key" => b.key.as_deref(),
        "description" => b.description.as_deref(),
        "url" => b.url.as_deref(),
        "mcc" => Some(&b.mcc),
        "currency" => Some(&b.currency),
        "amount" => b.amount.as_deref(),
        "country" => Some(&b.country),
        "merchant_name" => Some(&b.merchant_name),
        "city" | "merchant_city" => Some(&b.merchant_city),
        "postal_code" => b.postal_code.as_deref(),
        "txid" => Some(&b.txid),
        "crc" => Some(&b.crc),
        other => panic!("vectors.json has a field this test does not know: {other}"),
    }
}

/// Whether `err` is a rejection for the fixture's `expect_rule` (see [`vectors::rule`]).
fn rule_matches(rule: &str, err: &BrCodeError) -> bool {
    let tag_is = |t: &str| match err {
        BrCodeError::InvalidValue { tag, .. }
        | BrCodeError::FieldTooLong { tag, .. }
        | BrCodeError::Missing { tag } => tag == t,
        _ => false,
    };
    match vectors::rule(rule) {
        Rule::NotPix => matches!(err, BrCodeError::NotPix { .. }),
        Rule::TooLong => matches!(err, BrCodeError::TooLong { .. }),
        Rule::Crc => matches!(err, BrCodeError::Crc { .. }),
        Rule::Tag(t) => tag_is(t),
        Rule::Structural => matches!(
            err,
            BrCodeError::Tlv { .. }
                | BrCodeError::Crc { .. }
                | BrCodeError::Missing { .. }
                | BrCodeError::InvalidValue { .. }
                | BrCodeError::FieldTooLong { .. }
        ),
    }
}

#[test]
fn every_vector_matches_expectation() {
    let vectors = load();
    assert!(!vectors.is_empty());
    let mut checked = 0;
    for (i, v) in vectors.iter().enumerate() {
        let payload = v["payload"].as_str().expect("payload");
        let expect = expectation(v);
        let result = parse(payload);

        // Independent CRC cross-check of the fixture's crc_valid flag where 6304 exists.
        if let (Some(valid), Some(pos)) = (v["crc_valid"].as_bool(), payload.rfind("6304")) {
            if pos + 8 == payload.len() && v["tlv_valid"].as_bool() == Some(true) {
                let ok = format!("{:04X}", crc16(&payload.as_bytes()[..pos + 4])) == payload[pos + 4..];
                assert_eq!(ok, valid, "#{i}: crc_valid flag disagrees with crc16");
            }
        }

        match (expect, &result) {
            ("accept", Ok(b)) => {
                for (name, want) in v["fields"].as_object().expect("fields") {
                    assert_eq!(field(b, name), want.as_str(), "#{i} field {name}");
                }
                if let Some(a) = b.amount.as_deref() {
                    // amount_cents agrees with a float reading of the EMV amount.
                    let f: f64 = a.parse().unwrap();
                    assert_eq!(b.amount_cents(), Some((f * 100.0).round() as u64), "#{i}");
                }
                assert_eq!(b.is_dynamic(), v["kind"] == "dynamic", "#{i} kind");
            }
            ("reject", Err(e)) => {
                let rule = v["expect_rule"].as_str().unwrap_or("");
                assert!(rule_matches(rule, e), "#{i}: rejected for {e:?}, fixture's rule: {rule}");
                // The message is for humans: it must say something.
                assert!(e.to_string().len() > 10);
            }
            ("either", _) => {}
            (exp, got) => panic!("#{i}: expected {exp}, got {got:?}\n  payload {payload}"),
        }
        checked += 1;
    }
    assert_eq!(checked, vectors.len());
}

#[test]
fn fields_of_rejected_sound_vectors_parse_when_the_rule_is_lifted() {
    // Sanity: "reject" vectors with a sound CRC and TLV fail for their rule, not earlier.
    let vectors = load();
    for v in &vectors {
        if v["expect"] == "reject" && v["crc_valid"] == true && v["tlv_valid"] == true {
            let e = parse(v["payload"].as_str().unwrap()).unwrap_err();
            assert!(!matches!(e, BrCodeError::Crc { .. } | BrCodeError::Tlv { .. }), "{e:?}");
        }
    }
}
