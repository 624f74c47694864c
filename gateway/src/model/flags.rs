//! Effect flags: one switch per effect kind (`display_qr`, `payment_confirmed`,
//! `print_receipt`, `charge_expired`), for a cutover from another system or a rollback to
//! it. With a kind off, its effects are still decided (the charge's state moves on as
//! usual) and counted as `skipped_by_flag`, but never rendered, queued or dead-lettered,
//! and the record's offset is committed as for any finished record: an old and a new
//! system can overlap on purpose, each doing the kinds switched on in it.
//!
//! A flag applies to records planned after it changes; jobs already in the outbox are
//! delivered. The flags are kept in the outbox file ([`crate::store::flags`]), so a
//! restart keeps them; a kind never switched is on.

use device_protocol::EffectKind;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// Every effect kind, in the order flags are listed.
pub const EFFECT_KINDS: [EffectKind; 4] =
    [EffectKind::DisplayQr, EffectKind::PaymentConfirmed, EffectKind::PrintReceipt, EffectKind::ChargeExpired];

/// The effect kind named `name` (its wire name, e.g. `display_qr`).
pub fn effect_kind(name: &str) -> Option<EffectKind> {
    EFFECT_KINDS.into_iter().find(|k| k.as_str() == name)
}

fn index(kind: EffectKind) -> usize {
    match kind {
        EffectKind::DisplayQr => 0,
        EffectKind::PaymentConfirmed => 1,
        EffectKind::PrintReceipt => 2,
        EffectKind::ChargeExpired => 3,
    }
}

/// The flags in memory, shared by the planner (which reads them per effect) and the HTTP
/// endpoint (which switches them after storing the change). All on by default.
#[derive(Debug)]
pub struct EffectFlags {
    on: [AtomicBool; 4],
}

impl Default for EffectFlags {
    fn default() -> Self {
        EffectFlags { on: std::array::from_fn(|_| AtomicBool::new(true)) }
    }
}

impl EffectFlags {
    /// The flags as stored: (kind name, on) pairs; a kind not among them is on, a name
    /// that is no kind is skipped (and returned, for the caller to log).
    pub fn from_stored(stored: &[(String, bool)]) -> (EffectFlags, Vec<String>) {
        let flags = EffectFlags::default();
        let mut unknown = Vec::new();
        for (name, on) in stored {
            match effect_kind(name) {
                Some(kind) => flags.set(kind, *on),
                None => unknown.push(name.clone()),
            }
        }
        (flags, unknown)
    }

    /// Whether effects of `kind` are carried out.
    pub fn is_on(&self, kind: EffectKind) -> bool {
        self.on[index(kind)].load(Ordering::Relaxed)
    }

    /// Switches `kind` on or off (in memory only; [`crate::store::flags`] stores it).
    pub fn set(&self, kind: EffectKind, on: bool) {
        self.on[index(kind)].store(on, Ordering::Relaxed);
    }

    /// Every kind's flag by name: `{"display_qr": true, …}`.
    pub fn as_map(&self) -> BTreeMap<String, bool> {
        EFFECT_KINDS.into_iter().map(|k| (k.as_str().to_string(), self.is_on(k))).collect()
    }

    /// The kinds switched off, by name, in [`EFFECT_KINDS`] order.
    pub fn off(&self) -> Vec<&'static str> {
        EFFECT_KINDS.into_iter().filter(|k| !self.is_on(*k)).map(EffectKind::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_flags_override_the_default_and_unknown_names_are_returned() {
        let stored = vec![("display_qr".to_string(), false), ("print_pdf".to_string(), false)];
        let (flags, unknown) = EffectFlags::from_stored(&stored);
        assert_eq!(unknown, vec!["print_pdf".to_string()]);
        assert!(!flags.is_on(EffectKind::DisplayQr));
        assert!(flags.is_on(EffectKind::PrintReceipt));
        assert_eq!(flags.off(), vec!["display_qr"]);
        flags.set(EffectKind::DisplayQr, true);
        flags.set(EffectKind::ChargeExpired, false);
        assert_eq!(flags.off(), vec!["charge_expired"]);
        assert_eq!(flags.as_map().len(), 4);
        assert!(!flags.as_map()["charge_expired"]);
    }

    #[test]
    fn every_kind_is_named_by_its_wire_name() {
        for k in EFFECT_KINDS {
            assert_eq!(effect_kind(k.as_str()), Some(k));
        }
        assert_eq!(effect_kind("DISPLAY_QR"), None);
    }
}
