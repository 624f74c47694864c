//! The whole product on real parts: a tansu broker on loopback, the `pixgate` binary with
//! its embedded MQTT broker, one simulated device per registry entry connected over MQTT,
//! and the bundled CDC fixtures fed through the capture simulator. Then everything the
//! devices did is checked against `fixtures/cdc/expected.json`, by decoding what they
//! made (QR codes from the PNGs, text from the printer transcripts): every QR shown or on a
//! pay-with-Pix slip is the charge's BR Code, and no paid receipt carries a QR.

// Helpers of a test are test steps too: a panic is a failed test (clippy.toml's
// allow-unwrap-in-tests covers only the #[test] fns themselves).
#![allow(clippy::unwrap_used)]

use pixgate_tests::demo::{self, DemoConfig};
use pixgate_tests::gateway;
use render::locale::Label;
use render::Locale;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

fn fixtures() -> PathBuf {
    demo::default_fixtures()
}

fn read_jsonl(name: &str) -> Vec<Value> {
    std::fs::read_to_string(fixtures().join(name)).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The receipt locale of each device id (its last `locale`), from `devices.jsonl`.
fn device_locales() -> HashMap<String, Locale> {
    let mut out = HashMap::new();
    for rec in read_jsonl("devices.jsonl") {
        if let Some(tag) = rec["value"]["fullDocument"]["locale"].as_str() {
            out.insert(rec["key"].as_str().unwrap().to_string(), Locale::from_tag(tag));
        }
    }
    out
}

/// Last known merchant name and value per charge id, from `charges.jsonl`.
fn charge_docs() -> HashMap<String, Value> {
    let mut docs = HashMap::new();
    for rec in read_jsonl("charges.jsonl") {
        let doc = &rec["value"]["fullDocument"];
        docs.insert(rec["key"].as_str().unwrap().to_string(), doc.clone());
    }
    docs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixtures_end_to_end_on_real_broker_and_mqtt() {
    let out = std::env::temp_dir().join(format!("pixgate-e2e-{}", std::process::id()));
    let cfg = DemoConfig {
        fixtures: fixtures(),
        out: out.clone(),
        pixgate_bin: gateway::find_binary().expect("build pixgate first (cargo build -p gateway)"),
        timeout: Duration::from_secs(300),
        pace: demo::Pace::KeepingUp,
    };
    let summary = demo::run(&cfg).await.expect("demo run");
    let effects = summary["effects"].as_array().unwrap();
    let counts = &summary["counts"];

    // 1. Exactly the expected effects, each exactly once, on the right device.
    let want_order = pixgate_tests::expected_effects(&fixtures());
    let mut want: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for ((dev, charge), kinds) in &want_order {
        for kind in kinds {
            *want.entry((dev.clone(), charge.clone(), kind.clone())).or_default() += 1;
        }
    }
    let mut got: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for e in effects {
        let key = (
            e["device"].as_str().unwrap().into(),
            e["charge"].as_str().unwrap().into(),
            e["kind"].as_str().unwrap().into(),
        );
        *got.entry(key).or_default() += 1;
    }
    assert_eq!(got, want, "effects carried out differ from expected.json");
    assert!(!effects.is_empty());

    // 2. In order per device: seq strictly increasing in the order carried out, and each
    //    charge's effects on a device in the order the lifecycle dictates.
    let mut by_device: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for e in effects {
        by_device.entry(e["device"].as_str().unwrap().into()).or_default().push(e);
    }
    for (dev, list) in &by_device {
        let seqs: Vec<u64> = list.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{dev}: seqs not increasing: {seqs:?}");
        let mut per_charge: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for e in list {
            per_charge
                .entry(e["charge"].as_str().unwrap().into())
                .or_default()
                .push(e["kind"].as_str().unwrap().into());
        }
        for (charge, kinds) in per_charge {
            assert_eq!(kinds, want_order[&(dev.clone(), charge.clone())], "{dev} {charge}: order");
        }
    }
    assert_eq!(counts["device_order_violations"], 0);

    // 3. Deterministic, unique message ids (32 hex).
    let ids: HashSet<&str> = effects.iter().map(|e| e["message_id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), effects.len(), "message ids repeat");
    assert!(ids.iter().all(|id| id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit())));

    // The text of one printer job: its own section of the device's transcript, whitespace
    // collapsed (the decoder prints wrapped and column-padded lines).
    let collapse = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    let job_text = |e: &Value| -> String {
        let transcript =
            std::fs::read_to_string(out.join("devices").join(e["device"].as_str().unwrap()).join("transcript.txt"))
                .unwrap();
        let header = format!("===== seq {:04} ", e["seq"].as_u64().unwrap());
        transcript.split(&header).nth(1).and_then(|s| s.split("\n===== seq ").next()).expect("job section").to_string()
    };

    // 4. Every QR shown (a card machine's screen, a printer's pay-with-Pix slip) decodes to
    //    a valid BR Code carrying the charge's amount. A paid receipt has no QR at all (a
    //    payable code on proof of payment invites a second payment): the simulator's
    //    decoder finds none in its picture and printed no QR command, and the receipt names
    //    the payment by its end-to-end id and txid, after their labels in the device's locale.
    let docs = charge_docs();
    let locales = device_locales();
    let (mut qr_checked, mut paid_checked) = (0, 0);
    for e in effects {
        let kind = e["kind"].as_str().unwrap();
        if kind != "display_qr" && kind != "print_receipt" {
            continue;
        }
        let charge = e["charge"].as_str().unwrap();
        let png = out.join(e["file"].as_str().unwrap());
        let img = image::open(&png).unwrap_or_else(|err| panic!("{}: {err}", png.display())).to_luma8();
        if kind == "print_receipt" {
            assert_eq!(
                preview::escpos::qr::scan(&img),
                Vec::<String>::new(),
                "{}: a QR on a paid receipt",
                png.display()
            );
            let section = job_text(e);
            assert!(
                !section.contains("[QR") && !section.contains("[RASTER"),
                "{}: QR commands on a paid receipt:\n{section}",
                png.display()
            );
            let locale = locales[e["device"].as_str().unwrap()];
            let doc = &docs[charge];
            for (label, field) in [(Label::EndToEndId, "endToEndId"), (Label::Txid, "transactionID")] {
                let value = doc[field].as_str().unwrap_or_else(|| panic!("paid charge {charge} has no {field}"));
                let want = format!("{}: {value}", locale.label(label));
                assert!(collapse(&section).contains(&want), "{}: no {want:?} in\n{section}", png.display());
            }
            paid_checked += 1;
            continue;
        }
        let mut prepared = rqrr::PreparedImage::prepare(img);
        let grids = prepared.detect_grids();
        assert_eq!(grids.len(), 1, "{}: expected one QR", png.display());
        let (_, payload) = grids[0].decode().unwrap_or_else(|err| panic!("{}: {err:?}", png.display()));
        let parsed = render::brcode::parse(&payload)
            .unwrap_or_else(|err| panic!("{}: invalid BR Code {payload}: {err}", png.display()));
        let value = &docs[charge]["value"];
        let cents = value.as_u64().or_else(|| value["$numberLong"].as_str().and_then(|s| s.parse().ok())).unwrap();
        assert_eq!(parsed.amount_cents(), Some(cents), "{}: amount", png.display());
        qr_checked += 1;
    }
    assert!(qr_checked > 100, "only {qr_checked} QR codes checked");
    assert_eq!(paid_checked, effects.iter().filter(|e| e["kind"] == "print_receipt").count());
    assert!(paid_checked > 50, "only {paid_checked} paid receipts checked");

    // 5. Receipt transcripts keep the accents of the merchant names. The header wraps at
    //    word boundaries and emoji have no byte in any printer code page (dropped, see
    //    render::receipt), so compare whitespace-collapsed text without them, within the
    //    job's own section of the printer's transcript.
    let mut accented = 0;
    for e in effects.iter().filter(|e| e["kind"] == "print_receipt") {
        let name = docs[e["charge"].as_str().unwrap()]["merchant"]["name"].as_str().unwrap();
        let printable: String = name.chars().filter(|&c| (c as u32) < 0x2000).collect();
        let section = job_text(e);
        assert!(
            collapse(&section).contains(&collapse(&printable)),
            "receipt {} lacks {printable:?}:\n{section}",
            e["file"]
        );
        if !printable.is_ascii() {
            accented += 1;
        }
    }
    assert!(accented > 0, "no accented merchant name was printed");

    // 6. Nothing read was lost: every event is accounted for, and every edge case is
    //    counted with its reason (and, from 1., caused no device effect).
    assert_eq!(counts["events_read"], counts["events_published"]);
    let published = counts["events_published"].as_u64().unwrap();
    assert_eq!(
        published as usize,
        read_jsonl("devices.jsonl").len() + read_jsonl("charges.jsonl").len() + read_jsonl("edge-cases.jsonl").len()
    );
    let ignored = &counts["ignored"];
    let dead = &counts["dead_lettered"];
    for (reason, n) in
        [("duplicate_event", 1), ("document_deleted_before_lookup", 1), ("delete_event", 1), ("stale_version", 1)]
    {
        assert_eq!(ignored[reason], n, "ignored {reason}: {ignored}");
    }
    for (reason, n) in [
        ("not_json", 2),
        ("invalid_brcode", 2),
        ("unknown_terminal", 1),
        ("terminal_of_another_company", 1),
        ("invalid_field:status", 1),
        ("invalid_field:value", 2),
        ("missing_field:company", 1),
    ] {
        assert_eq!(dead[reason], n, "dead-lettered {reason}: {dead}");
    }
    let total_dead: u64 = dead.as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(total_dead, 10, "unexpected dead letters: {dead}");

    // Every stage timed what passed through it: each record with jobs read and accepted,
    // each job sent once first, each effect acknowledged.
    let stages = &counts["stage_latency_counts"];
    let acked: u64 = counts["effects_acknowledged"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(stages["device"], acked, "{stages}");
    assert!(stages["queue"].as_u64() >= Some(acked), "every job done was sent first: {stages}");
    assert_eq!(stages["kafka"], stages["accept"], "{stages}");
    assert!(stages["accept"].as_u64().is_some_and(|n| n > 100), "{stages}");

    // 7. The dead letters are on the dead-letter topic, with reason and source position.
    let dls: Vec<Value> = std::fs::read_to_string(out.join("deadletters.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(dls.len(), 10);
    for dl in &dls {
        assert_eq!(dl["source_topic"], "charge.upserted");
        assert!(
            dl["source_offset"].as_i64().unwrap() >= 0 && dl["reason"].is_string() && dl["value_base64"].is_string(),
            "{dl}"
        );
    }
    let mut reasons: Vec<&str> = dls.iter().map(|d| d["reason"].as_str().unwrap()).collect();
    reasons.sort();
    let mut want_reasons: Vec<&str> = dead
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(r, n)| std::iter::repeat_n(r.as_str(), n.as_u64().unwrap() as usize))
        .collect();
    want_reasons.sort();
    assert_eq!(reasons, want_reasons);
    let bad_qr: Vec<&Value> = dls.iter().filter(|d| d["reason"] == "invalid_brcode").collect();
    assert!(
        bad_qr.iter().all(|d| d["device"] == "d3cea27d26934b484e73cf57" && d["effect"] == "display_qr"),
        "{bad_qr:?}"
    );

    let _ = std::fs::remove_dir_all(&out);
}
