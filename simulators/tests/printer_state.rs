//! A simulated printer's condition over MQTT (`DeviceHandle::set_printer_state`): the
//! retained status says it, a job that arrives anyway is refused as a real printer would
//! (transient `failed`), the state is reported again after a reconnect, and
//! `Rendering::Verify` checks payloads without drawing them.

// A test: a panic in its helpers is a failed test, as in its #[test] functions.
#![allow(clippy::unwrap_used)]

mod common;

use common::{start_broker, temp_dir, FakeGateway};
use device_protocol::messages::{CONTENT_ESCPOS, CONTENT_SCREEN};
use device_protocol::{AckResult, EffectKind, Job, PrinterState, ScreenContent, ScreenKind, Status};
use render::codepage::CodePage;
use simulators::device::{MqttSecurity, Rendering, Stats};
use simulators::fleet::{self, FleetConfig, FleetOptions};
use simulators::registry::DeviceSpec;
use std::sync::Arc;
use std::time::Duration;

const PRINTER: &str = "0fb23c6f5da2cec255404e4f";
const TERMINAL: &str = "0034d6608697a8d41bed440e";

fn job(seq: u64, content_type: &str, payload: &[u8], kind: EffectKind) -> Job {
    Job {
        v: 1,
        message_id: format!("{seq:032x}"),
        seq,
        kind,
        event_id: format!("Charge:c:{seq}"),
        charge_id: "c".into(),
        content_type: content_type.into(),
        payload: Job::encode_payload(payload),
        expires_at: None,
    }
}

fn screen(brcode: &str, amount_cents: u64) -> Vec<u8> {
    serde_json::to_vec(&ScreenContent {
        screen: ScreenKind::PayWithPix,
        merchant_name: "Loja".into(),
        amount_cents,
        brcode: Some(brcode.into()),
        expires_at: None,
        payer_name: None,
        paid_at: None,
        locale: "pt-BR".into(),
        time_zone: "America/Sao_Paulo".into(),
    })
    .unwrap()
}

