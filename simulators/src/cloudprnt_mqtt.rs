//! A simulated Star CloudPRNT printer deciding its protocol at boot, as a Star mC-Print3 or
//! TSP100IV with CloudPRNT Version MQTT firmware does, and speaking **CloudPRNT Version
//! MQTT (Full MQTT / Pass URL)** when the server offers it; otherwise the HTTP method of
//! [`crate::cloudprnt`]. Written from Star's documents (Star CloudPRNT Protocol Guide
//! v2.4.0: *Protocol Guide* "How to Specify the CloudPRNT Communication Protocol",
//! *Server setting information request (GET)*, *MQTT General Specification*, *MQTT Message
//! Topic Specification*, *MQTT Message Payload Specification*, *Print job requests (GET)*).
//!
//! 1. **Server setting request** at start and before every (re)connect (guide: the printer
//!    makes it "at a predetermined timing, such as a printer start"): `GET
//!    {base}/cloudprnt-setting.json?mac=…&replaced_path=…` ([`setting_url`]: the CloudPRNT
//!    URL with its last path segment replaced), with the poll's HTTP Basic credentials and
//!    CA roots. The answer ([`setting_answer`]): 404 "Server only supports CloudPRNT
//!    Version HTTP" → the HTTP method ([`CloudPrinter::run`]) for good; 200 → the JSON
//!    [`ServerSetting`], and with `"MQTT"` in `serverSupportProtocol` ("If both are
//!    specified, a printer will operate with CloudPRNT Version MQTT") and no
//!    `useTriggerPOST` the MQTT method ([`method_of`]).
//! 2. **Connect** (guide: MQTT 3.1.1; user name and password from the setting; "Client
//!    certificates are not supported"; a Will registered at connect; "Messages published by
//!    a printer do not use Retain"; QoS 1 both ways): to `hostName:portNumber`, over TLS
//!    when `useTls`, with a Will `client-will` ([`will_payload`]). Then SUBSCRIBE
//!    `star/cloudprnt/to-device/{mac}/#` ([`to_device_filter`]) and publish a `client-status`
//!    ([`ClientStatus`]) to `star/cloudprnt/to-server/{mac}/client-status`
//!    ([`to_server_topic`]).
//! 3. **`print-job`** ([`PrintJob`], decided by [`plan_job`]): a `jobToken` among the last
//!    [`REMEMBERED_TOKENS`](crate::cloudprnt::REMEMBERED_TOKENS) printed is not printed again (guide: "A printer remembers the
//!    past 10 jobTokens" and answers a duplicate with a `print-result`); `jobType` `url`
//!    GETs `printData` as `image/png` (guide: *Print job requests (GET)* "If “url” is
//!    specified in the jobType key … the printer will execute this GET request", with
//!    [`print_data_url`]'s query); the outcome goes back as a `print-result`
//!    ([`PrintResult`], guide: "A printer publishes a print-result message when a printing
//!    operation succeeds or fails"). Printed jobs land where the HTTP method puts them
//!    (`{out}/{seq:04}-print.png`, `{out}/jobs.jsonl`).
//! 4. **`request-client-status`** → a `client-status` (guide: also "when there is a status
//!    change on the printer side", which the state file makes).
//!
//! The condition comes from the same state file as the HTTP method's: `offline` is a
//! printer switched off: the TCP connection is dropped without DISCONNECT (so the broker
//! publishes the Will; Star's printers may also publish a will-shaped message themselves
//! when switched off, this one does not), nothing happens while it lasts, and then the
//! printer boots again from step 1.
//!
//! Choices of this simulator where Star's documents say nothing (or nothing was found):
//! the MAC is written lower case with colons in topics and payloads ([`normalize_mac`]);
//! the client id is `authenticationSetting.clientId`, else that MAC; keep-alive 30 s;
//! clean session; a refused setting request, CONNACK or SUBSCRIBE, a failed request or a
//! lost connection waits one poll interval and starts again from step 1; the setting's
//! `nextUrl`, `reloadIntervalMin`, `pollingTimeSec` and custom topic names are not
//! simulated; a setting offering MQTT without `mqttConnectionSetting` falls back to HTTP;
//! a setting asking for Trigger POST runs the plain HTTP method (polls on its interval,
//! `request-post` is not simulated); `jobType` `raw` is taken as base64 of the PNG when
//! `mediaTypes` holds `image/png` (a third-party emulator does this, Star's pages we have
//! do not say); the status code of a duplicate is [`CloudPrntMqttOptions::duplicate_code`];
//! received messages are acknowledged (PUBACK) on arrival; the remembered tokens and the
//! file counter outlive a switch-off (they live as long as the process); `client-status` goes out with
//! `printingInProgress` true just before a job is printed and false just after, then the
//! `print-result`; jobs are handled one at a time in arrival order.

