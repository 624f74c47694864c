//! Decoding a `charge.upserted` record straight from its bytes, for the consumer's hot path.
//!
//! [`crate::value::decode_envelope`] parses a record into a `serde_json::Value` and
//! [`crate::value::decode_charge`] reads the charge from it: an allocation per key and per
//! string of a ~1.2 KB record, which was the consumer's largest cost after rendering
//! (about 8% of pixgate's CPU in a backlog drain). Here it is checked as a `Value` parse
//! would check it, building nothing ([`Checked`]), then deserialized into structs of the
//! fields pixgate uses, in the shapes the capture job writes, with borrowed strings: 0.6×
//! the reference's time on the fixtures (`benches/charge_decode.rs`).
//!
//! The `Value` decoders stay the reference: this path only answers when a field has the
//! shape it expects; on anything else (a missing or malformed field, an unusual but valid
//! form) it hands the record to the reference decoders, whose result, `Ok` or dead-letter
//! reason, is what [`decode_charge_record`] returns. So the two cannot disagree on an
//! error, and the test `fast_and_reference_decoders_agree` checks that they agree on every
//! fixture and on mutations of it.

use crate as cdc;
use crate::document::{Charge, ChargeStatus, Operation};
use crate::error::DecodeError;
use chrono::{DateTime, Utc};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;

/// A `charge.upserted` record decoded: the envelope's fields and the charge document.
#[derive(Debug, Clone, PartialEq)]
pub struct ChargeRecord {
    /// `eventId`.
    pub event_id: String,
    /// `operationType`.
    pub operation: Operation,
    /// `documentKey._id`.
    pub document_id: String,
    /// `clusterTime` as `(t << 32) | i` ([`cdc::Envelope::cluster_time`]).
    pub cluster_time: u64,
    /// The `fullDocument` decoded as a charge ([`cdc::decode_charge`]); `None` when the
    /// event has no document (a delete, or a document deleted before the lookup).
    pub charge: Option<Result<Charge, DecodeError>>,
}

/// Decodes a `charge.upserted` record: what [`cdc::decode_envelope`] and then
/// [`cdc::decode_charge`] on its `fullDocument` give, without building a `Value` when the
/// record has the usual shapes.
///
/// # Errors
/// The envelope's [`DecodeError`], as [`cdc::decode_envelope`] gives it. A document that
/// is not a valid charge is `Ok` with [`ChargeRecord::charge`] holding the error.
pub fn decode_charge_record(bytes: &[u8]) -> Result<ChargeRecord, DecodeError> {
    match fast_record(bytes) {
        Some(r) => Ok(r),
        None => decode_with_values(bytes),
    }
}

/// The reference: [`cdc::decode_envelope`], then [`cdc::decode_charge`] on its
/// `fullDocument`, through a `serde_json::Value`. What [`decode_charge_record`] returns for
/// a record the typed pass does not take, and what it must equal for every record (the
/// unit test below and `fuzz/fuzz_targets/cdc_decode.rs` check that).
///
/// # Errors
/// The envelope's [`DecodeError`].
pub fn decode_with_values(bytes: &[u8]) -> Result<ChargeRecord, DecodeError> {
    let env = cdc::decode_envelope(bytes)?;
    let charge = env.full_document.as_ref().map(cdc::decode_charge);
    Ok(ChargeRecord {
        event_id: env.event_id,
        operation: env.operation,
        document_id: env.document_id,
        cluster_time: env.cluster_time,
        charge,
    })
}

/// The record in the shapes the capture job writes; `None` hands it to the reference
/// decoders (any field missing, `null` where required, of another type or form, repeated).
fn fast_record(bytes: &[u8]) -> Option<ChargeRecord> {
    // serde_json skips the fields a struct does not name without checking them as a
    // `Value` would (a `\u` escape that is no code point, a number out of `f64` range): a
    // first pass checks the whole record as the reference parses it, building nothing.
    serde_json::from_slice::<Checked>(bytes).ok()?;
    let r: Record<'_> = serde_json::from_slice(bytes).ok()?;
    let operation = match r.operation.as_ref() {
        "insert" => Operation::Insert,
        "update" => Operation::Update,
        "replace" => Operation::Replace,
        "delete" => Operation::Delete,
        _ => return None,
    };
    let ts = r.cluster_time.timestamp;
    if ts.t > u64::from(u32::MAX) || ts.i > u64::from(u32::MAX) {
        return None;
    }
    let charge = match r.full_document {
        None => None,
        Some(d) => Some(Ok(d.into_charge()?)),
    };
    Some(ChargeRecord {
        event_id: r.event_id.into_owned(),
        operation,
        document_id: r.document_key.id.0?,
        cluster_time: (ts.t << 32) | ts.i,
        charge,
    })
}

