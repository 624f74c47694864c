//! Why a record has no effect ([`IgnoreReason`]) or cannot be carried out
//! ([`DeadLetterReason`]). Their wire text (`as_str`, `Display`) is what `/stats`,
//! `/metrics` and the dead-letter topic show; it is stable.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Why a record has no effect, by design. Counted on `/stats` (`ignored`) and `/metrics`
/// (`pixgate_ignored_records_total{reason}`); never dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IgnoreReason {
    /// `duplicate_event`: an event id the router saw lately (a redelivery).
    DuplicateEvent,
    /// `delete_event`: a charge was deleted; nothing to show or print.
    DeleteEvent,
    /// `document_deleted_before_lookup`: an update whose document was gone when the
    /// capture job looked it up (no `fullDocument`).
    DocumentDeletedBeforeLookup,
    /// `stale_version`: the charge's `__v` is not newer than the last one applied.
    StaleVersion,
    /// `no_status_change`: a newer version with the same status.
    NoStatusChange,
    /// `device_disabled`: the charge's card machine is disabled in the registry.
    DeviceDisabled,
    /// `no_device_concerned`: no device must show or print anything for this charge.
    NoDeviceConcerned,
    /// `tombstone`: a record with a null value (not an empty one), the marker a compacted
    /// topic keeps for a deleted key. On either topic it means nothing: the capture job's
    /// deletes are change events with an envelope (`operationType: delete`).
    Tombstone,
}

impl IgnoreReason {
    /// The wire text, e.g. `stale_version`.
    pub fn as_str(self) -> &'static str {
        match self {
            IgnoreReason::DuplicateEvent => "duplicate_event",
            IgnoreReason::DeleteEvent => "delete_event",
            IgnoreReason::DocumentDeletedBeforeLookup => "document_deleted_before_lookup",
            IgnoreReason::StaleVersion => "stale_version",
            IgnoreReason::NoStatusChange => "no_status_change",
            IgnoreReason::DeviceDisabled => "device_disabled",
            IgnoreReason::NoDeviceConcerned => "no_device_concerned",
            IgnoreReason::Tombstone => "tombstone",
        }
    }
}

impl fmt::Display for IgnoreReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a record, or one effect of it, goes to the dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeadLetterReason {
    /// `not_json`: the record value is not a JSON object.
    NotJson,
    /// `missing_field:<field>`: a required field is absent or null (dotted path).
    MissingField(String),
    /// `invalid_field:<field>`: a field has the wrong type or an impossible value.
    InvalidField(String),
    /// `unknown_terminal`: the charge's card machine is not in the registry.
    UnknownTerminal,
    /// `terminal_of_another_company`: the card machine belongs to another company.
    TerminalOfAnotherCompany,
    /// `terminal_is_not_a_card_machine`: the charge's `terminal` is a printer.
    TerminalIsNotACardMachine,
    /// `charge_state_unreadable`: the charge's last applied state cannot be read back from
    /// the outbox, so whether the event is new cannot be decided.
    ChargeStateUnreadable,
    /// `no_printer_for_receipt`: a paid charge's card machine has no printer to print on.
    NoPrinterForReceipt,
    /// `no_default_printer`: a paid charge without a card machine, and its company has no
    /// default printer.
    NoDefaultPrinter,
    /// `invalid_brcode`: the charge's `brCode` fails validation.
    InvalidBrcode,
    /// `brcode_amount_mismatch`: the `brCode` carries another amount than the charge.
    BrcodeAmountMismatch,
    /// `static_brcode_unbuildable`: no static payload can be built for the charge.
    StaticBrcodeUnbuildable,
    /// `receipt_unrenderable`: the receipt cannot be rendered for the printer.
    ReceiptUnrenderable,
    /// `wrong_device_kind`: the effect does not fit the device (a QR screen for a printer).
    WrongDeviceKind,
    /// `delivery_failed`: the device refused the job, or never acknowledged it.
    DeliveryFailed,
    /// `expired`: the job's time to live passed before it was done.
    Expired,
}

impl DeadLetterReason {
    /// The reason of a change event that cannot be decoded ([`cdc::DecodeError`]).
    pub fn of_decode(e: &cdc::DecodeError) -> DeadLetterReason {
        match e {
            cdc::DecodeError::NotJson(_) => DeadLetterReason::NotJson,
            cdc::DecodeError::Missing(f) => DeadLetterReason::MissingField((*f).to_string()),
            cdc::DecodeError::Invalid { field, .. } => DeadLetterReason::InvalidField((*field).to_string()),
        }
    }

    /// Whether a record dead-lettered for this reason may route once the device registry
    /// changes (`unknown_terminal`, `terminal_of_another_company`): the consumer holds such
    /// a record while the registry is behind, and `pixgate deadletter replay` routes it
    /// again.
    pub fn depends_on_registry(&self) -> bool {
        matches!(self, DeadLetterReason::UnknownTerminal | DeadLetterReason::TerminalOfAnotherCompany)
    }

