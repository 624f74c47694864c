//! Malformed records and unusable Pix payloads interleaved with good events on one
//! partition: each bad record, and each effect that cannot be carried out, ends on
//! `pixgate.deadletter` with its reason and source position (read back from Kafka); every
//! good event's effects are delivered; the partition keeps flowing (pixgate's committed
//! offset reaches its end).
//!
//! Covered reasons, by where pixgate decides them:
//! - envelope (`cdc::decode_envelope`): `not_json` (truncated, binary, an array),
//!   `missing_field:eventId`, `invalid_field:operationType`, `missing_field:documentKey._id`,
//!   `invalid_field:clusterTime`, `invalid_field:fullDocument`;
//! - charge document (`cdc::decode_charge`): `missing_field:company`,
//!   `invalid_field:value` (decimal string, negative), `invalid_field:status`,
//!   `missing_field:__v`, `missing_field:merchant`, `missing_field:merchant.name`,
//!   `invalid_field:terminal`, `invalid_field:paidAt`;
//! - routing (`router`): `unknown_terminal`, `terminal_of_another_company`,
//!   `terminal_is_not_a_card_machine`;
//! - one effect (`jobs::render_job`, `router` unroutable): `invalid_brcode` (bad CRC on a
//!   QR; a paid charge's bad `brCode` holds back neither its screen nor its receipt),
//!   `brcode_amount_mismatch`, `static_brcode_unbuildable`, `receipt_unrenderable` (a code
//!   page the printer model lacks), `no_printer_for_receipt`, `no_default_printer`;
//! - device registry (`cdc::decode_device`): `not_json`, `missing_field:company`,
//!   `invalid_field:kind`, `invalid_field:printer.paperWidthMm`,
//!   `invalid_field:printer.codePage`, `invalid_field:screen.widthPx`.
//!
//! Not covered here: `delivery_failed` (a device refusing a job; needs a device fault, not
//! a malformed record).

// Helpers of a test are test steps too: a panic is a failed test (clippy.toml's
// allow-unwrap-in-tests covers only the #[test] fns themselves).
#![allow(clippy::unwrap_used)]

