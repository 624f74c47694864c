//! The CloudPRNT endpoint a printer is pointed at, `/cloudprnt` (Star CloudPRNT protocol
//! guide, "HTTP method reference"; one URL for the three requests):
//!
//! | request | what |
//! |---|---|
//! | `POST /cloudprnt` | the poll: JSON `statusCode`, `status` (ASB), `printerMAC`, `printingInProgress`; answered `{"jobReady": false}` or `{"jobReady": true, "mediaTypes": ["image/png"], "jobToken": MESSAGE_ID, "deleteMethod": "DELETE"}` |
//! | `GET /cloudprnt?type=image/png&mac=MAC&token=T` | the job's picture; no side effects, the same bytes every time; `404` when `T` is not offered |
//! | `DELETE /cloudprnt?mac=MAC&code=OK&token=T` | printed (`OK` or 2xx), or why not: the dispatcher's ack; `200` always |
//! | `GET /cloudprnt-setting.json?mac=MAC` | the printer's settings ("Server setting information request"): for a `cloudprnt-mqtt` printer, pixgate's MQTT listener and the credentials to connect with; `404` ("the server supports the HTTP method only") for a `cloudprnt-http` one |
//!
//! Every request carries HTTP Basic credentials (the printer's web settings: user name,
//! password): the device id and the secret issued to it, checked against
//! `mqtt.credentials`. The device must be a registered, enabled CloudPRNT printer, and the
//! MAC the request names (`printerMAC`, `mac`) the one its registry document gives: a
//! printer reaches only its own jobs. Every refusal is counted
//! (`cloudprnt_refusals{rule}`) and logged (bounded, [`LogLimit`]). Anything else on the
//! listener is `404`.
//!
//! The settings give a printer on the MQTT method the client id `dev-{id}`, its device id
//! as the username and, as the password, the secret it has just proved with: pixgate keeps
//! no secret readable, and the printer holds it already. They are answered over TLS only
//! (or `cloudprnt.plain`), never cached.

use super::board::{Board, Confirmation, PollRefused};
use super::media;
use super::status::Condition;
use crate::deliver::http_auth::basic;
use crate::deliver::mqtt::auth::Secrets;
use crate::model::{CloudSettings, DirectPrinters, Directory, Standing};
use crate::telemetry::log_limit::LogLimit;
use crate::telemetry::Stats;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use std::sync::Arc;

/// Why a request was refused: the `rule` of the log line and the label on `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No HTTP Basic credentials: `401`.
    NoCredentials,
    /// A wrong secret, or none issued: `401`.
    BadCredentials,
    /// Not a registered `cloudprnt-http` printer: `403`.
    UnknownDevice,
    /// Registered with `enabled: false`: `403`.
    DisabledDevice,
    /// The request's MAC is not the registry's for that printer (or names none): `403`.
    MacMismatch,
    /// An Epson printer's form `ID` is not the device id it authenticated as: `403`.
    IdMismatch,
    /// A poll body that is not CloudPRNT's JSON: `400`.
    Malformed,
    /// Polls beyond `cloudprnt.max_polls_per_second`: `429`.
    PollRate,
    /// `cloudprnt.max_connections` open already: the connection is closed.
    Capacity,
    /// The TLS handshake failed or did not end in `cloudprnt.request_timeout_ms`.
    TlsHandshake,
}