use crate::cloudprnt::{
    append_query, asb_status, reported, status_code, url_encode, CloudPrinter, Event, MEDIA_TYPE, REQUEST_TIMEOUT,
    STATE_TICK,
};
use anyhow::{Context, Result};
use base64::Engine as _;
use preview::escpos::status::PrinterCondition;
use reqwest::{Method as HttpMethod, Url};
use rumqttc::mqttbytes::v4::SubscribeReasonCode;
use rumqttc::{
    AsyncClient, ConnectReturnCode, ConnectionError, Event as MqttEvent, EventLoop, LastWill, MqttOptions, Packet,
    Publish, QoS, TlsConfiguration, Transport,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The file name that replaces the CloudPRNT URL's last path segment in the server setting
/// request.
pub const SETTING_FILE: &str = "cloudprnt-setting.json";

/// MQTT keep-alive (the simulator's choice).
pub const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// The default `--duplicate-code`.
pub const DEFAULT_DUPLICATE_CODE: &str = "200 OK";

/// The code refused SUBSCRIBEs are reported with (`refused 128`): MQTT 3.1.1's SUBACK
/// failure return code `0x80`.
pub const SUBACK_FAILURE: u16 = 0x80;

/// What the MQTT method needs beyond [`crate::cloudprnt::CloudPrntOptions`].
#[derive(Debug, Clone)]
pub struct CloudPrntMqttOptions {
    /// The `print-result` status code (not URL-encoded) of a `print-job` whose `jobToken`
    /// was printed already; `printSucceeded` is true when it starts with `2`. Star's guide
    /// says only that this result carries a status code "indicating that a message with a
    /// duplicate jobToken was received and will not be printed"; the value itself is not
    /// documented in what we have, hence an option (default [`DEFAULT_DUPLICATE_CODE`]).
    pub duplicate_code: String,
}

impl Default for CloudPrntMqttOptions {
    fn default() -> Self {
        CloudPrntMqttOptions { duplicate_code: DEFAULT_DUPLICATE_CODE.to_string() }
    }
}

/// `mac` lower case with colons (`00-11-62-0A-1B-2C`, `0011620A1B2C` →
/// `00:11:62:0a:1b:2c`); anything that is not 12 hex digits once `:`, `-` and `.` are
/// dropped is only lower-cased.
pub fn normalize_mac(mac: &str) -> String {
    let hex: String = mac.chars().filter(|c| !matches!(c, ':' | '-' | '.')).collect();
    if hex.len() == 12 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
        let hex = hex.to_ascii_lowercase();
        (0..6).map(|i| &hex[2 * i..2 * i + 2]).collect::<Vec<_>>().join(":")
    } else {
        mac.to_lowercase()
    }
}

/// The server setting request's URL for CloudPRNT URL `url` and printer `mac` (lower case
/// with colons): `url`'s last path segment replaced by [`SETTING_FILE`], its query and
/// fragment dropped, and `?mac={mac}&replaced_path={segment}` (both URL-encoded):
/// `https://127.0.0.1:8443/cloudprnt` →
/// `https://127.0.0.1:8443/cloudprnt-setting.json?mac=00%3A11%3A62%3A0a%3A1b%3A2c&replaced_path=cloudprnt`.
///
/// # Errors
/// `url` has no path to replace a segment of (e.g. `mailto:`).
pub fn setting_url(url: &Url, mac: &str) -> Result<Url> {
    let mut setting = url.clone();
    let last = url.path_segments().and_then(|mut s| s.next_back()).unwrap_or("");
    let replaced = percent_encoding::percent_decode_str(last).decode_utf8_lossy().into_owned();
    setting
        .path_segments_mut()
        .map_err(|()| anyhow::anyhow!("{url} has no path for {SETTING_FILE}"))?
        .pop()
        .push(SETTING_FILE);
    setting.set_fragment(None);
    setting.set_query(Some(&format!("mac={}&replaced_path={}", url_encode(mac), url_encode(&replaced))));
    Ok(setting)
}

/// The fields of a server setting answer this printer reads (guide: *Server setting
/// information request (GET)*, *Response (GET)*).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerSetting {
    /// `star_cloudprnt_server_setting`.
    #[serde(default)]
    pub title: Option<String>,
    /// `1.0.0`.
    #[serde(default)]
    pub version: Option<String>,
    /// `"HTTP"`, `"MQTT"`.
    #[serde(default)]
    pub server_support_protocol: Vec<String>,
    /// Required when `"MQTT"` is offered.
    #[serde(default, rename = "settingForMQTT")]
    pub setting_for_mqtt: Option<SettingForMqtt>,
}

/// `settingForMQTT`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SettingForMqtt {
    /// CloudPRNT Version MQTT (Trigger POST): MQTT only tells the printer when to poll.
    #[serde(default, rename = "useTriggerPOST")]
    pub use_trigger_post: bool,
    /// Where and how to connect.
    #[serde(default)]
    pub mqtt_connection_setting: Option<MqttConnectionSetting>,
}

/// `settingForMQTT.mqttConnectionSetting`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MqttConnectionSetting {
    /// The broker's host name or IP address (also the TLS server name).
    pub host_name: String,
    /// The broker's port.
    pub port_number: u16,
    /// TLS, verified against `--ca`.
    #[serde(default)]
    pub use_tls: bool,
    /// Client id and credentials.
    #[serde(default)]
    pub authentication_setting: Option<AuthenticationSetting>,
}

/// `mqttConnectionSetting.authenticationSetting`.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticationSetting {
    /// MQTT client id (default: the MAC).
    #[serde(default)]
    pub client_id: Option<String>,
    /// MQTT user name.
    #[serde(default)]
    pub username: Option<String>,
    /// MQTT password.
    #[serde(default)]
    pub password: Option<String>,
}

impl std::fmt::Debug for AuthenticationSetting {
    /// Never prints the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthenticationSetting")
            .field("client_id", &self.client_id)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// The protocol a server setting makes the printer run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    /// CloudPRNT Version HTTP: polling ([`CloudPrinter::run`]).
    Http,
    /// CloudPRNT Version MQTT (Trigger POST); not simulated: run as [`Method::Http`].
    TriggerPost,
    /// CloudPRNT Version MQTT (Full MQTT / Pass URL), on this broker.
    Mqtt(MqttConnectionSetting),
}

