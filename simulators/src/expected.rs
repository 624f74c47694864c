//! What pixgate is expected to do with a stream of change events: an independent model of
//! the routing rules of `fixtures/cdc/README.md` ("Effects") as `gateway/src/router.rs`
//! documents them, used by the generator ([`crate::capture::generate`]) and the scale tests
//! to know, per event, which device must carry out which effect.
//!
//! Rules, applied to each `charge.upserted` event in order (per charge, Kafka keeps order):
//! 1. an `eventId` already applied → ignored `duplicate_event`; a `delete` → `delete_event`;
//!    no `fullDocument` → `document_deleted_before_lookup`; (pixgate remembers the last
//!    10,000 event ids only and reports an older redelivery as `stale_version`: the same
//!    fate, ignored, under another label);
//! 2. a document without the fields the rules need (company, integer centavos `value ≥ 0`,
//!    known `status`, integer `__v`, merchant name and city) → dead letter;
//! 3. `__v` not newer than the last applied one → `stale_version`; same status as applied →
//!    `no_status_change`;
//! 4. a `terminal` that is not registered → dead letter `unknown_terminal`; of another
//!    company → `terminal_of_another_company`; a printer → `terminal_is_not_a_card_machine`;
//!    disabled → ignored `device_disabled`;
//! 5. `ACTIVE` → the terminal `display_qr`; `EXPIRED` → `charge_expired`; `COMPLETED` →
//!    `payment_confirmed`, then `print_receipt` on the terminal's paired printer (registered,
//!    enabled, a printer, same company) or else the company's default printer (enabled,
//!    `defaultForCompany`); no terminal: `COMPLETED` → the default printer's
//!    `print_receipt`, anything else → `no_device_concerned`;
//! 6. an effect with no printer → dead letter `no_printer_for_receipt` /
//!    `no_default_printer`; `display_qr` and `print_receipt` carry the Pix payload, so a
//!    `brCode` that fails `render::brcode::parse` (or carries another amount, or is static
//!    and names none for a charge above 0) dead-letters those two (`invalid_brcode`,
//!    `brcode_amount_mismatch`), and a static charge without `pixKey` →
//!    `static_brcode_unbuildable`.
//!
//! State (last applied `__v`/status, applied event ids) is recorded for every event that
//! is not dead-lettered as a whole. `device.upserted` events update the registry when their
//! `clusterTime` is newer than the entry's; a delete removes the device.
//!
//! `expected.json` of the fixtures is the contract's own statement of these rules; the unit
//! tests check the model reproduces it exactly.

use anyhow::Context;
use device_protocol::EffectKind;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// The effects a fixtures folder's `expected.json` lists: per charge id, its (device id,
/// effect kind) pairs in the order the charge's lifecycle dictates (e.g. `display_qr`
/// before `payment_confirmed`). The file's shape: `{charge id: {"effects": [{"device",
/// "kind", …}, …], …}, …}` (`fixtures/cdc/README.md`).
///
/// # Errors
/// The file cannot be read, is not JSON, or not that shape.
pub fn read_expected_json(path: &Path) -> anyhow::Result<BTreeMap<String, Vec<(String, String)>>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let expected: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let shape = || format!("{}: not {{charge: {{\"effects\": [{{\"device\", \"kind\"}}]}}}}", path.display());
    let mut out = BTreeMap::new();
    for (charge, c) in expected.as_object().with_context(shape)? {
        let effects = c["effects"].as_array().with_context(shape)?;
        let pairs = effects
            .iter()
            .map(|e| Some((e["device"].as_str()?.to_string(), e["kind"].as_str()?.to_string())))
            .collect::<Option<Vec<_>>>()
            .with_context(shape)?;
        out.insert(charge.clone(), pairs);
    }
    Ok(out)
}

/// One effect a device must carry out.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpectedEffect {
    /// Device id.
    pub device: String,
    /// Charge id.
    pub charge: String,
    /// Effect kind.
    pub kind: EffectKind,
    /// The event that causes it.
    pub event_id: String,
    /// `device_protocol::message_id(event_id, device, kind)`: the job's id.
    pub message_id: String,
}

