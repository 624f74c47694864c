//! The reference decoders: a record parsed into a `serde_json::Value`, then the envelope
//! and the documents read from it. The consumer's path for `charge.upserted` is the typed
//! [`crate::charge_record`] decoder, which must give exactly what these give (checked by a
//! unit test and by the fuzz target `fuzz/fuzz_targets/cdc_decode.rs`); device events and
//! the fallback take these.

use crate::document::{
    Charge, ChargeStatus, CloudMethod, CloudPrinter, Device, DeviceKind, DirectPrinter, Envelope, Interrupted,
    Operation,
};
use crate::error::DecodeError;
use chrono::{DateTime, Utc};
use serde_json::Value;

/// Decodes a record value into an [`Envelope`].
///
/// # Errors
/// [`DecodeError::NotJson`] for bytes that are not a JSON object; `Missing`/`Invalid` for
/// envelope fields (`clusterTime` with a `t` or `i` that is not an unsigned 32-bit integer,
/// as BSON timestamps are, is `Invalid`).
pub fn decode_envelope(bytes: &[u8]) -> Result<Envelope, DecodeError> {
    let mut v: Value = serde_json::from_slice(bytes).map_err(|e| DecodeError::NotJson(e.to_string()))?;
    if !v.is_object() {
        return Err(DecodeError::NotJson("not a JSON object".into()));
    }
    let event_id = str_field(&v, "eventId", "eventId")?.to_string();
    let operation = match str_field(&v, "operationType", "operationType")? {
        "insert" => Operation::Insert,
        "update" => Operation::Update,
        "replace" => Operation::Replace,
        "delete" => Operation::Delete,
        other => return Err(invalid("operationType", format!("unknown operation `{other}`"))),
    };
    let document_id = oid(req(&v["documentKey"]["_id"], "documentKey._id")?, "documentKey._id")?;
    let ts = req(&v["clusterTime"]["$timestamp"], "clusterTime")?;
    // A BSON timestamp is two unsigned 32-bit integers (seconds, ordinal); a wider value
    // would be cut off when packed into `cluster_time` and mis-order the event.
    let part = |k: &str| {
        ts[k]
            .as_u64()
            .filter(|n| *n <= u64::from(u32::MAX))
            .ok_or_else(|| invalid("clusterTime", format!("{k} is not an unsigned 32-bit integer: {}", ts[k])))
    };
    let (t, i) = (part("t")?, part("i")?);
    // Moved out, not cloned: the document is most of the record.
    let full_document = match v.get_mut("fullDocument").map(Value::take) {
        None | Some(Value::Null) => None,
        Some(d @ Value::Object(_)) => Some(d),
        Some(_) => return Err(invalid("fullDocument", "not an object".into())),
    };
    Ok(Envelope { event_id, operation, document_id, cluster_time: (t << 32) | i, full_document })
}

/// Decodes a `Charge` document.
///
/// # Errors
/// A missing `company`, `value`, `status`, `__v` or merchant; a `value` that is not a
/// non-negative integer of centavos (a decimal string such as `"45.99"` is refused rather
/// than guessed); an unknown `status`.
pub fn decode_charge(doc: &Value) -> Result<Charge, DecodeError> {
    let id = oid(req(&doc["_id"], "_id")?, "_id")?;
    let company = oid(req(&doc["company"], "company")?, "company")?;
    let value = long(req(&doc["value"], "value")?, "value")?;
    if value < 0 {
        return Err(invalid("value", format!("negative amount {value}")));
    }
    let status = match str_field(doc, "status", "status")? {
        "ACTIVE" => ChargeStatus::Active,
        "COMPLETED" => ChargeStatus::Completed,
        "EXPIRED" => ChargeStatus::Expired,
        other => return Err(invalid("status", format!("unknown status `{other}`"))),
    };
    let version = long(req(&doc["__v"], "__v")?, "__v")?;
    let merchant = req(&doc["merchant"], "merchant")?;
    let items = match &doc["additionalInfo"] {
        Value::Array(a) => {
            a.iter().map(|it| (text(&it["key"]).unwrap_or_default(), text(&it["value"]).unwrap_or_default())).collect()
        }
        _ => Vec::new(),
    };
    Ok(Charge {
        id,
        company,
        value_cents: value as u64,
        status,
        version,
        terminal: opt(&doc["terminal"]).map(|t| oid(t, "terminal")).transpose()?,
        brcode: text(&doc["brCode"]),
        pix_key: text(&doc["pixKey"]),
        transaction_id: text(&doc["transactionID"]),
        merchant_name: text(&merchant["name"]).ok_or(DecodeError::Missing("merchant.name"))?,
        merchant_city: text(&merchant["city"]).ok_or(DecodeError::Missing("merchant.city"))?,
        items,
        comment: text(&doc["comment"]),
        payer_name: text(&doc["payer"]["name"]),
        paid_at: opt(&doc["paidAt"]).map(|d| date(d, "paidAt")).transpose()?,
        expires_at: opt(&doc["expiresDate"]).map(|d| date(d, "expiresDate")).transpose()?,
        end_to_end_id: text(&doc["endToEndId"]),
    })
}