/// The method `setting` asks for: [`Method::Mqtt`] when `serverSupportProtocol` holds
/// `"MQTT"`, `useTriggerPOST` is not set and the connection setting is there;
/// [`Method::TriggerPost`] with `useTriggerPOST`; else [`Method::Http`].
pub fn method_of(setting: &ServerSetting) -> Method {
    if !setting.server_support_protocol.iter().any(|p| p.eq_ignore_ascii_case("MQTT")) {
        return Method::Http;
    }
    let Some(mqtt) = &setting.setting_for_mqtt else {
        tracing::warn!("the server offers MQTT without settingForMQTT: CloudPRNT Version HTTP");
        return Method::Http;
    };
    if mqtt.use_trigger_post {
        return Method::TriggerPost;
    }
    match &mqtt.mqtt_connection_setting {
        Some(conn) => Method::Mqtt(conn.clone()),
        None => {
            tracing::warn!("the server offers MQTT without mqttConnectionSetting: CloudPRNT Version HTTP");
            Method::Http
        }
    }
}

/// What the answer to a server setting request means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingAnswer {
    /// Run this method.
    Method(Method),
    /// 401 or 403: ask again after the poll interval.
    Refused(u16),
}

/// The meaning of a server setting answer with HTTP `status` and `body`: 404 → HTTP, 401
/// and 403 → refused, 200 → [`method_of`] its JSON.
///
/// # Errors
/// Another status, or a 200 body that is not a server setting.
pub fn setting_answer(status: u16, body: &[u8]) -> Result<SettingAnswer> {
    match status {
        404 => Ok(SettingAnswer::Method(Method::Http)),
        401 | 403 => Ok(SettingAnswer::Refused(status)),
        200 => {
            let setting: ServerSetting =
                serde_json::from_slice(body).context("the server setting is not star_cloudprnt_server_setting JSON")?;
            Ok(SettingAnswer::Method(method_of(&setting)))
        }
        other => anyhow::bail!("server setting request answered {other}"),
    }
}

/// What the printer subscribes to: `star/cloudprnt/to-device/{mac}/#`.
pub fn to_device_filter(mac: &str) -> String {
    format!("star/cloudprnt/to-device/{mac}/#")
}

/// Where the printer publishes `method` (`client-status`, `print-result`, `client-will`):
/// `star/cloudprnt/to-server/{mac}/{method}`.
pub fn to_server_topic(mac: &str, method: &str) -> String {
    format!("star/cloudprnt/to-server/{mac}/{method}")
}

/// The method of a message to printer `mac` on `topic` (`print-job` of
/// `star/cloudprnt/to-device/{mac}/print-job`), or none for another printer's topic.
pub fn to_device_method<'t>(topic: &'t str, mac: &str) -> Option<&'t str> {
    topic.strip_prefix("star/cloudprnt/to-device/")?.strip_prefix(mac)?.strip_prefix('/')
}

/// The Will: `{"title":"client-will","printerMAC":mac,"unintentionalDisconnection":true}`.
pub fn will_payload(mac: &str) -> Vec<u8> {
    serde_json::json!({"title": "client-will", "printerMAC": mac, "unintentionalDisconnection": true})
        .to_string()
        .into_bytes()
}

/// A `client-status` message (the HTTP poll's fields with a `title`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientStatus {
    /// `client-status`.
    pub title: String,
    /// The MAC, lower case with colons.
    #[serde(rename = "printerMAC")]
    pub printer_mac: String,
    /// [`status_code`], URL-encoded (`200%20OK`).
    pub status_code: String,
    /// [`asb_status`].
    pub status: String,
    /// Printing a job right now.
    pub printing_in_progress: bool,
}

impl ClientStatus {
    /// The status of printer `mac` in condition `c`.
    pub fn new(c: &PrinterCondition, mac: &str, printing: bool) -> ClientStatus {
        ClientStatus {
            title: "client-status".into(),
            printer_mac: mac.to_string(),
            status_code: url_encode(status_code(c)),
            status: asb_status(c),
            printing_in_progress: printing,
        }
    }
}

/// A `print-result` message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrintResult {
    /// `print-result`.
    pub title: String,
    /// The MAC, lower case with colons.
    #[serde(rename = "printerMAC")]
    pub printer_mac: String,
    /// The job's token.
    pub job_token: String,
    /// The printer status code, URL-encoded (`200%20OK`).
    pub status_code: String,
    /// The code is a 2xx one.
    pub print_succeeded: bool,
}

impl PrintResult {
    /// The result of job `token` on printer `mac`: status code `code` (not yet
    /// URL-encoded).
    pub fn new(mac: &str, token: &str, code: &str) -> PrintResult {
        PrintResult {
            title: "print-result".into(),
            printer_mac: mac.to_string(),
            job_token: token.to_string(),
            status_code: url_encode(code),
            print_succeeded: code.starts_with('2'),
        }
    }
}

/// The fields of a `print-job` message this printer reads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrintJob {
    /// Echoed in the `print-result`; a token printed already is not printed again.
    pub job_token: String,
    /// `url` (GET `printData`) or `raw` (`printData` is the job).
    #[serde(default)]
    pub job_type: Option<String>,
    /// The media types the job can be had in.
    #[serde(default)]
    pub media_types: Option<Vec<String>>,
    /// The URL (`url`) or the base64 job (`raw`).
    #[serde(default)]
    pub print_data: Option<String>,
}