/// The envelope (`fixtures/cdc/README.md`), fields pixgate reads; others are skipped.
#[derive(Deserialize)]
struct Record<'a> {
    #[serde(rename = "eventId", borrow)]
    event_id: Cow<'a, str>,
    #[serde(rename = "operationType", borrow)]
    operation: Cow<'a, str>,
    #[serde(rename = "documentKey")]
    document_key: DocumentKey,
    #[serde(rename = "clusterTime")]
    cluster_time: ClusterTime,
    #[serde(rename = "fullDocument", default, borrow)]
    full_document: Option<Document<'a>>,
}

#[derive(Deserialize)]
struct DocumentKey {
    #[serde(rename = "_id")]
    id: Oid,
}

#[derive(Deserialize)]
struct ClusterTime {
    #[serde(rename = "$timestamp")]
    timestamp: Timestamp,
}

#[derive(Deserialize)]
struct Timestamp {
    t: u64,
    i: u64,
}

/// A `Charge` document, fields pixgate reads.
#[derive(Deserialize)]
struct Document<'a> {
    #[serde(rename = "_id")]
    id: Oid,
    company: Oid,
    value: Long,
    #[serde(borrow)]
    status: Cow<'a, str>,
    #[serde(rename = "__v")]
    version: Long,
    #[serde(default)]
    terminal: Option<Oid>,
    #[serde(rename = "brCode", default)]
    brcode: Option<String>,
    #[serde(rename = "pixKey", default)]
    pix_key: Option<String>,
    #[serde(rename = "transactionID", default)]
    transaction_id: Option<String>,
    merchant: Merchant,
    #[serde(rename = "additionalInfo", default)]
    items: Option<Vec<Item>>,
    #[serde(default)]
    comment: Option<String>,
    #[serde(default)]
    payer: Option<Payer>,
    #[serde(rename = "paidAt", default)]
    paid_at: Option<Date>,
    #[serde(rename = "expiresDate", default)]
    expires_at: Option<Date>,
    #[serde(rename = "endToEndId", default)]
    end_to_end_id: Option<String>,
}

#[derive(Deserialize)]
struct Merchant {
    name: String,
    city: String,
}

#[derive(Deserialize)]
struct Item {
    key: String,
    value: String,
}

#[derive(Deserialize)]
struct Payer {
    #[serde(default)]
    name: Option<String>,
}

impl Document<'_> {
    /// The [`Charge`], `None` where [`cdc::decode_charge`] would refuse it or read it
    /// otherwise (an empty id, a negative amount, an unknown status, a bad date).
    fn into_charge(self) -> Option<Charge> {
        let status = match self.status.as_ref() {
            "ACTIVE" => ChargeStatus::Active,
            "COMPLETED" => ChargeStatus::Completed,
            "EXPIRED" => ChargeStatus::Expired,
            _ => return None,
        };
        let value = u64::try_from(self.value.0?).ok()?;
        let terminal = match self.terminal {
            None => None,
            Some(t) => Some(t.0?),
        };
        let date = |d: Option<Date>| match d {
            None => Some(None),
            Some(d) => d.0.map(Some),
        };
        Some(Charge {
            id: self.id.0?,
            company: self.company.0?,
            value_cents: value,
            status,
            version: self.version.0?,
            terminal,
            brcode: self.brcode,
            pix_key: self.pix_key,
            transaction_id: self.transaction_id,
            merchant_name: self.merchant.name,
            merchant_city: self.merchant.city,
            items: self.items.unwrap_or_default().into_iter().map(|i| (i.key, i.value)).collect(),
            comment: self.comment,
            payer_name: self.payer.and_then(|p| p.name),
            paid_at: date(self.paid_at)?,
            expires_at: date(self.expires_at)?,
            end_to_end_id: self.end_to_end_id,
        })
    }
}

/// `{"$oid": "…"}` or a plain string; `None` inside when empty (the reference refuses it).
struct Oid(Option<String>);

/// An integer: a JSON integer that fits `i64`, or `{"$numberLong": "…"}` /
/// `{"$numberInt": "…"}`; `None` inside when the text is not an `i64`.
struct Long(Option<i64>);

/// `{"$date": "ISO-8601"}`, `{"$date": {"$numberLong": "ms"}}` or an ISO-8601 string;
/// `None` inside when it does not parse or is out of range.
struct Date(Option<DateTime<Utc>>);

/// The one member of a `{"$name": value}` wrapper, if `name` is its key.
fn wrapped<'de, A: MapAccess<'de>, T: Deserialize<'de>>(mut map: A, names: &[&str]) -> Result<T, A::Error> {
    let key: Str<'de> = map.next_key()?.ok_or_else(|| serde::de::Error::custom("empty object"))?;
    if !names.contains(&key.0.as_ref()) {
        return Err(serde::de::Error::custom("unexpected key"));
    }
    let v = map.next_value()?;
    match map.next_key::<serde::de::IgnoredAny>()? {
        None => Ok(v),
        Some(_) => Err(serde::de::Error::custom("more than one key")),
    }
}