/// Decodes a `Device` document.
///
/// # Errors
/// Missing `company` or `kind`, an unknown `kind`, a printer paper width other than 58 or
/// 80 mm, an unknown code page, a `printer.nativeQr` or `printer.printPixSlip` that is not
/// a boolean, a `printer.transport` other than `mqtt`, `tcp`, `serial`, `usb`,
/// `cloudprnt-http`, `cloudprnt-mqtt`, `epson-sdp`, a direct transport without a `printer.endpoint` of
/// its scheme (or another one with one), a `printer.interruptedJob` other than `reprint`,
/// `hold`, a cloud printer without a `printer.mac` of six hex pairs.
pub fn decode_device(doc: &Value) -> Result<Device, DecodeError> {
    let id = oid(req(&doc["_id"], "_id")?, "_id")?;
    let company = oid(req(&doc["company"], "company")?, "company")?;
    let kind = match str_field(doc, "kind", "kind")? {
        "printer" => {
            let p = &doc["printer"];
            let width = opt(&p["paperWidthMm"]).map(|w| long(w, "printer.paperWidthMm")).transpose()?.unwrap_or(80);
            if width != 58 && width != 80 {
                return Err(invalid("printer.paperWidthMm", format!("{width} mm is not 58 or 80")));
            }
            let code_page = match text(&p["codePage"]) {
                None => render::codepage::CodePage::Cp860,
                Some(name) => render::codepage::CodePage::from_name(&name)
                    .ok_or_else(|| invalid("printer.codePage", format!("unknown code page `{name}`")))?,
            };
            // Absent is false; anything but a boolean is an error, not a silent false.
            let flag = |field: &str, name: &'static str| match &p[field] {
                Value::Null => Ok(false),
                Value::Bool(b) => Ok(*b),
                other => Err(invalid(name, format!("{other} is not a boolean"))),
            };
            // Absent `nativeQr` means a raster QR, which every printer prints.
            let native_qr = flag("nativeQr", "printer.nativeQr")?;
            let pix_slip = flag("printPixSlip", "printer.printPixSlip")?;
            let (direct, cloud) = printer_transport(p)?;
            DeviceKind::Printer { paper_width_mm: width as u8, code_page, native_qr, pix_slip, direct, cloud }
        }
        "terminal" => {
            let s = &doc["screen"];
            let dim = |v: &Value, f: &'static str, d: i64| -> Result<u32, DecodeError> {
                let n = opt(v).map(|x| long(x, f)).transpose()?.unwrap_or(d);
                u32::try_from(n).ok().filter(|n| (64..=8192).contains(n)).ok_or_else(|| invalid(f, format!("{n} px")))
            };
            DeviceKind::Terminal {
                width_px: dim(&s["widthPx"], "screen.widthPx", 720)?,
                height_px: dim(&s["heightPx"], "screen.heightPx", 1280)?,
                paired_printer: opt(&doc["pairedPrinter"]).map(|p| oid(p, "pairedPrinter")).transpose()?,
            }
        }
        other => return Err(invalid("kind", format!("unknown device kind `{other}`"))),
    };
    Ok(Device {
        id,
        company,
        kind,
        model: text(&doc["model"]).unwrap_or_default(),
        locale: text(&doc["locale"]).unwrap_or_else(|| "pt-BR".into()),
        time_zone: text(&doc["timeZone"]),
        enabled: doc["enabled"].as_bool().unwrap_or(true),
        default_for_company: doc["defaultForCompany"].as_bool().unwrap_or(false),
    })
}

