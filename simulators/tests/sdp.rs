//! `printer-sim sdp` against a small Epson Server Direct Print server written here (axum):
//! the server challenges with HTTP Digest (MD5, qop=auth, checked independently with the
//! `md5` crate), marks its nonce stale once, offers one small ESC/POS receipt as hex
//! `<command>`s (twice: the printer does not dedupe), records the SetResponses and
//! SetStatus notifications. The test checks the printed PNG, the `.bin` beside it, the
//! `jobs.jsonl` records, the result XML, and a paper-out job's failure and status.

// A test: a panic in its helpers is a failed test, as in its #[test] functions.
#![allow(clippy::unwrap_used)]

mod common;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Form;
use md5::{Digest, Md5};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;

/// Deadlock guard (a failing simulator must not hang the test), not a timing check.
const GUARD: Duration = Duration::from_secs(60);
const REALM: &str = "pixgate sdp";
const USER: &str = "printer1";
const PASSWORD: &str = "s3cret pass";
const ID: &str = "TM-T88VI-1";

/// A small receipt: initialise, centred title, a line, feed and cut.
const RECEIPT: &[u8] = b"\x1b@\x1ba\x01PIXGATE\n\x1ba\x00Total R$ 10,00\n\n\n\x1dVA\x00";

fn md5_hex(s: &str) -> String {
    hex::encode(Md5::digest(s.as_bytes()))
}

/// The server side.
#[derive(Default)]
struct Server {
    /// The nonce now; the old ones are answered `stale=true`.
    nonce: String,
    old_nonces: Vec<String>,
    /// Answers to the next GetRequests (empty: nothing to print).
    offers: VecDeque<String>,
    /// Every request: `ConnectionType`, the Authorization's nonce and nc (if accepted), or
    /// the challenge sent.
    log: Vec<String>,
    /// ResponseFile of each SetResponse.
    responses: Vec<String>,
    /// Status of each SetStatus.
    statuses: Vec<String>,
}

type Shared = Arc<Mutex<Server>>;

fn challenge(nonce: &str, stale: bool) -> Response {
    let stale = if stale { ", stale=true" } else { "" };
    let value = format!(r#"Digest realm="{REALM}", qop="auth", algorithm=MD5, nonce="{nonce}", opaque="op-1"{stale}"#);
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, value)], "").into_response()
}

/// The Authorization's parameters (values without commas here).
fn digest_params(value: &str) -> Option<HashMap<String, String>> {
    let rest = value.strip_prefix("Digest ")?;
    Some(
        rest.split(", ")
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
            .collect(),
    )
}

async fn sdp(State(server): State<Shared>, headers: HeaderMap, Form(form): Form<HashMap<String, String>>) -> Response {
    let mut s = server.lock().unwrap();
    let kind = form.get("ConnectionType").cloned().unwrap_or_default();
    assert_eq!(form.get("ID").map(String::as_str), Some(ID));
    assert_eq!(
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()),
        Some("application/x-www-form-urlencoded")
    );
    let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(digest_params);
    let Some(p) = auth else {
        s.log.push(format!("{kind} challenged"));
        return challenge(&s.nonce.clone(), false);
    };
    let get = |k: &str| p.get(k).cloned().unwrap_or_default();
    assert_eq!(
        (get("username"), get("realm"), get("uri"), get("algorithm"), get("qop"), get("opaque")),
        (USER.into(), REALM.into(), "/sdp".into(), "MD5".into(), "auth".into(), "op-1".into())
    );
    let ha1 = md5_hex(&format!("{USER}:{REALM}:{PASSWORD}"));
    let ha2 = md5_hex("POST:/sdp");
    let expected = md5_hex(&format!("{ha1}:{}:{}:{}:auth:{ha2}", get("nonce"), get("nc"), get("cnonce")));
    if get("response") != expected {
        s.log.push(format!("{kind} rejected"));
        return challenge(&s.nonce.clone(), false);
    }
    if get("nonce") != s.nonce {
        assert!(s.old_nonces.contains(&get("nonce")), "a nonce the server gave");
        s.log.push(format!("{kind} stale"));
        return challenge(&s.nonce.clone(), true);
    }
    s.log.push(format!("{kind} {} {}", get("nonce"), get("nc")));
    match kind.as_str() {
        "GetRequest" => match s.offers.pop_front() {
            Some(xml) => ([(header::CONTENT_TYPE, "text/xml; charset=utf-8")], xml).into_response(),
            None => StatusCode::OK.into_response(),
        },
        "SetResponse" => {
            s.responses.push(form.get("ResponseFile").cloned().unwrap_or_default());
            if s.responses.len() == 1 {
                // The nonce expires after the first result.
                let old = std::mem::replace(&mut s.nonce, "nonce-2".into());
                s.old_nonces.push(old);
            }
            StatusCode::OK.into_response()
        }
        "SetStatus" => {
            s.statuses.push(form.get("Status").cloned().unwrap_or_default());
            StatusCode::OK.into_response()
        }
        other => panic!("ConnectionType {other:?}"),
    }
}

