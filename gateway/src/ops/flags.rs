//! Switching effect flags ([`crate::model::flags`]): what `GET /flags` and
//! `POST /flags/{kind}/{on|off}` answer ([`crate::ops::http`]) and what `pixgate flags`
//! prints ([`crate::cli::flags`]) when it opens the outbox file itself. A change is stored
//! in the outbox first, then applied in memory: a flag the running gateway applies is
//! never one a restart would forget.

use crate::model::flags::{effect_kind, EffectFlags, EFFECT_KINDS};
use crate::store::{Outbox, OutboxError};
use device_protocol::EffectKind;
use serde_json::{json, Value};

/// `kind` and `state` of a request: an effect kind's wire name and `on` or `off`.
///
/// # Errors
/// Either is not one of those, in words naming the accepted values.
pub fn parse(kind: &str, state: &str) -> Result<(EffectKind, bool), String> {
    let kind = effect_kind(kind).ok_or_else(|| {
        let names: Vec<&str> = EFFECT_KINDS.iter().map(|k| k.as_str()).collect();
        format!("no effect kind `{kind}`: one of {}", names.join(", "))
    })?;
    let on = match state {
        "on" => true,
        "off" => false,
        other => return Err(format!("a flag is `on` or `off`, not `{other}`")),
    };
    Ok((kind, on))
}

/// The flags as JSON: `{"flags": {"display_qr": true, …}, "off": ["…"]}`.
pub fn listing(flags: &EffectFlags) -> Value {
    json!({ "flags": flags.as_map(), "off": flags.off() })
}

/// Stores `kind`'s flag in `outbox`, then applies it to `flags`; returns the [`listing`]
/// after the change. Logged at warn when it changes something (it changes what devices get).
///
/// # Errors
/// The outbox cannot be written; then nothing changed.
pub fn set(outbox: &Outbox, flags: &EffectFlags, kind: EffectKind, on: bool) -> Result<Value, OutboxError> {
    outbox.set_effect_flag(kind.as_str(), on)?;
    let before = flags.is_on(kind);
    flags.set(kind, on);
    if before != on {
        tracing::warn!(
            kind = kind.as_str(),
            on,
            "effect flag switched: records planned from now on {} this kind",
            if on { "carry out" } else { "skip" }
        );
    }
    Ok(listing(flags))
}

/// The flags stored in `outbox` (a kind with no row is on), names that are no kind logged.
///
/// # Errors
/// The outbox cannot be read.
pub fn load(outbox: &Outbox) -> Result<EffectFlags, OutboxError> {
    let (flags, unknown) = EffectFlags::from_stored(&outbox.effect_flags()?);
    for name in unknown {
        tracing::warn!(kind = %name, "the outbox holds a flag for an effect kind this pixgate does not know: ignored");
    }
    Ok(flags)
}

/// The line `/readyz` adds while some kinds are off (`None` while all are on). Readiness
/// stays as the other rules say: a kind switched off on purpose is no fault.
pub fn readiness_line(flags: &EffectFlags) -> Option<String> {
    let off = flags.off();
    (!off.is_empty())
        .then(|| format!("effects switched off (decided, counted skipped_by_flag, not delivered): {}", off.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_is_stored_before_it_applies_and_reads_back() {
        let (_dir, o) = crate::test_fixtures::temp_outbox("ops-flags");
        let flags = load(&o).unwrap();
        assert_eq!(readiness_line(&flags), None);
        let (kind, on) = parse("print_receipt", "off").unwrap();
        let v = set(&o, &flags, kind, on).unwrap();
        assert_eq!(v["off"], json!(["print_receipt"]));
        assert_eq!(v["flags"]["print_receipt"], false);
        assert!(readiness_line(&flags).unwrap().ends_with(": print_receipt"));
        assert!(!load(&o).unwrap().is_on(EffectKind::PrintReceipt), "kept in the outbox");
        assert!(parse("receipt", "off").unwrap_err().contains("display_qr, payment_confirmed"));
        assert!(parse("display_qr", "false").unwrap_err().contains("`on` or `off`"));
    }
}