/// The transports `printer.transport` may name: MQTT, the direct ones, the cloud ones.
const TRANSPORTS: [&str; 7] = ["mqtt", "tcp", "serial", "usb", "cloudprnt-http", "cloudprnt-mqtt", "epson-sdp"];

/// `printer.transport` (`mqtt` when absent), then what that transport needs: a
/// `printer.endpoint` of its scheme and `printer.interruptedJob` (`reprint` when absent)
/// for a direct one, a `printer.mac` for `cloudprnt-http` and `cloudprnt-mqtt`, nothing
/// more for `epson-sdp`.
fn printer_transport(p: &Value) -> Result<(Option<DirectPrinter>, Option<CloudPrinter>), DecodeError> {
    let transport = match &p["transport"] {
        Value::Null => "mqtt",
        Value::String(t) if TRANSPORTS.contains(&t.as_str()) => t.as_str(),
        other => return Err(invalid("printer.transport", format!("{other} is not one of {}", TRANSPORTS.join(", ")))),
    };
    let mac = match &p["mac"] {
        Value::Null => None,
        Value::String(m) => Some(m.as_str()),
        other => return Err(invalid("printer.mac", format!("{other} is not a string"))),
    };
    let method = match transport {
        "cloudprnt-http" => Some(CloudMethod::Http),
        "cloudprnt-mqtt" => Some(CloudMethod::Mqtt),
        _ => None,
    };
    if let Some(method) = method {
        if !p["endpoint"].is_null() {
            return Err(invalid("printer.endpoint", format!("is set but a {transport} printer fetches its jobs")));
        }
        let mac = mac.ok_or_else(|| invalid("printer.mac", format!("printer.transport {transport} needs a mac")))?;
        let mac = normalize_mac(mac).ok_or_else(|| invalid("printer.mac", format!("`{mac}` is not six hex pairs")))?;
        return Ok((None, Some(CloudPrinter { mac: Some(mac), method })));
    }
    if transport == "epson-sdp" {
        if !p["endpoint"].is_null() {
            return Err(invalid("printer.endpoint", "is set but an epson-sdp printer fetches its jobs".into()));
        }
        if let Some(m) = mac {
            return Err(invalid("printer.mac", format!("`{m}` is set but an epson-sdp printer is known by its ID")));
        }
        return Ok((None, Some(CloudPrinter { mac: None, method: CloudMethod::EpsonSdp })));
    }
    if let Some(m) = mac {
        return Err(invalid("printer.mac", format!("`{m}` is set but printer.transport is {transport}")));
    }
    Ok((direct_printer(p, transport)?, None))
}

/// `aa:bb:cc:dd:ee:ff` (or `-` between pairs, any case) in lower case with `:`; `None`
/// for anything else.
pub fn normalize_mac(text: &str) -> Option<String> {
    let pairs: Vec<&str> = text.split([':', '-']).collect();
    let ok = pairs.len() == 6 && pairs.iter().all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    ok.then(|| pairs.join(":").to_ascii_lowercase())
}

