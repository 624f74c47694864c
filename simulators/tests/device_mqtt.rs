//! End-to-end tests of the simulated devices against a real embedded rumqttd broker, driven
//! from an outside MQTT client playing the gateway.

// A test: a panic in its helpers is a failed test, as in its #[test] functions.
#![allow(clippy::unwrap_used)]

mod common;

use common::{qr_codes_in_png, start_broker, temp_dir, FakeGateway};
use device_protocol::messages::{CONTENT_ESCPOS, CONTENT_SCREEN};
use device_protocol::{message_id, AckResult, EffectKind, Job, ScreenContent, ScreenKind};
use render::brcode::{encode_static, StaticPix};
use render::codepage::CodePage;
use render::receipt::{render_receipt, PrinterProfile, Receipt, ReceiptKind};
use render::Locale;
use simulators::device::MqttSecurity;
use simulators::fleet::{self, FleetConfig};
use simulators::registry::DeviceSpec;
use std::time::Duration;

const PRINTER: &str = "0fb23c6f5da2cec255404e4f";
const PRINTER58: &str = "54f31af3176813e02ea68ef7";
const TERMINAL: &str = "0034d6608697a8d41bed440e";
const CHARGE: &str = "6750a1b2c3d4e5f601234567";
const MERCHANT: &str = "Padaria São João & Ação";
const END_TO_END_ID: &str = "E25328704202611271201yxv2kgafrfw";

fn brcode() -> String {
    encode_static(&StaticPix {
        key: "padaria@example.com".into(),
        amount_cents: Some(1990),
        merchant_name: MERCHANT.into(),
        merchant_city: "São Paulo".into(),
        txid: Some("TX123".into()),
        description: None,
    })
    .unwrap()
}

fn screen_job(device: &str, seq: u64, screen: ScreenKind, kind: EffectKind) -> Job {
    let content = ScreenContent {
        screen,
        merchant_name: MERCHANT.into(),
        amount_cents: 1990,
        brcode: (screen == ScreenKind::PayWithPix).then(brcode),
        expires_at: Some(chrono::Utc::now() + chrono::Duration::minutes(10)),
        payer_name: None,
        paid_at: None,
        locale: "pt-BR".into(),
        time_zone: "America/Sao_Paulo".into(),
    };
    let event_id = format!("Charge:{CHARGE}:{seq}");
    Job {
        v: 1,
        message_id: message_id(&event_id, device, kind),
        seq,
        kind,
        event_id,
        charge_id: CHARGE.into(),
        content_type: CONTENT_SCREEN.into(),
        payload: Job::encode_payload(&serde_json::to_vec(&content).unwrap()),
        expires_at: None,
    }
}

fn receipt_job(device: &str, seq: u64, profile: &PrinterProfile) -> Job {
    let r = Receipt {
        kind: ReceiptKind::Paid,
        merchant_name: MERCHANT.into(),
        merchant_city: "São Paulo".into(),
        amount_cents: 1990,
        items: vec![("Pão de queijo".into(), "3x".into())],
        comment: None,
        payer_name: Some("José Araújo".into()),
        paid_at: Some(chrono::Utc::now()),
        time_zone: chrono_tz::America::Sao_Paulo,
        end_to_end_id: Some(END_TO_END_ID.into()),
        charge_id: CHARGE.into(),
        txid: Some("TX123".into()),
        // Given as the gateway gives it; a paid receipt must not print it.
        brcode: Some(brcode()),
        locale: Locale::PtBr,
    };
    let bytes = render_receipt(&r, profile).unwrap();
    let event_id = format!("Charge:{CHARGE}:{seq}");
    Job {
        v: 1,
        message_id: message_id(&event_id, device, EffectKind::PrintReceipt),
        seq,
        kind: EffectKind::PrintReceipt,
        event_id,
        charge_id: CHARGE.into(),
        content_type: CONTENT_ESCPOS.into(),
        payload: Job::encode_payload(&bytes),
        expires_at: None,
    }
}

fn terminal_spec() -> DeviceSpec {
    DeviceSpec::Terminal {
        id: TERMINAL.into(),
        width_px: 720,
        height_px: 1280,
        locale: "pt-BR".into(),
        time_zone: "America/Sao_Paulo".into(),
    }
}