/// What pixgate must do with one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// These effects (in order), plus effects dead-lettered one by one with their reason.
    Effects {
        /// Effects to carry out.
        effects: Vec<ExpectedEffect>,
        /// Effects that go to the dead-letter topic instead, with the reason.
        dead: Vec<(EffectKind, &'static str)>,
    },
    /// No effect by design, with the reason pixgate counts.
    Ignored(&'static str),
    /// The whole event goes to the dead-letter topic.
    DeadLetter(String),
}

impl Fate {
    /// The effects to carry out (none unless [`Fate::Effects`]).
    pub fn effects(&self) -> &[ExpectedEffect] {
        match self {
            Fate::Effects { effects, .. } => effects,
            _ => &[],
        }
    }
}

#[derive(Debug, Clone)]
struct DeviceEntry {
    company: String,
    printer: bool,
    paired_printer: Option<String>,
    enabled: bool,
    default_for_company: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Active,
    Completed,
    Expired,
}

/// The model's state: the registry and each charge's last applied version and status.
#[derive(Debug, Default)]
pub struct Model {
    devices: HashMap<String, (u64, Option<DeviceEntry>)>,
    charges: HashMap<String, (i64, Status)>,
    seen: HashSet<String>,
}

fn oid(v: &Value) -> Option<String> {
    v["$oid"].as_str().or_else(|| v.as_str()).filter(|s| !s.is_empty()).map(str::to_string)
}

fn integer(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v["$numberLong"].as_str().or_else(|| v["$numberInt"].as_str()).and_then(|s| s.parse().ok()))
}

fn cluster_time(env: &Value) -> Option<u64> {
    let ts = &env["clusterTime"]["$timestamp"];
    Some((ts["t"].as_u64()? << 32) | (ts["i"].as_u64()? & 0xFFFF_FFFF))
}

impl Model {
    /// An empty model (no devices, no charges).
    pub fn new() -> Model {
        Model::default()
    }

    /// Applies one `device.upserted` record value (the envelope's bytes). Returns whether
    /// the registry changed; undecodable values change nothing.
    pub fn apply_device(&mut self, value: &[u8]) -> bool {
        let Ok(env) = serde_json::from_slice::<Value>(value) else { return false };
        let (Some(id), Some(at)) = (oid(&env["documentKey"]["_id"]), cluster_time(&env)) else { return false };
        if self.devices.get(&id).is_some_and(|(prev, _)| *prev >= at) {
            return false;
        }
        let doc = &env["fullDocument"];
        let entry = if env["operationType"] == "delete" || doc.is_null() {
            None
        } else {
            let Some(company) = oid(&doc["company"]) else { return false };
            let printer = match doc["kind"].as_str() {
                Some("printer") => true,
                Some("terminal") => false,
                _ => return false,
            };
            Some(DeviceEntry {
                company,
                printer,
                paired_printer: oid(&doc["pairedPrinter"]),
                enabled: doc["enabled"].as_bool().unwrap_or(true),
                default_for_company: doc["defaultForCompany"].as_bool().unwrap_or(false),
            })
        };
        self.devices.insert(id, (at, entry));
        true
    }

    fn device(&self, id: &str) -> Option<&DeviceEntry> {
        self.devices.get(id).and_then(|(_, d)| d.as_ref())
    }

    /// The company's enabled `defaultForCompany` printer. With several, pixgate's pick is
    /// unspecified (a hash map's order); the model takes the smallest id, and the
    /// generator gives every company exactly one.
    fn default_printer(&self, company: &str) -> Option<String> {
        let mut found: Vec<&String> = self
            .devices
            .iter()
            .filter(|(_, (_, d))| {
                d.as_ref().is_some_and(|d| d.company == company && d.enabled && d.default_for_company && d.printer)
            })
            .map(|(id, _)| id)
            .collect();
        found.sort();
        found.first().map(|s| s.to_string())
    }

    fn receipt_printer(&self, terminal: &DeviceEntry, company: &str) -> Option<String> {
        let paired = terminal
            .paired_printer
            .as_ref()
            .filter(|p| self.device(p).is_some_and(|d| d.printer && d.enabled && d.company == company));
        paired.cloned().or_else(|| self.default_printer(company))
    }

