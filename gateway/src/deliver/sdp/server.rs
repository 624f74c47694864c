//! The endpoint an Epson printer on Server Direct Print is pointed at, `POST /sdp` (Epson
//! Server Direct Print User's Manual), one URL for the three requests, all
//! `application/x-www-form-urlencoded`:
//!
//! | `ConnectionType` | fields | answer |
//! |---|---|---|
//! | `GetRequest` (the poll) | `ID` | `200`, `text/xml`: empty, or the job in flight ([`epos::print_request`]) |
//! | `SetResponse` (a job's result) | `ID`, `ResponseFile` | `200`, empty; the result becomes the dispatcher's ack |
//! | `SetStatus` (status notification) | `ID`, `Status` | `200`, empty; the printer's condition |
//!
//! Every request carries HTTP Digest credentials ([`super::digest`]): the device id and the
//! secret issued to it with `--digest`. The device must be a registered, enabled
//! `epson-sdp` printer, and the form's `ID` (the printer's WebConfig "ID") its device id.
//! Refusals are counted and logged as the CloudPRNT server's are (`cloudprnt_refusals`,
//! the same rules, with `id_mismatch` for the ID).
//!
//! The poll carries no condition. A printer with status notification on tells it in
//! `SetStatus`: paper out and cover open hold its queue until it tells otherwise. Without
//! it, a job that fails for the printer's condition is offered again after the dispatcher's
//! backoff. A job handed out again before its result came (the result was lost: Epson's
//! printers keep no memory of job ids) is printed under the reprint header, as a direct
//! printer's interrupted job is. A job is recorded as handed out in the outbox, synced,
//! before the answer that carries it ([`Outbox::mark_direct`], the direct printers'
//! mark), so that a copy handed out after a restart is a reprint too; a result saying
//! its only copy never reached the print mechanism removes the mark
//! ([`Outbox::clear_direct_mark`]).

use super::digest::{Digest, DigestError};
use super::epos;
use crate::deliver::cloudprnt::board::{Confirmation, Offer, PollRefused};
use crate::deliver::cloudprnt::server::{Refusal, Server};
use crate::model::{CloudSettings, Standing};
use crate::store::{DirectMark, Outbox, OutboxError};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use device_protocol::Status;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What the handler shares.
#[derive(Clone)]
pub struct Sdp {
    /// The CloudPRNT server's board, printers, secrets and counters: one board for every
    /// printer that fetches its jobs.
    pub server: Server,
    /// Challenges and checks.
    pub digest: Arc<Digest>,
    /// Each printer's condition from its last status notification, and when it came.
    pub conditions: Arc<Mutex<HashMap<String, (Status, Instant)>>>,
    /// A notification older than this is not taken as the printer's condition
    /// (`cloudprnt.offline_after_ms`).
    pub fresh_for: Duration,
    /// Where a job handed out is recorded (the direct printers' marks).
    pub outbox: Arc<Outbox>,
    /// Held while a mark is read and written: a poll for a job whose first copy is being
    /// recorded waits, so that no copy goes out unrecorded, and one printer's marks land
    /// in the order they were made.
    pub marking: Arc<tokio::sync::Mutex<()>>,
}

/// The routes, request bodies bounded by `max_body_bytes`.
pub fn routes(sdp: Sdp, max_body_bytes: usize) -> Router {
    Router::new().route("/sdp", post(request)).layer(DefaultBodyLimit::max(max_body_bytes)).with_state(sdp)
}

/// The form fields pixgate reads.
#[derive(Debug, Deserialize)]
struct Form {
    #[serde(rename = "ConnectionType")]
    connection_type: String,
    #[serde(rename = "ID", default)]
    id: String,
    #[serde(rename = "ResponseFile", default)]
    response_file: Option<String>,
    #[serde(rename = "Status", default)]
    status: Option<String>,
}

fn xml(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/xml; charset=utf-8")], body).into_response()
}

