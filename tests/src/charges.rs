//! Hand-made `charge.upserted` records for scenario tests: a fixture charge re-dated to now
//! and pointed at a chosen card machine, with its own id, status, `__v` and expiry.

use serde_json::{json, Value};
use simulators::capture::CaptureRecord;
use std::path::Path;

/// The first record of `fixtures/charges.jsonl`, the template of [`charge_record`].
///
/// # Panics
/// The file is missing or its first line is not JSON.
pub fn template(fixtures: &Path) -> Value {
    let text = std::fs::read_to_string(fixtures.join("charges.jsonl")).expect("charges.jsonl");
    serde_json::from_str(text.lines().next().expect("a first line")).expect("JSON")
}

/// A `charge.upserted` record for charge `id` (24 hex digits) created on `terminal`, from
/// `template` (its company, value and brCode, so the terminal must be of that company):
/// `status` (`ACTIVE`, `COMPLETED`, `EXPIRED`) at `__v` = `v`, dated now, expiring
/// `expires_in_min` minutes from now; `t` is the oplog second of its `clusterTime`.
pub fn charge_record(
    template: &Value,
    terminal: &str,
    id: &str,
    status: &str,
    v: i64,
    expires_in_min: i64,
    t: u64,
) -> CaptureRecord {
    let now = chrono::Utc::now();
    let date =
        |d: chrono::DateTime<chrono::Utc>| json!({ "$date": d.to_rfc3339_opts(chrono::SecondsFormat::Millis, true) });
    let mut value = template["value"].clone();
    // The contract's id: `Charge:<_id>:<clusterTime as (t << 32 | i)>`.
    let i = v as u64 + 1;
    value["eventId"] = json!(format!("Charge:{id}:{}", t << 32 | i));
    value["operationType"] = json!(if v == 0 { "insert" } else { "update" });
    value["documentKey"]["_id"]["$oid"] = json!(id);
    value["clusterTime"] = json!({ "$timestamp": { "t": t, "i": i } });
    value["wallTime"] = date(now);
    let doc = &mut value["fullDocument"];
    doc["_id"]["$oid"] = json!(id);
    doc["status"] = json!(status);
    doc["__v"] = json!(v);
    doc["terminal"]["$oid"] = json!(terminal);
    doc["createdAt"] = date(now);
    doc["updatedAt"] = date(now);
    doc["expiresDate"] = date(now + chrono::Duration::minutes(expires_in_min));
    if status == "COMPLETED" {
        doc["paidAt"] = date(now);
        doc["payer"] = json!({ "name": "Maria da Silva" });
        doc["endToEndId"] = json!(format!("E1234567820261130{id}"));
    }
    CaptureRecord {
        topic: "charge.upserted".into(),
        key: Some(id.into()),
        value: serde_json::to_vec(&value).expect("JSON"),
    }
}