/// A PrintRequestInfo with one job, the receipt as hex `<command>`s (the second one upper
/// case).
fn offer(printjobid: &str) -> String {
    let (a, b) = RECEIPT.split_at(12);
    format!(
        r#"<?xml version="1.0" encoding="utf-8"?><PrintRequestInfo Version="2.00"><ePOSPrint><Parameter><devid>local_printer</devid><timeout>10000</timeout><printjobid>{printjobid}</printjobid></Parameter><PrintData><epos-print xmlns="http://www.epson-pos.com/schemas/2011/03/epos-print"><command>{}</command><command>{}</command></epos-print></PrintData></ePOSPrint></PrintRequestInfo>"#,
        hex::encode(a),
        hex::encode_upper(b)
    )
}

fn result_xml(printjobid: &str, success: bool, code: &str, status: u32) -> String {
    format!(
        r#"<?xml version="1.0" encoding="utf-8"?><PrintResponseInfo Version="2.00"><ePOSPrint><Parameter><devid>local_printer</devid><printjobid>{printjobid}</printjobid></Parameter><PrintResponse><response xmlns="http://www.epson-pos.com/schemas/2011/03/epos-print" success="{success}" code="{code}" status="{status}" battery="0"/></PrintResponse></ePOSPrint></PrintResponseInfo>"#
    )
}

