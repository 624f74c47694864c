//! Rendering a planned effect into the job its device receives: a screen description for a
//! card machine, an ESC/POS stream for a printer (the receipt for `print_receipt`; the
//! pay-with-Pix slip for `display_qr` and the expiry notice for `charge_expired`, which the
//! router sends to printers with `printer.printPixSlip`).
//!
//! The Pix payload is checked here, per effect: a `brCode` that fails validation (CRC,
//! currency, structure), or whose amount differs from the charge's `value`, is never shown
//! or printed; that effect becomes a dead letter with the validator's reason. Effects that
//! need no payload (the "paid" and "expired" screens) still go out.

use crate::config::TtlConfig;
use crate::model::DeadLetterReason;
use crate::route::router::PlannedEffect;
use cdc::{Charge, DeviceKind};
use chrono::{DateTime, Utc};
use device_protocol::messages::{CONTENT_ESCPOS, CONTENT_SCREEN, VERSION};
use device_protocol::{message_id, EffectKind, Job, ScreenContent, ScreenKind};
use render::brcode::{self, StaticPix};
use render::receipt::{render_receipt_for, PrinterProfile, Receipt, ReceiptKind};
use render::Locale;

/// Why an effect could not be rendered; becomes the dead-letter reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RenderError {
    /// The charge's `brCode` fails validation.
    #[error("invalid brCode: {0}")]
    InvalidBrCode(String),
    /// The charge's `brCode` carries another amount than the charge.
    #[error("brCode amount {brcode_cents} centavos differs from charge value {value_cents}")]
    AmountMismatch {
        /// Amount in the payload, centavos.
        brcode_cents: u64,
        /// The charge's `value`, centavos.
        value_cents: u64,
    },
    /// The charge's `brCode` is a static one (no `26-25` location) with no amount (field
    /// `54`) for a charge of `value_cents`: the payer's bank would ask the payer to type an
    /// amount, and any would do.
    #[error(
        "brCode is static and names no amount for a charge of {value_cents} centavos: the payer could pay any amount"
    )]
    NoAmount {
        /// The charge's `value`, centavos.
        value_cents: u64,
    },
    /// No static payload could be built (no `pixKey`, or a field the encoder refuses).
    #[error("cannot build a static Pix payload: {0}")]
    StaticPayload(String),
    /// The receipt could not be rendered for this printer.
    #[error("receipt: {0}")]
    Receipt(String),
    /// The effect's kind does not fit the device's kind (a QR screen for a printer).
    #[error("{kind} cannot go to a {device}")]
    WrongDevice {
        /// Effect kind.
        kind: &'static str,
        /// Device kind.
        device: &'static str,
    },
}

impl RenderError {
    /// The dead-letter reason for counters and dead letters.
    pub fn reason(&self) -> DeadLetterReason {
        match self {
            RenderError::InvalidBrCode(_) => DeadLetterReason::InvalidBrcode,
            RenderError::AmountMismatch { .. } | RenderError::NoAmount { .. } => DeadLetterReason::BrcodeAmountMismatch,
            RenderError::StaticPayload(_) => DeadLetterReason::StaticBrcodeUnbuildable,
            RenderError::Receipt(_) => DeadLetterReason::ReceiptUnrenderable,
            RenderError::WrongDevice { .. } => DeadLetterReason::WrongDeviceKind,
        }
    }
}

/// The Pix payload to show or print for a charge: its validated `brCode` (dynamic), or a
/// static payload built from `pixKey`, `value`, merchant and `transactionID`.
///
/// # Errors
/// See [`RenderError`].
pub fn pix_payload(charge: &Charge) -> Result<String, RenderError> {
    if let Some(payload) = &charge.brcode {
        let parsed = brcode::parse(payload).map_err(|e| RenderError::InvalidBrCode(e.to_string()))?;
        match parsed.amount_cents() {
            Some(cents) if cents != charge.value_cents => {
                return Err(RenderError::AmountMismatch { brcode_cents: cents, value_cents: charge.value_cents });
            }
            // A dynamic payload's bank fetches the amount from its location; a static one
            // carries it or lets the payer type any.
            None if parsed.leaves_amount_to_payer() && charge.value_cents > 0 => {
                return Err(RenderError::NoAmount { value_cents: charge.value_cents });
            }
            _ => {}
        }
        return Ok(payload.clone());
    }
    let key = charge.pix_key.clone().ok_or_else(|| RenderError::StaticPayload("no pixKey".into()))?;
    brcode::encode_static(&StaticPix {
        key,
        amount_cents: Some(charge.value_cents).filter(|&c| c > 0),
        merchant_name: charge.merchant_name.clone(),
        merchant_city: charge.merchant_city.clone(),
        txid: charge.transaction_id.clone(),
        description: None,
    })
    .map_err(|e| RenderError::StaticPayload(e.to_string()))
}