/// A direct `transport`'s `printer.endpoint` and `printer.interruptedJob`; `None` for MQTT.
fn direct_printer(p: &Value, transport: &str) -> Result<Option<DirectPrinter>, DecodeError> {
    let endpoint = match &p["endpoint"] {
        Value::Null => None,
        Value::String(e) => Some(e.as_str()),
        other => return Err(invalid("printer.endpoint", format!("{other} is not a string"))),
    };
    let interrupted = match &p["interruptedJob"] {
        Value::Null => Some(Interrupted::Reprint),
        Value::String(s) => Interrupted::from_name(s),
        _ => None,
    };
    let interrupted = interrupted
        .ok_or_else(|| invalid("printer.interruptedJob", format!("{} is not reprint or hold", p["interruptedJob"])))?;
    match (transport, endpoint) {
        ("mqtt", None) => Ok(None),
        ("mqtt", Some(e)) => Err(invalid("printer.endpoint", format!("`{e}` is set but printer.transport is mqtt"))),
        (t, None) => Err(invalid("printer.endpoint", format!("printer.transport {t} needs an endpoint {t}://…"))),
        (t, Some(e)) if !e.starts_with(&format!("{t}://")) => {
            Err(invalid("printer.endpoint", format!("`{e}` does not start with {t}:// (printer.transport)")))
        }
        (_, Some(e)) => Ok(Some(DirectPrinter { endpoint: e.to_string(), interrupted })),
    }
}

fn invalid(field: &'static str, problem: String) -> DecodeError {
    DecodeError::Invalid { field, problem }
}

fn opt(v: &Value) -> Option<&Value> {
    (!v.is_null()).then_some(v)
}

fn req<'a>(v: &'a Value, field: &'static str) -> Result<&'a Value, DecodeError> {
    opt(v).ok_or(DecodeError::Missing(field))
}

fn str_field<'a>(doc: &'a Value, key: &str, field: &'static str) -> Result<&'a str, DecodeError> {
    req(&doc[key], field)?.as_str().ok_or_else(|| invalid(field, "not a string".into()))
}

fn text(v: &Value) -> Option<String> {
    v.as_str().map(str::to_string)
}

/// `{"$oid": "…"}` or a plain string.
fn oid(v: &Value, field: &'static str) -> Result<String, DecodeError> {
    let s = v["$oid"].as_str().or_else(|| v.as_str()).ok_or_else(|| invalid(field, "not an ObjectId".into()))?;
    if s.is_empty() {
        return Err(invalid(field, "empty id".into()));
    }
    Ok(s.to_string())
}

/// An integer: JSON number without fraction, `{"$numberLong": "…"}` or `{"$numberInt": "…"}`.
fn long(v: &Value, field: &'static str) -> Result<i64, DecodeError> {
    if let Some(n) = v.as_i64() {
        return Ok(n);
    }
    let wrapped = v["$numberLong"].as_str().or_else(|| v["$numberInt"].as_str());
    match wrapped {
        Some(s) => s.parse().map_err(|_| invalid(field, format!("`{s}` is not an integer"))),
        None => Err(invalid(field, format!("expected an integer, found {v}"))),
    }
}