impl Refusal {
    /// The label: `no_credentials`, `bad_credentials`, `unknown_device`,
    /// `disabled_device`, `mac_mismatch`, `id_mismatch`, `malformed`, `poll_rate`, `capacity`,
    /// `tls_handshake`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NoCredentials => "no_credentials",
            Refusal::BadCredentials => "bad_credentials",
            Refusal::UnknownDevice => "unknown_device",
            Refusal::DisabledDevice => "disabled_device",
            Refusal::MacMismatch => "mac_mismatch",
            Refusal::IdMismatch => "id_mismatch",
            Refusal::Malformed => "malformed",
            Refusal::PollRate => "poll_rate",
            Refusal::Capacity => "capacity",
            Refusal::TlsHandshake => "tls_handshake",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Refusal::NoCredentials | Refusal::BadCredentials => StatusCode::UNAUTHORIZED,
            Refusal::Malformed => StatusCode::BAD_REQUEST,
            Refusal::PollRate => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::FORBIDDEN,
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct Server {
    /// The offers.
    pub board: Arc<Board>,
    /// Which printers are cloud printers, and their MACs.
    pub printers: Arc<DirectPrinters>,
    /// Which devices are enabled.
    pub directory: Arc<Directory>,
    /// The device secrets (`mqtt.credentials`); `None`: no secret verifies.
    pub secrets: Option<Arc<Secrets>>,
    /// Counters.
    pub stats: Arc<Stats>,
    /// Bounds the log lines refusals write.
    pub log: Arc<LogLimit>,
    /// Pictures drawn at once (CPU-bound: one per core); a GET waits for a slot.
    pub drawing: Arc<tokio::sync::Semaphore>,
    /// Where printers on the MQTT method are told to connect: pixgate's MQTT listener, or
    /// an external broker's printers' listener; `None`: every printer is told to use the
    /// HTTP method.
    pub mqtt: Option<MqttListener>,
    /// `https`, or `http` with `cloudprnt.plain`: the scheme of the job URL given to
    /// printers on the MQTT method.
    pub scheme: &'static str,
}

/// What a printer on the MQTT method is told of the MQTT listener it connects to:
/// pixgate's own, or an external broker's printers' listener.
#[derive(Debug, Clone)]
pub struct MqttListener {
    /// `cloudprnt.mqtt_host`; `None`: the host the printer reached this server at.
    pub host: Option<String>,
    /// `cloudprnt.mqtt_port`, else `mqtt.listen`'s port.
    pub port: u16,
    /// Whether it speaks TLS (`mqtt.tls`; always with an external broker).
    pub tls: bool,
}

impl Server {
    /// Counts and logs a refusal of `source` (a device id, or the user name given).
    pub fn refuse(&self, rule: Refusal, source: &str, detail: &str) {
        self.stats.cloudprnt_refused(rule.as_str());
        if self.log.admit(rule.as_str(), source) {
            tracing::warn!(rule = rule.as_str(), source, detail, "CloudPRNT request refused");
        }
    }

    fn refusal(&self, rule: Refusal, source: &str, detail: &str) -> Response {
        self.refuse(rule, source, detail);
        let mut r = rule.status().into_response();
        if rule.status() == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Basic realm=\"pixgate\""));
        }
        r
    }

    /// The printer the request's credentials and `mac` prove, or the refusal to answer.
    #[allow(clippy::result_large_err)]
    fn authenticate(&self, headers: &HeaderMap, mac: Option<&str>) -> Result<(String, CloudSettings), Response> {
        let Some(basic) = basic(headers) else {
            return Err(self.refusal(Refusal::NoCredentials, "-", "no HTTP Basic credentials"));
        };
        let Some((id, secret)) = basic else {
            return Err(self.refusal(Refusal::BadCredentials, "-", "HTTP Basic credentials do not decode"));
        };
        let (id, secret) = (id.as_str(), secret.as_str());
        // The secret first: without it, nobody learns which ids are printers.
        if !self.secrets.as_ref().is_some_and(|s| s.verify(id, secret.as_bytes())) {
            return Err(self.refusal(Refusal::BadCredentials, id, "wrong secret, or none issued"));
        }
        let Some(settings) = self.printers.cloud(id).filter(|c| c.method != cdc::CloudMethod::EpsonSdp) else {
            return Err(self.refusal(Refusal::UnknownDevice, id, "not a registered CloudPRNT printer"));
        };
        if self.directory.standing(id) != Standing::Enabled {
            return Err(self.refusal(Refusal::DisabledDevice, id, "disabled in the registry"));
        }
        let mac = mac.map(super::status::decode);
        let registry = settings.mac.as_deref();
        if registry.is_none() || mac.as_deref().and_then(cdc::value::normalize_mac).as_deref() != registry {
            let detail = format!(
                "MAC {} is not the registry's {}",
                mac.as_deref().unwrap_or("(none)"),
                registry.unwrap_or("(none)")
            );
            return Err(self.refusal(Refusal::MacMismatch, id, &detail));
        }
        Ok((id.to_string(), settings))
    }
}

