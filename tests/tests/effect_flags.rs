//! Effect flags, the cutover's switches: with a kind off, its records are read, decided
//! and counted `skipped_by_flag`, never queued nor dead-lettered, and their offsets are
//! committed; the flags survive a restart, can be switched while no gateway runs, and a
//! kind switched back on is carried out again.
//!
//! Real parts: tansu, the `pixgate` binary and its CLI, the simulated fleet over MQTT, the
//! bundled fixtures checked against `expected.json`.

// Helpers of a test are test steps too: a panic is a failed test (clippy.toml's
// allow-unwrap-in-tests covers only the #[test] fns themselves).
#![allow(clippy::unwrap_used)]

use pixgate_tests::gateway::{cli as pixgate_cli, count, total};
use pixgate_tests::harness::{replay_devices, Rig};
use serde_json::{json, Value};
use simulators::capture;
use std::collections::BTreeMap;
use std::time::Duration;

const TOKEN: &str = "flags-admin-token-51d2";
const TERMINAL: &str = "7f80e222f828767efc2f9162";
const CHARGE_TOPIC: &str = "charge.upserted";

/// The `off` list of a `pixgate flags` answer.
fn off_of(out: &str) -> Value {
    serde_json::from_str::<Value>(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))["off"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_switched_off_is_decided_counted_and_committed_but_never_delivered() {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let mut rig = Rig::builder("flags")
        .env("PIXGATE_HTTP__ADMIN_TOKEN", TOKEN)
        .envs(pixgate_tests::replay_clock_env(&fixtures))
        .start()
        .await;
    let fleet = rig.start_fleet(pixgate_tests::fixture_devices(&fixtures), replay_devices()).await;
    rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;
    let (bin, port) = (rig.bin().to_path_buf(), rig.settings().http_port);
    let token = [("PIXGATE_HTTP__ADMIN_TOKEN", TOKEN)];

    // Switching needs the admin token; reading the flags does not.
    let (ok, _, err) = pixgate_cli(&bin, port, &["flags", "set", "display_qr", "off"], &[]);
    assert!(!ok && err.contains("unauthorized"), "switched without the token: {err}");
    let (ok, _, err) = pixgate_cli(&bin, port, &["flags", "set", "qr", "off"], &token);
    assert!(!ok && err.contains("no effect kind `qr`"), "{err}");
    let (ok, out, err) = pixgate_cli(&bin, port, &["flags", "set", "display_qr", "off"], &token);
    assert!(ok, "{err}");
    assert_eq!(off_of(&out), json!(["display_qr"]));
    let (ok, out, err) = pixgate_cli(&bin, port, &["flags", "set", "print_receipt", "off"], &token);
    assert!(ok, "{err}");
    assert_eq!(off_of(&out), json!(["display_qr", "print_receipt"]));
    let (ok, out, err) = pixgate_cli(&bin, port, &["flags"], &[]);
    assert!(ok, "{err}");
    assert_eq!(off_of(&out), json!(["display_qr", "print_receipt"]));

    // Still ready, and /readyz says which kinds are off.
    let (status, body) = rig.gateway().get("/readyz").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ready\n") && body.contains("effects switched off"), "{body}");
    assert!(body.contains("display_qr, print_receipt"), "{body}");

    // The fixtures: every record read and finished, the kinds still on carried out exactly
    // as expected.json says, the kinds off counted and nowhere else.
    let records = capture::publish_file(rig.brokers(), &fixtures.join("charges.jsonl")).await.unwrap() as u64;
    let mut want: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    let mut skipped_want: BTreeMap<String, u64> = BTreeMap::new();
    for ((device, charge), kinds) in pixgate_tests::expected_effects(&fixtures) {
        for kind in kinds {
            if kind == "display_qr" || kind == "print_receipt" {
                *skipped_want.entry(kind).or_default() += 1;
            } else {
                *want.entry((device.clone(), charge.clone(), kind)).or_default() += 1;
            }
        }
    }
    let delivered: u64 = want.values().map(|n| *n as u64).sum();
    assert!(delivered > 0 && skipped_want.len() == 2, "{want:?} {skipped_want:?}");
    rig.wait_stats(Duration::from_secs(120), |s| {
        count(&s.counters.events_read, CHARGE_TOPIC) == records
            && s.counters.pending_records == 0
            && total(&s.counters.effects_done) == delivered
    })
    .await;
    let s = rig.gateway().stats().unwrap();
    assert_eq!(s.counters.skipped_by_flag, skipped_want, "skipped_by_flag by kind");
    assert_eq!(s.counters.outbox_jobs, 0, "nothing left queued");
    assert!(s.counters.dead_lettered_effects.is_empty(), "{:?}", s.counters.dead_lettered_effects);
    assert!(s.counters.dead_lettered_records.is_empty(), "{:?}", s.counters.dead_lettered_records);
    assert_eq!(count(&s.counters.effects_done, "display_qr") + count(&s.counters.effects_done, "print_receipt"), 0);
    assert_eq!(s.effect_flags.get("display_qr"), Some(&false));
    let mut got: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for e in fleet.effects() {
        *got.entry((e.device, e.charge, e.kind.as_str().to_string())).or_default() += 1;
    }
    assert_eq!(got, want, "the devices carried out exactly the kinds still on");
    let (_, metrics) = rig.gateway().get("/metrics").unwrap();
    for (sample, want) in [
        ("pixgate_effect_enabled{kind=\"display_qr\"}", 0.0),
        ("pixgate_effect_enabled{kind=\"payment_confirmed\"}", 1.0),
        ("pixgate_skipped_by_flag_total{kind=\"display_qr\"}", skipped_want["display_qr"] as f64),
    ] {
        let value = metrics
            .lines()
            .find_map(|l| l.strip_prefix(sample)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no `{sample}` in {metrics}"));
        assert_eq!(value, want, "{sample}");
    }

    // Offsets committed past every record, skipped effects or not (the final commit of a
    // clean stop).
    rig.gateway().wait_assigned(Duration::from_secs(30)).await.unwrap();
    assert!(rig.stop_gateway(Duration::from_secs(20)), "pixgate did not stop cleanly");
    let group = rig.settings().group_id.clone();
    let committed = pixgate_tests::kafka::committed_offsets(rig.brokers(), &group, CHARGE_TOPIC, 3).unwrap();
    assert_eq!(committed.iter().sum::<i64>(), records as i64, "committed {committed:?}");

    // While no gateway runs, the CLI switches the flag in the outbox file itself.
    let outbox = rig.settings().outbox_path.to_str().unwrap().to_string();
    let file = [("PIXGATE_OUTBOX__PATH", outbox.as_str())];
    let (ok, out, err) = pixgate_cli(&bin, port, &["flags", "set", "print_receipt", "on"], &file);
    assert!(ok, "{err}");
    assert_eq!(off_of(&out), json!(["display_qr"]));

    // Kept across the restart: display_qr as switched over HTTP, print_receipt from the file.
    rig.start_gateway();
    let (_, flags) = rig.gateway().get("/flags").unwrap();
    assert_eq!(off_of(&flags), json!(["display_qr"]), "{flags}");
    let (status, body) = rig.gateway().get("/readyz").unwrap();
    assert!(status == 200 && body.contains("switched off") && body.contains("display_qr"), "{status} {body}");

    // Switched back on, a new charge's QR is shown again.
    let (ok, out, err) = pixgate_cli(&bin, port, &["flags", "set", "display_qr", "on"], &token);
    assert!(ok, "{err}");
    assert_eq!(off_of(&out), json!([]));
    let (status, body) = rig.gateway().get("/readyz").unwrap();
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    let template = pixgate_tests::charges::template(&fixtures);
    let charge = "f1a65f1a65f1a65f1a65f1a6";
    let t = chrono::Utc::now().timestamp() as u64;
    let record = pixgate_tests::charges::charge_record(&template, TERMINAL, charge, "ACTIVE", 0, 60, t);
    capture::publish_records(&rig.producer(), &[record]).await.unwrap();
    rig.wait_stats(Duration::from_secs(60), |s| count(&s.counters.effects_done, "display_qr") == 1).await;
    let qr: Vec<_> = fleet.effects().into_iter().filter(|e| e.charge == charge).collect();
    assert!(
        qr.iter().any(|e| e.device == TERMINAL && e.kind.as_str() == "display_qr"),
        "no QR for the new charge on {TERMINAL}: {qr:?}"
    );
    fleet.shutdown().await;
    rig.shutdown();
}
