//! Kill `pixgate` with SIGKILL at arbitrary moments while the fixtures flow, restart it on
//! the same outbox and consumer group, and check that the devices end up having carried
//! out every effect exactly once (after their dedupe by message id), in order per device,
//! and nothing that should not have happened. Real tansu broker, real MQTT, real process
//! kills.

use pixgate_tests::gateway::stats_or_error;
use pixgate_tests::harness::{replay_devices, Rig};
use simulators::capture;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_lose_nothing_and_repeat_nothing() {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let mut rig = Rig::builder("crash").envs(pixgate_tests::replay_clock_env(&fixtures)).start().await;
    let fleet = rig.start_fleet(pixgate_tests::fixture_devices(&fixtures), replay_devices()).await;

    // The registry first (as the contract asks), then every charge event at once.
    rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;
    capture::publish_file(rig.brokers(), &fixtures.join("charges.jsonl")).await.unwrap();

    // Kill it while it works, several times, at varied moments after it has rejoined its
    // consumer group (see `GatewayProcess::wait_assigned` for why not during the join).
    let mut kills = 0;
    for pause_ms in [700u64, 1300, 400, 2100, 900, 1600] {
        rig.gateway().wait_assigned(Duration::from_secs(60)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        rig.kill_gateway();
        kills += 1;
        rig.start_gateway();
    }

    // Then let it finish. Every effect but a QR is certain to happen (a QR may be
    // superseded), so wait until all of those arrived — a lost one times out here — and
    // then until pixgate is idle and the devices quiet for 3 s (any extra would show).
    let want = pixgate_tests::expected_effects(&fixtures);
    let certain: BTreeSet<(String, String, String)> = want
        .iter()
        .flat_map(|((dev, charge), kinds)| {
            kinds.iter().filter(|k| *k != "display_qr").map(|k| (dev.clone(), charge.clone(), k.clone()))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = (usize::MAX, Instant::now());
    loop {
        let s = rig.gateway().stats();
        let idle = s.as_ref().is_ok_and(|s| {
            s.counters.pending_records == 0 && s.counters.queued_jobs == 0 && s.counters.outbox_jobs == 0
        });
        let effects = fleet.effects();
        let seen: BTreeSet<(String, String, String)> =
            effects.iter().map(|e| (e.device.clone(), e.charge.clone(), e.kind.as_str().to_string())).collect();
        let missing = certain.difference(&seen).count();
        if effects.len() != last.0 {
            last = (effects.len(), Instant::now());
        } else if missing == 0 && idle && last.1.elapsed() > Duration::from_secs(3) {
            break;
        }
        assert!(Instant::now() < deadline, "{missing} certain effects never arrived; stats {}", stats_or_error(&s));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let report = fleet.shutdown().await;

    let mut got: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut per_device_seq: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for e in &report.effects {
        got.entry((e.device.clone(), e.charge.clone())).or_default().push(e.kind.as_str().into());
        per_device_seq.entry(e.device.clone()).or_default().push(e.seq);
        assert!(ids.insert(e.message_id.clone()), "message id carried out twice: {}", e.message_id);
    }
    // Every effect exactly once, in lifecycle order. All charge events were published at
    // once, so a QR still queued when its charge was paid or expired may be superseded
    // (never shown): the only effect allowed to be missing, and only before its successor.
    for (key, kinds) in &want {
        let shown = got.get(key).cloned().unwrap_or_default();
        let without_qr: Vec<&String> = kinds.iter().filter(|k| *k != "display_qr").collect();
        let shown_without_qr: Vec<&String> = shown.iter().filter(|k| *k != "display_qr").collect();
        assert_eq!(shown_without_qr, without_qr, "{key:?}: effects");
        assert!(shown == *kinds || shown.iter().collect::<Vec<_>>() == without_qr, "{key:?}: {shown:?} vs {kinds:?}");
    }
    for key in got.keys() {
        assert!(want.contains_key(key), "unexpected effect {key:?}");
    }
    for (dev, seqs) in &per_device_seq {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{dev}: carried out out of order: {seqs:?}");
    }
    assert_eq!(report.stats.order_violations, 0);
    // The reconciliation counts, written with what they count, went through the kills
    // exactly: each record read once, each job queued once, and each queued job of a kind
    // delivered (as the devices report, after their dedupe), superseded or expired.
    let (status, body) = rig.gateway().get("/reconciliation?window=1h").unwrap();
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    let windows: Vec<gateway::store::reconcile::Window> = serde_json::from_value(body["windows"].clone()).unwrap();
    let mut read: BTreeMap<String, u64> = BTreeMap::new();
    let (mut queued, mut delivered, mut expired) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let mut superseded = 0;
    for w in &windows {
        *read.entry(w.topic.clone()).or_default() += w.read;
        for (into, from) in [(&mut queued, &w.queued), (&mut delivered, &w.delivered), (&mut expired, &w.expired)] {
            for (k, n) in from {
                *into.entry(k.clone()).or_insert(0u64) += n;
            }
        }
        superseded += w.superseded;
    }
    let lines = |name: &str| std::fs::read_to_string(fixtures.join(name)).unwrap().lines().count() as u64;
    let want_read: BTreeMap<String, u64> = [
        ("charge.upserted".to_string(), lines("charges.jsonl")),
        ("device.upserted".to_string(), lines("devices.jsonl")),
    ]
    .into();
    assert_eq!(read, want_read, "records read, each once");
    let mut want_queued: BTreeMap<String, u64> = BTreeMap::new();
    for k in want.values().flatten() {
        *want_queued.entry(k.clone()).or_default() += 1;
    }
    assert_eq!(queued, want_queued, "jobs queued, each once");
    let mut carried: BTreeMap<String, u64> = BTreeMap::new();
    for e in &report.effects {
        *carried.entry(e.kind.as_str().to_string()).or_default() += 1;
    }
    // A QR the device showed just before a kill, its ack lost, may be superseded after the
    // restart: from pixgate's side it was never delivered. Every other kind: exactly.
    let qr = |m: &BTreeMap<String, u64>| m.get("display_qr").copied().unwrap_or(0);
    assert!(qr(&delivered) <= qr(&carried) && qr(&carried) <= qr(&delivered) + superseded, "{delivered:?} {carried:?}");
    let but_qr = |m: &BTreeMap<String, u64>| {
        m.iter().filter(|(k, _)| *k != "display_qr").map(|(k, n)| (k.clone(), *n)).collect::<BTreeMap<_, _>>()
    };
    assert_eq!(but_qr(&delivered), but_qr(&carried), "delivered: what the devices carried out");
    for (k, n) in &queued {
        let left = delivered.get(k).unwrap_or(&0)
            + expired.get(k).unwrap_or(&0)
            + if k == "display_qr" { superseded } else { 0 };
        assert_eq!(left, *n, "{k}: queued {n}, delivered {delivered:?}, expired {expired:?}, superseded {superseded}");
    }
    println!(
        "crash test: {kills} SIGKILLs; {} effects carried out; {} raw job deliveries, {} duplicates absorbed by device dedupe",
        report.effects.len(),
        report.stats.raw_jobs,
        report.stats.duplicates
    );
    rig.shutdown();
}
