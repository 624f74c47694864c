//! The JSON messages on the v1 topics (see [`crate::topics`]).
//!
//! Every message carries `"v": 1`. Unknown fields are ignored on read, so a newer device
//! can add fields without breaking an older gateway.

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Protocol version carried in every message.
pub const VERSION: u8 = 1;

/// Content type of an ESC/POS job: `payload` is the raw byte stream for the printer.
pub const CONTENT_ESCPOS: &str = "application/vnd.escpos";
/// Content type of a screen job: `payload` is a UTF-8 JSON [`ScreenContent`].
pub const CONTENT_SCREEN: &str = "application/vnd.pixgate.screen+json";

/// What a job makes a device do; the names of `expected.json` in the CDC fixtures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectKind {
    /// Card machine shows the Pix QR code of an `ACTIVE` charge.
    DisplayQr,
    /// Card machine shows the "paid" screen of a `COMPLETED` charge.
    PaymentConfirmed,
    /// Printer prints the receipt of a `COMPLETED` charge.
    PrintReceipt,
    /// Card machine clears the QR of an `EXPIRED` charge and says so.
    ChargeExpired,
}

impl EffectKind {
    /// The snake_case name used on the wire and in `expected.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            EffectKind::DisplayQr => "display_qr",
            EffectKind::PaymentConfirmed => "payment_confirmed",
            EffectKind::PrintReceipt => "print_receipt",
            EffectKind::ChargeExpired => "charge_expired",
        }
    }
}

/// A job for one device, published on `pixgate/v1/devices/{id}/jobs` at QoS 1.
///
/// Example:
/// ```json
/// {"v":1,"message_id":"5f0c…","seq":3,"kind":"print_receipt",
///  "event_id":"Charge:0d91…:7712820098842492949","charge_id":"0d91…",
///  "content_type":"application/vnd.escpos","payload":"G0AbdAM…",
///  "expires_at":"2026-11-28T12:01:08Z"}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Always [`VERSION`].
    pub v: u8,
    /// Deterministic id ([`crate::message_id`]); the device's dedupe key.
    pub message_id: String,
    /// Per-device sequence number, strictly increasing in the order jobs must be carried out.
    pub seq: u64,
    /// What the job does.
    pub kind: EffectKind,
    /// The change event this job comes from (`eventId` of the CDC envelope).
    pub event_id: String,
    /// The charge's `_id`.
    pub charge_id: String,
    /// [`CONTENT_ESCPOS`] or [`CONTENT_SCREEN`].
    pub content_type: String,
    /// The content, base64 (standard alphabet, padded).
    pub payload: String,
    /// After this instant the job must not be carried out (a stale QR is worse than none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

impl Job {
    /// The decoded payload bytes.
    ///
    /// # Errors
    /// The payload is not valid base64.
    pub fn payload_bytes(&self) -> Result<Vec<u8>, base64::DecodeError> {
        B64.decode(&self.payload)
    }

    /// Encodes `bytes` for [`Job::payload`].
    pub fn encode_payload(bytes: &[u8]) -> String {
        B64.encode(bytes)
    }

    /// Appends the job's wire JSON to `out`: the same bytes as `serde_json::to_writer`,
    /// faster. A payload of base64 characters only (what [`Job::encode_payload`] makes) is
    /// copied as it is instead of going through JSON string escaping, which scans it a byte
    /// at a time and was most of the cost of serializing a job (kilobytes of payload
    /// against a few dozen bytes of the rest). Any other payload is escaped as usual.
    /// Written field by field: a field added to [`Job`] must be added here too, which the
    /// byte-for-byte test against serde's output enforces.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        fn field<T: Serialize + ?Sized>(out: &mut Vec<u8>, open: &[u8], value: &T) {
            out.extend_from_slice(open);
            serde_json::to_writer(&mut *out, value).expect("a job's fields serialize into a Vec");
        }
        field(out, b"{\"v\":", &self.v);
        field(out, b",\"message_id\":", &self.message_id);
        field(out, b",\"seq\":", &self.seq);
        field(out, b",\"kind\":", &self.kind);
        field(out, b",\"event_id\":", &self.event_id);
        field(out, b",\"charge_id\":", &self.charge_id);
        field(out, b",\"content_type\":", &self.content_type);
        if is_base64_text(&self.payload) {
            out.extend_from_slice(b",\"payload\":\"");
            out.extend_from_slice(self.payload.as_bytes());
            out.push(b'"');
        } else {
            field(out, b",\"payload\":", &self.payload);
        }
        if let Some(t) = &self.expires_at {
            field(out, b",\"expires_at\":", t);
        }
        out.push(b'}');
    }

    /// The job's wire JSON ([`Job::write_json`] into a new buffer).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.payload.len() + 256);
        self.write_json(&mut out);
        out
    }
}

