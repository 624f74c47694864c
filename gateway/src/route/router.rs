//! Which device must do what for a charge event: the routing rules of
//! `fixtures/cdc/README.md`, section "Effects".
//!
//! - `ACTIVE` on terminal T → T `display_qr`;
//! - `COMPLETED` → T `payment_confirmed`, and T's paired printer `print_receipt` (falling
//!   back to the company's default printer when T has no usable paired printer);
//! - `EXPIRED` → T `charge_expired`;
//! - no terminal: `COMPLETED` → the company's default printer `print_receipt`; else nothing.
//!
//! A pixgate extension (the contract has no such field): a printer whose device document
//! says `printer.printPixSlip: true` also prints, when it is the printer the charge's
//! receipt goes to (T's paired printer or the company default, as above), the "pay with
//! Pix" slip with the QR on `ACTIVE` (`display_qr`, an ESC/POS job) and an expiry notice on
//! `EXPIRED` (`charge_expired`), after T's own effect. Without the flag (the default, and
//! every device of the fixtures) nothing changes, so `expected.json` is reproduced exactly.
//!
//! Effects fire on a status *change*. An event whose `__v` is not newer than the last one
//! applied for that charge has no effect (a QR never reappears after "paid"), and neither
//! has a redelivered `eventId`. Nothing is dropped silently: every event ends as effects,
//! an ignore reason, or a dead-letter reason, each counted.

use crate::model::{DeadLetterReason, IgnoreReason};
use crate::route::registry::Registry;
use crate::store::Outbox;
use cdc::{self, Charge, ChargeStatus, Device, DeviceKind, Envelope, Operation};
use device_protocol::EffectKind;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// One effect to carry out on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedEffect {
    /// What to do.
    pub kind: EffectKind,
    /// Where (a snapshot of the registry entry at routing time).
    pub device: Device,
}

/// The fate of a charge event.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Carry out these effects. `unroutable` are effects the rules call for but no device
    /// can take (e.g. no printer for the receipt): each is dead-lettered with its reason.
    Effects {
        /// The decoded charge, for rendering.
        charge: Box<Charge>,
        /// Effects with their device, in the order they must happen.
        effects: Vec<PlannedEffect>,
        /// Effects without a device, with the reason.
        unroutable: Vec<(EffectKind, DeadLetterReason)>,
    },
    /// No effect, by design (stale, duplicate, delete, no device concerned). The reason is
    /// counted.
    Ignored(IgnoreReason),
    /// The event cannot be carried out; it goes to the dead-letter topic with this reason
    /// and detail.
    DeadLetter {
        /// Why, e.g. `unknown_terminal`.
        reason: DeadLetterReason,
        /// Human-readable detail.
        detail: String,
    },
}

/// The last applied `(__v, status)` of the charges seen lately: two generations of at most
/// `capacity / 2` entries each; when the current one fills up it becomes the previous one
/// and the old previous one is dropped. Bounded memory, O(1), and a charge used within the
/// last `capacity / 2` charges is always held (the batch being written among them).
#[derive(Debug)]
struct ChargeCache {
    current: HashMap<String, (i64, ChargeStatus)>,
    previous: HashMap<String, (i64, ChargeStatus)>,
    half: usize,
}

impl ChargeCache {
    fn new(capacity: usize) -> ChargeCache {
        ChargeCache { current: HashMap::new(), previous: HashMap::new(), half: (capacity / 2).max(1) }
    }

    fn get(&self, id: &str) -> Option<(i64, ChargeStatus)> {
        self.current.get(id).or_else(|| self.previous.get(id)).copied()
    }

    fn insert(&mut self, id: String, state: (i64, ChargeStatus)) {
        self.current.insert(id, state);
        if self.current.len() >= self.half {
            self.previous = std::mem::take(&mut self.current);
        }
    }
}