    /// Whether `pixgate deadletter replay` routes a record dead-lettered for this reason
    /// again: the registry may have changed since ([`DeadLetterReason::depends_on_registry`]),
    /// or the charge's stored state, unreadable then (a disk read error), be readable now.
    /// Routed again, a record that would be dead-lettered once more is refused, nothing
    /// written.
    pub fn routes_again(&self) -> bool {
        self.depends_on_registry() || matches!(self, DeadLetterReason::ChargeStateUnreadable)
    }

    /// The wire text without a field (`missing_field`, `invalid_field` for those two).
    fn kind(&self) -> &'static str {
        match self {
            DeadLetterReason::NotJson => "not_json",
            DeadLetterReason::MissingField(_) => "missing_field",
            DeadLetterReason::InvalidField(_) => "invalid_field",
            DeadLetterReason::UnknownTerminal => "unknown_terminal",
            DeadLetterReason::TerminalOfAnotherCompany => "terminal_of_another_company",
            DeadLetterReason::TerminalIsNotACardMachine => "terminal_is_not_a_card_machine",
            DeadLetterReason::ChargeStateUnreadable => "charge_state_unreadable",
            DeadLetterReason::NoPrinterForReceipt => "no_printer_for_receipt",
            DeadLetterReason::NoDefaultPrinter => "no_default_printer",
            DeadLetterReason::InvalidBrcode => "invalid_brcode",
            DeadLetterReason::BrcodeAmountMismatch => "brcode_amount_mismatch",
            DeadLetterReason::StaticBrcodeUnbuildable => "static_brcode_unbuildable",
            DeadLetterReason::ReceiptUnrenderable => "receipt_unrenderable",
            DeadLetterReason::WrongDeviceKind => "wrong_device_kind",
            DeadLetterReason::DeliveryFailed => "delivery_failed",
            DeadLetterReason::Expired => "expired",
        }
    }

    const WITHOUT_FIELD: [DeadLetterReason; 14] = [
        DeadLetterReason::NotJson,
        DeadLetterReason::UnknownTerminal,
        DeadLetterReason::TerminalOfAnotherCompany,
        DeadLetterReason::TerminalIsNotACardMachine,
        DeadLetterReason::ChargeStateUnreadable,
        DeadLetterReason::NoPrinterForReceipt,
        DeadLetterReason::NoDefaultPrinter,
        DeadLetterReason::InvalidBrcode,
        DeadLetterReason::BrcodeAmountMismatch,
        DeadLetterReason::StaticBrcodeUnbuildable,
        DeadLetterReason::ReceiptUnrenderable,
        DeadLetterReason::WrongDeviceKind,
        DeadLetterReason::DeliveryFailed,
        DeadLetterReason::Expired,
    ];
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeadLetterReason::MissingField(field) | DeadLetterReason::InvalidField(field) => {
                write!(f, "{}:{field}", self.kind())
            }
            other => f.write_str(other.kind()),
        }
    }
}

/// A wire text that names no [`DeadLetterReason`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dead-letter reason {0:?}")]
pub struct UnknownReason(pub String);

impl FromStr for DeadLetterReason {
    type Err = UnknownReason;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(field) = s.strip_prefix("missing_field:") {
            return Ok(DeadLetterReason::MissingField(field.to_string()));
        }
        if let Some(field) = s.strip_prefix("invalid_field:") {
            return Ok(DeadLetterReason::InvalidField(field.to_string()));
        }
        DeadLetterReason::WITHOUT_FIELD.into_iter().find(|r| r.kind() == s).ok_or_else(|| UnknownReason(s.to_string()))
    }
}

impl Serialize for DeadLetterReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DeadLetterReason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_from_its_wire_text() {
        let mut all = DeadLetterReason::WITHOUT_FIELD.to_vec();
        all.push(DeadLetterReason::MissingField("company".into()));
        all.push(DeadLetterReason::InvalidField("printer.nativeQr".into()));
        for r in all {
            let text = r.to_string();
            assert_eq!(text.parse::<DeadLetterReason>(), Ok(r.clone()), "{text}");
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{text}\""));
        }
        assert_eq!(DeadLetterReason::InvalidField("value".into()).to_string(), "invalid_field:value");
        assert!("no_such_reason".parse::<DeadLetterReason>().is_err());
    }

    #[test]
    fn decode_errors_keep_their_reason_text() {
        let errors = [
            cdc::DecodeError::NotJson("x".into()),
            cdc::DecodeError::Missing("company"),
            cdc::DecodeError::Invalid { field: "value", problem: "x".into() },
        ];
        for e in errors {
            assert_eq!(DeadLetterReason::of_decode(&e).to_string(), e.reason());
        }
    }
}