/// Whether `s` holds only characters of the standard base64 alphabet and `=`, none of
/// which JSON escapes. Branch-free within 64-byte chunks, so it vectorises: far cheaper
/// than the escaping it spares.
fn is_base64_text(s: &str) -> bool {
    let ok = |b: u8| {
        ((b | 0x20).wrapping_sub(b'a') < 26) | (b.wrapping_sub(b'0') < 10) | (b == b'+') | (b == b'/') | (b == b'=')
    };
    s.as_bytes().chunks(64).all(|c| c.iter().fold(true, |all, &b| all & ok(b)))
}

/// What a card machine shows, carried in a [`CONTENT_SCREEN`] job. The device draws it
/// itself at its own resolution; amounts are integer centavos (BRL).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScreenContent {
    /// Which screen.
    pub screen: ScreenKind,
    /// Merchant name as the shop knows it (accents kept).
    pub merchant_name: String,
    /// Amount in centavos.
    pub amount_cents: u64,
    /// The Pix BR Code payload to show as a QR ([`ScreenKind::PayWithPix`] only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brcode: Option<String>,
    /// When the charge expires ([`ScreenKind::PayWithPix`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// Who paid ([`ScreenKind::Paid`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payer_name: Option<String>,
    /// When it was paid ([`ScreenKind::Paid`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<DateTime<Utc>>,
    /// BCP 47 locale of the device, e.g. `pt-BR`.
    pub locale: String,
    /// IANA time zone of the device, e.g. `America/Sao_Paulo`.
    pub time_zone: String,
}

/// The three card-machine screens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScreenKind {
    /// The QR code and amount of a charge waiting for payment.
    PayWithPix,
    /// Payment confirmed.
    Paid,
    /// The charge expired; the QR is gone.
    Expired,
}

/// A device's answer to a job, published on `pixgate/v1/devices/{id}/acks` at QoS 1.
///
/// Example: `{"v":1,"message_id":"5f0c…","seq":3,"result":"done"}` or
/// `{"v":1,"message_id":"5f0c…","seq":3,"result":"failed","reason":"paper out","permanent":false}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ack {
    /// Always [`VERSION`].
    pub v: u8,
    /// The job's message id.
    pub message_id: String,
    /// The job's sequence number.
    pub seq: u64,
    /// Outcome.
    pub result: AckResult,
    /// Why it failed (for `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A permanent failure is not retried (e.g. undecodable job); a transient one is.
    #[serde(default)]
    pub permanent: bool,
    /// The device had already carried out this message id and did not do it again.
    #[serde(default)]
    pub duplicate: bool,
}

impl Ack {
    /// A `done` ack for the job `message_id`/`seq`; `duplicate` when the device had already
    /// carried that message id out and did nothing this time.
    pub fn done(message_id: &str, seq: u64, duplicate: bool) -> Ack {
        Ack {
            v: VERSION,
            message_id: message_id.to_string(),
            seq,
            result: AckResult::Done,
            reason: None,
            permanent: false,
            duplicate,
        }
    }

    /// A `failed` ack for the job `message_id`/`seq` with `reason`; `permanent` when a retry
    /// cannot succeed (the gateway then dead-letters it at once).
    pub fn failed(message_id: &str, seq: u64, reason: impl Into<String>, permanent: bool) -> Ack {
        Ack {
            v: VERSION,
            message_id: message_id.to_string(),
            seq,
            result: AckResult::Failed,
            reason: Some(reason.into()),
            permanent,
            duplicate: false,
        }
    }
}

