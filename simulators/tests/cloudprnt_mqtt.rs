//! The simulated CloudPRNT printer on the MQTT method against a real embedded rumqttd broker
//! and a small HTTP server answering the server setting request and the job GETs, with an
//! outside MQTT client playing the CloudPRNT server.

// A test: a panic in its helpers is a failed test, as in its #[test] functions.
#![allow(clippy::unwrap_used)]

mod common;

use base64::Engine as _;
use common::{start_broker, temp_dir};
use rumqttc::{AsyncClient, Event as MqttEvent, MqttOptions, Packet, QoS};
use serde_json::{json, Value};
use simulators::cloudprnt::{BasicAuth, CloudPrinter, CloudPrntOptions, Event, JobRecord};
use simulators::cloudprnt_mqtt::{run, CloudPrntMqttOptions};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

const MAC: &str = "00:11:62:0a:1b:2c";
const WAIT: Duration = Duration::from_secs(10);

/// What the HTTP server answers the server setting request with: status and body.
type Setting = Arc<Mutex<(u16, Value)>>;

/// Serves GETs on `listener`: `/cloudprnt-setting.json…` with `setting`, anything else
/// with `png`; records every request target (and whether it had the credentials).
async fn serve(listener: tokio::net::TcpListener, setting: Setting, png: Vec<u8>, seen: Arc<Mutex<Vec<String>>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { return };
        let (setting, png, seen) = (setting.clone(), png.clone(), seen.clone());
        tokio::spawn(async move {
            let mut stream = BufReader::new(stream);
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                if stream.read_line(&mut line).await.unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push(line);
            }
            let target = head.first().and_then(|l| l.split(' ').nth(1)).unwrap_or("").to_string();
            // printer1:s3cret
            let authorized = head.iter().any(|l| l.trim() == "authorization: Basic cHJpbnRlcjE6czNjcmV0");
            seen.lock().unwrap().push(format!("{target}{}", if authorized { "" } else { " (no credentials)" }));
            let (status, content_type, body) = if target.starts_with("/cloudprnt-setting.json") {
                let (status, body) = setting.lock().unwrap().clone();
                (status, "application/json", body.to_string().into_bytes())
            } else if target.starts_with("/missing") {
                (404, "text/plain", Vec::new())
            } else {
                (200, "image/png", png)
            };
            let head = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let mut stream = stream.into_inner();
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(&body).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// The outside client: subscribed to everything printers publish.
struct Server {
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<(String, Value)>,
}

impl Server {
    async fn connect(port: u16) -> Server {
        let mut mo = MqttOptions::new("cloudprnt-server", "127.0.0.1", port);
        mo.set_max_packet_size(1 << 22, 1 << 22);
        let (client, mut events) = AsyncClient::new(mo, 64);
        client.subscribe("star/cloudprnt/to-server/#", QoS::AtLeastOnce).await.unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, mut ready) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match events.poll().await {
                    Ok(MqttEvent::Incoming(Packet::SubAck(_))) => {
                        let _ = ready_tx.send(());
                    }
                    Ok(MqttEvent::Incoming(Packet::Publish(p))) => {
                        let method = p.topic.rsplit('/').next().unwrap().to_string();
                        assert_eq!(p.topic, format!("star/cloudprnt/to-server/{MAC}/{method}"));
                        assert!(!p.retain, "printers do not retain");
                        let _ = tx.send((method, serde_json::from_slice(&p.payload).unwrap()));
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        tokio::time::timeout(WAIT, ready.recv()).await.unwrap();
        Server { client, rx }
    }

    async fn send(&self, method: &str, payload: Value) {
        let topic = format!("star/cloudprnt/to-device/{MAC}/{method}");
        self.client.publish(topic, QoS::AtLeastOnce, false, payload.to_string()).await.unwrap();
    }

    /// The next message the printer published.
    async fn next(&mut self) -> (String, Value) {
        tokio::time::timeout(WAIT, self.rx.recv()).await.expect("a message from the printer").unwrap()
    }

    /// The next message, which must be a `client-status`; its `statusCode` and
    /// `printingInProgress`.
    async fn status(&mut self) -> (String, bool) {
        let (method, status) = self.next().await;
        assert_eq!(method, "client-status", "{status}");
        assert_eq!(status["title"], "client-status");
        assert_eq!(status["printerMAC"], MAC);
        (status["statusCode"].as_str().unwrap().to_string(), status["printingInProgress"].as_bool().unwrap())
    }

    /// The next message, which must be the `print-result` of `token`: its `statusCode` and
    /// `printSucceeded`.
    async fn result(&mut self, token: &str) -> (String, bool) {
        let (method, result) = self.next().await;
        assert_eq!(method, "print-result", "{result}");
        assert_eq!(
            (&result["title"], &result["printerMAC"], &result["jobToken"]),
            (&json!("print-result"), &json!(MAC), &json!(token))
        );
        (result["statusCode"].as_str().unwrap().to_string(), result["printSucceeded"].as_bool().unwrap())
    }
}

async fn next_event(events: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(WAIT, events.recv()).await.expect("a printer event").unwrap()
}

#[tokio::test]
async fn prints_jobs_sent_over_mqtt() {
    let dir = temp_dir("cloudprnt-mqtt");
    let port = start_broker();
    let mut server = Server::connect(port).await;
    let mut png = Vec::new();
    image::GrayImage::from_pixel(576, 30, image::Luma([255]))
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = format!("http://{}", listener.local_addr().unwrap());
    let setting: Setting = Arc::new(Mutex::new((401, json!({}))));
    let seen = Arc::new(Mutex::new(Vec::new()));
    tokio::spawn(serve(listener, setting.clone(), png.clone(), seen.clone()));

    let state = dir.join("state");
    std::fs::write(&state, "ready").unwrap();
    let printer = CloudPrinter::new(CloudPrntOptions {
        url: format!("{http}/cloudprnt").parse().unwrap(),
        mac: "00:11:62:0A:1B:2C".into(),
        out: dir.to_path_buf(),
        auth: Some(BasicAuth { user: "printer1".into(), password: "s3cret".into() }),
        ca: None,
        poll: Duration::from_millis(200),
        state_file: Some(state.clone()),
        skip_confirm: 1,
        paper_mm: 80,
        confirm_delay: std::time::Duration::ZERO,
    })
    .unwrap();
    let (tx, mut events) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut report = move |e: &Event| {
            let _ = tx.send(e.clone());
        };
        run(printer, CloudPrntMqttOptions { duplicate_code: "200 OK".into() }, &mut report).await;
    });

    // Refused setting requests are reported once; then the setting names the broker.
    assert_eq!(next_event(&mut events).await, Event::Refused(401));
    *setting.lock().unwrap() = (
        200,
        json!({"title": "star_cloudprnt_server_setting", "version": "1.0.0",
            "serverSupportProtocol": ["HTTP", "MQTT"],
            "settingForMQTT": {"useTriggerPOST": false, "mqttConnectionSetting": {
                "hostName": "127.0.0.1", "portNumber": port, "useTls": false,
                "authenticationSetting": {"clientId": "dev-printer1", "username": "printer1", "password": "s3cret"}}}}),
    );
    assert_eq!(next_event(&mut events).await, Event::Polling(format!("{http}/cloudprnt")));
    assert_eq!(server.status().await, ("200%20OK".into(), false));
    let requests = std::mem::take(&mut *seen.lock().unwrap());
    assert!(requests.len() >= 2, "{requests:?}");
    for r in &requests {
        assert_eq!(r, "/cloudprnt-setting.json?mac=00%3A11%3A62%3A0a%3A1b%3A2c&replaced_path=cloudprnt");
    }

    // A url job: GET printData with the query, printed; its result skipped (--skip-confirm 1).
    server
        .send(
            "print-job",
            json!({"title": "print-job", "jobToken": "T1", "jobType": "url",
            "mediaTypes": ["image/png"], "printData": format!("{http}/job/1?x=1")}),
        )
        .await;
    let printed = next_event(&mut events).await;
    assert_eq!(printed, Event::Printed { path: dir.join("0001-print.png"), token: Some("T1".into()) });
    assert_eq!(server.status().await, ("200%20OK".into(), true));
    assert_eq!(server.status().await, ("200%20OK".into(), false));
    assert_eq!(
        std::mem::take(&mut *seen.lock().unwrap()),
        ["/job/1?x=1&mac=00%3A11%3A62%3A0a%3A1b%3A2c&type=image%2Fpng&token=T1"]
    );
    assert_eq!(std::fs::read(dir.join("0001-print.png")).unwrap(), png);
    // The same token again: not printed, answered as a duplicate.
    server
        .send(
            "print-job",
            json!({"jobToken": "T1", "jobType": "url", "mediaTypes": ["image/png"],
            "printData": format!("{http}/job/1")}),
        )
        .await;
    assert_eq!(server.result("T1").await, ("200%20OK".into(), true));
    assert_eq!(next_event(&mut events).await, Event::Duplicate("T1".into()));
    // A raw job: base64 of the PNG.
    let raw = base64::engine::general_purpose::STANDARD.encode(&png);
    server
        .send("print-job", json!({"jobToken": "T2", "jobType": "raw", "mediaTypes": ["image/png"], "printData": raw}))
        .await;
    assert_eq!(server.status().await, ("200%20OK".into(), true));
    assert_eq!(server.status().await, ("200%20OK".into(), false));
    assert_eq!(server.result("T2").await, ("200%20OK".into(), true));
    assert_eq!(
        next_event(&mut events).await,
        Event::Printed { path: dir.join("0002-print.png"), token: Some("T2".into()) }
    );
    // A download that fails; a type it cannot take.
    server.send("print-job", json!({"jobToken": "T3", "jobType": "url", "printData": format!("{http}/missing")})).await;
    assert_eq!(server.result("T3").await, ("520%20Job%20Download%20Error".into(), false));
    server
        .send("print-job", json!({"jobToken": "T4", "jobType": "raw", "mediaTypes": ["text/plain"], "printData": ""}))
        .await;
    assert_eq!(server.result("T4").await, ("510%20Incompatible%20Media%20Type".into(), false));
    let jobs: Vec<JobRecord> = std::fs::read_to_string(dir.join("jobs.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(jobs.iter().map(|j| j.token.as_deref()).collect::<Vec<_>>(), [Some("T1"), Some("T2")]);

    // Paper out: a client-status at once; a job is answered with the condition.
    std::fs::write(&state, "paper-out").unwrap();
    assert_eq!(server.status().await, ("410%20Out%20of%20Paper".into(), false));
    server
        .send(
            "print-job",
            json!({"jobToken": "T5", "jobType": "raw", "mediaTypes": ["image/png"], "printData": "AA=="}),
        )
        .await;
    assert_eq!(server.result("T5").await, ("410%20Out%20of%20Paper".into(), false));
    server.send("request-post", json!({"title": "request-post"})).await;
    server.send("request-client-status", json!({"title": "request-client-status"})).await;
    assert_eq!(server.status().await, ("410%20Out%20of%20Paper".into(), false));

    // Switched off: the connection drops without DISCONNECT, so the broker sends the Will.
    std::fs::write(&state, "offline").unwrap();
    let (method, will) = server.next().await;
    assert_eq!(method, "client-will");
    assert_eq!(will, json!({"title": "client-will", "printerMAC": MAC, "unintentionalDisconnection": true}));
    seen.lock().unwrap().clear();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(seen.lock().unwrap().is_empty(), "switched off: no requests");
    // Switched on: a boot (setting request), connect, subscribe, status.
    std::fs::write(&state, "ready").unwrap();
    assert_eq!(next_event(&mut events).await, Event::Polling(format!("{http}/cloudprnt")));
    assert_eq!(server.status().await, ("200%20OK".into(), false));
    assert_eq!(
        seen.lock().unwrap().first().map(String::as_str),
        Some("/cloudprnt-setting.json?mac=00%3A11%3A62%3A0a%3A1b%3A2c&replaced_path=cloudprnt")
    );
    // Tokens survive the power cycle in this simulator (they are in memory for the process).
    server
        .send(
            "print-job",
            json!({"jobToken": "T2", "jobType": "raw", "mediaTypes": ["image/png"], "printData": "AA=="}),
        )
        .await;
    assert_eq!(server.result("T2").await, ("200%20OK".into(), true));
}