/// The next status the gateway sees for `device`.
async fn next_status(gw: &mut FakeGateway, device: &str) -> Status {
    loop {
        let (topic, payload) =
            tokio::time::timeout(Duration::from_secs(10), gw.status.recv()).await.expect("a status").unwrap();
        if topic.contains(device) {
            return serde_json::from_slice(&payload).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paper_out_is_reported_and_jobs_are_refused_until_ready() {
    let port = start_broker();
    let stats = Arc::new(Stats::default());
    let printer = DeviceSpec::Printer {
        id: PRINTER.into(),
        paper_width_mm: 80,
        code_page: CodePage::Cp860,
        native_qr: true,
        model: String::new(),
    };
    let terminal = DeviceSpec::Terminal {
        id: TERMINAL.into(),
        width_px: 720,
        height_px: 1280,
        locale: "pt-BR".into(),
        time_zone: "America/Sao_Paulo".into(),
    };
    let out = temp_dir("printer-state");
    let cfg = FleetConfig {
        mqtt_host: "127.0.0.1".into(),
        mqtt_port: port,
        out_dir: out.to_path_buf(),
        devices: vec![printer, terminal],
        security: MqttSecurity::Plain,
    };
    let mut gw = FakeGateway::connect(port).await;
    let fleet = fleet::start_with_options(
        cfg,
        FleetOptions { rendering: Rendering::Verify, stats: stats.clone(), ..FleetOptions::default() },
    )
    .await
    .unwrap();
    fleet.wait_connected(Duration::from_secs(10)).await.unwrap();
    let p = fleet.device(PRINTER).unwrap();
    assert_eq!(next_status(&mut gw, PRINTER).await.printer, Some(PrinterState::Ready));

    p.set_printer_state(PrinterState::PaperOut).await.unwrap();
    assert_eq!(
        next_status(&mut gw, PRINTER).await,
        Status { v: 1, online: true, printer: Some(PrinterState::PaperOut) }
    );
    assert!(
        fleet.device(TERMINAL).unwrap().set_printer_state(PrinterState::PaperOut).await.is_err(),
        "a card machine has no paper"
    );

    // A job sent anyway is refused, transiently, and counted.
    gw.send(PRINTER, &job(1, CONTENT_ESCPOS, b"\x1b@hello\n", EffectKind::PrintReceipt)).await;
    let ack = gw.next_ack().await;
    assert_eq!((ack.result, ack.permanent, ack.reason.as_deref()), (AckResult::Failed, false, Some("paper_out")));
    assert_eq!(p.counters().received_while_held, 1);

    // Cover open, then ready: the same job is carried out (Verify: nothing drawn).
    p.set_printer_state(PrinterState::CoverOpen).await.unwrap();
    assert_eq!(next_status(&mut gw, PRINTER).await.printer, Some(PrinterState::CoverOpen));
    p.set_printer_state(PrinterState::Ready).await.unwrap();
    assert_eq!(next_status(&mut gw, PRINTER).await.printer, Some(PrinterState::Ready));
    gw.send(PRINTER, &job(1, CONTENT_ESCPOS, b"\x1b@hello\n", EffectKind::PrintReceipt)).await;
    assert_eq!(gw.next_ack().await.result, AckResult::Done);
    assert_eq!(
        p.counters(),
        simulators::device::DeviceCountersSnapshot { raw_jobs: 2, carried_out: 1, received_while_held: 1 }
    );
    assert_eq!(stats.effects()[0].file, "", "Verify draws nothing");

    // Verify still checks payloads: not ESC/POS, a bad BR Code, an amount that differs.
    gw.send(PRINTER, &job(2, CONTENT_ESCPOS, b"plain text", EffectKind::PrintReceipt)).await;
    let ack = gw.next_ack().await;
    assert_eq!((ack.result, ack.permanent), (AckResult::Failed, true), "{ack:?}");
    let good = render::brcode::encode_dynamic("pix.example.com/qr/v2/x", Some(990), "Loja", "Recife").unwrap();
    let mut bad = good.clone();
    bad.pop();
    bad.push('X');
    for (seq, content) in [(1, screen(&bad, 990)), (2, screen(&good, 991))] {
        gw.send(TERMINAL, &job(seq, CONTENT_SCREEN, &content, EffectKind::DisplayQr)).await;
        let ack = gw.next_ack().await;
        assert_eq!((ack.result, ack.permanent), (AckResult::Failed, true), "{ack:?}");
    }
    gw.send(TERMINAL, &job(3, CONTENT_SCREEN, &screen(&good, 990), EffectKind::DisplayQr)).await;
    assert_eq!(gw.next_ack().await.result, AckResult::Done);

    // The state survives a reconnect: another client takes the device's client id, the
    // broker drops the device, it reconnects and reports paper_out again, not ready.
    p.set_printer_state(PrinterState::PaperOut).await.unwrap();
    assert_eq!(next_status(&mut gw, PRINTER).await.printer, Some(PrinterState::PaperOut));
    {
        let (_intruder, mut el) =
            rumqttc::AsyncClient::new(rumqttc::MqttOptions::new(format!("dev-{PRINTER}"), "127.0.0.1", port), 8);
        loop {
            if let rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_)) =
                tokio::time::timeout(Duration::from_secs(10), el.poll()).await.unwrap().unwrap()
            {
                break;
            }
        }
    }
    let back = loop {
        let s = next_status(&mut gw, PRINTER).await;
        if s.online {
            break s;
        }
    };
    assert_eq!(back.printer, Some(PrinterState::PaperOut), "after a reconnect the printer still reports its state");
    fleet.device(PRINTER).unwrap().wait_ready(Duration::from_secs(10)).await.unwrap();
    fleet.shutdown().await;
    assert_eq!(next_status(&mut gw, PRINTER).await, Status { v: 1, online: false, printer: None });
}