/// `{"$date": "ISO-8601"}`, `{"$date": {"$numberLong": "ms"}}` or an ISO-8601 string.
fn date(v: &Value, field: &'static str) -> Result<DateTime<Utc>, DecodeError> {
    let d = if v.get("$date").is_some() { &v["$date"] } else { v };
    if let Some(s) = d.as_str() {
        return DateTime::parse_from_rfc3339(s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| invalid(field, format!("`{s}`: {e}")));
    }
    let ms = long(d, field)?;
    DateTime::from_timestamp_millis(ms).ok_or_else(|| invalid(field, format!("{ms} ms out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn extended_json_forms() {
        assert_eq!(long(&json!({"$numberLong": "990"}), "v").unwrap(), 990);
        assert_eq!(long(&json!(4599), "v").unwrap(), 4599);
        assert!(long(&json!("45.99"), "v").is_err());
        assert!(long(&json!(45.99), "v").is_err());
        assert_eq!(oid(&json!({"$oid": "ab"}), "x").unwrap(), "ab");
        let d = date(&json!({"$date": "2026-11-27T12:01:07.340Z"}), "d").unwrap();
        assert_eq!(d.timestamp_millis() % 1000, 340);
        assert_eq!(date(&json!({"$date": {"$numberLong": "1000"}}), "d").unwrap().timestamp(), 1);
    }

    /// `printer.transport`: absent or `mqtt` is an MQTT printer; `tcp`, `serial`, `usb` need
    /// a `printer.endpoint` of that scheme; `printer.interruptedJob` is `reprint` by
    /// default. Anything else names the field at fault.
    #[test]
    fn a_printers_transport_and_its_endpoint() {
        let doc = |printer: Value| json!({"_id": "p1", "company": "c1", "kind": "printer", "printer": printer});
        let direct = |printer: Value| match decode_device(&doc(printer)).map(|d| d.kind) {
            Ok(DeviceKind::Printer { direct, .. }) => Ok(direct),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.reason() + " " + &e.to_string()),
        };
        assert_eq!(direct(json!({})), Ok(None));
        assert_eq!(direct(json!({"transport": "mqtt"})), Ok(None));
        assert_eq!(
            direct(json!({"transport": "tcp", "endpoint": "tcp://10.0.0.5"})),
            Ok(Some(DirectPrinter { endpoint: "tcp://10.0.0.5".into(), interrupted: Interrupted::Reprint }))
        );
        assert_eq!(
            direct(json!({"transport": "serial", "endpoint": "serial:///dev/ttyS0", "interruptedJob": "hold"})),
            Ok(Some(DirectPrinter { endpoint: "serial:///dev/ttyS0".into(), interrupted: Interrupted::Hold }))
        );
        for (printer, why) in [
            (json!({"transport": "lpt"}), "invalid_field:printer.transport"),
            (json!({"transport": 9100}), "invalid_field:printer.transport"),
            (json!({"transport": "tcp"}), "invalid_field:printer.endpoint field `printer.endpoint`: printer.transport tcp needs an endpoint tcp://…"),
            (json!({"transport": "usb", "endpoint": "tcp://h"}), "invalid_field:printer.endpoint field `printer.endpoint`: `tcp://h` does not start with usb://"),
            (json!({"endpoint": "tcp://h"}), "invalid_field:printer.endpoint"),
            (json!({"transport": "tcp", "endpoint": 1}), "invalid_field:printer.endpoint"),
            (json!({"transport": "tcp", "endpoint": "tcp://h", "interruptedJob": "twice"}), "invalid_field:printer.interruptedJob"),
        ] {
            let got = direct(printer.clone()).unwrap_err();
            assert!(got.starts_with(why), "{printer}: {got}");
        }
    }

    /// `printer.transport` `cloudprnt-http` needs a `printer.mac` (normalized) and no
    /// endpoint; a MAC on any other transport is an error, not ignored.
    #[test]
    fn a_cloudprnt_printer_and_its_mac() {
        let doc = |printer: Value| json!({"_id": "p1", "company": "c1", "kind": "printer", "printer": printer});
        let cloud = |printer: Value| match decode_device(&doc(printer)).map(|d| d.kind) {
            Ok(DeviceKind::Printer { direct, cloud, .. }) => Ok((direct, cloud)),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.reason() + " " + &e.to_string()),
        };
        assert_eq!(
            cloud(json!({"transport": "cloudprnt-http", "mac": "00-11-62-0A-1B-2C"})),
            Ok((None, Some(CloudPrinter { mac: Some("00:11:62:0a:1b:2c".into()), method: CloudMethod::Http })))
        );
        assert_eq!(
            cloud(json!({"transport": "cloudprnt-mqtt", "mac": "00:11:62:0a:1b:2c"})),
            Ok((None, Some(CloudPrinter { mac: Some("00:11:62:0a:1b:2c".into()), method: CloudMethod::Mqtt })))
        );
        assert_eq!(
            cloud(json!({"transport": "epson-sdp"})),
            Ok((None, Some(CloudPrinter { mac: None, method: CloudMethod::EpsonSdp })))
        );
        assert_eq!(cloud(json!({"transport": "tcp", "endpoint": "tcp://h"})).unwrap().1, None);
        for (printer, why) in [
            (json!({"transport": "cloudprnt-mqtt"}), "invalid_field:printer.mac"),
            (json!({"transport": "cloudprnt-http"}), "invalid_field:printer.mac"),
            (json!({"transport": "cloudprnt-http", "mac": "00:11:62:0a:1b"}), "invalid_field:printer.mac"),
            (json!({"transport": "cloudprnt-http", "mac": "00:11:62:0a:1b:zz"}), "invalid_field:printer.mac"),
            (json!({"transport": "cloudprnt-http", "mac": 17}), "invalid_field:printer.mac"),
            (
                json!({"transport": "cloudprnt-http", "mac": "00:11:62:0a:1b:2c", "endpoint": "tcp://h"}),
                "invalid_field:printer.endpoint",
            ),
            (
                json!({"transport": "tcp", "endpoint": "tcp://h", "mac": "00:11:62:0a:1b:2c"}),
                "invalid_field:printer.mac",
            ),
            (json!({"mac": "00:11:62:0a:1b:2c"}), "invalid_field:printer.mac"),
            (json!({"transport": "epson-sdps"}), "invalid_field:printer.transport"),
            (json!({"transport": "epson-sdp", "mac": "00:11:62:0a:1b:2c"}), "invalid_field:printer.mac"),
            (json!({"transport": "epson-sdp", "endpoint": "tcp://h"}), "invalid_field:printer.endpoint"),
        ] {
            let got = cloud(printer.clone()).unwrap_err();
            assert!(got.starts_with(why), "{printer}: {got}");
        }
    }

    #[test]
    fn envelope_errors_are_reasons() {
        assert_eq!(decode_envelope(b"\x00\xff garbage").unwrap_err().reason(), "not_json");
        assert_eq!(
            decode_envelope(br#"{"eventId": "Charge:broken", "operationType": "upd"#).unwrap_err().reason(),
            "not_json"
        );
        assert_eq!(decode_envelope(b"[1]").unwrap_err().reason(), "not_json");
        let e = decode_envelope(br#"{"operationType":"insert"}"#).unwrap_err();
        assert_eq!(e.reason(), "missing_field:eventId");
    }

    /// Found by `fuzz/fuzz_targets/cdc_decode.rs` (minimised): `t` above `u32::MAX` was
    /// shifted out of `cluster_time` silently (`7955216000 << 32` keeps only its low 32 bits),
    /// so the event looked older than it was.
    #[test]
    fn cluster_time_parts_wider_than_32_bits_are_refused() {
        let minimised = br#"{"eventId":"D","operationType":"insert","documentKey":{"_id":{"$oid":"c48"}},"clusterTime":{"$timestamp":{"t":7955216000,"i":6}}}"#;
        let e = decode_envelope(minimised).unwrap_err();
        assert_eq!(e.to_string(), "field `clusterTime`: t is not an unsigned 32-bit integer: 7955216000");
        let env = |t: &str, i: &str| {
            decode_envelope(format!(r#"{{"eventId":"D","operationType":"insert","documentKey":{{"_id":{{"$oid":"c48"}}}},"clusterTime":{{"$timestamp":{{"t":{t},"i":{i}}}}}}}"#).as_bytes())
        };
        for (t, i) in [("4294967296", "6"), ("1", "4294967296"), ("18446744073709551615", "0")] {
            let e = env(t, i).unwrap_err();
            assert_eq!(e.reason(), "invalid_field:clusterTime", "t={t} i={i}: {e}");
            assert!(e.to_string().contains("32-bit"), "{e}");
        }
        assert_eq!(env("4294967295", "4294967295").unwrap().cluster_time, u64::MAX);
        assert_eq!(env("1795780800", "18").unwrap().cluster_time, (1_795_780_800u64 << 32) | 18);
    }

    #[test]
    fn every_fixture_line_decodes_or_fails_with_a_reason() {
        let mut charges = 0;
        for file in ["devices.jsonl", "charges.jsonl", "edge-cases.jsonl"] {
            for (topic, bytes) in crate::fixtures::records(file) {
                let env = match decode_envelope(&bytes) {
                    Ok(e) => e,
                    Err(e) => {
                        assert_eq!(file, "edge-cases.jsonl", "{e}");
                        continue;
                    }
                };
                let Some(doc) = env.full_document else { continue };
                if topic == "device.upserted" {
                    decode_device(&doc).unwrap();
                } else if let Err(e) = decode_charge(&doc) {
                    assert_eq!(file, "edge-cases.jsonl", "{e}");
                } else {
                    charges += 1;
                }
            }
        }
        assert!(charges > 230, "{charges}");
    }
}