    /// Applies one `charge.upserted` record value and returns its fate.
    pub fn apply_charge(&mut self, value: &[u8]) -> Fate {
        let Ok(env) = serde_json::from_slice::<Value>(value) else { return Fate::DeadLetter("not_json".into()) };
        let Some(event_id) = env["eventId"].as_str().map(str::to_string) else {
            return Fate::DeadLetter("missing_field:eventId".into());
        };
        if self.seen.contains(&event_id) {
            return Fate::Ignored("duplicate_event");
        }
        if env["operationType"] == "delete" {
            return Fate::Ignored("delete_event");
        }
        let doc = &env["fullDocument"];
        if doc.is_null() {
            return Fate::Ignored("document_deleted_before_lookup");
        }
        let Some(id) = oid(&doc["_id"]) else { return Fate::DeadLetter("missing_field:_id".into()) };
        let Some(company) = oid(&doc["company"]) else { return Fate::DeadLetter("missing_field:company".into()) };
        let Some(value_cents) = integer(&doc["value"]).filter(|v| *v >= 0) else {
            return Fate::DeadLetter("invalid_field:value".into());
        };
        let status = match doc["status"].as_str() {
            Some("ACTIVE") => Status::Active,
            Some("COMPLETED") => Status::Completed,
            Some("EXPIRED") => Status::Expired,
            _ => return Fate::DeadLetter("invalid_field:status".into()),
        };
        let Some(version) = integer(&doc["__v"]) else { return Fate::DeadLetter("invalid_field:__v".into()) };
        if !doc["merchant"]["name"].is_string() || !doc["merchant"]["city"].is_string() {
            return Fate::DeadLetter("missing_field:merchant".into());
        }
        let previous = self.charges.get(&id).copied();
        if previous.is_some_and(|(v, _)| version <= v) {
            return Fate::Ignored("stale_version");
        }
        let fate = self.plan(&event_id, &id, &company, status, value_cents as u64, doc, previous.map(|(_, s)| s));
        if !matches!(fate, Fate::DeadLetter(_)) {
            self.charges.insert(id, (version, status));
            self.seen.insert(event_id);
        }
        fate
    }

    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        event_id: &str,
        charge: &str,
        company: &str,
        status: Status,
        value_cents: u64,
        doc: &Value,
        previous: Option<Status>,
    ) -> Fate {
        if previous == Some(status) {
            return Fate::Ignored("no_status_change");
        }
        let terminal = match oid(&doc["terminal"]) {
            None => None,
            Some(t) => match self.device(&t) {
                None => return Fate::DeadLetter("unknown_terminal".into()),
                Some(d) if d.company != company => return Fate::DeadLetter("terminal_of_another_company".into()),
                Some(d) if d.printer => return Fate::DeadLetter("terminal_is_not_a_card_machine".into()),
                Some(d) if !d.enabled => return Fate::Ignored("device_disabled"),
                Some(d) => Some((t, d)),
            },
        };
        let mut planned: Vec<(String, EffectKind)> = Vec::new();
        let mut dead: Vec<(EffectKind, &'static str)> = Vec::new();
        match (status, &terminal) {
            (Status::Active, Some((t, _))) => planned.push((t.clone(), EffectKind::DisplayQr)),
            (Status::Expired, Some((t, _))) => planned.push((t.clone(), EffectKind::ChargeExpired)),
            (Status::Completed, Some((t, d))) => {
                planned.push((t.clone(), EffectKind::PaymentConfirmed));
                match self.receipt_printer(d, company) {
                    Some(p) => planned.push((p, EffectKind::PrintReceipt)),
                    None => dead.push((EffectKind::PrintReceipt, "no_printer_for_receipt")),
                }
            }
            (Status::Completed, None) => match self.default_printer(company) {
                Some(p) => planned.push((p, EffectKind::PrintReceipt)),
                None => dead.push((EffectKind::PrintReceipt, "no_default_printer")),
            },
            (Status::Active | Status::Expired, None) => return Fate::Ignored("no_device_concerned"),
        }
        let payload_problem = pix_payload_problem(doc, value_cents);
        let mut effects = Vec::new();
        for (device, kind) in planned {
            // Only what shows a QR needs the payload: a paid receipt prints the ids as text.
            let needs_payload = matches!(kind, EffectKind::DisplayQr);
            match payload_problem {
                Some(reason) if needs_payload => dead.push((kind, reason)),
                _ => effects.push(ExpectedEffect {
                    message_id: device_protocol::message_id(event_id, &device, kind),
                    device,
                    charge: charge.to_string(),
                    kind,
                    event_id: event_id.to_string(),
                }),
            }
        }
        Fate::Effects { effects, dead }
    }
}