/// What to do with a `print-job`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobPlan {
    /// Do not print; publish a `print-result` with status code `code` (not URL-encoded).
    /// `duplicate`: the token was printed already (reported as `duplicate TOKEN`).
    Answer {
        /// The token was printed already.
        duplicate: bool,
        /// The result's status code.
        code: String,
    },
    /// GET the PNG here, then print it.
    Fetch(Url),
    /// Print these bytes (a PNG, if they decode).
    Print(Vec<u8>),
}

/// `print_data` (resolved against the CloudPRNT URL `base`) with
/// `mac={mac}&type=image%2Fpng&token={token}` after any query it has.
///
/// # Errors
/// `print_data` is not a URL.
pub fn print_data_url(print_data: &str, base: &Url, mac: &str, token: &str) -> Result<Url> {
    let url = base.join(print_data).with_context(|| format!("printData {print_data:?} is not a URL"))?;
    let query = format!("mac={}&type={}&token={}", url_encode(mac), url_encode(MEDIA_TYPE), url_encode(token));
    Ok(append_query(url, &query))
}

/// What printer `mac` in condition `c` does with `job`, in this order: `known` (its token
/// was printed already) → [`JobPlan::Answer`] `duplicate_code`; a condition that cannot
/// print → its [`status_code`]; `jobType` `url` (with `image/png` among `mediaTypes` when
/// they are given) → [`JobPlan::Fetch`] [`print_data_url`] (no `printData`: 520); `raw`
/// with `image/png` among `mediaTypes` → [`JobPlan::Print`] the base64-decoded
/// `printData` (not base64: 511); anything else → 510.
pub fn plan_job(
    job: &PrintJob,
    c: &PrinterCondition,
    known: bool,
    mac: &str,
    base: &Url,
    duplicate_code: &str,
) -> JobPlan {
    let answer = |code: &str| JobPlan::Answer { duplicate: false, code: code.to_string() };
    if known {
        return JobPlan::Answer { duplicate: true, code: duplicate_code.to_string() };
    }
    if !c.can_print() {
        return answer(status_code(c));
    }
    let png_offered = job.media_types.as_ref().map(|types| types.iter().any(|t| t.eq_ignore_ascii_case(MEDIA_TYPE)));
    let data = job.print_data.as_deref().filter(|d| !d.is_empty());
    match (job.job_type.as_deref(), png_offered) {
        (Some("url"), None | Some(true)) => match data.map(|d| print_data_url(d, base, mac, &job.job_token)) {
            Some(Ok(url)) => JobPlan::Fetch(url),
            Some(Err(e)) => {
                tracing::warn!("{e:#}");
                answer("520 Job Download Error")
            }
            None => {
                tracing::warn!(token = %job.job_token, "a url print-job without printData");
                answer("520 Job Download Error")
            }
        },
        (Some("raw"), Some(true)) => {
            match base64::engine::general_purpose::STANDARD.decode(data.unwrap_or("").trim().as_bytes()) {
                Ok(bytes) => JobPlan::Print(bytes),
                Err(e) => {
                    tracing::warn!(token = %job.job_token, "raw printData is not base64: {e}");
                    answer("511 Media Decoding Error")
                }
            }
        }
        (job_type, _) => {
            tracing::warn!(?job_type, media_types = ?job.media_types, "no {MEDIA_TYPE} print-job of type url or raw");
            answer("510 Incompatible Media Type")
        }
    }
}

/// Runs the printer until the process ends: the server setting request, then the MQTT
/// method, or the HTTP method ([`CloudPrinter::run`]) when the server asks for it. Reports
/// [`Event::Polling`] when polling starts or, on MQTT, after every subscription, and the
/// other events as they happen.
pub async fn run(mut printer: CloudPrinter, opts: CloudPrntMqttOptions, report: &mut (dyn FnMut(&Event) + Send)) {
    let mac = normalize_mac(&printer.opts.mac);
    let mut refused = None;
    loop {
        let c = printer.condition();
        if c.offline {
            // Switched off: nothing until switched on, then a boot.
            printer.wait(&c).await;
            continue;
        }
        let answer = match setting_url(&printer.opts.url, &mac) {
            Ok(url) => fetch_setting(&printer, url).await,
            Err(e) => {
                tracing::warn!("{e:#}: CloudPRNT Version HTTP");
                Ok(SettingAnswer::Method(Method::Http))
            }
        };
        match answer {
            Ok(SettingAnswer::Method(Method::Http)) => {
                tracing::info!("the server supports CloudPRNT Version HTTP only: polling");
                return printer.run(report).await;
            }
            Ok(SettingAnswer::Method(Method::TriggerPost)) => {
                tracing::info!("the server asks for Trigger POST, not simulated: polling (CloudPRNT Version HTTP)");
                return printer.run(report).await;
            }
            Ok(SettingAnswer::Method(Method::Mqtt(setting))) => {
                match session(&mut printer, &setting, &mac, &opts, &mut refused, report).await {
                    Ended::Offline => continue,
                    Ended::Refused(code) => refusal(&mut refused, code, report),
                    Ended::Failed(e) => {
                        tracing::warn!(host = %setting.host_name, port = setting.port_number, "MQTT: {e:#}")
                    }
                }
            }
            Ok(SettingAnswer::Refused(status)) => refusal(&mut refused, status, report),
            Err(e) => tracing::warn!(url = %printer.opts.url, "server setting: {e:#}"),
        }
        printer.wait(&c).await;
    }
}