/// Routing state: the last applied version and status of each charge (recent ones in
/// memory, all of them in the outbox), and recently applied event ids.
pub struct Router {
    charges: ChargeCache,
    /// Where the states of charges not in memory are read from; `None`: memory only.
    store: Option<Arc<Outbox>>,
    /// The charge whose state the last `route_charge` changed, for the outbox to persist.
    applied: Option<String>,
    seen: HashSet<String>,
    seen_order: VecDeque<String>,
    seen_capacity: usize,
}

/// Event ids the router remembers by default: a redelivery within the last 10,000 events
/// is reported as `duplicate_event`; an older one is still ignored, as `stale_version`
/// (its `__v` is not newer than the charge's). At about 200 bytes an id, 1,000,000 (the
/// old default) made memory grow by some 200 MiB over a backlog of a million events.
pub const DEFAULT_SEEN_CAPACITY: usize = 10_000;

impl Default for Router {
    fn default() -> Self {
        Router::new(DEFAULT_SEEN_CAPACITY)
    }
}

impl Router {
    /// A router that remembers up to `seen_capacity` event ids (oldest forgotten first;
    /// the `__v` check still stops an old redelivery after that).
    pub fn new(seen_capacity: usize) -> Router {
        Router {
            charges: ChargeCache::new(usize::MAX),
            store: None,
            applied: None,
            seen: HashSet::new(),
            seen_order: VecDeque::new(),
            seen_capacity,
        }
    }

    /// A router that keeps the states of the last `cache` charges or so in memory and reads
    /// older ones from `outbox` (which stores every state the router applies, with the
    /// batch of its record). `cache` must exceed two outbox batches, so that the states of
    /// the batch being written, not yet in the outbox, are always in memory.
    pub fn with_store(seen_capacity: usize, outbox: Arc<Outbox>, cache: usize) -> Router {
        Router { charges: ChargeCache::new(cache), store: Some(outbox), ..Router::new(seen_capacity) }
    }

    /// The charge's last applied state: in memory, else in the outbox.
    fn previous(&self, id: &str) -> Result<Option<(i64, ChargeStatus)>, String> {
        if let Some(s) = self.charges.get(id) {
            return Ok(Some(s));
        }
        match &self.store {
            Some(o) => o.charge(id).map(|s| s.map(|s| (s.version, s.status))).map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }

    /// A charge's state read from elsewhere (the route changelog of a charge partition
    /// taken): kept when its `__v` is newer than the state known here (memory, else the
    /// outbox), so that an event it makes stale is ignored. Returns whether it was newer
    /// (the caller then stores it in the outbox).
    ///
    /// # Errors
    /// The outbox cannot be read (nothing changed).
    pub fn restore_state(&mut self, id: &str, version: i64, status: ChargeStatus) -> Result<bool, String> {
        let newer = self.previous(id)?.is_none_or(|(v, _)| v < version);
        if newer {
            self.charges.insert(id.to_string(), (version, status));
        }
        Ok(newer)
    }

    /// The charge state the last [`Router::route_charge`] call applied, if it applied one
    /// (taken: a second call returns `None`). The outbox persists it with the jobs.
    pub fn take_applied(&mut self) -> Option<(String, i64, ChargeStatus)> {
        let id = self.applied.take()?;
        let (v, s) = self.charges.get(&id)?;
        Some((id, v, s))
    }

    /// Decides what a `charge.upserted` event does, and records it as applied unless it
    /// is dead-lettered (so that a later replay of a dead letter can still apply).
    pub fn route_charge(&mut self, env: &Envelope, registry: &Registry) -> Decision {
        self.route_decoded(&env.event_id, env.operation, env.full_document.as_ref().map(cdc::decode_charge), registry)
    }

    /// [`Router::route_charge`] for an event already decoded: its `eventId`, operation
    /// and `fullDocument` as a charge (`None` without a document), as
    /// [`cdc::charge_record::decode_charge_record`] gives them (the consumer's path).
    pub fn route_decoded(
        &mut self,
        event_id: &str,
        operation: Operation,
        charge: Option<Result<Charge, cdc::DecodeError>>,
        registry: &Registry,
    ) -> Decision {
        self.applied = None;
        if self.seen.contains(event_id) {
            return Decision::Ignored(IgnoreReason::DuplicateEvent);
        }
        if operation == Operation::Delete {
            return Decision::Ignored(IgnoreReason::DeleteEvent);
        }
        let charge = match charge {
            None => return Decision::Ignored(IgnoreReason::DocumentDeletedBeforeLookup),
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                return Decision::DeadLetter { reason: DeadLetterReason::of_decode(&e), detail: e.to_string() }
            }
        };
        let previous = match self.previous(&charge.id) {
            Ok(p) => p,
            // Without the charge's state the event could undo a later one (a QR after "paid"):
            // it is not applied, and the dead letter says why.
            Err(e) => {
                return Decision::DeadLetter {
                    reason: DeadLetterReason::ChargeStateUnreadable,
                    detail: format!("charge {}: {e}", charge.id),
                }
            }
        };
        if let Some((v, _)) = previous {
            if charge.version <= v {
                return Decision::Ignored(IgnoreReason::StaleVersion);
            }
        }
        let decision = plan(&charge, previous.map(|(_, s)| s), registry);
        if !matches!(decision, Decision::DeadLetter { .. }) {
            self.charges.insert(charge.id.clone(), (charge.version, charge.status));
            self.applied = Some(charge.id.clone());
            self.remember(event_id);
        }
        decision
    }

