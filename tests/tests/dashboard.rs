//! The operator's live dashboard, in a real browser while the bundled fixtures run: Debian's
//! chromium, headless, driven over WebDriver (chromedriver) loads `/dashboard` from the
//! `pixgate` binary on a tansu broker with the simulated fleet connected, is given the admin
//! token, and must show every device, pictures of receipts and screens, and counts that
//! move while the charges are read, without a reload; it switches an effect flag with the
//! token. A screenshot is saved as `target/test-artifacts/dashboard.png`.
//!
//! Also over plain HTTP: the page is open but its feed and pictures need the token, and the
//! picture of each device's newest job is the very image the simulated device made of the
//! same job (pixel for pixel).

// Helpers of a test are test steps too: a panic is a failed test (clippy.toml's
// allow-unwrap-in-tests covers only the #[test] fns themselves).
#![allow(clippy::unwrap_used)]

use pixgate_tests::browser::{self, Browser};
use pixgate_tests::gateway::total;
use pixgate_tests::harness::{replay_devices, Rig};
use pixgate_tests::net::http_request_bytes;
use serde_json::Value;
use simulators::capture;
use std::collections::BTreeMap;
use std::time::Duration;

const TOKEN: &str = "dashboard-admin-token-7c1e";
const CHARGE_TOPIC: &str = "charge.upserted";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_fleet_live_in_a_real_browser() {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let rig = Rig::builder("dashboard")
        .env("PIXGATE_HTTP__ADMIN_TOKEN", TOKEN)
        .envs(pixgate_tests::replay_clock_env(&fixtures))
        .start()
        .await;
    let devices = pixgate_tests::fixture_devices(&fixtures);
    let fleet = rig.start_fleet(devices.clone(), replay_devices()).await;
    rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;
    let addr = format!("127.0.0.1:{}", rig.settings().http_port);
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("Authorization", bearer.as_str())];

    // The page is open; what it shows needs the token.
    let (status, page) = http_request_bytes(&addr, "GET", "/dashboard", &[]).unwrap();
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&page).contains("<title>pixgate dashboard</title>"));
    for headers in [&[][..], &[("Authorization", "Bearer wrong")][..]] {
        let (status, body) = http_request_bytes(&addr, "GET", "/dashboard/events", headers).unwrap();
        assert_eq!(status, 401, "{}", String::from_utf8_lossy(&body));
        let (status, _) = http_request_bytes(&addr, "GET", "/dashboard/preview/x/1", headers).unwrap();
        assert_eq!(status, 401);
    }

    // The page, before any charge is read: every device listed, connected.
    let artifacts = browser::artifacts_dir();
    let browser = Browser::start(&artifacts).await.unwrap();
    browser.goto(&format!("http://{addr}/dashboard")).await.unwrap();
    // Kept only as long as the page is not reloaded.
    let _: Value = browser.execute("window.__loadedOnce = 'yes'; return true;", vec![]).await.unwrap();
    browser
        .wait_for("document.getElementById('ready').textContent === 'admin token needed'", Duration::from_secs(20))
        .await
        .unwrap();
    browser.find("#token").await.unwrap().send_keys(TOKEN).await.unwrap();
    browser.find("#connect").await.unwrap().click().await.unwrap();
    let n = devices.len();
    browser
        .wait_for(&format!("document.querySelectorAll('#devices tbody tr[data-device]').length === {n}"), secs(30))
        .await
        .unwrap();
    let connected: u64 = browser
        .execute("return Number(document.getElementById('count-connected').textContent);", vec![])
        .await
        .unwrap();
    assert_eq!(connected as usize, n, "every simulated device is connected");

    // The charges, read while the page watches: the count of effects done moves, live.
    let records = capture::publish_file(rig.brokers(), &fixtures.join("charges.jsonl")).await.unwrap() as u64;
    let want: u64 = pixgate_tests::expected_effects(&fixtures).values().map(|k| k.len() as u64).sum();
    browser.wait_for("Number(document.getElementById('count-done').textContent) > 0", secs(60)).await.unwrap();
    let first_seen: u64 =
        browser.execute("return Number(document.getElementById('count-done').textContent);", vec![]).await.unwrap();
    // Every expected effect is carried out or superseded by a newer QR before delivery.
    rig.wait_stats(secs(180), |s| {
        pixgate_tests::gateway::count(&s.counters.events_read, CHARGE_TOPIC) == records
            && s.counters.pending_records == 0
            && s.counters.outbox_jobs == 0
            && total(&s.counters.effects_done) + s.counters.superseded == want
    })
    .await;
    let (_, stats) = rig.gateway().get("/stats").unwrap();
    let done: u64 = serde_json::from_str::<Value>(&stats).unwrap()["effects_done"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    browser
        .wait_for(&format!("Number(document.getElementById('count-done').textContent) === {done}"), secs(30))
        .await
        .unwrap();
    let updates: Value = browser
        .execute("return {loaded: window.__loadedOnce, text: document.getElementById('live').textContent};", vec![])
        .await
        .unwrap();
    assert_eq!(updates["loaded"], "yes", "the page was reloaded: {updates}");
    assert!(updates["text"].as_str().unwrap().starts_with("live"), "{updates}");
    assert!(first_seen < done, "the count was already final ({done}) when first seen; not seen moving");

    // Pictures: a receipt as the printer prints it, a screen as the card machine shows it.
    for kind in ["print_receipt", "payment_confirmed"] {
        browser
            .wait_for(
                &format!(
                    "[...document.querySelectorAll('img.preview')].some(i => i.alt.startsWith('{kind}') && i.complete && i.naturalWidth > 0)"
                ),
                secs(30),
            )
            .await
            .unwrap();
    }
    let receipt_width: u64 = browser
        .execute(
            "return [...document.querySelectorAll('img.preview')].find(i => i.alt.startsWith('print_receipt') && i.naturalWidth > 0).naturalWidth;",
            vec![],
        )
        .await
        .unwrap();
    assert!(receipt_width == 576 || receipt_width == 384, "a receipt is as wide as the print head: {receipt_width}");
    // The page keeps only the pictures its rows show (plus the one opened), however many
    // jobs it has seen go by.
    let (kept, rows): (u64, u64) = browser
        .execute(
            "return [state.pictures.size, document.querySelectorAll('#devices tbody tr[data-device]').length];",
            vec![],
        )
        .await
        .unwrap();
    assert!(kept > 0 && kept <= rows + 1, "{kept} pictures kept for {rows} rows");

    // A flag switched from the page, with the token: the gateway has it off, then on again.
    browser.find("button[data-flag='charge_expired']").await.unwrap().click().await.unwrap();
    browser
        .wait_for("document.querySelector(\"td[data-flag-state='charge_expired']\").textContent === 'off'", secs(10))
        .await
        .unwrap();
    let (_, flags) = rig.gateway().get("/flags").unwrap();
    let off: Value = serde_json::from_str::<Value>(&flags).unwrap()["off"].clone();
    assert_eq!(off, serde_json::json!(["charge_expired"]), "{flags}");
    let (_, readyz) = rig.gateway().get("/readyz").unwrap();
    assert!(readyz.contains("charge_expired"), "{readyz}");

    // The screenshot, with a receipt opened beside the tables.
    let _: Value = browser
        .execute(
            "[...document.querySelectorAll('img.preview')].find(i => i.alt.startsWith('print_receipt') && i.naturalWidth > 0).click(); return true;",
            vec![],
        )
        .await
        .unwrap();
    browser.wait_for("!document.getElementById('picture-img').hidden", secs(5)).await.unwrap();
    let shot = browser.screenshot(&artifacts.join("dashboard.png")).await.unwrap();
    let img = image::open(&shot).unwrap().to_rgb8();
    assert!(img.width() >= 1000 && img.height() >= 700, "{}x{}", img.width(), img.height());

    browser.find("button[data-flag='charge_expired']").await.unwrap().click().await.unwrap();
    browser
        .wait_for("document.querySelector(\"td[data-flag-state='charge_expired']\").textContent === 'on'", secs(10))
        .await
        .unwrap();
    let (_, flags) = rig.gateway().get("/flags").unwrap();
    assert_eq!(serde_json::from_str::<Value>(&flags).unwrap()["off"], serde_json::json!([]), "{flags}");
    drop(browser);

    // Each device's newest job, drawn by the gateway, is the picture the device made of it.
    let mut newest: BTreeMap<String, simulators::effect::EffectRecord> = BTreeMap::new();
    for e in fleet.effects() {
        if newest.get(&e.device).is_none_or(|n| n.seq < e.seq) {
            newest.insert(e.device.clone(), e);
        }
    }
    assert!(newest.len() >= 4, "{newest:?}");
    let (mut screens, mut receipts) = (0, 0);
    for (device, e) in &newest {
        let (status, png) =
            http_request_bytes(&addr, "GET", &format!("/dashboard/preview/{device}/{}", e.seq), &auth).unwrap();
        assert_eq!(status, 200, "{device} seq {}: {}", e.seq, String::from_utf8_lossy(&png));
        let drawn = image::load_from_memory(&png).unwrap().to_rgb8();
        let file = std::path::Path::new(&e.file);
        let file = if file.is_absolute() { file.to_path_buf() } else { rig.dir().join("devices").join(file) };
        let made = image::open(&file).unwrap_or_else(|err| panic!("{}: {err}", file.display())).to_rgb8();
        assert_eq!(drawn.dimensions(), made.dimensions(), "{device} seq {} ({:?})", e.seq, e.kind);
        assert!(
            drawn == made,
            "{device} seq {} ({:?}): the gateway's picture differs from the device's",
            e.seq,
            e.kind
        );
        if e.kind == device_protocol::EffectKind::PrintReceipt {
            receipts += 1;
        } else {
            screens += 1;
        }
    }
    assert!(receipts > 0 && screens > 0, "receipts {receipts}, screens {screens}");
    // A job that is neither recent nor queued has no picture.
    let (status, _) = http_request_bytes(&addr, "GET", "/dashboard/preview/nobody/1", &auth).unwrap();
    assert_eq!(status, 404);

    fleet.shutdown().await;
    rig.shutdown();
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