/// Reports refusal `code` unless the last refusal had the same code.
fn refusal(last: &mut Option<u16>, code: u16, report: &mut (dyn FnMut(&Event) + Send)) {
    if *last != Some(code) {
        report(&Event::Refused(code));
    }
    *last = Some(code);
}

/// GETs the server setting at `url` with the printer's credentials.
///
/// # Errors
/// The request failed, or [`setting_answer`]'s.
async fn fetch_setting(printer: &CloudPrinter, url: Url) -> Result<SettingAnswer> {
    let resp = printer.request(HttpMethod::GET, url).send().await?;
    let status = resp.status().as_u16();
    let body = resp.bytes().await?;
    setting_answer(status, &body)
}

/// How an MQTT session ended.
enum Ended {
    /// The printer was switched off (the connection dropped without DISCONNECT).
    Offline,
    /// CONNACK refused with this return code, or SUBACK failed ([`SUBACK_FAILURE`]).
    Refused(u16),
    /// Could not connect, or the connection was lost.
    Failed(anyhow::Error),
}

/// The MQTT options of printer `mac` for `setting`; TLS verifies against `roots`, which
/// must come from `--ca` (`have_ca`).
///
/// # Errors
/// TLS without `--ca`, or no TLS configuration.
fn mqtt_options(
    setting: &MqttConnectionSetting,
    mac: &str,
    roots: &Arc<rustls::RootCertStore>,
    have_ca: bool,
) -> Result<MqttOptions> {
    let auth = setting.authentication_setting.clone().unwrap_or_default();
    let client_id = auth.client_id.filter(|id| !id.is_empty()).unwrap_or_else(|| mac.to_string());
    let mut mo = MqttOptions::new(client_id, setting.host_name.clone(), setting.port_number);
    mo.set_clean_session(true)
        .set_keep_alive(KEEP_ALIVE)
        .set_last_will(LastWill::new(to_server_topic(mac, "client-will"), will_payload(mac), QoS::AtLeastOnce, false))
        .set_max_packet_size(crate::device::MAX_PACKET_BYTES, crate::device::MAX_PACKET_BYTES);
    if let Some(user) = auth.username.filter(|u| !u.is_empty()) {
        mo.set_credentials(user, auth.password.unwrap_or_default());
    }
    if setting.use_tls {
        anyhow::ensure!(
            have_ca,
            "the server setting asks for MQTT over TLS: --ca is needed (the CA to verify the broker against)"
        );
        let config = crate::device::ring_client_builder(roots.clone())?.with_no_client_auth();
        mo.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(Arc::new(config))));
    }
    Ok(mo)
}

/// Connects (CONNACK) and subscribes (SUBACK); PUBLISHes that come first go to `early`.
async fn connect(
    client: &AsyncClient,
    events: &mut EventLoop,
    mac: &str,
    early: &mut Vec<Publish>,
) -> Result<(), Ended> {
    loop {
        match events.poll().await {
            Ok(MqttEvent::Incoming(Packet::ConnAck(ack))) => {
                if ack.code != ConnectReturnCode::Success {
                    return Err(Ended::Refused(ack.code as u16));
                }
                client
                    .subscribe(to_device_filter(mac), QoS::AtLeastOnce)
                    .await
                    .map_err(|e| Ended::Failed(anyhow::anyhow!("subscribing: {e}")))?;
            }
            Ok(MqttEvent::Incoming(Packet::SubAck(ack))) => {
                if ack.return_codes.iter().any(|c| matches!(c, SubscribeReasonCode::Failure)) {
                    return Err(Ended::Refused(SUBACK_FAILURE));
                }
                return Ok(());
            }
            Ok(MqttEvent::Incoming(Packet::Publish(p))) => early.push(p),
            Ok(_) => {}
            Err(ConnectionError::ConnectionRefused(code)) => return Err(Ended::Refused(code as u16)),
            Err(e) => return Err(Ended::Failed(anyhow::anyhow!("connecting: {e}"))),
        }
    }
}

/// One connection to the broker, from CONNECT until it is lost or the printer is switched
/// off.
async fn session(
    printer: &mut CloudPrinter,
    setting: &MqttConnectionSetting,
    mac: &str,
    opts: &CloudPrntMqttOptions,
    refused: &mut Option<u16>,
    report: &mut (dyn FnMut(&Event) + Send),
) -> Ended {
    let mo = match mqtt_options(setting, mac, &printer.roots, printer.opts.ca.is_some()) {
        Ok(mo) => mo,
        Err(e) => return Ended::Failed(e),
    };
    let (client, mut events) = AsyncClient::new(mo, 64);
    let mut early = Vec::new();
    match tokio::time::timeout(REQUEST_TIMEOUT, connect(&client, &mut events, mac, &mut early)).await {
        Ok(Ok(())) => {}
        Ok(Err(ended)) => return ended,
        Err(_) => return Ended::Failed(anyhow::anyhow!("no CONNACK and SUBACK within {REQUEST_TIMEOUT:?}")),
    }
    tracing::info!(host = %setting.host_name, port = setting.port_number, tls = setting.use_tls, "MQTT: subscribed");
    *refused = None;
    report(&Event::Polling(printer.opts.url.to_string()));

    // The connection is driven by its own task, which also holds it: aborting that task
    // drops the TCP connection without DISCONNECT.
    let (tx, mut rx) = mpsc::unbounded_channel();
    for p in early {
        let _ = tx.send(Ok(p));
    }
    let pump = tokio::spawn(async move {
        loop {
            match events.poll().await {
                Ok(MqttEvent::Incoming(Packet::Publish(p))) => {
                    if tx.send(Ok(p)).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            }
        }
    });
    let mut link = Link { client, mac: mac.to_string() };
    let mut shown = printer.condition();
    link.status(&shown, false).await;
    let mut tick = tokio::time::interval(STATE_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ended = loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Ok(p)) => {
                    let c = printer.condition();
                    if c.offline {
                        break Ended::Offline;
                    }
                    if reported(&c) != reported(&shown) {
                        shown = c;
                        link.status(&c, false).await;
                    }
                    link.message(printer, &p, &c, opts, report).await;
                }
                Some(Err(e)) => break Ended::Failed(anyhow::anyhow!("connection lost: {e}")),
                None => break Ended::Failed(anyhow::anyhow!("connection task ended")),
            },
            _ = tick.tick() => {
                let c = printer.condition();
                if c.offline {
                    break Ended::Offline;
                }
                if reported(&c) != reported(&shown) {
                    tracing::debug!(condition = ?c, "condition changed: client-status");
                    shown = c;
                    link.status(&c, false).await;
                }
            }
        }
    };
    pump.abort();
    let _ = pump.await;
    if let Ended::Offline = ended {
        tracing::info!("switched off: connection dropped without DISCONNECT");
    }
    ended
}