/// The routes, with request bodies bounded by `max_body_bytes`.
pub fn routes(server: Server, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/cloudprnt", post(poll).get(job).delete(confirm))
        .route("/cloudprnt-setting.json", get(settings))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(server)
}

/// A poll's fields pixgate reads (the guide: only `statusCode` is always there).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Poll {
    status_code: String,
    #[serde(default)]
    status: Option<String>,
    #[serde(default, rename = "printerMAC")]
    printer_mac: Option<String>,
    #[serde(default)]
    printing_in_progress: Option<bool>,
}

async fn poll(State(s): State<Server>, headers: HeaderMap, body: Bytes) -> Response {
    // Some firmware labels the JSON as a form: the body is read as JSON whatever it says.
    let poll: Poll = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => return s.refusal(Refusal::Malformed, "-", &format!("poll body: {e}")),
    };
    let (device, _) = match s.authenticate(&headers, poll.printer_mac.as_deref()) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let condition = Condition::read(&poll.status_code, poll.status.as_deref());
    let answer = s.board.poll(&device, condition.status(), poll.printing_in_progress.unwrap_or(false));
    if answer.is_ok() {
        s.stats.update(|c| c.cloudprnt_polls += 1);
    }
    match answer {
        Err(PollRefused::Rate) => s.refusal(Refusal::PollRate, &device, "polling too often"),
        Ok(None) => Json(serde_json::json!({ "jobReady": false })).into_response(),
        Ok(Some(token)) => Json(serde_json::json!({
            "jobReady": true,
            "mediaTypes": [media::PNG],
            "jobToken": token,
            "deleteMethod": "DELETE",
        }))
        .into_response(),
    }
}

/// The query of the job GET and the confirmation.
#[derive(Debug, Deserialize)]
struct JobQuery {
    mac: Option<String>,
    token: Option<String>,
    #[serde(rename = "type")]
    media: Option<String>,
    code: Option<String>,
}

async fn job(State(s): State<Server>, headers: HeaderMap, Query(q): Query<JobQuery>) -> Response {
    let (device, settings) = match s.authenticate(&headers, q.mac.as_deref()) {
        Ok(d) => d,
        Err(r) => return r,
    };
    if q.media.as_deref().is_some_and(|m| m != media::PNG) {
        return StatusCode::UNSUPPORTED_MEDIA_TYPE.into_response();
    }
    let Some(offer) = s.board.hand(&device, q.token.as_deref()) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let picture = match offer.picture.get() {
        Some(p) => p.clone(),
        None => {
            let Ok(_slot) = s.drawing.acquire().await else { return StatusCode::SERVICE_UNAVAILABLE.into_response() };
            let wire = offer.wire.clone();
            match tokio::task::spawn_blocking(move || media::png(&wire, &settings)).await {
                Ok(Ok(png)) => offer.picture.get_or_init(|| Bytes::from(png)).clone(),
                Ok(Err(e)) => {
                    tracing::error!(device = %device, message_id = %offer.message_id, error = %e, "the job cannot be drawn for the printer");
                    s.board.fail(&device, &offer.message_id, e.to_string()).await;
                    return StatusCode::NOT_FOUND.into_response();
                }
                Err(e) => {
                    tracing::error!(device = %device, error = %e, "drawing the job panicked");
                    return StatusCode::INTERNAL_SERVER_ERROR.into_response();
                }
            }
        }
    };
    tracing::debug!(device = %device, seq = offer.seq, message_id = %offer.message_id, bytes = picture.len(), "job fetched by the printer");
    ([(header::CONTENT_TYPE, media::PNG)], picture).into_response()
}