fn pngs_in(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "png")).collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_job_is_carried_out_once_and_acked_twice() {
    let port = start_broker();
    let out = temp_dir("dup");
    let fleet = fleet::start(FleetConfig {
        mqtt_host: "127.0.0.1".into(),
        mqtt_port: port,
        out_dir: out.clone(),
        devices: vec![terminal_spec()],
        security: MqttSecurity::Plain,
    })
    .await
    .unwrap();
    fleet.wait_connected(Duration::from_secs(10)).await.unwrap();
    let mut gw = FakeGateway::connect(port).await;

    let job = screen_job(TERMINAL, 1, ScreenKind::PayWithPix, EffectKind::DisplayQr);
    gw.send(TERMINAL, &job).await;
    let a1 = gw.next_ack().await;
    gw.send(TERMINAL, &job).await;
    let a2 = gw.next_ack().await;

    assert_eq!(
        (a1.message_id.as_str(), a1.seq, a1.result, a1.duplicate),
        (job.message_id.as_str(), 1, AckResult::Done, false)
    );
    assert_eq!(
        (a2.message_id.as_str(), a2.seq, a2.result, a2.duplicate),
        (job.message_id.as_str(), 1, AckResult::Done, true)
    );
    assert_eq!(pngs_in(&out.join(TERMINAL)).len(), 1);
    assert_eq!(fleet.effects().len(), 1);
    assert_eq!(fleet.raw_jobs(), 2);
    assert_eq!(fleet.duplicates(), 1);
    assert_eq!(fleet.order_violations(), 0);

    // A later job with a smaller seq is carried out but counted as an order violation.
    let late = screen_job(TERMINAL, 0, ScreenKind::Expired, EffectKind::ChargeExpired);
    gw.send(TERMINAL, &late).await;
    let a3 = gw.next_ack().await;
    assert_eq!((a3.result, a3.duplicate), (AckResult::Done, false));
    assert_eq!(fleet.order_violations(), 1);

    let report = fleet.shutdown().await;
    assert_eq!(report.effects.len(), 2);
    assert_eq!(report.effects[0].kind, EffectKind::DisplayQr);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["effects"][0]["kind"], "display_qr");
    assert_eq!(json["effects"][0]["charge"], CHARGE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printer_receipt_has_no_qr_and_an_accented_transcript_naming_the_payment() {
    let port = start_broker();
    let out = temp_dir("printer");
    let devices = vec![
        DeviceSpec::Printer {
            id: PRINTER.into(),
            paper_width_mm: 80,
            code_page: CodePage::Cp860,
            native_qr: true,
            model: String::new(),
        },
        DeviceSpec::Printer {
            id: PRINTER58.into(),
            paper_width_mm: 58,
            code_page: CodePage::Cp860,
            native_qr: false,
            model: String::new(),
        },
    ];
    let fleet = fleet::start(FleetConfig {
        mqtt_host: "127.0.0.1".into(),
        mqtt_port: port,
        out_dir: out.clone(),
        devices,
        security: MqttSecurity::Plain,
    })
    .await
    .unwrap();
    fleet.wait_connected(Duration::from_secs(10)).await.unwrap();
    let mut gw = FakeGateway::connect(port).await;

    for (id, profile) in [
        (PRINTER, PrinterProfile { paper_width_mm: 80, code_page: CodePage::Cp860, native_qr: true }),
        (PRINTER58, PrinterProfile { paper_width_mm: 58, code_page: CodePage::Cp860, native_qr: false }),
    ] {
        let job = receipt_job(id, 7, &profile);
        gw.send(id, &job).await;
        let ack = gw.next_ack().await;
        assert_eq!((ack.message_id.as_str(), ack.result), (job.message_id.as_str(), AckResult::Done), "{id}: {ack:?}");
        let pngs = pngs_in(&out.join(id));
        assert_eq!(pngs.len(), 1, "{id}");
        assert!(pngs[0].file_name().unwrap().to_str().unwrap().starts_with("0007-print_receipt-"));
        let width = image::open(&pngs[0]).unwrap().width();
        assert_eq!(width, if profile.paper_width_mm == 80 { 576 } else { 384 });
        assert_eq!(qr_codes_in_png(&pngs[0]), Vec::<String>::new(), "{id}: a paid receipt must print no QR");
        let transcript = std::fs::read_to_string(out.join(id).join("transcript.txt")).unwrap();
        assert!(transcript.contains("São João"), "{id}: accents lost:\n{transcript}");
        assert!(
            !transcript.contains("[QR") && !transcript.contains("[RASTER"),
            "{id}: QR commands on a paid receipt:\n{transcript}"
        );
        let flat = transcript.split_whitespace().collect::<Vec<_>>().join(" ");
        for want in [format!("ID fim a fim: {END_TO_END_ID}"), "ID da transação: TX123".to_string()] {
            assert!(flat.contains(&want), "{id}: no {want:?} in\n{transcript}");
        }
        assert!(transcript.contains(&job.message_id), "{id}: header line missing");
    }

    // Undecodable content: permanent failure, nothing printed.
    let mut bad =
        receipt_job(PRINTER, 8, &PrinterProfile { paper_width_mm: 80, code_page: CodePage::Cp860, native_qr: true });
    bad.payload = "%%% not base64".into();
    bad.message_id = "bad".into();
    gw.send(PRINTER, &bad).await;
    let ack = gw.next_ack().await;
    assert_eq!((ack.result, ack.permanent), (AckResult::Failed, true));
    assert!(ack.reason.is_some());
    assert_eq!(fleet.effects().len(), 2);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_qr_screen_decodes_and_status_is_retained() {
    let port = start_broker();
    let out = temp_dir("terminal");
    let fleet = fleet::start(FleetConfig {
        mqtt_host: "127.0.0.1".into(),
        mqtt_port: port,
        out_dir: out.clone(),
        devices: vec![terminal_spec()],
        security: MqttSecurity::Plain,
    })
    .await
    .unwrap();
    fleet.wait_connected(Duration::from_secs(10)).await.unwrap();
    let mut gw = FakeGateway::connect(port).await;

    let job = screen_job(TERMINAL, 3, ScreenKind::PayWithPix, EffectKind::DisplayQr);
    gw.send(TERMINAL, &job).await;
    assert_eq!(gw.next_ack().await.result, AckResult::Done);
    let pngs = pngs_in(&out.join(TERMINAL));
    assert_eq!(pngs.len(), 1);
    let img = image::open(&pngs[0]).unwrap();
    assert_eq!((img.width(), img.height()), (720, 1280));
    assert_eq!(qr_codes_in_png(&pngs[0]), vec![brcode()]);
    let transcript = std::fs::read_to_string(out.join(TERMINAL).join("transcript.txt")).unwrap();
    assert!(transcript.contains("display_qr") && transcript.contains(MERCHANT), "{transcript}");

    // Expired job: refused, permanently.
    let mut old = screen_job(TERMINAL, 4, ScreenKind::PayWithPix, EffectKind::DisplayQr);
    old.expires_at = Some(chrono::Utc::now() - chrono::Duration::minutes(1));
    gw.send(TERMINAL, &old).await;
    let ack = gw.next_ack().await;
    assert_eq!((ack.result, ack.permanent), (AckResult::Failed, true));

    // The retained online status reached the gateway; shutdown publishes offline.
    let (topic, payload) = tokio::time::timeout(Duration::from_secs(5), gw.status.recv()).await.unwrap().unwrap();
    assert!(topic.ends_with(&format!("{TERMINAL}/status")));
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&payload).unwrap()["online"], true);
    fleet.shutdown().await;
    let (_, payload) = tokio::time::timeout(Duration::from_secs(5), gw.status.recv()).await.unwrap().unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&payload).unwrap(),
        serde_json::json!({"v":1,"online":false})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_keeps_retrying_until_the_broker_appears() {
    let port = common::free_port();
    let out = temp_dir("retry");
    let fleet = fleet::start(FleetConfig {
        mqtt_host: "127.0.0.1".into(),
        mqtt_port: port,
        out_dir: out.clone(),
        devices: vec![terminal_spec()],
        security: MqttSecurity::Plain,
    })
    .await
    .unwrap();
    assert!(fleet.wait_connected(Duration::from_millis(700)).await.is_err(), "no broker yet");
    common::start_broker_on(port);
    fleet.wait_connected(Duration::from_secs(15)).await.unwrap();
    let mut gw = FakeGateway::connect(port).await;
    let job = screen_job(TERMINAL, 1, ScreenKind::Paid, EffectKind::PaymentConfirmed);
    gw.send(TERMINAL, &job).await;
    assert_eq!(gw.next_ack().await.result, AckResult::Done);
    let report = fleet.shutdown().await;
    assert_eq!(report.effects.len(), 1);
    assert!(report.effects[0].file.ends_with(&format!("0001-payment_confirmed-{CHARGE}.png")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_session_gets_jobs_published_while_offline() {
    let port = start_broker();
    let out = temp_dir("session");
    let cfg = FleetConfig {
        mqtt_host: "127.0.0.1".into(),
        mqtt_port: port,
        out_dir: out.clone(),
        devices: vec![terminal_spec()],
        security: MqttSecurity::Plain,
    };
    let first = fleet::start(cfg.clone()).await.unwrap();
    first.wait_connected(Duration::from_secs(10)).await.unwrap();
    first.shutdown().await;

    let mut gw = FakeGateway::connect(port).await;
    let job = screen_job(TERMINAL, 5, ScreenKind::Expired, EffectKind::ChargeExpired);
    gw.send(TERMINAL, &job).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let second = fleet::start(cfg).await.unwrap();
    second.wait_connected(Duration::from_secs(10)).await.unwrap();
    let ack = gw.next_ack().await;
    assert_eq!((ack.message_id.as_str(), ack.result), (job.message_id.as_str(), AckResult::Done));
    let report = second.shutdown().await;
    assert_eq!(report.effects.len(), 1);
}