/// Renders `effect` of event `event_id` for `charge` into the device's job. `seq` is
/// assigned later by the dispatcher (it is per device, in delivery order); here it is 0.
///
/// # Errors
/// See [`RenderError`].
pub fn render_job(
    event_id: &str,
    charge: &Charge,
    effect: &PlannedEffect,
    default_tz: &str,
) -> Result<Job, RenderError> {
    let device = &effect.device;
    let tz_name = device.time_zone.clone().unwrap_or_else(|| default_tz.to_string());
    let tz: chrono_tz::Tz = tz_name.parse().unwrap_or(chrono_tz::America::Sao_Paulo);
    let wrong = |dev: &'static str| RenderError::WrongDevice { kind: effect.kind.as_str(), device: dev };
    let (content_type, bytes) = match (&device.kind, effect.kind) {
        (DeviceKind::Terminal { .. }, kind) => {
            let (screen, brcode) = match kind {
                EffectKind::DisplayQr => (ScreenKind::PayWithPix, Some(pix_payload(charge)?)),
                EffectKind::PaymentConfirmed => (ScreenKind::Paid, None),
                EffectKind::ChargeExpired => (ScreenKind::Expired, None),
                EffectKind::PrintReceipt => return Err(wrong("card machine")),
            };
            let content = ScreenContent {
                screen,
                merchant_name: charge.merchant_name.clone(),
                amount_cents: charge.value_cents,
                brcode,
                expires_at: charge.expires_at,
                payer_name: charge.payer_name.clone(),
                paid_at: charge.paid_at,
                locale: device.locale.clone(),
                time_zone: tz_name,
            };
            (CONTENT_SCREEN, serde_json::to_vec(&content).expect("screen content serialises"))
        }
        (
            DeviceKind::Printer { paper_width_mm, code_page, native_qr, .. },
            kind @ (EffectKind::PrintReceipt | EffectKind::DisplayQr | EffectKind::ChargeExpired),
        ) => {
            // On a printer, `display_qr` is the pay-with-Pix slip and `charge_expired` the
            // expiry notice (router: `printer.printPixSlip`); the notice never carries a QR,
            // so it goes out even when the payload is invalid, like the card machine's screen.
            let (kind, brcode) = match kind {
                // A paid receipt carries no payable QR (a second payment must not be invited):
                // it needs no payload, so a bad `brCode` does not hold back a receipt.
                EffectKind::PrintReceipt => (ReceiptKind::Paid, None),
                EffectKind::DisplayQr => {
                    (ReceiptKind::PayWithPix { expires_at: charge.expires_at }, Some(pix_payload(charge)?))
                }
                _ => (ReceiptKind::Expired { expired_at: charge.expires_at }, None),
            };
            let receipt = Receipt {
                kind,
                merchant_name: charge.merchant_name.clone(),
                merchant_city: charge.merchant_city.clone(),
                amount_cents: charge.value_cents,
                items: charge.items.clone(),
                comment: charge.comment.clone(),
                payer_name: charge.payer_name.clone(),
                paid_at: charge.paid_at,
                time_zone: tz,
                end_to_end_id: charge.end_to_end_id.clone(),
                charge_id: charge.id.clone(),
                txid: charge.transaction_id.clone(),
                brcode,
                locale: Locale::from_tag(&device.locale),
            };
            // The model decides the `ESC t` number of the code page (vendors differ) and
            // whether `GS ( k` is trusted; a page the model lacks is an error, not a wrong table.
            let setup =
                PrinterProfile { paper_width_mm: *paper_width_mm, code_page: *code_page, native_qr: *native_qr }
                    .on_model(&device.model);
            (CONTENT_ESCPOS, render_receipt_for(&receipt, &setup).map_err(|e| RenderError::Receipt(e.to_string()))?)
        }
        (DeviceKind::Printer { .. }, _) => return Err(wrong("printer")),
    };
    Ok(Job {
        v: VERSION,
        message_id: message_id(event_id, &device.id, effect.kind),
        seq: 0,
        kind: effect.kind,
        event_id: event_id.to_string(),
        charge_id: charge.id.clone(),
        content_type: content_type.to_string(),
        payload: Job::encode_payload(&bytes),
        // Set by the consumer with [`expires_at`] when the job is accepted.
        expires_at: None,
    })
}