    fn remember(&mut self, event_id: &str) {
        if self.seen.insert(event_id.to_string()) {
            self.seen_order.push_back(event_id.to_string());
            while self.seen_order.len() > self.seen_capacity {
                if let Some(old) = self.seen_order.pop_front() {
                    self.seen.remove(&old);
                }
            }
        }
    }
}

fn plan(charge: &Charge, previous: Option<ChargeStatus>, registry: &Registry) -> Decision {
    if previous == Some(charge.status) {
        return Decision::Ignored(IgnoreReason::NoStatusChange);
    }
    let terminal = match &charge.terminal {
        None => None,
        Some(id) => match registry.get(id) {
            None => return dead(DeadLetterReason::UnknownTerminal, format!("terminal {id} is not in the registry")),
            Some(d) if d.company != charge.company => {
                return dead(
                    DeadLetterReason::TerminalOfAnotherCompany,
                    format!("terminal {id} belongs to company {}", d.company),
                )
            }
            Some(d) if !matches!(d.kind, DeviceKind::Terminal { .. }) => {
                return dead(DeadLetterReason::TerminalIsNotACardMachine, format!("device {id} is a printer"))
            }
            Some(d) if !d.enabled => return Decision::Ignored(IgnoreReason::DeviceDisabled),
            Some(d) => Some(d),
        },
    };
    let mut effects = Vec::new();
    let mut unroutable = Vec::new();
    let mut on = |kind, device: &Device| effects.push(PlannedEffect { kind, device: device.clone() });
    let slip = slip_printer(terminal, &charge.company, registry);
    match (charge.status, terminal) {
        (ChargeStatus::Active, Some(t)) => {
            on(EffectKind::DisplayQr, t);
            if let Some(p) = slip {
                on(EffectKind::DisplayQr, p);
            }
        }
        (ChargeStatus::Expired, Some(t)) => {
            on(EffectKind::ChargeExpired, t);
            if let Some(p) = slip {
                on(EffectKind::ChargeExpired, p);
            }
        }
        (ChargeStatus::Completed, Some(t)) => {
            on(EffectKind::PaymentConfirmed, t);
            match receipt_printer(t, &charge.company, registry) {
                Some(p) => on(EffectKind::PrintReceipt, p),
                None => unroutable.push((EffectKind::PrintReceipt, DeadLetterReason::NoPrinterForReceipt)),
            }
        }
        (ChargeStatus::Completed, None) => match registry.default_printer(&charge.company) {
            Some(p) => on(EffectKind::PrintReceipt, p),
            None => unroutable.push((EffectKind::PrintReceipt, DeadLetterReason::NoDefaultPrinter)),
        },
        (ChargeStatus::Active, None) => match slip {
            Some(p) => on(EffectKind::DisplayQr, p),
            None => return Decision::Ignored(IgnoreReason::NoDeviceConcerned),
        },
        (ChargeStatus::Expired, None) => match slip {
            Some(p) => on(EffectKind::ChargeExpired, p),
            None => return Decision::Ignored(IgnoreReason::NoDeviceConcerned),
        },
    }
    Decision::Effects { charge: Box::new(charge.clone()), effects, unroutable }
}

