//! Deterministic message ids: the same change event always yields the same id per device
//! and effect, so a device can tell a redelivery from a new job.

use crate::EffectKind;
use sha2::{Digest, Sha256};

/// The message id of the job that carries effect `kind` of event `event_id` to `device`.
///
/// Shape: 32 lowercase hex characters, the first 16 bytes of
/// SHA-256(`event_id` 0x1F `device` 0x1F `kind`). The unit separator keeps
/// `("a:b", "c")` and `("a", "b:c")` apart.
pub fn message_id(event_id: &str, device: &str, kind: EffectKind) -> String {
    let mut h = Sha256::new();
    h.update(event_id.as_bytes());
    h.update([0x1F]);
    h.update(device.as_bytes());
    h.update([0x1F]);
    h.update(kind.as_str().as_bytes());
    hex::encode(&h.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_distinct() {
        let a = message_id("Charge:x:1", "dev", EffectKind::DisplayQr);
        assert_eq!(a, message_id("Charge:x:1", "dev", EffectKind::DisplayQr));
        assert_eq!(a.len(), 32);
        assert_ne!(a, message_id("Charge:x:1", "dev", EffectKind::PrintReceipt));
        assert_ne!(a, message_id("Charge:x:2", "dev", EffectKind::DisplayQr));
        assert_ne!(message_id("a:b", "c", EffectKind::DisplayQr), message_id("a", "b:c", EffectKind::DisplayQr));
    }
}
