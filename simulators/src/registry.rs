//! The device registry as the simulators see it: which printers and card machines exist and
//! how they are built, read from `device.upserted` change events (`fixtures/cdc/devices.jsonl`).
//!
//! Each line is `{"topic","key","value"}` where `value` is a MongoDB change-stream envelope
//! whose `fullDocument` is a Device document in relaxed Extended JSON. The last event per
//! device id wins; a `delete` (or an event whose `fullDocument` is `null`) removes the device.
//! Lines that are not JSON objects, or documents of an unknown `kind`, are skipped with a
//! warning.

use anyhow::{Context, Result};
use render::codepage::CodePage;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// The time zone used when a device document does not name one.
pub const DEFAULT_TIME_ZONE: &str = "America/Sao_Paulo";

/// One physical device to simulate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A thermal receipt printer.
    Printer {
        /// Registry id (24 hex characters).
        id: String,
        /// Paper roll width: 58 or 80 mm (384 or 576 dots).
        paper_width_mm: u8,
        /// Code table the printer is set to at power-on.
        code_page: CodePage,
        /// Whether it understands `GS ( k` QR commands (informative: the decoder always does).
        native_qr: bool,
        /// The registry's `model` (picks the `ESC t` numbering, see `render::profile`);
        /// empty when unknown (generic ESC/POS).
        model: String,
    },
    /// A card machine ("maquininha") with a screen.
    Terminal {
        /// Registry id (24 hex characters).
        id: String,
        /// Screen width in pixels.
        width_px: u32,
        /// Screen height in pixels.
        height_px: u32,
        /// BCP 47 locale, e.g. `pt-BR`.
        locale: String,
        /// IANA time zone, default [`DEFAULT_TIME_ZONE`].
        time_zone: String,
    },
}

impl DeviceSpec {
    /// The registry id.
    pub fn id(&self) -> &str {
        match self {
            DeviceSpec::Printer { id, .. } | DeviceSpec::Terminal { id, .. } => id,
        }
    }

    /// `"printer"` or `"terminal"`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            DeviceSpec::Printer { .. } => "printer",
            DeviceSpec::Terminal { .. } => "terminal",
        }
    }

    /// Print head width in dots for a printer (58 mm → 384, 80 mm → 576); `None` for a terminal.
    pub fn width_dots(&self) -> Option<u32> {
        match self {
            DeviceSpec::Printer { paper_width_mm, .. } => Some(if *paper_width_mm >= 70 { 576 } else { 384 }),
            DeviceSpec::Terminal { .. } => None,
        }
    }
}

/// A MongoDB `{"$oid": ".."}` or plain string id.
fn oid(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(m) => m.get("$oid").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// A relaxed-Extended-JSON integer: `5`, `5.0`, `"5"`, `{"$numberInt": "5"}`, `{"$numberLong": "5"}`.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        Value::Object(m) => m.get("$numberInt").or_else(|| m.get("$numberLong")).and_then(int),
        _ => None,
    }
}

/// Builds a [`DeviceSpec`] from a Device document (`fullDocument`). `fallback_id` is used when
/// the document has no `_id`. Missing printer or screen settings take the fixtures' defaults
/// (80 mm, CP860, native QR; 720 × 1280); missing locale is `pt-BR`.
///
/// # Errors
/// No id, or `kind` is neither `printer` nor `terminal`.
pub fn device_from_document(doc: &Value, fallback_id: Option<&str>) -> Result<DeviceSpec> {
    let id = doc
        .get("_id")
        .and_then(oid)
        .or_else(|| fallback_id.map(str::to_string))
        .context("device document has no _id")?;
    let locale = doc.get("locale").and_then(Value::as_str).unwrap_or("pt-BR").to_string();
    let time_zone = doc
        .get("timeZone")
        .or_else(|| doc.get("time_zone"))
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_TIME_ZONE)
        .to_string();
    match doc.get("kind").and_then(Value::as_str) {
        Some("printer") => {
            let p = doc.get("printer").cloned().unwrap_or(Value::Null);
            let paper_width_mm = p.get("paperWidthMm").and_then(int).map(|w| w.clamp(0, 255) as u8).unwrap_or(80);
            let code_page =
                p.get("codePage").and_then(Value::as_str).and_then(CodePage::from_name).unwrap_or(CodePage::Cp860);
            let native_qr = p.get("nativeQr").and_then(Value::as_bool).unwrap_or(true);
            let model = doc.get("model").and_then(Value::as_str).unwrap_or_default().to_string();
            Ok(DeviceSpec::Printer { id, paper_width_mm, code_page, native_qr, model })
        }
        Some("terminal") => {
            let s = doc.get("screen").cloned().unwrap_or(Value::Null);
            let dim = |k: &str, d: u32| s.get(k).and_then(int).map(|v| v.clamp(1, 8192) as u32).unwrap_or(d);
            Ok(DeviceSpec::Terminal {
                id,
                width_px: dim("widthPx", 720),
                height_px: dim("heightPx", 1280),
                locale,
                time_zone,
            })
        }
        other => anyhow::bail!("device {id}: unknown kind {other:?}"),
    }
}