/// Why no Pix payload can be shown for this charge document, if so.
fn pix_payload_problem(doc: &Value, value_cents: u64) -> Option<&'static str> {
    match doc["brCode"].as_str() {
        Some(payload) => match render::brcode::parse(payload) {
            Err(_) => Some("invalid_brcode"),
            Ok(p) if p.amount_cents().is_some_and(|c| c != value_cents) => Some("brcode_amount_mismatch"),
            Ok(p) if p.leaves_amount_to_payer() && value_cents > 0 => Some("brcode_amount_mismatch"),
            Ok(_) => None,
        },
        None if !doc["pixKey"].is_string() => Some("static_brcode_unbuildable"),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::read_records;
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/cdc").join(name)
    }

    fn model_with_devices() -> Model {
        let mut m = Model::new();
        for r in read_records(&fixture("devices.jsonl")).unwrap() {
            assert!(m.apply_device(&r.value));
        }
        m
    }

    /// The model reproduces the contract's own `expected.json`, effect for effect and in
    /// order: the same file the end-to-end test checks pixgate's output against.
    #[test]
    fn model_reproduces_expected_json() {
        let mut m = model_with_devices();
        let mut got: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for r in read_records(&fixture("charges.jsonl")).unwrap() {
            let fate = m.apply_charge(&r.value);
            assert!(
                matches!(fate, Fate::Effects { ref dead, .. } if dead.is_empty()) || matches!(fate, Fate::Ignored(_)),
                "{fate:?}"
            );
            let entry = got.entry(r.key.clone().unwrap()).or_default();
            entry.extend(fate.effects().iter().map(|e| (e.device.clone(), e.kind.as_str().to_string())));
        }
        assert_eq!(got, read_expected_json(&fixture("expected.json")).unwrap());
    }

    /// The edge cases end as pixgate counts them (the end-to-end test's reason table).
    #[test]
    fn edge_cases_have_the_reasons_pixgate_counts() {
        let mut m = model_with_devices();
        for r in read_records(&fixture("charges.jsonl")).unwrap() {
            m.apply_charge(&r.value);
        }
        let fates: Vec<String> = read_records(&fixture("edge-cases.jsonl"))
            .unwrap()
            .iter()
            .map(|r| match m.apply_charge(&r.value) {
                Fate::Ignored(reason) => reason.to_string(),
                Fate::DeadLetter(reason) => reason,
                Fate::Effects { effects, dead } => {
                    assert!(
                        effects.iter().all(|e| e.kind != EffectKind::DisplayQr),
                        "a bad QR would be shown: {effects:?}"
                    );
                    dead.iter().map(|(_, r)| r.to_string()).collect::<Vec<_>>().join(",")
                }
            })
            .collect();
        assert_eq!(
            fates,
            [
                "duplicate_event",
                "document_deleted_before_lookup",
                "delete_event",
                "invalid_field:status",
                "not_json",
                "not_json",
                "invalid_brcode",
                "invalid_brcode",
                "unknown_terminal",
                "terminal_of_another_company",
                "stale_version",
                "invalid_field:value",
                "missing_field:company",
                "invalid_field:value",
            ]
        );
    }

    #[test]
    fn registry_changes_apply_by_cluster_time() {
        let dev = |t: u64, enabled: bool, op: &str| {
            serde_json::to_vec(&serde_json::json!({
                "eventId": format!("Device:p:{t}"), "operationType": op,
                "documentKey": {"_id": {"$oid": "p"}}, "clusterTime": {"$timestamp": {"t": t, "i": 1}},
                "fullDocument": if op == "delete" { Value::Null } else { serde_json::json!({"_id": {"$oid": "p"}, "company": {"$oid": "c"}, "kind": "printer", "defaultForCompany": true, "enabled": enabled}) },
            }))
            .unwrap()
        };
        let mut m = Model::new();
        assert!(m.apply_device(&dev(2, true, "insert")));
        assert!(!m.apply_device(&dev(1, false, "update")), "older event is stale");
        assert_eq!(m.default_printer("c").as_deref(), Some("p"));
        assert!(m.apply_device(&dev(3, true, "delete")));
        assert_eq!(m.default_printer("c"), None);
    }
}
