//! The change-event decoder (the `cdc` crate) on arbitrary record values.
//!
//! Input: a Kafka record value as pixgate reads it from `charge.upserted` /
//! `device.upserted` (contract: `fixtures/cdc/README.md`). It goes through
//! `decode_envelope`, and the envelope's `fullDocument` through both `decode_charge` and
//! `decode_device`; when the input is itself a JSON document, that is decoded as a charge and
//! as a device too, so mutations reach the document decoders without an envelope around them.
//!
//! Properties: `charge_record::decode_charge_record` (the consumer's typed decoder) returns
//! exactly what `decode_envelope` then `decode_charge` return; never panics; every error's
//! dead-letter reason has one of the documented forms (`not_json`, `missing_field:<f>`,
//! `invalid_field:<f>`); an accepted envelope's `cluster_time` is exactly `(t << 32) | i` of
//! the input's `clusterTime.$timestamp` (BSON timestamps are two unsigned 32-bit integers:
//! nothing may be cut off silently); accepted documents respect the ranges their decoders
//! document.

#![no_main]

use cdc::{decode_charge, decode_device, decode_envelope, DecodeError, DeviceKind};
use cdc::charge_record::{decode_charge_record, decode_with_values};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let json: Option<Value> = serde_json::from_slice(data).ok();
    // The consumer's typed decoder gives exactly what the reference decoders give.
    assert_eq!(decode_charge_record(data), decode_with_values(data));
    match decode_envelope(data) {
        Ok(env) => {
            let v = json.as_ref().expect("an accepted envelope is JSON");
            let ts = &v["clusterTime"]["$timestamp"];
            let (t, i) = (ts["t"].as_u64().unwrap(), ts["i"].as_u64().unwrap());
            assert_eq!((env.cluster_time >> 32, env.cluster_time & 0xFFFF_FFFF), (t, i), "clusterTime {ts}");
            assert!(!env.document_id.is_empty());
            if let Some(doc) = &env.full_document {
                assert!(doc.is_object());
                documents(doc);
            }
        }
        Err(e) => check_reason(&e),
    }
    if let Some(v) = &json {
        documents(v);
    }
});

fn documents(doc: &Value) {
    match decode_charge(doc) {
        Ok(c) => {
            assert!(c.value_cents <= i64::MAX as u64);
            assert!(!c.id.is_empty() && !c.company.is_empty());
        }
        Err(e) => check_reason(&e),
    }
    match decode_device(doc) {
        Ok(d) => match d.kind {
            DeviceKind::Printer { paper_width_mm, .. } => assert!(paper_width_mm == 58 || paper_width_mm == 80),
            DeviceKind::Terminal { width_px, height_px, .. } => {
                assert!((64..=8192).contains(&width_px) && (64..=8192).contains(&height_px))
            }
        },
        Err(e) => check_reason(&e),
    }
}

fn check_reason(e: &DecodeError) {
    let r = e.reason();
    let field = r.strip_prefix("missing_field:").or_else(|| r.strip_prefix("invalid_field:"));
    assert!(r == "not_json" || field.is_some_and(|f| !f.is_empty() && !f.contains(char::is_whitespace)), "reason {r:?}");
    let _ = e.to_string();
}