/// The time to live of a job of `kind` from when it is accepted (for `display_qr`, the
/// fallback when its charge has no `expiresDate`).
pub fn ttl_of(kind: EffectKind, ttl: &TtlConfig) -> chrono::Duration {
    let secs = match kind {
        EffectKind::DisplayQr => ttl.display_qr_s,
        EffectKind::PaymentConfirmed => ttl.payment_confirmed_s,
        EffectKind::ChargeExpired => ttl.charge_expired_s,
        EffectKind::PrintReceipt => ttl.print_receipt_s,
    };
    chrono::Duration::seconds(secs.min(i64::MAX as u64 / 1000) as i64)
}

/// When a job of `kind` for `charge`, accepted at `accepted_at`, expires: a `display_qr`
/// at the charge's `expiresDate` (a QR of a charge that can no longer be paid must not be
/// shown), else `accepted_at` + the kind's TTL from [`TtlConfig`].
pub fn expires_at(kind: EffectKind, charge: &Charge, accepted_at: DateTime<Utc>, ttl: &TtlConfig) -> DateTime<Utc> {
    match (kind, charge.expires_at) {
        (EffectKind::DisplayQr, Some(at)) => at,
        _ => accepted_at + ttl_of(kind, ttl),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::documents;
    use cdc;
    use device_protocol::EffectKind;

    fn charges(file: &str) -> Vec<Charge> {
        documents(file, cdc::decode_charge)
    }

    #[test]
    fn every_fixture_charge_has_a_valid_payload_with_its_amount() {
        let all = charges("charges.jsonl");
        assert!(all.iter().any(|c| c.brcode.is_none()) && all.iter().any(|c| c.brcode.is_some()));
        for c in all {
            let payload = pix_payload(&c).unwrap_or_else(|e| panic!("{}: {e}", c.id));
            let parsed = brcode::parse(&payload).unwrap();
            assert_eq!(parsed.amount_cents(), Some(c.value_cents).filter(|&v| v > 0), "{}", c.id);
        }
    }

    /// A `brCode` that is static (no location) must name the charge's amount: without one
    /// the payer's bank asks the payer to type any amount, while the screen says the
    /// charge's. With the amount, or for a charge of 0, it goes out.
    #[test]
    fn a_static_brcode_without_the_amount_is_refused() {
        let mut charge = charges("charges.jsonl").into_iter().find(|c| c.value_cents > 0).unwrap();
        let static_with = |amount_cents| {
            brcode::encode_static(&StaticPix {
                key: "pix@example.com".into(),
                amount_cents,
                merchant_name: "Loja".into(),
                merchant_city: "Recife".into(),
                txid: Some("abc".into()),
                description: None,
            })
            .unwrap()
        };
        charge.brcode = Some(static_with(None));
        assert!(!brcode::parse(charge.brcode.as_ref().unwrap()).unwrap().is_dynamic());
        let refused = pix_payload(&charge).unwrap_err();
        assert_eq!(refused, RenderError::NoAmount { value_cents: charge.value_cents });
        assert_eq!(refused.reason(), DeadLetterReason::BrcodeAmountMismatch);
        charge.brcode = Some(static_with(Some(charge.value_cents)));
        assert_eq!(pix_payload(&charge).unwrap(), static_with(Some(charge.value_cents)));
        charge.brcode = Some(static_with(None));
        charge.value_cents = 0;
        assert!(pix_payload(&charge).is_ok(), "a charge of 0 names no amount either");
    }

    /// Each printer gets the `ESC t` number its model uses for its code page: CP860 is
    /// table 4 on Bematech and Elgin, 3 on Epson-numbered printers; CP850 is 2 on all.
    #[test]
    fn receipts_select_the_code_page_by_model_numbering() {
        let charge = charges("charges.jsonl").into_iter().find(|c| c.status == cdc::ChargeStatus::Completed).unwrap();
        let mut seen = Vec::new();
        for device in documents("devices.jsonl", cdc::decode_device) {
            let cdc::DeviceKind::Printer { code_page, .. } = device.kind else { continue };
            let effect = PlannedEffect { kind: EffectKind::PrintReceipt, device: device.clone() };
            let job = render_job("ev", &charge, &effect, "America/Sao_Paulo").unwrap();
            let bytes = job.payload_bytes().unwrap();
            assert_eq!(&bytes[..3], &[0x1B, 0x40, 0x1B], "{}: starts with ESC @ ESC", device.model);
            assert_eq!(bytes[3], 0x74, "{}: ESC t", device.model);
            seen.push((device.model.clone(), code_page.name(), bytes[4]));
        }
        assert!(seen.contains(&("Bematech MP-4200 TH".into(), "CP860", 4)), "{seen:?}");
        assert!(seen.contains(&("Elgin i9".into(), "CP860", 4)), "{seen:?}");
        assert!(seen.contains(&("Epson TM-T20X".into(), "CP850", 2)), "{seen:?}");
    }

    /// On a printer (router: `printer.printPixSlip`), `display_qr` is the pay-with-Pix slip
    /// with the charge's payload as a QR and `charge_expired` the notice without any QR;
    /// `payment_confirmed` is not a printer job.
    #[test]
    fn printers_get_the_slip_and_the_notice_as_escpos() {
        let charge = charges("charges.jsonl")
            .into_iter()
            .find(|c| c.status == cdc::ChargeStatus::Active && c.transaction_id.is_some())
            .unwrap();
        let payload = pix_payload(&charge).unwrap();
        let has = |b: &[u8], w: &[u8]| b.windows(w.len()).any(|x| x == w);
        for device in documents("devices.jsonl", cdc::decode_device) {
            let cdc::DeviceKind::Printer { .. } = device.kind else { continue };
            let job =
                |kind| render_job("ev", &charge, &PlannedEffect { kind, device: device.clone() }, "America/Sao_Paulo");
            let slip = job(EffectKind::DisplayQr).unwrap();
            assert_eq!((slip.kind, slip.content_type.as_str()), (EffectKind::DisplayQr, CONTENT_ESCPOS));
            let bytes = slip.payload_bytes().unwrap();
            assert!(has(&bytes, payload.as_bytes()) || has(&bytes, &[0x1D, 0x76, 0x30]), "{}: no QR", device.id);
            let notice = job(EffectKind::ChargeExpired).unwrap().payload_bytes().unwrap();
            assert!(
                !has(&notice, &[0x1D, 0x28, 0x6B]) && !has(&notice, &[0x1D, 0x76, 0x30]),
                "{}: QR on a notice",
                device.id
            );
            assert!(
                has(&notice, charge.transaction_id.as_ref().unwrap().as_bytes()),
                "{}: notice without txid",
                device.id
            );
            assert!(matches!(job(EffectKind::PaymentConfirmed), Err(RenderError::WrongDevice { .. })));
        }
    }

    #[test]
    fn ttl_per_kind_and_qr_until_the_charge_expires() {
        let ttl = TtlConfig::default();
        let mut charge = charges("charges.jsonl").into_iter().find(|c| c.expires_at.is_some()).unwrap();
        let now: DateTime<Utc> = "2026-11-30T10:00:00Z".parse().unwrap();
        assert_eq!(expires_at(EffectKind::DisplayQr, &charge, now, &ttl), charge.expires_at.unwrap());
        assert_eq!(
            expires_at(EffectKind::PaymentConfirmed, &charge, now, &ttl),
            "2026-11-30T10:10:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        assert_eq!(
            expires_at(EffectKind::PrintReceipt, &charge, now, &ttl),
            "2026-12-01T10:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        charge.expires_at = None;
        assert_eq!(
            expires_at(EffectKind::DisplayQr, &charge, now, &ttl),
            "2026-11-30T11:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
    }

    #[test]
    fn bad_brcodes_in_edge_cases_are_refused_with_a_reason() {
        let bad: Vec<RenderError> = charges("edge-cases.jsonl")
            .iter()
            .filter(|c| c.brcode.is_some())
            .map(|c| pix_payload(c).unwrap_err())
            .collect();
        assert_eq!(bad.len(), 2);
        assert!(bad.iter().all(|e| e.reason() == DeadLetterReason::InvalidBrcode), "{bad:?}");
        let text: Vec<String> = bad.iter().map(ToString::to_string).collect();
        assert!(text[0].contains("CRC") || text[0].contains("crc"), "{}", text[0]);
        assert!(text[1].contains("53"), "currency tag named: {}", text[1]);
    }
}