/// Reads a `device.upserted` JSONL file into the devices it leaves registered, in order of
/// first appearance. Last event per id wins; deletes and `null` documents remove the device.
///
/// # Errors
/// The file cannot be read. Bad lines are skipped with a `tracing` warning, not errors.
pub fn devices_from_jsonl(path: impl AsRef<Path>) -> Result<Vec<DeviceSpec>> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(devices_from_str(&text))
}

/// The devices that `device.upserted` records (e.g. a generated
/// [`crate::capture::generate::Scenario`]'s) leave registered; same rules as
/// [`devices_from_jsonl`], the record value being the change event.
pub fn devices_from_records(records: &[crate::capture::CaptureRecord]) -> Vec<DeviceSpec> {
    let text: Vec<String> = records.iter().map(|r| String::from_utf8_lossy(&r.value).into_owned()).collect();
    devices_from_str(&text.join("\n"))
}

/// [`devices_from_jsonl`] on text already in memory.
pub fn devices_from_str(text: &str) -> Vec<DeviceSpec> {
    let mut order: Vec<String> = Vec::new();
    let mut latest: HashMap<String, Option<DeviceSpec>> = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            tracing::warn!(line = n + 1, "devices: not JSON, skipped");
            continue;
        };
        let value = event.get("value").unwrap_or(&event);
        if !value.is_object() {
            tracing::warn!(line = n + 1, "devices: value is not an object, skipped");
            continue;
        }
        let key = event.get("key").and_then(Value::as_str);
        let id = value
            .get("documentKey")
            .and_then(|k| k.get("_id"))
            .and_then(oid)
            .or_else(|| value.get("fullDocument").and_then(|d| d.get("_id")).and_then(oid))
            .or_else(|| key.map(str::to_string));
        let Some(id) = id else {
            tracing::warn!(line = n + 1, "devices: no device id, skipped");
            continue;
        };
        let op = value.get("operationType").and_then(Value::as_str).unwrap_or("");
        let doc = value.get("fullDocument").filter(|d| d.is_object());
        let spec = match (op, doc) {
            ("delete", _) | (_, None) => None,
            (_, Some(doc)) => match device_from_document(doc, Some(&id)) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(line = n + 1, "devices: {e:#}, skipped");
                    continue;
                }
            },
        };
        if !latest.contains_key(&id) {
            order.push(id.clone());
        }
        latest.insert(id, spec);
    }
    order.into_iter().filter_map(|id| latest.remove(&id).flatten()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixture_devices() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/cdc/devices.jsonl");
        let devices = devices_from_jsonl(path).unwrap();
        assert!(!devices.is_empty());
        let first = &devices[0];
        assert_eq!(
            first,
            &DeviceSpec::Printer {
                id: "0fb23c6f5da2cec255404e4f".into(),
                paper_width_mm: 80,
                code_page: CodePage::Cp860,
                native_qr: true,
                model: "Bematech MP-4200 TH".into(),
            }
        );
        assert!(devices.iter().any(|d| matches!(d, DeviceSpec::Terminal { width_px: 720, height_px: 1280, time_zone, .. } if time_zone == DEFAULT_TIME_ZONE)));
        assert!(devices.iter().any(|d| d.width_dots() == Some(384)));
    }

    #[test]
    fn last_wins_and_deletes() {
        let text = r#"{"topic":"device.upserted","key":"aa","value":{"operationType":"insert","documentKey":{"_id":{"$oid":"aa"}},"fullDocument":{"_id":{"$oid":"aa"},"kind":"printer","printer":{"paperWidthMm":{"$numberInt":"58"},"codePage":"CP437","nativeQr":false}}}}
{"topic":"device.upserted","key":"bb","value":{"operationType":"insert","documentKey":{"_id":{"$oid":"bb"}},"fullDocument":{"_id":{"$oid":"bb"},"kind":"terminal","locale":"en-US","screen":{"widthPx":480,"heightPx":800}}}}
{"topic":"device.upserted","key":"aa","value":{"operationType":"update","documentKey":{"_id":{"$oid":"aa"}},"fullDocument":{"_id":{"$oid":"aa"},"kind":"printer","printer":{"paperWidthMm":80,"codePage":"CP850","nativeQr":true}}}}
{"topic":"device.upserted","key":"cc","value":{"operationType":"insert","documentKey":{"_id":{"$oid":"cc"}},"fullDocument":{"_id":{"$oid":"cc"},"kind":"printer"}}}
{"topic":"device.upserted","key":"cc","value":{"operationType":"delete","documentKey":{"_id":{"$oid":"cc"}},"fullDocument":null}}
{"topic":"device.upserted","key":"dd","value":"{not json"}
{"topic":"device.upserted","key":"ee","value":{"operationType":"insert","documentKey":{"_id":{"$oid":"ee"}},"fullDocument":{"_id":{"$oid":"ee"},"kind":"toaster"}}}
"#;
        let d = devices_from_str(text);
        assert_eq!(d.len(), 2);
        assert_eq!(
            d[0],
            DeviceSpec::Printer {
                id: "aa".into(),
                paper_width_mm: 80,
                code_page: CodePage::Cp850,
                native_qr: true,
                model: String::new(),
            }
        );
        assert_eq!(
            d[1],
            DeviceSpec::Terminal {
                id: "bb".into(),
                width_px: 480,
                height_px: 800,
                locale: "en-US".into(),
                time_zone: DEFAULT_TIME_ZONE.into()
            }
        );
    }
}