impl Sdp {
    /// A `401` with a new challenge.
    fn challenge(&self, stale: bool) -> Response {
        let mut r = StatusCode::UNAUTHORIZED.into_response();
        if let Ok(v) = header::HeaderValue::from_str(&self.digest.challenge(stale)) {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        r
    }

    /// The printer the request's Digest credentials prove, or the answer to give.
    #[allow(clippy::result_large_err)]
    fn authenticate(&self, headers: &HeaderMap, uri: &Uri) -> Result<(String, CloudSettings), Response> {
        let s = &self.server;
        let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let target = uri.path_and_query().map_or("/sdp", |p| p.as_str());
        let ha1 = |user: &str| s.secrets.as_ref()?.digest_ha1(user);
        let id = match self.digest.verify(authorization, "POST", target, ha1) {
            Ok(id) => id,
            // Epson's first request is a dummy without credentials, answered with the
            // challenge; an old nonce is renewed. Neither is a refusal.
            Err(DigestError::Missing) => {
                tracing::debug!("SDP request without Digest credentials: challenged");
                return Err(self.challenge(false));
            }
            Err(DigestError::Stale) => return Err(self.challenge(true)),
            Err(DigestError::Wrong(user)) => {
                s.refuse(Refusal::BadCredentials, &user, "wrong secret, or none issued with --digest");
                return Err(self.challenge(false));
            }
            Err(e @ DigestError::Malformed(_)) => {
                s.refuse(Refusal::BadCredentials, "-", &e.to_string());
                return Err(self.challenge(false));
            }
        };
        let Some(settings) = s.printers.cloud(&id).filter(|c| c.method == cdc::CloudMethod::EpsonSdp) else {
            s.refuse(Refusal::UnknownDevice, &id, "not a registered epson-sdp printer");
            return Err(StatusCode::FORBIDDEN.into_response());
        };
        if s.directory.standing(&id) != Standing::Enabled {
            s.refuse(Refusal::DisabledDevice, &id, "disabled in the registry");
            return Err(StatusCode::FORBIDDEN.into_response());
        }
        Ok((id, settings))
    }

    /// The condition its last status notification told, if recent.
    fn condition(&self, device: &str) -> Status {
        let conditions = self.conditions.lock().unwrap_or_else(PoisonError::into_inner);
        match conditions.get(device) {
            Some((status, at)) if at.elapsed() < self.fresh_for => status.clone(),
            _ => Status { v: 1, online: true, printer: None },
        }
    }
}

async fn request(State(sdp): State<Sdp>, headers: HeaderMap, uri: Uri, body: Bytes) -> Response {
    let (device, settings) = match sdp.authenticate(&headers, &uri) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let s = &sdp.server;
    let form: Form = match serde_urlencoded::from_bytes(&body) {
        Ok(f) => f,
        Err(e) => {
            s.refuse(Refusal::Malformed, &device, &format!("form: {e}"));
            return StatusCode::BAD_REQUEST.into_response();
        }
    };
    if form.id != device {
        s.refuse(Refusal::IdMismatch, &device, &format!("ID {:?} is not the device id", form.id));
        return StatusCode::FORBIDDEN.into_response();
    }
    match form.connection_type.as_str() {
        "GetRequest" => poll(&sdp, &device, &settings).await,
        "SetResponse" => {
            let Some(file) = form.response_file else {
                s.refuse(Refusal::Malformed, &device, "SetResponse without ResponseFile");
                return StatusCode::BAD_REQUEST.into_response();
            };
            match epos::print_results(&file) {
                Ok(results) => {
                    for r in results {
                        result(&sdp, &device, r).await;
                    }
                    xml(String::new())
                }
                Err(e) => {
                    s.refuse(Refusal::Malformed, &device, &format!("ResponseFile: {e}"));
                    StatusCode::BAD_REQUEST.into_response()
                }
            }
        }
        "SetStatus" => {
            match form.status.as_deref().ok_or("SetStatus without Status".to_string()).and_then(epos::status_flags) {
                Ok(flags) => {
                    note_condition(&sdp, &device, flags);
                    xml(String::new())
                }
                Err(why) => {
                    s.refuse(Refusal::Malformed, &device, &why);
                    StatusCode::BAD_REQUEST.into_response()
                }
            }
        }
        other => {
            s.refuse(Refusal::Malformed, &device, &format!("ConnectionType {other:?}"));
            StatusCode::BAD_REQUEST.into_response()
        }
    }
}

/// Takes ASB `flags` (a status notification's, or a job result's) as `device`'s condition
/// for the next `fresh_for`, and tells the dispatcher.
fn note_condition(sdp: &Sdp, device: &str, flags: u32) {
    let status = epos::condition(flags).status();
    sdp.conditions
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(device.to_string(), (status.clone(), Instant::now()));
    sdp.server.board.condition(device, status);
}

/// A poll: the job in flight as ePOS-Print XML, or an empty answer.
async fn poll(sdp: &Sdp, device: &str, settings: &CloudSettings) -> Response {
    let s = &sdp.server;
    let token = match s.board.poll(device, sdp.condition(device), false) {
        Err(PollRefused::Rate) => {
            s.refuse(Refusal::PollRate, device, "polling too often");
            return StatusCode::TOO_MANY_REQUESTS.into_response();
        }
        Ok(t) => t,
    };
    s.stats.update(|c| c.sdp_polls += 1);
    let Some(offer) = token.and_then(|t| s.board.job(device, Some(&t))) else { return xml(String::new()) };
    let escpos = match crate::deliver::cloudprnt::media::escpos(&offer.wire) {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::error!(device, message_id = %offer.message_id, error = %e, "the job cannot be sent to the printer");
            s.board.fail(device, &offer.message_id, e.to_string()).await;
            return xml(String::new());
        }
    };
    let again = match handed_before(sdp, device, &offer).await {
        Ok(again) => again,
        Err(e) => {
            // Unrecorded, a copy handed out after a restart could not be told a reprint.
            tracing::error!(device, message_id = %offer.message_id, error = %e, "cannot record the job as handed out; not handed out");
            return xml(String::new());
        }
    };
    let escpos = if again {
        tracing::warn!(device, seq = offer.seq, message_id = %offer.message_id, "Epson printer asks again before the job's result: printed as a reprint");
        crate::deliver::direct::reprint::with_header(&escpos, settings.code_page)
    } else {
        escpos
    };
    tracing::debug!(device, seq = offer.seq, message_id = %offer.message_id, bytes = escpos.len(), "job handed to the printer");
    xml(epos::print_request(&offer.message_id, &escpos))
}