async fn confirm(State(s): State<Server>, headers: HeaderMap, Query(q): Query<JobQuery>) -> Response {
    let (device, _) = match s.authenticate(&headers, q.mac.as_deref()) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let how = Confirmation::of_code(q.code.as_deref().unwrap_or(""));
    if !s.board.confirm(&device, q.token.as_deref(), how).await {
        tracing::debug!(device = %device, token = q.token.as_deref().unwrap_or(""), "confirmation of a job not offered; ignored");
    }
    StatusCode::OK.into_response()
}

/// The query of the settings request (`uid` and `replaced_path` are not read: the job URL
/// is always this server's `/cloudprnt`).
#[derive(Debug, Deserialize)]
struct SettingsQuery {
    mac: Option<String>,
}

async fn settings(State(s): State<Server>, headers: HeaderMap, Query(q): Query<SettingsQuery>) -> Response {
    let (device, cloud) = match s.authenticate(&headers, q.mac.as_deref()) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let Some(mqtt) = s.mqtt.as_ref().filter(|_| cloud.method == cdc::CloudMethod::Mqtt) else {
        // Star: 404 means the server supports the HTTP method only; the printer polls.
        return StatusCode::NOT_FOUND.into_response();
    };
    let Some(Some((_, password))) = basic(&headers) else { return StatusCode::UNAUTHORIZED.into_response() };
    let Some(authority) = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<axum::http::uri::Authority>().ok())
    else {
        return s.refusal(Refusal::Malformed, &device, "no Host header");
    };
    s.board.set_url(&device, format!("{}://{authority}/cloudprnt", s.scheme));
    let host =
        mqtt.host.clone().unwrap_or_else(|| authority.host().trim_start_matches('[').trim_end_matches(']').to_string());
    tracing::info!(device = %device, host = %host, port = mqtt.port, "CloudPRNT printer asked for its MQTT settings");
    let settings = serde_json::json!({
        "title": "star_cloudprnt_server_setting",
        "version": "1.0.0",
        "serverSupportProtocol": ["HTTP", "MQTT"],
        "settingForMQTT": {
            "useTriggerPOST": false,
            "mqttConnectionSetting": {
                "hostName": host,
                "portNumber": mqtt.port,
                "useTls": mqtt.tls,
                "authenticationSetting": {
                    "clientId": format!("{}{device}", crate::deliver::mqtt::access::CLIENT_ID_PREFIX),
                    "username": device,
                    "password": password,
                },
            },
        },
    });
    ([(header::CACHE_CONTROL, "no-store")], Json(settings)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CloudSettings, Incoming};
    use crate::store::credentials::Credentials;
    use crate::test_fixtures::TempDir;
    use device_protocol::messages::CONTENT_ESCPOS;
    use device_protocol::{AckResult, EffectKind, Job};
    use render::codepage::CodePage;
    use std::time::Duration;
    use tokio::sync::mpsc;

    const MAC: &str = "00:11:62:0a:1b:2c";
    /// The MAC of `m`, a printer on the MQTT method.
    const MQTT_MAC: &str = "00:11:62:0a:1b:2d";

    struct Rig {
        _dir: TempDir,
        url: String,
        secrets: std::collections::HashMap<String, String>,
        board: Arc<Board>,
        stats: Arc<Stats>,
        directory: Arc<Directory>,
        incoming: mpsc::Receiver<Incoming>,
        http: reqwest::Client,
    }

    /// A server on loopback: printer `p` (a cloud printer, enabled), printer `m` (the same
    /// on the MQTT method) and device `q` (not a printer of this kind), each with a secret.
    async fn rig() -> Rig {
        let dir = TempDir::new("cloudprnt-server");
        std::fs::create_dir_all(dir.path()).unwrap();
        let file = dir.path().join("secrets.json");
        let secrets =
            Credentials::load(&file, true).unwrap().issue_many(["p", "q", "m"]).unwrap().into_iter().collect();
        let printers = Arc::new(DirectPrinters::default());
        let settings = CloudSettings {
            mac: Some(MAC.into()),
            method: cdc::CloudMethod::Http,
            width_dots: 384,
            code_page: CodePage::Cp860,
            model: String::new(),
        };
        printers.set_cloud("p", Some(settings.clone()));
        let on_mqtt = CloudSettings { mac: Some(MQTT_MAC.into()), method: cdc::CloudMethod::Mqtt, ..settings };
        printers.set_cloud("m", Some(on_mqtt));
        let directory = Arc::new(Directory::default());
        directory.set("p", Some(true));
        directory.set("m", Some(true));
        directory.set("q", Some(true));
        let (tx, incoming) = mpsc::channel(16);
        let board = Arc::new(Board::new(printers.clone(), tx, Duration::from_secs(60), 1_000_000));
        let stats = Arc::new(Stats::default());
        let server = Server {
            board: board.clone(),
            printers,
            directory: directory.clone(),
            secrets: Some(Arc::new(Secrets::new(file))),
            stats: stats.clone(),
            log: Arc::default(),
            drawing: Arc::new(tokio::sync::Semaphore::new(1)),
            mqtt: Some(MqttListener { host: None, port: 8883, tls: true }),
            scheme: "http",
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/cloudprnt", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, routes(server, 16 << 10)).await });
        Rig { _dir: dir, url, secrets, board, stats, directory, incoming, http: reqwest::Client::new() }
    }

    impl Rig {
        async fn settings(&self, user: Option<(&str, &str)>, mac: &str) -> reqwest::Response {
            let url = self.url.replace("/cloudprnt", "/cloudprnt-setting.json");
            let mut r = self.http.get(url).query(&[("mac", mac), ("replaced_path", "cloudprnt")]);
            if let Some((u, p)) = user {
                r = r.basic_auth(u, Some(p));
            }
            r.send().await.unwrap()
        }

        async fn poll(&self, user: Option<(&str, &str)>, mac: &str) -> (u16, String) {
            let mut r = self.http.post(&self.url).body(format!(
                r#"{{"statusCode":"200%20OK","printerMAC":"{mac}","status":"23 86 00 00 00 00 00 00 00"}}"#
            ));
            if let Some((u, p)) = user {
                r = r.basic_auth(u, Some(p));
            }
            let resp = r.send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }

        fn refused(&self, rule: &str) -> u64 {
            self.stats.snapshot().cloudprnt_refusals.get(rule).copied().unwrap_or(0)
        }
    }

    /// Each way in is refused with its own status and rule until the printer's own secret
    /// and MAC are given; then the offered job is polled, fetched as a PNG and confirmed
    /// into the dispatcher's ack.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_printer_with_its_secret_and_mac_gets_its_job() {
        let mut r = rig().await;
        let (p, q) = (r.secrets["p"].clone(), r.secrets["q"].clone());
        let mut job = crate::test_fixtures::job("m1", EffectKind::PrintReceipt, "c");
        job.seq = 1;
        job.content_type = CONTENT_ESCPOS.into();
        job.payload = Job::encode_payload(b"\x1b@\x1bt\x03PAGO\n\x1dVA\x03");
        r.board.offer("p", bytes::Bytes::from(job.to_json()));
        let _offline = r.incoming.recv().await.unwrap();

        let resp = r.http.post(&r.url).body("{}").send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 400, "a body without statusCode");
        assert_eq!(r.refused("malformed"), 1);
        let resp = r.http.post(&r.url).body(r#"{"statusCode":"200"}"#).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 401);
        assert_eq!(resp.headers()[header::WWW_AUTHENTICATE], "Basic realm=\"pixgate\"");
        assert_eq!(r.refused("no_credentials"), 1);
        assert_eq!(r.poll(Some(("p", "guess")), MAC).await.0, 401);
        assert_eq!(r.poll(Some(("nobody", &p)), MAC).await.0, 401, "an unknown id is a wrong secret");
        assert_eq!(r.refused("bad_credentials"), 2);
        assert_eq!(r.poll(Some(("q", &q)), MAC).await.0, 403, "q is no CloudPRNT printer");
        assert_eq!(r.refused("unknown_device"), 1);
        assert_eq!(r.poll(Some(("p", &p)), "00:11:62:0a:1b:2d").await.0, 403);
        assert_eq!(r.refused("mac_mismatch"), 1);
        r.directory.set("p", Some(false));
        assert_eq!(r.poll(Some(("p", &p)), MAC).await.0, 403);
        assert_eq!(r.refused("disabled_device"), 1);
        r.directory.set("p", Some(true));
        let get = |token: &str| {
            r.http.get(format!("{}?type=image%2Fpng&mac=00%3A11%3A62%3A0A%3A1B%3A2C&token={token}", r.url))
        };
        assert_eq!(get("m1").send().await.unwrap().status().as_u16(), 401, "no credentials on the GET");

        let (status, body) = r.poll(Some(("p", &p)), "00-11-62-0A-1B-2C").await;
        assert_eq!(status, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["jobReady"], true);
        assert_eq!(answer["jobToken"], "m1");
        assert_eq!(answer["mediaTypes"], serde_json::json!(["image/png"]));
        assert_eq!(r.stats.snapshot().cloudprnt_polls, 1);
        assert_eq!(get("m0").basic_auth("p", Some(&p)).send().await.unwrap().status().as_u16(), 404);
        let png = get("m1").basic_auth("p", Some(&p)).send().await.unwrap();
        assert_eq!(png.status().as_u16(), 200);
        assert_eq!(png.headers()[header::CONTENT_TYPE], "image/png");
        let img = image::load_from_memory(&png.bytes().await.unwrap()).unwrap();
        assert_eq!(img.width(), 384);
        let confirm = r.http.delete(format!("{}?mac=00%3A11%3A62%3A0a%3A1b%3A2c&code=OK&token=m1", r.url));
        assert_eq!(confirm.basic_auth("p", Some(&p)).send().await.unwrap().status().as_u16(), 200);
        loop {
            match r.incoming.recv().await.unwrap() {
                Incoming::Ack { device, ack } => {
                    assert_eq!((device.as_str(), ack.message_id.as_str(), ack.result), ("p", "m1", AckResult::Done));
                    break;
                }
                Incoming::Status { .. } => {}
            }
        }
    }
    /// A printer on the MQTT method asking for its settings with its own secret and MAC is
    /// told pixgate's MQTT listener, its client id, username and the secret it gave; one on
    /// the HTTP method gets 404 (it polls); anyone else is refused as on every route.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_printer_on_mqtt_is_told_where_and_how_to_connect() {
        let r = rig().await;
        let m = r.secrets["m"].clone();
        assert_eq!(r.settings(None, MQTT_MAC).await.status().as_u16(), 401);
        assert_eq!(r.settings(Some(("m", "guess")), MQTT_MAC).await.status().as_u16(), 401);
        assert_eq!(r.settings(Some(("m", &m)), MAC).await.status().as_u16(), 403, "another MAC");
        assert_eq!(r.settings(Some(("q", &r.secrets["q"])), MQTT_MAC).await.status().as_u16(), 403);
        assert_eq!(r.settings(Some(("p", &r.secrets["p"])), MAC).await.status().as_u16(), 404, "the HTTP method");
        assert!(r.board.url("m").is_none());

        let resp = r.settings(Some(("m", &m)), &MQTT_MAC.to_uppercase()).await;
        assert_eq!(resp.status().as_u16(), 200);
        assert_eq!(resp.headers()[header::CACHE_CONTROL], "no-store");
        let body: serde_json::Value = resp.json().await.unwrap();
        let setting = &body["settingForMQTT"];
        assert_eq!(body["title"], "star_cloudprnt_server_setting");
        assert_eq!(body["serverSupportProtocol"], serde_json::json!(["HTTP", "MQTT"]));
        assert_eq!(setting["useTriggerPOST"], false);
        let connection = &setting["mqttConnectionSetting"];
        assert_eq!(connection["hostName"], "127.0.0.1", "the host it reached this server at");
        assert_eq!((connection["portNumber"].as_u64(), connection["useTls"].as_bool()), (Some(8883), Some(true)));
        assert_eq!(
            connection["authenticationSetting"],
            serde_json::json!({"clientId": "dev-m", "username": "m", "password": m})
        );
        assert_eq!(r.board.url("m"), Some(r.url.clone()), "its jobs are GET from this server's /cloudprnt");
    }
}