/// Outcome of a job on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckResult {
    /// Carried out (shown or printed).
    Done,
    /// Not carried out; see `reason` and `permanent`.
    Failed,
}

/// A device's state, published retained on `pixgate/v1/devices/{id}/status`; its MQTT last
/// will publishes `{"v":1,"online":false}` there when the connection drops.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Always [`VERSION`].
    pub v: u8,
    /// Connected and able to take jobs.
    pub online: bool,
    /// Printers only: the state the printer reports (from `DLE EOT` on real hardware).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub printer: Option<PrinterState>,
}

/// A printer's reported condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrinterState {
    /// Ready to print.
    Ready,
    /// Paper roll near its end: still prints.
    PaperNearEnd,
    /// Out of paper: cannot print.
    PaperOut,
    /// Cover open: cannot print.
    CoverOpen,
}

impl PrinterState {
    /// Whether a job sent now would be printed.
    pub fn can_print(self) -> bool {
        matches!(self, PrinterState::Ready | PrinterState::PaperNearEnd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_json_shape() {
        let job = Job {
            v: VERSION,
            message_id: "ab".into(),
            seq: 3,
            kind: EffectKind::PrintReceipt,
            event_id: "Charge:x:1".into(),
            charge_id: "x".into(),
            content_type: CONTENT_ESCPOS.into(),
            payload: Job::encode_payload(&[0x1B, 0x40]),
            expires_at: None,
        };
        let v: serde_json::Value = serde_json::to_value(&job).unwrap();
        assert_eq!(v["kind"], "print_receipt");
        assert_eq!(v["payload"], "G0A=");
        assert!(v.get("expires_at").is_none());
        let back: Job = serde_json::from_value(v).unwrap();
        assert_eq!(back.payload_bytes().unwrap(), vec![0x1B, 0x40]);
    }

    /// `write_json` gives serde's bytes exactly, whether the payload is copied (base64) or
    /// escaped (anything else: quotes, backslashes, controls, non-ASCII), with and without
    /// an expiry, and the result reads back as the same job.
    #[test]
    fn write_json_is_serde_json_byte_for_byte() {
        let base = Job {
            v: VERSION,
            message_id: "5f0c\"quoted\"".into(),
            seq: u64::MAX,
            kind: EffectKind::DisplayQr,
            event_id: "Charge:0d91:7712820098842492949".into(),
            charge_id: "0d91\u{7}".into(),
            content_type: CONTENT_SCREEN.into(),
            payload: Job::encode_payload(&(0..=255u8).cycle().take(3000).collect::<Vec<_>>()),
            expires_at: Some("2026-11-28T12:01:08.250Z".parse().unwrap()),
        };
        let payloads = [
            base.payload.clone(),
            String::new(),
            "G0A=".into(),
            "ab\"cd".into(),
            "a\\b".into(),
            "a\nb\u{1}".into(),
            "pão".into(),
            format!("{}\"", "A".repeat(200)),
        ];
        for payload in payloads {
            for expires_at in [base.expires_at, None] {
                let job = Job { payload: payload.clone(), expires_at, ..base.clone() };
                let mut out = b"before".to_vec();
                job.write_json(&mut out);
                assert_eq!(
                    String::from_utf8_lossy(&out[6..]),
                    String::from_utf8_lossy(&serde_json::to_vec(&job).unwrap()),
                    "{payload:?}"
                );
                assert_eq!(serde_json::from_slice::<Job>(&out[6..]).unwrap(), job);
                assert_eq!(job.to_json(), &out[6..]);
            }
        }
        assert!(
            is_base64_text(&base.payload) && is_base64_text("") && !is_base64_text("G0A=\"") && !is_base64_text("G0A-")
        );
    }

    #[test]
    fn ack_defaults_and_unknown_fields() {
        let a: Ack = serde_json::from_str(r#"{"v":1,"message_id":"m","seq":1,"result":"done","extra":5}"#).unwrap();
        assert_eq!(a.result, AckResult::Done);
        assert!(!a.permanent && !a.duplicate);
        let s: Status = serde_json::from_str(r#"{"v":1,"online":true,"printer":"paper_out"}"#).unwrap();
        assert!(!s.printer.unwrap().can_print());
    }
}