/// Whether `offer` was handed to `device` before: by this process, or by one before a
/// restart (the outbox's mark names its message id, as handed out or, by a direct printer,
/// written). The first time, records it as handed out, synced, before it goes out; polls
/// meanwhile wait for that ([`Sdp::marking`]). `offer.handed` counts the copies, one more
/// for a mark found: above 1, some copy before this one may have printed.
///
/// # Errors
/// Disk or database failure (its words): then the job must not be handed out.
async fn handed_before(sdp: &Sdp, device: &str, offer: &Offer) -> Result<bool, String> {
    if offer.handed.load(Ordering::Acquire) == 0 {
        let _marking = sdp.marking.lock().await;
        if offer.handed.load(Ordering::Acquire) == 0 {
            let (device, seq, message_id) = (device.to_string(), offer.seq, offer.message_id.clone());
            let before = on_outbox(sdp, move |outbox| {
                if outbox.direct_mark(&device)?.is_some_and(|m| m.message_id == message_id) {
                    return Ok(true);
                }
                outbox.mark_direct(&device, &DirectMark { seq, message_id, done: false })?;
                Ok(false)
            })
            .await?;
            offer.handed.store(if before { 2 } else { 1 }, Ordering::Release);
            return Ok(before);
        }
    }
    offer.handed.fetch_add(1, Ordering::AcqRel);
    Ok(true)
}

