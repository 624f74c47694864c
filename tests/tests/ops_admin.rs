//! Operating a running gateway: the admin endpoints behind `http.admin_token`, and JSON
//! log lines that follow one payment from its record to the devices' acks.
//!
//! Real parts: tansu, the `pixgate` binary and its CLI, MQTT devices.

// Helpers of a test are test steps too: a panic is a failed test (clippy.toml's
// allow-unwrap-in-tests covers only the #[test] fns themselves).
#![allow(clippy::unwrap_used)]

use pixgate_tests::gateway::{cli as pixgate_cli, count};
use pixgate_tests::harness::{protocol_devices, wait_for, Rig};
use serde_json::Value;
use simulators::capture;
use std::time::Duration;

const TOKEN: &str = "admin-token-7c1f0e2d";
const WRONG: &str = "not-the-admin-token";
const TERMINAL: &str = "7f80e222f828767efc2f9162";
const PRINTER: &str = "8baa7196b50ac2f86702824c";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_need_the_token_and_refusals_are_counted_and_logged() {
    let rig = Rig::builder("admin")
        .env("PIXGATE_HTTP__ADMIN_TOKEN", TOKEN)
        .env("PIXGATE_CLOCK__CONTROL", "true")
        .start()
        .await;
    let gw = rig.gateway();
    let bearer = |t: &str| format!("Bearer {t}");

    // Open to anyone: liveness, readiness, counters.
    for path in ["/healthz", "/readyz", "/stats", "/metrics"] {
        let (status, body) = gw.get(path).unwrap();
        assert_eq!(status, 200, "{path}: {body}");
    }

    // Device data, replay and the clock: 401 without the token and with a wrong one.
    let admin = [
        ("GET", "/outbox"),
        ("GET", &format!("/outbox/{TERMINAL}")),
        ("GET", "/deadletters"),
        ("GET", "/deadletters/1"),
        ("POST", "/deadletters/1/replay"),
        ("POST", "/clock/advance?ms=1000"),
    ];
    for (method, path) in admin {
        let (status, body) = gw.request(method, path, &[]).unwrap();
        assert_eq!(status, 401, "{method} {path} without a token: {body}");
        assert!(body.contains("missing admin token"), "{body}");
        let (status, body) = gw.request(method, path, &[("Authorization", &bearer(WRONG))]).unwrap();
        assert_eq!(status, 401, "{method} {path} with a wrong token: {body}");
        assert!(body.contains("wrong admin token"), "{body}");
    }
    // With the token: served (a dead letter that does not exist is the handler's answer).
    let auth = bearer(TOKEN);
    let with_token = |method: &str, path: &str| gw.request(method, path, &[("Authorization", &auth)]).unwrap();
    let (status, body) = with_token("GET", "/outbox");
    assert_eq!(status, 200, "{body}");
    let (status, body) = with_token("GET", "/deadletters");
    assert_eq!(status, 200, "{body}");
    assert!(serde_json::from_str::<Value>(&body).unwrap()["deadletters"].is_array(), "{body}");
    let (status, body) = with_token("POST", "/clock/advance?ms=1000");
    assert_eq!(status, 200, "{body}");
    let (status, body) = with_token("POST", "/deadletters/1/replay");
    assert!(status != 401 && !body.contains("unauthorized"), "{status} {body}");

    // The CLI sends the configured token, from the setting or from a file.
    let (bin, port) = (rig.bin(), rig.settings().http_port);
    let (ok, _, err) = pixgate_cli(bin, port, &["outbox", "list"], &[]);
    assert!(!ok && err.contains("unauthorized"), "without a token the CLI is refused: {err}");
    let (ok, out, err) = pixgate_cli(bin, port, &["deadletter", "list"], &[("PIXGATE_HTTP__ADMIN_TOKEN", TOKEN)]);
    assert!(ok, "{err}");
    assert!(serde_json::from_str::<Value>(&out).unwrap()["deadletters"].is_array(), "{out}");
    let token_file = rig.dir().join("admin-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let file_env = [("PIXGATE_HTTP__ADMIN_TOKEN_FILE", token_file.to_str().unwrap())];
    let (ok, out, err) = pixgate_cli(bin, port, &["outbox", "list"], &file_env);
    assert!(ok, "{err}");
    assert!(serde_json::from_str::<Value>(&out).is_ok(), "{out}");

    // Counted: two refusals per admin request above, and the CLI's.
    let refused = 2 * admin.len() as u64 + 1;
    assert_eq!(gw.stats().unwrap().counters.http_unauthorized, refused);
    let (_, metrics) = gw.get("/metrics").unwrap();
    assert!(metrics.lines().any(|l| l == format!("pixgate_http_unauthorized_total {refused}")), "{metrics}");

    // Logged at warn with the path and the peer; never the token presented.
    let read_log = || std::fs::read_to_string(gw.log()).unwrap();
    let lines_with = |log: &str, text: &str| log.lines().filter(|l| l.contains(text)).count() as u64;
    wait_for("the refusals' log lines", Duration::from_secs(10), || {
        lines_with(&read_log(), "HTTP request refused") >= refused
    })
    .await;
    let log = read_log();
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("HTTP request refused")).collect();
    assert_eq!(refusals.len() as u64, refused, "{log}");
    assert!(refusals.iter().all(|l| l.contains("WARN") && l.contains("peer=127.0.0.1:")), "{refusals:#?}");
    assert!(refusals.iter().any(|l| l.contains("path=/deadletters/1/replay") && l.contains("wrong admin token")));
    assert!(!log.contains(WRONG) && !log.contains(TOKEN), "a token in the log: {log}");

    // A stream of refusals (a scanner, a client with a stale token): each counted, but at
    // most 20 logged in full per minute. Sent within seconds, 60 span at most two windows.
    const STREAM: u64 = 60;
    for _ in 0..STREAM {
        let (status, _) = gw.request("GET", "/outbox", &[]).unwrap();
        assert_eq!(status, 401);
    }
    assert_eq!(gw.stats().unwrap().counters.http_unauthorized, refused + STREAM);
    let logged = lines_with(&read_log(), "HTTP request refused") - refused;
    assert!(logged <= 40, "{logged} of {STREAM} refusals logged in full");
    rig.shutdown();
}