use device_protocol::EffectKind;
use pixgate_tests::gateway::{count, stats_json, stats_or_error, total};
use pixgate_tests::harness::{verifying_devices, Rig};
use pixgate_tests::scenario::Plan;
use serde_json::{json, Value};
use simulators::capture::{self, generate::ScenarioConfig, publish_records_at, CaptureRecord};
use simulators::device::Stats;
use simulators::expected::Model;
use simulators::registry::devices_from_records;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one bad record must cause: dead letters `(reason, effect kind if one effect)` and
/// effects `(device, kind)` that still go out.
struct Bad {
    record: CaptureRecord,
    dead: Vec<(&'static str, Option<EffectKind>)>,
    effects: Vec<(String, EffectKind)>,
}

fn raw(topic: &str, key: &str, bytes: &[u8]) -> CaptureRecord {
    CaptureRecord { topic: topic.into(), key: Some(key.into()), value: bytes.to_vec() }
}

fn rec(topic: &str, key: &str, v: &Value) -> CaptureRecord {
    raw(topic, key, &serde_json::to_vec(v).unwrap())
}

/// A change event for document `id` of `coll` at oplog position (`t`, `i`).
fn envelope(coll: &str, id: &str, i: u32, doc: Value) -> Value {
    json!({
        "eventId": format!("{coll}:{id}:{}", (1_800_000_000u64 << 32) | i as u64),
        "operationType": "insert",
        "ns": {"db": "payments", "coll": coll},
        "documentKey": {"_id": {"$oid": id}},
        "clusterTime": {"$timestamp": {"t": 1_800_000_000u64, "i": i}},
        "wallTime": {"$date": "2027-01-15T08:00:00.000Z"},
        "fullDocument": doc,
    })
}

fn oid(n: u32) -> String {
    format!("badbadbadbad{n:012x}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_records_and_payloads_are_dead_lettered_and_the_partition_flows() {
    // Good traffic: a generated registry, and of its charges one event each (the insert,
    // or the payment of a charge without a card machine), so no QR can be superseded.
    let plan = Plan::new(ScenarioConfig::new(99, 16, 400));
    let mut keys = HashSet::new();
    let good: Vec<CaptureRecord> = plan
        .charges
        .iter()
        .zip(&plan.fates)
        .filter(|(r, f)| {
            keys.insert(r.key.clone())
                || (f.effects().len() == 1
                    && f.effects()[0].kind == EffectKind::PrintReceipt
                    && !String::from_utf8_lossy(&r.value).contains("\"terminal\""))
        })
        .map(|(r, _)| r.clone())
        .take(120)
        .collect();
    let registry: Vec<Value> =
        plan.scenario.device_records().iter().map(|r| serde_json::from_slice(&r.value).unwrap()).collect();
    let docs: Vec<&Value> = registry.iter().map(|e| &e["fullDocument"]).collect();
    let terminal = docs.iter().find(|d| d["kind"] == "terminal" && d["enabled"] == true).expect("a terminal");
    let (t_id, company) = (
        terminal["_id"]["$oid"].as_str().unwrap().to_string(),
        terminal["company"]["$oid"].as_str().unwrap().to_string(),
    );
    let printer_same_company =
        docs.iter().find(|d| d["kind"] == "printer" && d["company"]["$oid"] == company.as_str()).unwrap()["_id"]
            ["$oid"]
            .as_str()
            .unwrap()
            .to_string();
    // A card machine whose paired printer prints its receipts (enabled, same company).
    let (paired_terminal, paired_printer) = docs
        .iter()
        .filter(|d| d["kind"] == "terminal" && d["enabled"] == true)
        .find_map(|t| {
            let p = t["pairedPrinter"]["$oid"].as_str()?;
            let printer = docs.iter().find(|d| {
                d["_id"]["$oid"] == p && d["kind"] == "printer" && d["enabled"] == true && d["company"] == t["company"]
            })?;
            Some((t["_id"]["$oid"].as_str()?.to_string(), printer["_id"]["$oid"].as_str()?.to_string()))
        })
        .expect("a card machine with a paired printer");
    let foreign_terminal = docs
        .iter()
        .find(|d| d["kind"] == "terminal" && d["company"]["$oid"] != company.as_str())
        .expect("another company's terminal")["_id"]["$oid"]
        .as_str()
        .unwrap()
        .to_string();

    // Extra registry: company X has a card machine and no printer at all; company Y's only
    // printer is a Bematech set to WPC1252, a table that model does not have.
    let (x, tx, y, py, ty) = (oid(0xc0), oid(0xc1), oid(0xc2), oid(0xc3), oid(0xc4));
    let mut device_records: Vec<CaptureRecord> = plan.scenario.device_records().to_vec();
    let dev = |id: &str, i: u32, doc: Value| rec("device.upserted", id, &envelope("Device", id, i, doc));
    device_records.push(dev(&tx, 1, json!({"_id": {"$oid": tx}, "company": {"$oid": x}, "kind": "terminal", "screen": {"widthPx": 720, "heightPx": 1280}, "enabled": true})));
    device_records.push(dev(&py, 2, json!({"_id": {"$oid": py}, "company": {"$oid": y}, "kind": "printer", "model": "Bematech MP-4200 TH", "printer": {"paperWidthMm": 80, "codePage": "WPC1252", "nativeQr": false}, "defaultForCompany": true, "enabled": true})));
    device_records.push(dev(&ty, 3, json!({"_id": {"$oid": ty}, "company": {"$oid": y}, "kind": "terminal", "pairedPrinter": {"$oid": py}, "enabled": true})));

    // Bad device records, interleaved with the good ones on partition 0.
    let mut n = 0x100;
    let mut next_id = || {
        n += 1;
        oid(n)
    };
    let printer_doc = |id: &str| json!({"_id": {"$oid": id}, "company": {"$oid": x}, "kind": "printer", "printer": {"paperWidthMm": 80, "codePage": "CP860"}, "enabled": true});
    let mut bad_devices: Vec<Bad> = Vec::new();
    let mut bad_device = |record: CaptureRecord, reason: &'static str| {
        bad_devices.push(Bad { record, dead: vec![(reason, None)], effects: vec![] })
    };
    bad_device(raw("device.upserted", &next_id(), b"\x00\xff\xfe not a device"), "not_json");
    let id = next_id();
    let mut d = printer_doc(&id);
    d.as_object_mut().unwrap().remove("company");
    bad_device(dev(&id, 10, d), "missing_field:company");
    let id = next_id();
    let mut d = printer_doc(&id);
    d["kind"] = json!("toaster");
    bad_device(dev(&id, 11, d), "invalid_field:kind");
    let id = next_id();
    let mut d = printer_doc(&id);
    d["printer"]["paperWidthMm"] = json!(72);
    bad_device(dev(&id, 12, d), "invalid_field:printer.paperWidthMm");
    let id = next_id();
    let mut d = printer_doc(&id);
    d["printer"]["codePage"] = json!("CP999");
    bad_device(dev(&id, 13, d), "invalid_field:printer.codePage");
    let id = next_id();
    bad_device(
        dev(
            &id,
            14,
            json!({"_id": {"$oid": id}, "company": {"$oid": x}, "kind": "terminal", "screen": {"widthPx": 10, "heightPx": 1280}}),
        ),
        "invalid_field:screen.widthPx",
    );

    // Bad charge events, built from a good one (ACTIVE on terminal T) with one thing wrong.
    let template: Value = plan
        .charges
        .iter()
        .map(|r| serde_json::from_slice::<Value>(&r.value).unwrap())
        .find(|v| {
            v["operationType"] == "insert"
                && v["fullDocument"]["terminal"]["$oid"] == t_id.as_str()
                && v["fullDocument"]["brCode"].is_null()
        })
        .expect("an ACTIVE charge on T");
    let mut i = 0u32;
    let mut charge = |edit: &dyn Fn(&mut Value, &mut Value)| -> CaptureRecord {
        i += 1;
        let id = oid(0x1000 + i);
        let mut env = template.clone();
        env["eventId"] = json!(format!("Charge:{id}:{i}"));
        env["documentKey"] = json!({"_id": {"$oid": id}});
        env["fullDocument"]["_id"] = json!({"$oid": id});
        let mut doc = env["fullDocument"].take();
        edit(&mut env, &mut doc);
        if env.get("fullDocument").is_some_and(Value::is_null) {
            env["fullDocument"] = doc;
        }
        rec("charge.upserted", &id, &env)
    };
    let paid = |doc: &mut Value| {
        doc["status"] = json!("COMPLETED");
        doc["paidAt"] = json!({"$date": "2027-01-15T08:01:00.000Z"});
    };
    let valid_dynamic =
        render::brcode::encode_dynamic("pix.example.com/qr/v2/abc123", Some(1234), "Loja", "Recife").unwrap();
    let mut bad_crc = valid_dynamic.clone();
    let last = bad_crc.pop().unwrap();
    bad_crc.push(if last == '0' { '1' } else { '0' });
    let bad_currency = {
        let body = valid_dynamic[..valid_dynamic.len() - 4].replace("5303986", "5303840");
        format!("{body}{:04X}", render::brcode::crc16(body.as_bytes()))
    };
    let mut bad: Vec<Bad> = Vec::new();
    let whole = |reason: &'static str| vec![(reason, None)];
    let mut push = |record: CaptureRecord,
                    dead: Vec<(&'static str, Option<EffectKind>)>,
                    effects: Vec<(String, EffectKind)>| bad.push(Bad { record, dead, effects });
    push(
        raw("charge.upserted", &oid(0x2001), br#"{"eventId": "Charge:broken", "operationType": "upd"#),
        whole("not_json"),
        vec![],
    );
    push(raw("charge.upserted", &oid(0x2002), b"\x00\xff binary garbage \xfe"), whole("not_json"), vec![]);
    push(raw("charge.upserted", &oid(0x2003), b"[1, 2, 3]"), whole("not_json"), vec![]);
    push(
        charge(&|e, _| {
            e.as_object_mut().unwrap().remove("eventId");
        }),
        whole("missing_field:eventId"),
        vec![],
    );
    push(charge(&|e, _| e["operationType"] = json!("upsert")), whole("invalid_field:operationType"), vec![]);
    push(charge(&|e, _| e["documentKey"] = json!({})), whole("missing_field:documentKey._id"), vec![]);
    push(
        charge(&|e, _| e["clusterTime"]["$timestamp"]["t"] = json!("soon")),
        whole("invalid_field:clusterTime"),
        vec![],
    );
    push(charge(&|e, _| e["fullDocument"] = json!("not a document")), whole("invalid_field:fullDocument"), vec![]);
    push(
        charge(&|_, d| {
            d.as_object_mut().unwrap().remove("company");
        }),
        whole("missing_field:company"),
        vec![],
    );
    push(charge(&|_, d| d["value"] = json!("45.99")), whole("invalid_field:value"), vec![]);
    push(charge(&|_, d| d["value"] = json!(-100)), whole("invalid_field:value"), vec![]);
    push(charge(&|_, d| d["status"] = json!("PAID")), whole("invalid_field:status"), vec![]);
    push(
        charge(&|_, d| {
            d.as_object_mut().unwrap().remove("__v");
        }),
        whole("missing_field:__v"),
        vec![],
    );
    push(
        charge(&|_, d| {
            d.as_object_mut().unwrap().remove("merchant");
        }),
        whole("missing_field:merchant"),
        vec![],
    );
    push(charge(&|_, d| d["merchant"] = json!({"city": "Recife"})), whole("missing_field:merchant.name"), vec![]);
    push(charge(&|_, d| d["terminal"] = json!(42)), whole("invalid_field:terminal"), vec![]);
    push(
        charge(&|_, d| {
            paid(d);
            d["paidAt"] = json!({"$date": "yesterday"});
        }),
        whole("invalid_field:paidAt"),
        vec![],
    );
    push(
        charge(&|_, d| d["terminal"] = json!({"$oid": "0123456789abcdef01234567"})),
        whole("unknown_terminal"),
        vec![],
    );
    let ft = foreign_terminal.clone();
    push(charge(&move |_, d| d["terminal"] = json!({"$oid": ft})), whole("terminal_of_another_company"), vec![]);
    let pp = printer_same_company.clone();
    push(charge(&move |_, d| d["terminal"] = json!({"$oid": pp})), whole("terminal_is_not_a_card_machine"), vec![]);
    // One effect dead-lettered, the others of the same event still delivered.
    let (c1, c2) = (bad_crc.clone(), bad_currency.clone());
    push(charge(&move |_, d| d["brCode"] = json!(c1)), vec![("invalid_brcode", Some(EffectKind::DisplayQr))], vec![]);
    // A paid receipt carries no QR, so a bad `brCode` does not hold it back: the payment is
    // done, and its screen and receipt both go out.
    let pt = paired_terminal.clone();
    push(
        charge(&move |_, d| {
            paid(d);
            d["terminal"] = json!({"$oid": pt});
            d["brCode"] = json!(c2);
        }),
        vec![],
        vec![
            (paired_terminal.clone(), EffectKind::PaymentConfirmed),
            (paired_printer.clone(), EffectKind::PrintReceipt),
        ],
    );
    let vd = valid_dynamic.clone();
    push(
        charge(&move |_, d| {
            d["brCode"] = json!(vd);
            d["value"] = json!(999);
        }),
        vec![("brcode_amount_mismatch", Some(EffectKind::DisplayQr))],
        vec![],
    );
    push(
        charge(&|_, d| {
            d.as_object_mut().unwrap().remove("pixKey");
        }),
        vec![("static_brcode_unbuildable", Some(EffectKind::DisplayQr))],
        vec![],
    );
    let (xx, txx) = (x.clone(), tx.clone());
    push(
        charge(&move |_, d| {
            paid(d);
            d["company"] = json!({"$oid": xx});
            d["terminal"] = json!({"$oid": txx});
        }),
        vec![("no_printer_for_receipt", Some(EffectKind::PrintReceipt))],
        vec![(tx.clone(), EffectKind::PaymentConfirmed)],
    );
    let xx = x.clone();
    push(
        charge(&move |_, d| {
            paid(d);
            d["company"] = json!({"$oid": xx});
            d.as_object_mut().unwrap().remove("terminal");
        }),
        vec![("no_default_printer", Some(EffectKind::PrintReceipt))],
        vec![],
    );
    let (yy, tyy) = (y.clone(), ty.clone());
    push(
        charge(&move |_, d| {
            paid(d);
            d["company"] = json!({"$oid": yy});
            d["terminal"] = json!({"$oid": tyy});
        }),
        vec![("receipt_unrenderable", Some(EffectKind::PrintReceipt))],
        vec![(ty.clone(), EffectKind::PaymentConfirmed)],
    );

    // Interleave: bad ones spread between the good ones, everything on partition 0.
    let interleave = |good: &[CaptureRecord], bad: &[Bad]| -> (Vec<CaptureRecord>, Vec<Option<usize>>) {
        let (mut out, mut which) = (Vec::new(), Vec::new());
        let step = (good.len() / (bad.len() + 1)).max(1);
        let mut b = bad.iter().enumerate();
        for (k, g) in good.iter().enumerate() {
            out.push(g.clone());
            which.push(None);
            if k % step == step - 1 {
                if let Some((j, x)) = b.next() {
                    out.push(x.record.clone());
                    which.push(Some(j));
                }
            }
        }
        for (j, x) in b {
            out.push(x.record.clone());
            which.push(Some(j));
        }
        (out, which)
    };
    let (device_stream, device_which) = interleave(&device_records, &bad_devices);
    let (charge_stream, charge_which) = interleave(&good, &bad);

    // What the good records must cause, from the model of the routing rules.
    let mut model = Model::new();
    for r in &device_records {
        model.apply_device(&r.value);
    }
    let mut want: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for r in &good {
        for e in model.apply_charge(&r.value).effects() {
            *want.entry((e.device.clone(), e.charge.clone(), e.kind.as_str().into())).or_default() += 1;
        }
    }
    for b in &bad {
        for (device, kind) in &b.effects {
            *want.entry((device.clone(), b.record.key.clone().unwrap(), kind.as_str().into())).or_default() += 1;
        }
    }
    let want_total: usize = want.values().sum();

    let rig = Rig::builder("dead-letters").start().await;
    let stats = Arc::new(Stats::default());
    let fleet = rig.start_fleet(devices_from_records(&device_records), verifying_devices(&stats)).await;

    let producer = rig.producer();
    let device_pos = publish_records_at(&producer, &device_stream, Some(0)).await.unwrap();
    let n_devices = device_stream.len() as u64;
    let deadline = Instant::now() + Duration::from_secs(180);
    pixgate_tests::demo::wait_until(rig.gateway(), deadline, |s| {
        s.counters.events_read.get("device.upserted").copied() >= Some(n_devices) && s.counters.pending_records == 0
    })
    .await
    .unwrap();
    let charge_pos = publish_records_at(&producer, &charge_stream, Some(0)).await.unwrap();
    let n_charges = charge_stream.len() as u64;
    pixgate_tests::demo::wait_until(rig.gateway(), deadline, |s| {
        let c = &s.counters;
        c.events_read.get("charge.upserted").copied() >= Some(n_charges)
            && c.pending_records == 0
            && c.queued_jobs == 0
            && c.outbox_jobs == 0
            && stats.carried_out() >= want_total as u64
    })
    .await
    .unwrap();

    // The partition flowed to its end: pixgate committed past every record, bad ones too.
    let committed_end = |topic: &'static str, end: i64| {
        let (b, g) = (rig.brokers().to_string(), rig.settings().group_id.clone());
        async move { pixgate_tests::kafka::wait_committed(&b, &g, topic, 1, deadline, |c| c[0] >= end).await.unwrap()[0] }
    };
    assert_eq!(
        committed_end("charge.upserted", charge_pos.last().unwrap().1 + 1).await,
        charge_pos.last().unwrap().1 + 1
    );
    committed_end("device.upserted", device_pos.last().unwrap().1 + 1).await;

    // Every good effect delivered, exactly, and nothing else.
    let report_effects = stats.effects();
    let mut got: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for e in &report_effects {
        *got.entry((e.device.clone(), e.charge.clone(), e.kind.as_str().into())).or_default() += 1;
    }
    assert_eq!(got, want, "effects delivered differ from the good records' effects");

    // The dead letters, read back from Kafka: one per bad record (or bad effect), with the
    // reason, the source topic, partition and offset, the key and the original bytes.
    let mut expected_dl: BTreeMap<(String, i64, Option<String>), (&'static str, &CaptureRecord)> = BTreeMap::new();
    for (stream, which, pos, bads) in
        [(&device_stream, &device_which, &device_pos, &bad_devices), (&charge_stream, &charge_which, &charge_pos, &bad)]
    {
        for (k, w) in which.iter().enumerate() {
            let Some(j) = w else { continue };
            for (reason, kind) in &bads[*j].dead {
                let prev = expected_dl.insert(
                    (stream[k].topic.clone(), pos[k].1, kind.map(|k| k.as_str().to_string())),
                    (reason, &stream[k]),
                );
                assert!(prev.is_none());
            }
        }
    }
    let s = rig.gateway().stats().unwrap();
    let counted = total(&s.counters.dead_lettered_records) + total(&s.counters.dead_lettered_effects);
    assert_eq!(counted as usize, expected_dl.len(), "dead letters counted on /stats: {}", stats_json(&s));
    let dls = pixgate_tests::kafka::read_topic(
        rig.brokers(),
        "pixgate.deadletter",
        1,
        expected_dl.len(),
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let mut seen = BTreeMap::new();
    for m in &dls {
        let dl: Value = serde_json::from_slice(&m.value).unwrap();
        let key = (
            dl["source_topic"].as_str().unwrap().to_string(),
            dl["source_offset"].as_i64().unwrap(),
            dl["effect"].as_str().map(str::to_string),
        );
        let Some((reason, record)) = expected_dl.get(&key) else { panic!("unexpected dead letter {dl}") };
        assert_eq!(dl["reason"], *reason, "{dl}");
        assert_eq!(dl["source_partition"], 0, "{dl}");
        assert_eq!(dl["key"].as_str(), record.key.as_deref(), "{dl}");
        use base64::Engine;
        let original = base64::engine::general_purpose::STANDARD.decode(dl["value_base64"].as_str().unwrap()).unwrap();
        assert_eq!(original, record.value, "{dl}: the dead letter carries the original bytes");
        assert!(dl["detail"].as_str().is_some_and(|d| !d.is_empty()), "{dl}");
        if key.2.is_some() && !reason.starts_with("no_") {
            assert!(
                dl["device"].is_string() && dl["message_id"].is_string(),
                "an effect's dead letter names its device and job: {dl}"
            );
        }
        assert!(seen.insert(key, reason).is_none(), "dead letter written twice: {dl}");
    }
    assert_eq!(seen.len(), expected_dl.len());
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for (r, _) in expected_dl.values() {
        *reasons.entry(r).or_default() += 1;
    }
    println!(
        "dead letters: {} good charge events and {} device records delivered {} effects; {} dead letters read back from pixgate.deadletter, each with its reason and source offset: {reasons:?}",
        good.len(),
        device_records.len(),
        report_effects.len(),
        dls.len()
    );
    fleet.shutdown().await;
    rig.shutdown();
}

/// An effect's dead letter survives pixgate dying before Kafka took it: it is parked in the
/// outbox in the same transaction as the charge's new state, and published from there. (Were
/// it written to Kafka only after that transaction, the record read again after the restart
/// would be `stale_version` and no dead letter would ever be written.)
///
/// Deterministic reproduction: `pixgate.deadletter` does not exist yet, so the write cannot
/// succeed; pixgate is killed while retrying it; the topic is created; pixgate restarts.
/// Expected: the dead letter is on the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effect_dead_letter_survives_a_crash_before_kafka_took_it() {
    let plan = Plan::new(ScenarioConfig::new(5, 8, 40));
    // No pixgate.deadletter topic yet: a dead letter cannot be written to Kafka.
    let mut rig = Rig::builder("dl-crash").topics(&[("device.upserted", 3), ("charge.upserted", 3)]).start().await;
    let producer = rig.producer();
    let n = plan.scenario.device_records().len() as u64;
    publish_records_at(&producer, plan.scenario.device_records(), None).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    pixgate_tests::demo::wait_until(rig.gateway(), deadline, |s| s.counters.devices_applied >= n).await.unwrap();

    // An ACTIVE charge on a card machine whose BR Code fails its CRC: its QR must be
    // dead-lettered with reason invalid_brcode.
    let mut env: Value = plan
        .charges
        .iter()
        .map(|r| serde_json::from_slice::<Value>(&r.value).unwrap())
        .find(|v| v["operationType"] == "insert" && v["fullDocument"]["terminal"].is_object())
        .expect("an ACTIVE charge on a card machine");
    let mut code = render::brcode::encode_dynamic("pix.example.com/qr/v2/crash", None, "Loja", "Recife").unwrap();
    let last = code.pop().unwrap();
    code.push(if last == '0' { '1' } else { '0' });
    env["fullDocument"]["brCode"] = json!(code);
    let key = env["documentKey"]["_id"]["$oid"].as_str().unwrap().to_string();
    let landed = publish_records_at(&producer, &[rec("charge.upserted", &key, &env)], None).await.unwrap();
    pixgate_tests::demo::wait_until(rig.gateway(), deadline, |s| {
        count(&s.counters.dead_lettered_effects, "invalid_brcode") == 1 && s.counters.deadletters_parked == 1
    })
    .await
    .unwrap();

    rig.kill_gateway();
    capture::ensure_topics(rig.brokers(), &[("pixgate.deadletter", 1)]).await.unwrap();
    rig.start_gateway();
    // The record is read again and finished (committed) by the restarted gateway.
    let (b, g, (p, o)) = (rig.brokers().to_string(), rig.settings().group_id.clone(), landed[0]);
    if let Err(e) =
        pixgate_tests::kafka::wait_committed(&b, &g, "charge.upserted", 3, deadline, |c| c[p as usize] > o).await
    {
        panic!("the record was never committed: {e}; stats {}", stats_or_error(&rig.gateway().stats()));
    }
    let stats = stats_json(&rig.gateway().stats().unwrap());
    let dls = pixgate_tests::kafka::read_topic(
        rig.brokers(),
        "pixgate.deadletter",
        1,
        1,
        Duration::from_secs(1),
        Duration::from_secs(40),
    )
    .await;
    let dls = dls.unwrap_or_else(|e| {
        panic!("the invalid_brcode dead letter is lost: {e}; after the restart pixgate counted {stats}")
    });
    let dl: Value = serde_json::from_slice(&dls[0].value).unwrap();
    assert_eq!(dl["reason"], "invalid_brcode");
    assert_eq!(dl["source_offset"], o);
    rig.shutdown();
}

/// A record too large to go whole onto `pixgate.deadletter` once dead-lettered (its value
/// is carried twice, as text and base64): it goes without its value, saying where the
/// record is, instead of staying parked and holding back every dead letter after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_too_large_for_its_topic_goes_without_its_value() {
    let rig = Rig::builder("dl-large").start().await;
    let producer = rig.producer();
    let big = vec![b'x'; 600_000];
    let small = b"not json either".to_vec();
    let landed = publish_records_at(
        &producer,
        &[raw("charge.upserted", "c-big", &big), raw("charge.upserted", "c-small", &small)],
        None,
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let published = pixgate_tests::demo::wait_until(rig.gateway(), deadline, |s| {
        count(&s.counters.dead_lettered_records, "not_json") == 2 && s.counters.deadletters_published == 2
    })
    .await;
    assert!(published.is_ok(), "both dead letters published: {published:?}");
    let dls = pixgate_tests::kafka::read_topic(
        rig.brokers(),
        "pixgate.deadletter",
        1,
        2,
        Duration::from_secs(1),
        Duration::from_secs(40),
    )
    .await
    .unwrap();
    let by_key = |key: &str| -> Value {
        let r = dls.iter().find(|r| r.key == key.as_bytes()).unwrap_or_else(|| panic!("no dead letter for {key}"));
        serde_json::from_slice(&r.value).unwrap()
    };
    let trimmed = by_key("c-big");
    assert_eq!(trimmed["reason"], "not_json");
    assert_eq!(trimmed["source_offset"], landed[0].1);
    assert_eq!(trimmed["value_base64"], "");
    assert!(trimmed["value"].is_null());
    let why = trimmed["value_unavailable"].as_str().unwrap();
    assert!(why.contains("over what the dead-letter topic takes") && why.contains("charge.upserted/"), "{why}");
    let whole = by_key("c-small");
    assert_eq!(whole["value"], "not json either");
    rig.shutdown();
}