impl<'de> Deserialize<'de> for Oid {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Oid;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an ObjectId")
            }
            fn visit_str<E>(self, v: &str) -> Result<Oid, E> {
                Ok(Oid((!v.is_empty()).then(|| v.to_string())))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Oid, A::Error> {
                let s: Str<'de> = wrapped(map, &["$oid"])?;
                self.visit_str(&s.0)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Long {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Long;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E>(self, v: i64) -> Result<Long, E> {
                Ok(Long(Some(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Long, E> {
                Ok(Long(i64::try_from(v).ok()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Long, A::Error> {
                let s: Str<'de> = wrapped(map, &["$numberLong", "$numberInt"])?;
                Ok(Long(s.0.parse().ok()))
            }
        }
        d.deserialize_any(V)
    }
}

/// An ISO-8601 (RFC 3339) date, as the reference reads it.
fn iso(v: &str) -> Date {
    Date(DateTime::parse_from_rfc3339(v).ok().map(|t| t.with_timezone(&Utc)))
}

impl<'de> Deserialize<'de> for Date {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Date;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a date")
            }
            fn visit_str<E>(self, v: &str) -> Result<Date, E> {
                Ok(iso(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Date, A::Error> {
                let inner: DateValue = wrapped(map, &["$date"])?;
                Ok(inner.0)
            }
        }
        /// What `$date` holds: an ISO-8601 string or `{"$numberLong": "ms"}`.
        struct DateValue(Date);
        impl<'de> Deserialize<'de> for DateValue {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct W;
                impl<'de> Visitor<'de> for W {
                    type Value = DateValue;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a date string or milliseconds")
                    }
                    fn visit_str<E>(self, v: &str) -> Result<DateValue, E> {
                        Ok(DateValue(iso(v)))
                    }
                    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<DateValue, A::Error> {
                        let ms: Str<'de> = wrapped(map, &["$numberLong"])?;
                        Ok(DateValue(Date(ms.0.parse().ok().and_then(DateTime::from_timestamp_millis))))
                    }
                }
                d.deserialize_any(W)
            }
        }
        d.deserialize_any(V)
    }
}

/// Any JSON value, read as serde_json reads one into a `Value` (every string unescaped and
/// checked, every number converted) but not built: what the reference's parse refuses,
/// this refuses.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Checked;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_unit<E>(self) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_none<E>(self) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Checked, D::Error> {
                Checked::deserialize(d)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
                while seq.next_element::<Checked>()?.is_some() {}
                Ok(Checked)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
                while map.next_key::<Checked>()?.is_some() {
                    map.next_value::<Checked>()?;
                }
                Ok(Checked)
            }
        }
        d.deserialize_any(V)
    }
}

/// A JSON string, borrowed from the input unless it holds escapes.
struct Str<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct S;
        impl<'de> Visitor<'de> for S {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(S)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// The object at `path` inside `doc`, if there is one.
    fn object_at<'v>(doc: &'v mut Value, path: &[&str]) -> Option<&'v mut serde_json::Map<String, Value>> {
        path.iter().try_fold(doc, |n, p| n.get_mut(*p))?.as_object_mut()
    }

    /// Field values that are valid, unusual or wrong, for every field the decoders read.
    fn variants() -> Vec<Value> {
        vec![
            Value::Null,
            json!(""),
            json!("x"),
            json!("ACTIVE"),
            json!("EXPIRED"),
            json!("2026-11-27T12:15:00.000Z"),
            json!("not a date"),
            json!(0),
            json!(-5),
            json!(990),
            json!(45.99),
            json!(18446744073709551615u64),
            json!(true),
            json!([]),
            json!([{"key": "a", "value": "b"}, "c", {"key": 1}]),
            json!({}),
            json!({"$oid": "ab12"}),
            json!({"$oid": ""}),
            json!({"$oid": 7}),
            json!({"$numberLong": "1500"}),
            json!({"$numberLong": "+7"}),
            json!({"$numberLong": "1.5"}),
            json!({"$numberLong": 3, "$numberInt": "4"}),
            json!({"$numberInt": "12"}),
            json!({"$date": "2026-11-27T12:15:00.000-03:00"}),
            json!({"$date": {"$numberLong": "1000"}}),
            json!({"$date": null}),
            json!({"$date": 5}),
            json!({"name": "Loja", "city": "Recife"}),
            json!({"name": "Loja"}),
            json!({"t": 1795780800u64, "i": 18}),
            json!({"t": 4294967296u64, "i": 0}),
            json!({"_id": {"$oid": "c1"}}),
        ]
    }

    /// The fast path and the reference decoders give the same result, `Ok` or error, for
    /// every record of the fixtures and for each of them with one field (envelope or
    /// document, nested ones included) removed or replaced by each of [`variants`].
    #[test]
    fn fast_and_reference_decoders_agree() {
        let mut records: Vec<Vec<u8>> = Vec::new();
        for file in ["charges.jsonl", "edge-cases.jsonl"] {
            records.extend(crate::fixtures::records(file).into_iter().map(|(_, b)| b));
        }
        let paths = [
            "eventId",
            "operationType",
            "documentKey",
            "documentKey._id",
            "clusterTime",
            "clusterTime.$timestamp",
            "clusterTime.$timestamp.t",
            "fullDocument",
            "fullDocument._id",
            "fullDocument.company",
            "fullDocument.value",
            "fullDocument.status",
            "fullDocument.__v",
            "fullDocument.merchant",
            "fullDocument.merchant.name",
            "fullDocument.merchant.city",
            "fullDocument.additionalInfo",
            "fullDocument.terminal",
            "fullDocument.brCode",
            "fullDocument.payer",
            "fullDocument.paidAt",
            "fullDocument.expiresDate",
            "fullDocument.endToEndId",
        ];
        let mut mutated = Vec::new();
        // Every 8th record is enough to meet each shape of field (and keeps the test quick).
        for bytes in records.iter().step_by(8) {
            let Ok(v) = serde_json::from_slice::<Value>(bytes) else { continue };
            for path in paths {
                let path: Vec<&str> = path.split('.').collect();
                let (last, parents) = path.split_last().unwrap();
                let mut removed = v.clone();
                let Some(obj) = object_at(&mut removed, parents) else { continue };
                obj.remove(*last);
                mutated.push(serde_json::to_vec(&removed).unwrap());
                for variant in variants() {
                    let mut changed = v.clone();
                    object_at(&mut changed, parents).unwrap().insert(last.to_string(), variant);
                    mutated.push(serde_json::to_vec(&changed).unwrap());
                }
            }
        }
        // What serde_json does not check in a field it skips, but refuses in a `Value`: a
        // `\u` escape that is no code point (found by fuzz/fuzz_targets/cdc_decode.rs in
        // `createdAt`), a number out of `f64` range, bytes that are not UTF-8.
        let usual = String::from_utf8(records[0].clone()).unwrap();
        for odd in [r#""\udc00x""#, "1e400", "-1e999", &format!("1{}", "0".repeat(400))] {
            mutated.push(usual.replacen(r#""ns":"#, &format!(r#""skipped":{odd},"ns":"#), 1).into_bytes());
            mutated.push(usual.replacen(r#""_id":"#, &format!(r#""skipped":[{odd}],"_id":"#), 2).into_bytes());
        }
        let mut bad_utf8 = usual.clone().into_bytes();
        let at = usual.find("createdAt").unwrap() + 14;
        bad_utf8[at] = 0xFF;
        mutated.push(bad_utf8);
        // Keys that repeat (the last one counts) and keys written with escapes.
        mutated.push(br#"{"eventId":"a","eventId":"b","operationType":"insert","documentKey":{"_id":"c1"},"clusterTime":{"$timestamp":{"t":1,"i":2}},"fullDocument":null}"#.to_vec());
        mutated.push(br#"{"eventId":"a","operationType":"insert","documentKey":{"\u005fid":"c1"},"clusterTime":{"$timestamp":{"t":1,"i":2}},"fullDocument":{"_id":"c1","company":"k","value":5,"value":-1,"status":"ACTIVE","__v":0,"merchant":{"name":"A","city":"B"}}}"#.to_vec());
        mutated.push(br#"{"eventId":"a\u00e9","operationType":"insert","documentKey":{"_id":"c1"},"clusterTime":{"$timestamp":{"t":1,"i":2}}} trailing"#.to_vec());
        let mut compared = 0;
        for bytes in records.iter().chain(&mutated) {
            let fast = decode_charge_record(bytes);
            assert_eq!(fast, decode_with_values(bytes), "{}", String::from_utf8_lossy(bytes));
            compared += 1;
        }
        assert!(compared > 15_000, "{compared} records compared");
        // The fast path must carry the usual records, not hand them all to the reference.
        let usual = crate::fixtures::records("charges.jsonl");
        let slow: Vec<String> = usual
            .iter()
            .filter(|(_, b)| !fast_record(b).is_some_and(|r| matches!(r.charge, Some(Ok(_)))))
            .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
            .collect();
        assert!(
            usual.len() > 200 && slow.is_empty(),
            "{} of {} usual records not decoded by the fast path, e.g. {:?}",
            slow.len(),
            usual.len(),
            slow.first()
        );
    }
}