/// The printer's side of a connection.
struct Link {
    client: AsyncClient,
    mac: String,
}

impl Link {
    /// Publishes `payload` as `method` (QoS 1, not retained); a connection that is gone is
    /// logged.
    async fn publish(&self, method: &str, payload: &impl Serialize) {
        let body = match serde_json::to_vec(payload) {
            Ok(b) => b,
            Err(e) => return tracing::error!("{method}: {e}"),
        };
        if let Err(e) = self.client.publish(to_server_topic(&self.mac, method), QoS::AtLeastOnce, false, body).await {
            tracing::warn!("publishing {method}: {e}");
        }
    }

    /// Publishes a `client-status` for condition `c`.
    async fn status(&self, c: &PrinterCondition, printing: bool) {
        self.publish("client-status", &ClientStatus::new(c, &self.mac, printing)).await;
    }

    /// Publishes the `print-result` of job `token`.
    async fn result(&self, token: &str, code: &str) {
        tracing::info!(token, code, "print-result");
        self.publish("print-result", &PrintResult::new(&self.mac, token, code)).await;
    }

    /// Handles message `p` in condition `c`.
    async fn message(
        &mut self,
        printer: &mut CloudPrinter,
        p: &Publish,
        c: &PrinterCondition,
        opts: &CloudPrntMqttOptions,
        report: &mut (dyn FnMut(&Event) + Send),
    ) {
        match to_device_method(&p.topic, &self.mac) {
            Some("print-job") => match serde_json::from_slice::<PrintJob>(&p.payload) {
                Ok(job) => self.job(printer, &job, c, opts, report).await,
                Err(e) => tracing::warn!(topic = %p.topic, "print-job is not CloudPRNT JSON: {e}; ignored"),
            },
            Some("request-client-status") => self.status(c, false).await,
            // Star: "Make a printer perform Server setting information request (GET)".
            Some("request-get-server-info") => match setting_url(&printer.opts.url, &self.mac) {
                Ok(url) => match fetch_setting(printer, url).await {
                    Ok(answer) => tracing::info!(?answer, "server setting asked for again"),
                    Err(e) => tracing::warn!("server setting: {e:#}"),
                },
                Err(e) => tracing::warn!("{e:#}"),
            },
            Some("request-post") => tracing::debug!("request-post: Trigger POST is not simulated; ignored"),
            Some(other) => tracing::info!(method = other, "not simulated; ignored"),
            None => tracing::info!(topic = %p.topic, "not a topic of this printer; ignored"),
        }
    }