/// One raw HTTP/1.1 request to `port` with `host` as its `Host`: the status code.
fn status_with_host(port: u16, method: &str, path: &str, host: &str, extra: &str) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    resp.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("no status: {resp}"))
}

/// Without a token, on loopback, the admin endpoints answer the machine's own clients but
/// not a web page elsewhere that a browser on the machine runs: a DNS rebinding (a foreign
/// `Host`) or a cross-site POST (a foreign or `null` `Origin`) is refused, counted, and
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_a_web_page_elsewhere_cannot_use_the_admin_endpoints() {
    let rig = Rig::builder("admin-site").start().await;
    let gw = rig.gateway();
    let port = rig.settings().http_port;
    let here = format!("127.0.0.1:{port}");
    assert_eq!(status_with_host(port, "GET", "/outbox", &here, ""), 200);
    assert_eq!(status_with_host(port, "GET", "/outbox", &format!("localhost:{port}"), ""), 200);
    assert_eq!(status_with_host(port, "GET", "/outbox", &format!("rebound.example:{port}"), ""), 401);
    for origin in ["https://shop.example", "null"] {
        let extra = format!("Origin: {origin}\r\n");
        assert_eq!(status_with_host(port, "POST", "/flags/display_qr/off", &here, &extra), 401, "{origin}");
    }
    let display_qr =
        || serde_json::from_str::<Value>(&gw.get("/flags").unwrap().1).unwrap()["flags"]["display_qr"].clone();
    assert_eq!(display_qr(), Value::Bool(true), "nothing switched");
    assert_eq!(gw.stats().unwrap().counters.http_unauthorized, 3);
    let read_log = || std::fs::read_to_string(gw.log()).unwrap();
    let foreign = |log: &str| log.lines().filter(|l| l.contains("Host or Origin is not a loopback address")).count();
    wait_for("the refusals' log lines", Duration::from_secs(10), || foreign(&read_log()) >= 3).await;
    let log = read_log();
    assert_eq!(foreign(&log), 3, "{log}");
    // The page pixgate serves itself (its own origin) may.
    let extra = format!("Origin: http://{here}\r\n");
    assert_eq!(status_with_host(port, "POST", "/flags/display_qr/off", &here, &extra), 200);
    assert_eq!(display_qr(), Value::Bool(false), "switched off");
    rig.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_follow_one_payment_with_its_ids() {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let rig = Rig::builder("jsonlog")
        .env("PIXGATE_LOG__FORMAT", "json")
        // "job queued" is a debug line.
        .env("RUST_LOG", "info,librdkafka=info,gateway::ingest::handoff=debug")
        .start()
        .await;
    let devices = [TERMINAL, PRINTER].map(|id| pixgate_tests::fixture_device(&fixtures, id)).to_vec();
    let fleet = rig.start_fleet(devices, protocol_devices()).await;
    rig.publish_registry_file(&fixtures.join("devices.jsonl")).await;

    // One payment: the QR, then "paid" on the card machine and the receipt on its printer.
    let charge = "abcdefabcdefabcdefabcdef";
    let template = pixgate_tests::charges::template(&fixtures);
    let t = chrono::Utc::now().timestamp() as u64;
    let producer = rig.producer();
    let record =
        |status: &str, v: i64| pixgate_tests::charges::charge_record(&template, TERMINAL, charge, status, v, 60, t);
    capture::publish_records(&producer, &[record("ACTIVE", 0)]).await.unwrap();
    rig.wait_stats(Duration::from_secs(60), |s| count(&s.counters.effects_done, "display_qr") == 1).await;
    capture::publish_records(&producer, &[record("COMPLETED", 1)]).await.unwrap();
    rig.wait_stats(Duration::from_secs(60), |s| {
        count(&s.counters.effects_done, "payment_confirmed") == 1
            && count(&s.counters.effects_done, "print_receipt") == 1
    })
    .await;
    let effects = fleet.effects();
    assert_eq!(effects.len(), 3, "{effects:?}");

    // Every line of the gateway's log is one JSON object.
    let log = std::fs::read_to_string(rig.gateway().log()).unwrap();
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines.iter().all(|l| l["timestamp"].is_string() && l["level"].is_string() && l["message"].is_string()));

    // Each delivered job: queued and done, both lines with the same ids, found by charge.
    let of_charge: Vec<&Value> = lines.iter().filter(|l| l["charge"] == charge).collect();
    for e in &effects {
        for message in ["job queued", "job done"] {
            let line = of_charge
                .iter()
                .find(|l| l["message"] == message && l["message_id"] == e.message_id.as_str())
                .unwrap_or_else(|| panic!("no {message:?} line for {e:?} in {of_charge:#?}"));
            assert_eq!(line["device"], e.device.as_str(), "{line}");
            assert_eq!(line["kind"], e.kind.as_str(), "{line}");
            assert_eq!(line["seq"], e.seq, "{line}");
            let event = line["event_id"].as_str().unwrap_or_else(|| panic!("no event_id: {line}"));
            assert!(event.starts_with(&format!("Charge:{charge}:")), "{line}");
        }
    }
    fleet.shutdown().await;
    rig.shutdown();
}