/// The printer for a terminal's receipts: its paired printer if registered, enabled, a
/// printer, and of the same company; otherwise the company's default printer.
fn receipt_printer<'a>(terminal: &Device, company: &str, registry: &'a Registry) -> Option<&'a Device> {
    let paired = match &terminal.kind {
        DeviceKind::Terminal { paired_printer: Some(p), .. } => registry.get(p),
        _ => None,
    };
    paired
        .filter(|p| p.enabled && p.company == company && matches!(p.kind, DeviceKind::Printer { .. }))
        .or_else(|| registry.default_printer(company))
}

/// The printer that prints the pay-with-Pix slip and the expiry notice of a charge: the
/// one its receipt goes to ([`receipt_printer`] for a terminal's charge, the company's
/// default printer otherwise), if its document sets `printer.printPixSlip`.
fn slip_printer<'a>(terminal: Option<&Device>, company: &str, registry: &'a Registry) -> Option<&'a Device> {
    let printer = match terminal {
        Some(t) => receipt_printer(t, company, registry),
        None => registry.default_printer(company),
    };
    printer.filter(|p| matches!(p.kind, DeviceKind::Printer { pix_slip: true, .. }))
}

fn dead(reason: DeadLetterReason, detail: String) -> Decision {
    Decision::DeadLetter { reason, detail }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeMap;

    use crate::test_fixtures::records as fixture;

    fn load_registry() -> Registry {
        load_registry_flagging(|_| false)
    }

    /// The fixture registry, with `printer.printPixSlip: true` added to the documents of the
    /// printers `flag` picks (by id).
    fn load_registry_flagging(flag: impl Fn(&str) -> bool) -> Registry {
        let mut reg = Registry::default();
        for (_, bytes) in fixture("devices.jsonl") {
            let env = cdc::decode_envelope(&bytes).unwrap();
            let mut doc = env.full_document.clone();
            if let Some(d) = doc.as_mut().filter(|d| d["kind"] == "printer" && flag(&env.document_id)) {
                d["printer"]["printPixSlip"] = Value::Bool(true);
            }
            let dev = doc.as_ref().map(|d| cdc::decode_device(d).unwrap());
            reg.apply(&env.document_id, env.cluster_time, dev);
        }
        reg
    }

    /// Every charge event of `charges.jsonl` through a fresh router: per charge, the
    /// effects in order as (device, kind).
    fn route_all(reg: &Registry) -> BTreeMap<String, Vec<(String, String)>> {
        let mut router = Router::default();
        let mut got: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for (_, bytes) in fixture("charges.jsonl") {
            let env = cdc::decode_envelope(&bytes).unwrap();
            let entry = got.entry(env.document_id.clone()).or_default();
            match router.route_charge(&env, reg) {
                Decision::Effects { effects, unroutable, .. } => {
                    assert!(unroutable.is_empty());
                    entry.extend(effects.into_iter().map(|e| (e.device.id, e.kind.as_str().to_string())));
                }
                Decision::Ignored(_) => {}
                d => panic!("unexpected {d:?}"),
            }
        }
        got.retain(|_, v| !v.is_empty());
        got
    }

    fn is_printer(reg: &Registry, id: &str) -> bool {
        matches!(reg.get(id).map(|d| &d.kind), Some(DeviceKind::Printer { .. }))
    }

    /// With `printPixSlip` on every printer, each charge gets exactly the effects of
    /// `expected.json` plus, on the printer that prints (or would print) its receipt, a
    /// `display_qr` slip after each `ACTIVE` and a `charge_expired` notice after each
    /// `EXPIRED`, including charges without a terminal.
    #[test]
    fn flagged_printers_get_the_slip_and_the_notice_on_the_receipt_printer() {
        let plain = route_all(&load_registry());
        let reg = load_registry_flagging(|_| true);
        let flagged = route_all(&reg);
        // (kind, after the terminal's own effect?) → count
        let mut added: BTreeMap<(String, bool), usize> = BTreeMap::new();
        for (charge, effects) in &flagged {
            let (on_printers, rest): (Vec<_>, Vec<_>) =
                effects.iter().cloned().partition(|(d, k)| is_printer(&reg, d) && k != "print_receipt");
            assert_eq!(
                &rest,
                plain.get(charge).unwrap_or(&vec![]),
                "{charge}: the extension changed a contract effect"
            );
            let receipt_printer = effects.iter().find(|(_, k)| k == "print_receipt").map(|(d, _)| d);
            for (i, (device, kind)) in effects.iter().enumerate() {
                if !is_printer(&reg, device) || kind == "print_receipt" {
                    continue;
                }
                assert!(kind == "display_qr" || kind == "charge_expired", "{charge}: {kind} on printer {device}");
                if let Some(p) = receipt_printer {
                    assert_eq!(device, p, "{charge}: slip and receipt on different printers");
                }
                // Right after the terminal's own effect of the same kind, when there is one.
                let after_terminal = match i.checked_sub(1).map(|j| &effects[j]) {
                    Some((t, k)) if !is_printer(&reg, t) => {
                        assert_eq!(k, kind, "{charge}");
                        true
                    }
                    _ => false,
                };
                *added.entry((kind.clone(), after_terminal)).or_default() += 1;
            }
            assert!(on_printers.len() <= 2, "{charge}: {on_printers:?}");
        }
        let count = |kind: &str| plain.values().flatten().filter(|(_, k)| k == kind).count();
        let n = |kind: &str, after: bool| added.get(&(kind.to_string(), after)).copied().unwrap_or(0);
        // Every terminal in the fixtures has a receipt printer: one slip per QR, one notice per expiry.
        assert_eq!(n("display_qr", true), count("display_qr"));
        assert_eq!(n("charge_expired", true), count("charge_expired"));
        // Charges without a terminal (16 ACTIVE, 2 EXPIRED insert events in the fixtures).
        assert!(n("display_qr", false) > 0 && n("charge_expired", false) > 0, "{added:?}");
    }

    /// A charge without terminal: nothing unless the company's default printer has the flag;
    /// a flagged printer that is not the charge's receipt printer gets nothing.
    #[test]
    fn slip_goes_only_to_the_flagged_receipt_printer() {
        // Company 8dbc…: default printer c967… (paired with terminal 724c…), and 8baa…
        // (paired with terminal 7f80…, the terminal of the first charge).
        let first = &fixture("charges.jsonl")[0].1;
        let env = cdc::decode_envelope(first).unwrap();
        let kinds = |reg: &Registry| match Router::default().route_charge(&env, reg) {
            Decision::Effects { effects, .. } => effects.into_iter().map(|e| (e.device.id, e.kind)).collect::<Vec<_>>(),
            d => panic!("{d:?}"),
        };
        let terminal = "7f80e222f828767efc2f9162".to_string();
        assert_eq!(kinds(&load_registry()), [(terminal.clone(), EffectKind::DisplayQr)]);
        assert_eq!(
            kinds(&load_registry_flagging(|id| id == "c967a64cb14028d512c9791e")),
            [(terminal.clone(), EffectKind::DisplayQr)]
        );
        assert_eq!(
            kinds(&load_registry_flagging(|id| id == "8baa7196b50ac2f86702824c")),
            [
                (terminal.clone(), EffectKind::DisplayQr),
                ("8baa7196b50ac2f86702824c".to_string(), EffectKind::DisplayQr)
            ]
        );

        // The same charge without its terminal: the company default printer, if flagged.
        let mut doc = env.full_document.clone().unwrap();
        doc.as_object_mut().unwrap().remove("terminal");
        let bare = Envelope { full_document: Some(doc), ..env.clone() };
        assert_eq!(
            Router::default().route_charge(&bare, &load_registry()),
            Decision::Ignored(IgnoreReason::NoDeviceConcerned)
        );
        match Router::default().route_charge(&bare, &load_registry_flagging(|id| id == "c967a64cb14028d512c9791e")) {
            Decision::Effects { effects, .. } => {
                assert_eq!(
                    effects.iter().map(|e| (e.device.id.as_str(), e.kind)).collect::<Vec<_>>(),
                    [("c967a64cb14028d512c9791e", EffectKind::DisplayQr)]
                )
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn print_pix_slip_must_be_a_boolean() {
        let (_, bytes) = &fixture("devices.jsonl")[0];
        let mut doc = cdc::decode_envelope(bytes).unwrap().full_document.unwrap();
        assert!(matches!(cdc::decode_device(&doc).unwrap().kind, DeviceKind::Printer { pix_slip: false, .. }));
        doc["printer"]["printPixSlip"] = Value::String("yes".into());
        assert_eq!(cdc::decode_device(&doc).unwrap_err().reason(), "invalid_field:printer.printPixSlip");
    }

    /// `nativeQr`: a boolean, or absent for false (a raster QR); `"true"` as a string is an
    /// error rather than a silent false.
    #[test]
    fn native_qr_must_be_a_boolean_and_absent_is_false() {
        let (_, bytes) = &fixture("devices.jsonl")[0];
        let mut doc = cdc::decode_envelope(bytes).unwrap().full_document.unwrap();
        for (v, want) in [(Value::Bool(true), true), (Value::Bool(false), false), (Value::Null, false)] {
            doc["printer"]["nativeQr"] = v.clone();
            assert!(
                matches!(cdc::decode_device(&doc).unwrap().kind, DeviceKind::Printer { native_qr, .. } if native_qr == want),
                "{v}"
            );
        }
        doc["printer"].as_object_mut().unwrap().remove("nativeQr");
        assert!(matches!(cdc::decode_device(&doc).unwrap().kind, DeviceKind::Printer { native_qr: false, .. }));
        doc["printer"]["nativeQr"] = Value::String("true".into());
        assert_eq!(cdc::decode_device(&doc).unwrap_err().reason(), "invalid_field:printer.nativeQr");
    }

    /// With room for 4 charge states in memory, the router decides every fixture event
    /// (charges and edge cases) exactly as one that remembers every charge: the states it
    /// dropped are read back from the outbox, where the consumer stores each applied one.
    #[test]
    fn charge_states_beyond_the_cache_are_read_back_from_the_outbox() {
        let (_dir, outbox) = crate::test_fixtures::temp_outbox("router-store");
        let src = crate::model::SourceRef { topic: "charge.upserted".into(), partition: 0, offset: 0, key: None };
        let reg = load_registry();
        let mut bounded = Router::with_store(DEFAULT_SEEN_CAPACITY, outbox.clone(), 4);
        let mut unbounded = Router::default();
        let (mut decided, mut read_back) = (0, 0);
        for (_, bytes) in fixture("charges.jsonl").into_iter().chain(fixture("edge-cases.jsonl")) {
            let Ok(env) = cdc::decode_envelope(&bytes) else { continue };
            let in_memory = cdc::decode_charge(env.full_document.as_ref().unwrap_or(&Value::Null))
                .map(|c| bounded.charges.get(&c.id).is_some());
            if in_memory == Ok(false) && outbox.charge(&env.document_id).unwrap().is_some() {
                read_back += 1;
            }
            assert_eq!(bounded.route_charge(&env, &reg), unbounded.route_charge(&env, &reg), "event {}", env.event_id);
            decided += 1;
            if let Some((id, version, status)) = bounded.take_applied() {
                outbox.accept(Some((&id, crate::store::ChargeState { version, status })), vec![], &src, 1).unwrap();
            }
            assert!(
                bounded.charges.current.len() + bounded.charges.previous.len() <= 4,
                "memory holds at most 4 states"
            );
        }
        assert!(decided > 20 && read_back > 0, "{decided} events, {read_back} states read back from the outbox");
    }

    /// The routing rules reproduce `expected.json` exactly, effect for effect.
    #[test]
    fn charges_fixture_matches_expected_json() {
        let reg = load_registry();
        let mut router = Router::default();
        let mut got: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for (_, bytes) in fixture("charges.jsonl") {
            let env = cdc::decode_envelope(&bytes).unwrap();
            let entry = got.entry(env.document_id.clone()).or_default();
            match router.route_charge(&env, &reg) {
                Decision::Effects { effects, unroutable, .. } => {
                    assert!(unroutable.is_empty());
                    entry.extend(effects.into_iter().map(|e| (e.device.id, e.kind.as_str().to_string())));
                }
                Decision::Ignored(_) => {}
                d => panic!("unexpected {d:?}"),
            }
        }
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(crate::test_fixtures::path("expected.json")).unwrap())
                .unwrap();
        let expected: BTreeMap<String, Vec<(String, String)>> = expected
            .as_object()
            .unwrap()
            .iter()
            .map(|(id, c)| {
                let effs = c["effects"].as_array().unwrap().iter();
                let effs = effs.map(|e| (e["device"].as_str().unwrap().into(), e["kind"].as_str().unwrap().into()));
                (id.clone(), effs.collect())
            })
            .collect();
        assert_eq!(got, expected);
    }

    /// Every edge case ends with no device effect and a named reason.
    #[test]
    fn edge_cases_have_no_effect_and_a_reason() {
        let reg = load_registry();
        let mut router = Router::default();
        for (_, bytes) in fixture("charges.jsonl") {
            router.route_charge(&cdc::decode_envelope(&bytes).unwrap(), &reg);
        }
        let mut reasons = Vec::new();
        for (_, bytes) in fixture("edge-cases.jsonl") {
            let reason = match cdc::decode_envelope(&bytes) {
                Err(e) => e.reason(),
                Ok(env) => match router.route_charge(&env, &reg) {
                    Decision::Ignored(r) => r.to_string(),
                    Decision::DeadLetter { reason, .. } => reason.to_string(),
                    // Bad BR Codes pass routing; rendering dead-letters them (see jobs).
                    Decision::Effects { charge, .. } if charge.brcode.is_some() => "brcode_checked_at_render".into(),
                    d => panic!("edge case produced {d:?}"),
                },
            };
            reasons.push(reason);
        }
        assert_eq!(
            reasons,
            [
                "duplicate_event",
                "document_deleted_before_lookup",
                "delete_event",
                "invalid_field:status",
                "not_json",
                "not_json",
                "brcode_checked_at_render",
                "brcode_checked_at_render",
                "unknown_terminal",
                "terminal_of_another_company",
                "stale_version",
                "invalid_field:value",
                "missing_field:company",
                "invalid_field:value",
            ]
        );
    }
}