    /// Carries out `job` in condition `c`.
    async fn job(
        &mut self,
        printer: &mut CloudPrinter,
        job: &PrintJob,
        c: &PrinterCondition,
        opts: &CloudPrntMqttOptions,
        report: &mut (dyn FnMut(&Event) + Send),
    ) {
        let t = job.job_token.as_str();
        // An empty token is no token (as on HTTP): never a duplicate, not remembered.
        let token = Some(t).filter(|t| !t.is_empty());
        let known = token.is_some_and(|t| printer.knows(t));
        let png = match plan_job(job, c, known, &self.mac, &printer.opts.url, &opts.duplicate_code) {
            JobPlan::Answer { duplicate, code } => {
                if duplicate {
                    report(&Event::Duplicate(t.to_string()));
                }
                return self.result(t, &code).await;
            }
            JobPlan::Print(png) => png,
            JobPlan::Fetch(url) => match printer.download(url).await {
                Ok(Ok(png)) => png,
                Ok(Err(code)) => return self.result(t, code).await,
                Err(e) => {
                    tracing::warn!("job GET: {e:#}");
                    return self.result(t, "520 Job Download Error").await;
                }
            },
        };
        let (width, height) = match printer.png_size(&png) {
            Ok(size) => size,
            Err(code) => return self.result(t, code).await,
        };
        self.status(c, true).await;
        let printed = printer.print(&png, token, width, height, report);
        self.status(c, false).await;
        if let Err(e) = printed {
            // As on HTTP: not confirmed, so the server may send it again.
            return tracing::error!(token = t, "printing: {e:#}; no print-result");
        }
        if printer.confirmation_skipped() {
            tracing::info!(token = t, "print-result skipped (--skip-confirm)");
            return;
        }
        self.result(t, "200 OK").await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw_printer::parse_condition;

    const MAC: &str = "00:11:62:0a:1b:2c";

    fn cond(words: &str) -> PrinterCondition {
        parse_condition(words).unwrap()
    }

    #[test]
    fn macs() {
        assert_eq!(normalize_mac("00:11:62:0A:1B:2C"), MAC);
        assert_eq!(normalize_mac("00-11-62-0a-1b-2c"), MAC);
        assert_eq!(normalize_mac("0011620A1B2C"), MAC);
        assert_eq!(normalize_mac("Printer-1"), "printer-1");
    }

    #[test]
    fn setting_urls() {
        let url = |u: &str| setting_url(&Url::parse(u).unwrap(), MAC).unwrap().to_string();
        assert_eq!(
            url("https://127.0.0.1:8443/cloudprnt"),
            "https://127.0.0.1:8443/cloudprnt-setting.json?mac=00%3A11%3A62%3A0a%3A1b%3A2c&replaced_path=cloudprnt"
        );
        assert_eq!(
            url("http://example.com/star/cloudprnt.php?shop=1#x"),
            "http://example.com/star/cloudprnt-setting.json?mac=00%3A11%3A62%3A0a%3A1b%3A2c&replaced_path=cloudprnt.php"
        );
        assert_eq!(
            url("http://example.com/a%20b"),
            "http://example.com/cloudprnt-setting.json?mac=00%3A11%3A62%3A0a%3A1b%3A2c&replaced_path=a%20b"
        );
        assert_eq!(
            url("http://example.com/star/"),
            "http://example.com/star/cloudprnt-setting.json?mac=00%3A11%3A62%3A0a%3A1b%3A2c&replaced_path="
        );
        assert_eq!(
            url("http://example.com"),
            "http://example.com/cloudprnt-setting.json?mac=00%3A11%3A62%3A0a%3A1b%3A2c&replaced_path="
        );
    }

    fn setting(json: serde_json::Value) -> Result<SettingAnswer> {
        setting_answer(200, json.to_string().as_bytes())
    }

    #[test]
    fn setting_decisions() {
        let full = serde_json::json!({
            "title": "star_cloudprnt_server_setting", "version": "1.0.0",
            "serverSupportProtocol": ["HTTP", "MQTT"],
            "settingForMQTT": {"useTriggerPOST": false, "mqttConnectionSetting": {
                "hostName": "127.0.0.1", "portNumber": 8883, "useTls": true,
                "authenticationSetting": {"clientId": "dev-8baa", "username": "8baa", "password": "pw"}}}
        });
        let Ok(SettingAnswer::Method(Method::Mqtt(conn))) = setting(full.clone()) else { panic!("MQTT expected") };
        assert_eq!((conn.host_name.as_str(), conn.port_number, conn.use_tls), ("127.0.0.1", 8883, true));
        let auth = conn.authentication_setting.clone().unwrap();
        assert_eq!(
            (auth.client_id.as_deref(), auth.username.as_deref(), auth.password.as_deref()),
            (Some("dev-8baa"), Some("8baa"), Some("pw"))
        );
        assert!(!format!("{conn:?}").contains("pw\""), "Debug must not print the password: {conn:?}");

        let mut trigger = full.clone();
        trigger["settingForMQTT"]["useTriggerPOST"] = true.into();
        assert_eq!(setting(trigger).unwrap(), SettingAnswer::Method(Method::TriggerPost));
        let mut http_only = full.clone();
        http_only["serverSupportProtocol"] = serde_json::json!(["HTTP"]);
        assert_eq!(setting(http_only).unwrap(), SettingAnswer::Method(Method::Http));
        let mut no_conn = full.clone();
        no_conn["settingForMQTT"] = serde_json::json!({"useTriggerPOST": false});
        assert_eq!(setting(no_conn).unwrap(), SettingAnswer::Method(Method::Http));
        let mut no_mqtt = full.clone();
        no_mqtt.as_object_mut().unwrap().remove("settingForMQTT");
        assert_eq!(setting(no_mqtt).unwrap(), SettingAnswer::Method(Method::Http));
        // MQTT only, no TLS, no credentials.
        let plain = serde_json::json!({"serverSupportProtocol": ["MQTT"], "settingForMQTT": {
            "mqttConnectionSetting": {"hostName": "broker", "portNumber": 1883}}});
        let Ok(SettingAnswer::Method(Method::Mqtt(conn))) = setting(plain) else { panic!("MQTT expected") };
        assert!(!conn.use_tls && conn.authentication_setting.is_none());

        assert_eq!(setting_answer(404, b"").unwrap(), SettingAnswer::Method(Method::Http));
        assert_eq!(setting_answer(401, b"").unwrap(), SettingAnswer::Refused(401));
        assert_eq!(setting_answer(403, b"no").unwrap(), SettingAnswer::Refused(403));
        assert!(setting_answer(500, b"").is_err());
        assert!(setting_answer(200, b"<html>").is_err());
    }

    #[test]
    fn topics_and_payloads() {
        assert_eq!(to_device_filter(MAC), "star/cloudprnt/to-device/00:11:62:0a:1b:2c/#");
        assert_eq!(to_server_topic(MAC, "print-result"), "star/cloudprnt/to-server/00:11:62:0a:1b:2c/print-result");
        assert_eq!(to_device_method("star/cloudprnt/to-device/00:11:62:0a:1b:2c/print-job", MAC), Some("print-job"));
        assert_eq!(to_device_method("star/cloudprnt/to-device/00:11:62:0a:1b:2d/print-job", MAC), None);
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&will_payload(MAC)).unwrap(),
            serde_json::json!({"title": "client-will", "printerMAC": MAC, "unintentionalDisconnection": true})
        );
        assert_eq!(
            serde_json::to_string(&ClientStatus::new(&cond("paper-out"), MAC, true)).unwrap(),
            r#"{"title":"client-status","printerMAC":"00:11:62:0a:1b:2c","statusCode":"410%20Out%20of%20Paper","status":"23 86 08 00 00 08 00 00 00","printingInProgress":true}"#
        );
        assert_eq!(
            serde_json::to_string(&PrintResult::new(MAC, "t 1", "200 OK")).unwrap(),
            r#"{"title":"print-result","printerMAC":"00:11:62:0a:1b:2c","jobToken":"t 1","statusCode":"200%20OK","printSucceeded":true}"#
        );
        assert!(!PrintResult::new(MAC, "t", "410 Out of Paper").print_succeeded);
    }

    #[test]
    fn print_data_query() {
        let base = Url::parse("https://127.0.0.1:8443/cloudprnt").unwrap();
        let url = |d: &str| print_data_url(d, &base, MAC, "job 1/a").unwrap().to_string();
        assert_eq!(
            url("https://127.0.0.1:8443/cloudprnt/job/42"),
            "https://127.0.0.1:8443/cloudprnt/job/42?mac=00%3A11%3A62%3A0a%3A1b%3A2c&type=image%2Fpng&token=job%201%2Fa"
        );
        assert_eq!(
            url("https://h/job?id=42"),
            "https://h/job?id=42&mac=00%3A11%3A62%3A0a%3A1b%3A2c&type=image%2Fpng&token=job%201%2Fa"
        );
        assert_eq!(
            url("/job"),
            "https://127.0.0.1:8443/job?mac=00%3A11%3A62%3A0a%3A1b%3A2c&type=image%2Fpng&token=job%201%2Fa"
        );
    }

    fn job(json: serde_json::Value) -> PrintJob {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn job_plans() {
        let base = Url::parse("https://127.0.0.1:8443/cloudprnt").unwrap();
        let ready = cond("");
        let url_job = job(serde_json::json!({"title": "print-job", "jobToken": "T1", "jobType": "url",
            "mediaTypes": ["image/png"], "printData": "https://127.0.0.1:8443/cloudprnt/job/1"}));
        let plan = |j: &PrintJob, c: &PrinterCondition, known: bool| plan_job(j, c, known, MAC, &base, "200 OK");
        let answer = |duplicate: bool, code: &str| JobPlan::Answer { duplicate, code: code.into() };

        assert_eq!(
            plan(&url_job, &ready, false),
            JobPlan::Fetch(
                Url::parse(
                    "https://127.0.0.1:8443/cloudprnt/job/1?mac=00%3A11%3A62%3A0a%3A1b%3A2c&type=image%2Fpng&token=T1"
                )
                .unwrap()
            )
        );
        // A duplicate wins over everything; then the condition.
        assert_eq!(plan(&url_job, &cond("paper-out"), true), answer(true, "200 OK"));
        assert_eq!(plan_job(&url_job, &ready, true, MAC, &base, "409 Duplicate"), answer(true, "409 Duplicate"));
        assert_eq!(plan(&url_job, &cond("paper-out"), false), answer(false, "410 Out of Paper"));
        assert_eq!(plan(&url_job, &cond("cover-open"), false), answer(false, "420 Cover Open"));
        assert!(matches!(plan(&url_job, &cond("paper-near-end"), false), JobPlan::Fetch(_)));
        // url: no mediaTypes is fine, other media types are not; no printData: 520.
        let mut j = url_job.clone();
        j.media_types = None;
        assert!(matches!(plan(&j, &ready, false), JobPlan::Fetch(_)));
        j.media_types = Some(vec!["application/vnd.star.starprnt".into()]);
        assert_eq!(plan(&j, &ready, false), answer(false, "510 Incompatible Media Type"));
        let mut j = url_job.clone();
        j.print_data = None;
        assert_eq!(plan(&j, &ready, false), answer(false, "520 Job Download Error"));

        // raw: base64 of the PNG.
        let raw = |data: &str, types: serde_json::Value| {
            job(serde_json::json!({"jobToken": "T2", "jobType": "raw", "mediaTypes": types, "printData": data}))
        };
        assert_eq!(
            plan(&raw("iVBORw0KGgo=", serde_json::json!(["image/png"])), &ready, false),
            JobPlan::Print(b"\x89PNG\r\n\x1a\n".to_vec())
        );
        assert_eq!(
            plan(&raw("not base64!", serde_json::json!(["image/png"])), &ready, false),
            answer(false, "511 Media Decoding Error")
        );
        assert_eq!(
            plan(&raw("iVBORw0KGgo=", serde_json::json!(["text/plain"])), &ready, false),
            answer(false, "510 Incompatible Media Type")
        );
        assert_eq!(
            plan(&raw("iVBORw0KGgo=", serde_json::Value::Null), &ready, false),
            answer(false, "510 Incompatible Media Type")
        );
        let other = job(serde_json::json!({"jobToken": "T3", "jobType": "pdf", "mediaTypes": ["image/png"]}));
        assert_eq!(plan(&other, &ready, false), answer(false, "510 Incompatible Media Type"));
        assert_eq!(plan(&other, &cond("paper-out"), false), answer(false, "410 Out of Paper"));
    }
}