/// Waits until `done` holds for the server's state.
async fn until(server: &Shared, what: &str, done: impl Fn(&Server) -> bool) {
    let deadline = tokio::time::Instant::now() + GUARD;
    while !done(&server.lock().unwrap()) {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Serves `server` on a free loopback port; its URL.
async fn serve(server: Shared) -> String {
    let app = axum::Router::new().route("/sdp", axum::routing::post(sdp)).with_state(server);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/sdp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// Starts `printer-sim sdp` for `url` with `{out}/password`, polling every 100 ms, and
/// `more` arguments.
fn start(url: &str, out: &std::path::Path, more: &[&str]) -> (tokio::process::Child, Lines<BufReader<ChildStdout>>) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_printer-sim"))
        .args(["sdp", "--url", url, "--id", ID, "--user", USER])
        .args(["--password-file", out.join("password").to_str().unwrap()])
        .args(["--out", out.to_str().unwrap(), "--poll-ms", "100"])
        .args(more)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("printer-sim starts");
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// The simulator's next stdout line.
async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(GUARD, lines.next_line()).await.expect("a line in time").unwrap().expect("a line")
}

#[tokio::test]
async fn prints_a_job_and_sends_its_result() {
    let out = common::temp_dir("sdp");
    let server: Shared = Arc::new(Mutex::new(Server {
        nonce: "nonce-1".into(),
        offers: [offer("ABC123"), offer("ABC123")].into(),
        ..Server::default()
    }));
    let url = serve(server.clone()).await;
    std::fs::write(out.join("password"), format!("{PASSWORD}\n")).unwrap();

    let (mut child, mut lines) = start(&url, &out, &["--status-ms", "60000", "--paper", "80"]);

    assert_eq!(next_line(&mut lines).await, format!("polling {url}"));
    let png = out.join("0001-print.png");
    assert_eq!(next_line(&mut lines).await, format!("printed {} token=ABC123", png.display()));
    // Offered again: printed again.
    assert_eq!(next_line(&mut lines).await, format!("printed {} token=ABC123", out.join("0002-print.png").display()));
    until(&server, "two results", |s| s.responses.len() == 2).await;

    let image = image::open(&png).unwrap().to_luma8();
    assert_eq!(image.width(), 576, "as wide as the 80 mm head");
    assert!(image.pixels().any(|p| p.0[0] < 128), "something is printed");
    assert_eq!(std::fs::read(out.join("0001-print.bin")).unwrap(), RECEIPT);
    assert_eq!(std::fs::read(out.join("0002-print.bin")).unwrap(), RECEIPT);
    let jobs = std::fs::read_to_string(out.join("jobs.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = jobs.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 2);
    assert_eq!(
        records[0],
        serde_json::json!({"file": "0001-print.png", "token": "ABC123", "width": 576, "height": image.height()})
    );
    assert_eq!(records[1]["file"], "0002-print.png");

    {
        let s = server.lock().unwrap();
        let printed = result_xml("ABC123", true, "", 2);
        assert_eq!(s.responses, [printed.clone(), printed]);
        assert!(s.statuses[0].contains(r#"asbstatus="0x00000000""#), "{:?}", s.statuses);
        // The first request goes without credentials; the challenge's nonce is then used
        // with nc counting up; after the stale challenge, the new nonce from nc 1.
        assert!(s.log[0].ends_with(" challenged"), "{:?}", s.log);
        assert!(s.log[1].ends_with(" nonce-1 00000001"), "{:?}", s.log);
        assert!(s.log[2].ends_with(" nonce-1 00000002"), "{:?}", s.log);
        let stale = s.log.iter().position(|l| l.ends_with(" stale")).expect("a stale challenge");
        assert!(s.log[stale + 1].ends_with(" nonce-2 00000001"), "{:?}", s.log);
        assert!(!s.log.iter().skip(1).any(|l| l.ends_with(" challenged")), "{:?}", s.log);
    }

    // Paper out: the status is notified at once, the next job fails, nothing printed.
    std::fs::write(out.join("state"), "paper-out").unwrap();
    until(&server, "a paper-out status", |s| s.statuses.iter().any(|x| x.contains("0x00080008"))).await;
    assert_eq!(
        server.lock().unwrap().statuses.last().unwrap(),
        r#"<?xml version="1.0" encoding="utf-8"?><statusmonitor Version="1.00"><printerstatus devicename="local_printer" asbstatus="0x00080008"/></statusmonitor>"#
    );
    server.lock().unwrap().offers.push_back(offer("J2"));
    until(&server, "the third result", |s| s.responses.len() == 3).await;
    assert_eq!(server.lock().unwrap().responses[2], result_xml("J2", false, "EPTR_REC_EMPTY", 0x80008));
    assert!(!out.join("0003-print.png").exists());
    assert_eq!(std::fs::read_to_string(out.join("jobs.jsonl")).unwrap(), jobs);
    child.kill().await.unwrap();
}

/// A wrong password: `refused 401` once, however often the printer tries again.
#[tokio::test]
async fn a_wrong_password_is_refused() {
    let out = common::temp_dir("sdp-refused");
    let server: Shared = Arc::new(Mutex::new(Server { nonce: "nonce-1".into(), ..Server::default() }));
    let url = serve(server.clone()).await;
    std::fs::write(out.join("password"), "wrong\n").unwrap();
    let (mut child, mut lines) = start(&url, &out, &[]);
    assert_eq!(next_line(&mut lines).await, "refused 401");
    until(&server, "three refused polls", |s| s.log.iter().filter(|l| l.ends_with(" rejected")).count() >= 3).await;
    child.kill().await.unwrap();
    assert_eq!(lines.next_line().await.unwrap(), None, "nothing more said");
    let s = server.lock().unwrap();
    assert_eq!(s.log[..3], ["GetRequest challenged", "GetRequest rejected", "GetRequest rejected"]);
}