/// Records that `offer` did not print (its result's code said it never reached the print
/// mechanism, [`epos::never_printed`]) when that copy was the only
/// one handed out: its mark is removed, so the next copy is no reprint (nor, should the
/// printer become a direct one, taken as printed). After several copies the mark stays:
/// an earlier one, its result lost, may have printed. A failure is logged; the next copy
/// is then marked a reprint.
async fn not_printed(sdp: &Sdp, device: &str, offer: &Offer) {
    if offer.handed.load(Ordering::Acquire) > 1 {
        return;
    }
    let (id, message_id) = (device.to_string(), offer.message_id.clone());
    let _marking = sdp.marking.lock().await;
    if let Err(e) = on_outbox(sdp, move |outbox| outbox.clear_direct_mark(&id, &message_id)).await {
        tracing::warn!(device, error = %e, "cannot record that the job did not print; its next copy is marked a reprint");
    }
}

/// Runs `f` on the outbox off the runtime (its writes are synced): what it returns, or
/// its error's words (a panic's too).
async fn on_outbox<T: Send + 'static>(
    sdp: &Sdp,
    f: impl FnOnce(&Outbox) -> Result<T, OutboxError> + Send + 'static,
) -> Result<T, String> {
    let outbox = sdp.outbox.clone();
    match tokio::task::spawn_blocking(move || f(&outbox)).await {
        Ok(done) => done.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// One job's result: the offer it names ends as the printer says.
async fn result(sdp: &Sdp, device: &str, r: epos::JobResult) {
    let s = &sdp.server;
    let Some(offer) = s.board.job(device, None) else {
        tracing::debug!(device, job_id = r.job_id.as_deref().unwrap_or(""), "result of a job not offered; ignored");
        return;
    };
    if r.job_id.as_deref().is_some_and(|id| id != epos::job_id(&offer.message_id)) {
        tracing::debug!(device, job_id = r.job_id.as_deref().unwrap_or(""), "result of another job; ignored");
        return;
    }
    // The result's ASB flags are the printer's condition as it printed, or failed to: a
    // printer without status notifications that ran out of paper holds its queue for
    // `fresh_for` instead of being handed its job again at its next poll.
    note_condition(sdp, device, r.asb);
    let how = if r.success {
        Confirmation::Printed
    } else if epos::permanent(&r.code) {
        Confirmation::Refused(r.code.clone())
    } else {
        tracing::warn!(device, code = %r.code, status = r.asb, "Epson printer did not print its job; offered again");
        if epos::never_printed(&r.code) {
            not_printed(sdp, device, &offer).await;
        }
        Confirmation::Again(r.code.clone())
    };
    s.board.confirm(device, Some(&offer.message_id), how).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deliver::cloudprnt::Board;
    use crate::deliver::mqtt::auth::Secrets;
    use crate::model::{DirectPrinters, Directory, Incoming};
    use crate::store::credentials::{Credentials, DIGEST_REALM};
    use crate::telemetry::Stats;
    use crate::test_fixtures::TempDir;
    use base64::Engine;
    use device_protocol::{AckResult, EffectKind, Job, PrinterState};
    use render::codepage::CodePage;
    use tokio::sync::mpsc;

    struct Rig {
        _dir: TempDir,
        _outbox_dir: TempDir,
        url: String,
        board: Arc<Board>,
        stats: Arc<Stats>,
        incoming: mpsc::Receiver<Incoming>,
        http: reqwest::Client,
        /// `e`'s secret (issued with --digest), and `p`'s (a CloudPRNT printer, with one too).
        secrets: HashMap<String, String>,
        /// Where the jobs handed out are marked.
        outbox: Arc<Outbox>,
    }

    /// An SDP endpoint on loopback: printer `e` on Epson SDP, printer `p` on CloudPRNT.
    async fn rig(name: &str) -> Rig {
        let dir = TempDir::new(name);
        std::fs::create_dir_all(dir.path()).unwrap();
        let file = dir.path().join("secrets.json");
        let mut store = Credentials::load(&file, true).unwrap();
        let secrets: HashMap<String, String> =
            ["e", "p"].iter().map(|id| (id.to_string(), store.issue_with_digest(id).unwrap())).collect();
        let printers = Arc::new(DirectPrinters::default());
        let settings = |method| CloudSettings {
            mac: None,
            method,
            width_dots: 576,
            code_page: CodePage::Cp860,
            model: String::new(),
        };
        printers.set_cloud("e", Some(settings(cdc::CloudMethod::EpsonSdp)));
        printers.set_cloud(
            "p",
            Some(CloudSettings { mac: Some("00:11:62:0a:1b:2c".into()), ..settings(cdc::CloudMethod::Http) }),
        );
        let directory = Arc::new(Directory::default());
        directory.set("e", Some(true));
        directory.set("p", Some(true));
        let (tx, incoming) = mpsc::channel(16);
        let board = Arc::new(Board::new(printers.clone(), tx, Duration::from_secs(60), 1_000));
        let stats = Arc::new(Stats::default());
        let server = Server {
            board: board.clone(),
            printers,
            directory,
            secrets: Some(Arc::new(Secrets::new(file))),
            stats: stats.clone(),
            log: Arc::default(),
            drawing: Arc::new(tokio::sync::Semaphore::new(1)),
            mqtt: None,
            scheme: "http",
        };
        let (outbox_dir, outbox) = crate::test_fixtures::temp_outbox(&format!("{name}-outbox"));
        let sdp = Sdp {
            server,
            digest: Arc::default(),
            conditions: Arc::default(),
            fresh_for: Duration::from_secs(60),
            outbox: outbox.clone(),
            marking: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/sdp", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, routes(sdp, 16 << 10)).await });
        let http = reqwest::Client::new();
        Rig { _dir: dir, _outbox_dir: outbox_dir, url, board, stats, incoming, http, secrets, outbox }
    }

    impl Rig {
        /// Posts `form` as `user` with `password` (Digest after the challenge; `None`: no
        /// credentials at all): the status and body.
        async fn post(&self, user_password: Option<(&str, &str)>, form: &[(&str, &str)]) -> (u16, String) {
            let body = serde_urlencoded::to_string(form).unwrap();
            let send = |auth: Option<String>| {
                let mut r = self
                    .http
                    .post(&self.url)
                    .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(body.clone());
                if let Some(a) = auth {
                    r = r.header(header::AUTHORIZATION, a);
                }
                r.send()
            };
            let first = send(None).await.unwrap();
            let Some((user, password)) = user_password else {
                return (first.status().as_u16(), first.text().await.unwrap());
            };
            assert_eq!(first.status().as_u16(), 401, "the dummy request is challenged");
            let challenge = first.headers()[header::WWW_AUTHENTICATE].to_str().unwrap().to_string();
            let nonce = challenge.split("nonce=\"").nth(1).unwrap().split('"').next().unwrap();
            let ha1 = super::super::digest::md5_hex(&format!("{user}:{DIGEST_REALM}:{password}"));
            let ha2 = super::super::digest::md5_hex("POST:/sdp");
            let response = super::super::digest::md5_hex(&format!("{ha1}:{nonce}:00000001:c0ffee:auth:{ha2}"));
            let auth = format!(
                r#"Digest username="{user}", realm="{DIGEST_REALM}", nonce="{nonce}", uri="/sdp", algorithm=MD5, qop=auth, nc=00000001, cnonce="c0ffee", response="{response}""#
            );
            let second = send(Some(auth)).await.unwrap();
            (second.status().as_u16(), second.text().await.unwrap())
        }

        fn refused(&self, rule: &str) -> u64 {
            self.stats.snapshot().cloudprnt_refusals.get(rule).copied().unwrap_or(0)
        }
    }

    /// A receipt job `message_id` at `seq`, as the dispatcher offers it.
    fn receipt(message_id: &str, seq: u64) -> (Job, bytes::Bytes) {
        let mut job = crate::test_fixtures::job(message_id, EffectKind::PrintReceipt, "c");
        job.seq = seq;
        job.content_type = device_protocol::messages::CONTENT_ESCPOS.into();
        job.payload = base64::engine::general_purpose::STANDARD.encode(b"\x1b@\x1bt\x03RECIBO\n\x1dV\x00");
        let wire = bytes::Bytes::from(job.to_json());
        (job, wire)
    }

    fn command_of(xml: &str) -> Vec<u8> {
        let doc = roxmltree::Document::parse(xml).unwrap();
        hex::decode(doc.descendants().find(|n| n.tag_name().name() == "command").unwrap().text().unwrap()).unwrap()
    }

    /// The printer with its own Digest secret and ID polls its job as ePOS-Print XML
    /// carrying the job's ESC/POS; asked again before its result, it gets it as a reprint;
    /// its result is the dispatcher's ack; its status notification, its condition.
    /// Everyone else is refused and counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_printer_with_its_digest_secret_gets_its_job() {
        let mut r = rig("sdp-server").await;
        let e = r.secrets["e"].clone();
        let poll = [("ConnectionType", "GetRequest"), ("ID", "e")];
        assert_eq!(r.post(None, &poll).await.0, 401);
        assert_eq!(r.refused("bad_credentials"), 0, "Epson's dummy first request is no refusal");
        assert_eq!(r.post(Some(("e", "guess")), &poll).await.0, 401);
        assert_eq!(r.refused("bad_credentials"), 1);
        assert_eq!(r.post(Some(("p", &r.secrets["p"])), &[("ConnectionType", "GetRequest"), ("ID", "p")]).await.0, 403);
        assert_eq!(r.refused("unknown_device"), 1, "a CloudPRNT printer is not an SDP one");
        assert_eq!(r.post(Some(("e", &e)), &[("ConnectionType", "GetRequest"), ("ID", "p")]).await.0, 403);
        assert_eq!(r.refused("id_mismatch"), 1);

        assert_eq!(r.post(Some(("e", &e)), &poll).await, (200, String::new()), "nothing offered");
        let _online = r.incoming.try_recv();
        let (job, wire) = receipt("0123456789abcdef0123456789abcdef", 7);
        r.board.offer("e", wire);
        let (status, body) = r.post(Some(("e", &e)), &poll).await;
        assert_eq!(status, 200);
        assert!(body.contains("<printjobid>0123456789abcdef0123456789abcd</printjobid>"), "{body}");
        let original = job.payload_bytes().unwrap();
        assert_eq!(command_of(&body), original, "the rendered ESC/POS, byte for byte");
        let (_, again) = r.post(Some(("e", &e)), &poll).await;
        assert_eq!(
            command_of(&again),
            crate::deliver::direct::reprint::with_header(&original, CodePage::Cp860),
            "asked again before its result: the reprint"
        );
        let counted = r.stats.snapshot();
        assert_eq!((counted.sdp_polls, counted.cloudprnt_polls), (3, 0), "three polls answered, counted as SDP's");

        let result = r#"<PrintResponseInfo Version="2.00"><ePOSPrint><Parameter><devid>local_printer</devid><printjobid>0123456789abcdef0123456789abcd</printjobid></Parameter><PrintResponse><response xmlns="http://www.epson-pos.com/schemas/2011/03/epos-print" success="true" code="" status="2" battery="0"/></PrintResponse></ePOSPrint></PrintResponseInfo>"#;
        let set = [("ConnectionType", "SetResponse"), ("ID", "e"), ("ResponseFile", result)];
        assert_eq!(r.post(Some(("e", &e)), &set).await, (200, String::new()));
        let ack = loop {
            match r.incoming.try_recv().unwrap() {
                Incoming::Ack { ack, .. } => break ack,
                Incoming::Status { .. } => {}
            }
        };
        assert_eq!(
            (ack.message_id.as_str(), ack.seq, ack.result),
            ("0123456789abcdef0123456789abcdef", 7, AckResult::Done)
        );

        let paper_out = r#"<statusmonitor Version="1.00"><printerstatus devicename="local_printer" asbstatus="0x00080008"/></statusmonitor>"#;
        let notify = [("ConnectionType", "SetStatus"), ("ID", "e"), ("Status", paper_out)];
        assert_eq!(r.post(Some(("e", &e)), &notify).await.0, 200);
        let Incoming::Status { status, .. } = r.incoming.try_recv().unwrap() else { panic!() };
        assert_eq!(status.printer, Some(PrinterState::PaperOut));
        assert_eq!(r.post(Some(("e", &e)), &[("ConnectionType", "Other"), ("ID", "e")]).await.0, 400);
        assert_eq!(r.refused("malformed"), 1);
    }

    /// A printer without status notifications that fails a job for lack of paper tells
    /// its condition in the result's ASB flags: that holds it (the next poll is answered
    /// empty, and the dispatcher hears of paper out) until a newer condition says ready.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_results_paper_out_holds_the_printer() {
        let mut r = rig("sdp-server-result-condition").await;
        let e = r.secrets["e"].clone();
        let poll = [("ConnectionType", "GetRequest"), ("ID", "e")];
        let m = "0123456789abcdef0123456789abcdef";
        r.board.offer("e", receipt(m, 1).1);
        assert!(r.post(Some(("e", &e)), &poll).await.1.contains("<printjobid>"), "handed out");
        // ASB_RECEIPT_END | ASB_OFF_LINE, decimal as a result carries it.
        let failed = format!(
            r#"<PrintResponseInfo Version="2.00"><ePOSPrint><Parameter><devid>local_printer</devid><printjobid>{}</printjobid></Parameter><PrintResponse><response success="false" code="EPTR_REC_EMPTY" status="{}" battery="0"/></PrintResponse></ePOSPrint></PrintResponseInfo>"#,
            epos::job_id(m),
            0x80008
        );
        let set = [("ConnectionType", "SetResponse"), ("ID", "e"), ("ResponseFile", failed.as_str())];
        assert_eq!(r.post(Some(("e", &e)), &set).await, (200, String::new()));
        let told: Vec<Incoming> = std::iter::from_fn(|| r.incoming.try_recv().ok()).collect();
        assert!(
            told.iter().any(
                |i| matches!(i, Incoming::Status { status, .. } if status.printer == Some(PrinterState::PaperOut))
            ),
            "{told:?}"
        );
        r.board.offer("e", receipt(m, 1).1);
        assert_eq!(r.post(Some(("e", &e)), &poll).await, (200, String::new()), "held: paper out");
        let ready = r#"<statusmonitor Version="1.00"><printerstatus devicename="local_printer" asbstatus="0x00000000"/></statusmonitor>"#;
        let notify = [("ConnectionType", "SetStatus"), ("ID", "e"), ("Status", ready)];
        assert_eq!(r.post(Some(("e", &e)), &notify).await.0, 200);
        assert!(r.post(Some(("e", &e)), &poll).await.1.contains("<printjobid>"), "ready again: handed out");
    }

    /// A job is marked handed out in the outbox before the answer that carries it: one
    /// the mark names (handed out before a restart, or written whole by a direct printer)
    /// is a reprint at its first hand in this process, and stays one after a result saying
    /// that copy did not print (an earlier copy may have). A job whose only copy never
    /// reached the printer has its mark removed: its next copy is an original; one whose
    /// copy failed part-way (paper out, the cutter) keeps it: its next copy is a reprint.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_handed_out_before_a_restart_is_a_reprint_unless_it_did_not_print() {
        let mut r = rig("sdp-server-restart").await;
        let e = r.secrets["e"].clone();
        let poll = [("ConnectionType", "GetRequest"), ("ID", "e")];
        assert_eq!(r.post(Some(("e", &e)), &poll).await, (200, String::new()), "nothing offered");
        let handed = |message_id: &str, seq, done| DirectMark { seq, message_id: message_id.to_string(), done };
        let not_printed = |message_id: &str, code: &str| {
            let job_id = epos::job_id(message_id);
            format!(
                r#"<PrintResponseInfo Version="2.00"><ePOSPrint><Parameter><devid>local_printer</devid><printjobid>{job_id}</printjobid></Parameter><PrintResponse><response xmlns="http://www.epson-pos.com/schemas/2011/03/epos-print" success="false" code="{code}" status="2" battery="0"/></PrintResponse></ePOSPrint></PrintResponseInfo>"#
            )
        };
        let original = receipt("m", 1).0.payload_bytes().unwrap();
        let reprint = crate::deliver::direct::reprint::with_header(&original, CodePage::Cp860);
        let copy = async |message_id: &str, seq| {
            r.board.offer("e", receipt(message_id, seq).1);
            command_of(&r.post(Some(("e", &e)), &poll).await.1)
        };
        let result = async |message_id: &str, code: &str| {
            let set =
                [("ConnectionType", "SetResponse"), ("ID", "e"), ("ResponseFile", &not_printed(message_id, code))];
            assert_eq!(r.post(Some(("e", &e)), &set).await, (200, String::new()));
        };

        let m = "0123456789abcdef0123456789abcdef";
        r.outbox.mark_direct("e", &handed(m, 7, false)).unwrap();
        assert_eq!(copy(m, 7).await, reprint, "handed out before the restart");
        result(m, "DeviceNotFound").await;
        assert_eq!(r.outbox.direct_mark("e").unwrap(), Some(handed(m, 7, false)), "the copy before may have printed");
        assert_eq!(copy(m, 7).await, reprint, "still a reprint");

        let n = "fedcba9876543210fedcba9876543210";
        assert_eq!(copy(n, 8).await, original, "a new job is an original");
        assert_eq!(r.outbox.direct_mark("e").unwrap(), Some(handed(n, 8, false)), "marked before it went out");
        result(n, "DeviceNotFound").await;
        assert_eq!(r.outbox.direct_mark("e").unwrap(), None, "its only copy never reached the printer");
        assert_eq!(copy(n, 8).await, original, "its next copy");

        // Paper out and a cutter fault may come part-way through a job, or after it
        // printed: the mark stays, and the next copy is a reprint.
        for (o, seq, code) in [("aa", 10, "EPTR_REC_EMPTY"), ("bb", 11, "EPTR_CUTTER")] {
            assert_eq!(copy(o, seq).await, original, "a new job is an original");
            result(o, code).await;
            assert_eq!(r.outbox.direct_mark("e").unwrap(), Some(handed(o, seq, false)), "{code}");
            assert_eq!(copy(o, seq).await, reprint, "after {code}");
        }

        let k = "00112233445566778899aabbccddeeff";
        r.outbox.mark_direct("e", &handed(k, 9, true)).unwrap();
        assert_eq!(copy(k, 9).await, reprint, "written whole by a direct printer");
        let acks = std::iter::from_fn(|| r.incoming.try_recv().ok())
            .filter_map(|i| match i {
                Incoming::Ack { ack, .. } => Some((ack.message_id, ack.result)),
                Incoming::Status { .. } => None,
            })
            .collect::<Vec<_>>();
        let failed = [m, n, "aa", "bb"].map(|id| (id.to_string(), AckResult::Failed));
        assert_eq!(acks, failed, "offered again");
    }
}
