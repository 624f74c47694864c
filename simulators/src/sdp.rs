//! A simulated Epson TM printer (TM-T88VI, TM-m30) using Server Direct Print: the printer
//! fetches its own print data by polling a server. Written from Epson's documents (Epson
//! Server Direct Print User's Manual; ePOS-Print XML User's Manual). `printer-sim sdp` runs
//! it ([`SdpPrinter::run`]).
//!
//! One cycle (Server Direct Print User's Manual: print data acquisition, result
//! notification, status notification):
//!
//! 1. *GetRequest*: `POST URL` as `application/x-www-form-urlencoded`,
//!    `ConnectionType=GetRequest&ID=<id>` ([`get_request_form`]).
//! 2. The answer: `200` with an empty body is nothing to print; otherwise a `text/xml`
//!    `PrintRequestInfo` ([`parse_request`]) with one or more `ePOSPrint` elements, each a
//!    `Parameter` (`devid`, `timeout`, `printjobid`) and a `PrintData` holding an ePOS-Print
//!    XML `epos-print` document (ePOS-Print XML User's Manual). The jobs are handled in
//!    order. `<command>` carries raw ESC/POS as hex digits (ePOS-Print XML: "command"
//!    element); the commands of one `epos-print` are concatenated.
//! 3. Print each job ([`decide`]): one the printer cannot print (paper out, cover open, an
//!    error) fails with ePOS-Print's `EPTR_REC_EMPTY`, `EPTR_COVER_OPEN` or
//!    `EPTR_MECHANICAL`; one that uses any other ePOS-Print element than `<command>` fails
//!    with `SchemaError` (the simulator draws only ESC/POS, see below). The ESC/POS goes
//!    through the [`preview`] decoder at the head width (58 mm: 384 dots, 80 mm: 576) and
//!    the paper to `{out}/{seq:04}-print.png`, as [`crate::cloudprnt`] writes it (and its
//!    [`crate::cloudprnt::JobRecord`] line in `{out}/jobs.jsonl`, the token being the
//!    `printjobid`), the bytes beside it as `{out}/{seq:04}-print.bin`.
//! 4. *SetResponse*: `POST URL`, `ConnectionType=SetResponse&ID=<id>&ResponseFile=<xml>`
//!    ([`set_response_form`]) with a `PrintResponseInfo` holding one `ePOSPrint` per job
//!    of the answer ([`response_xml`]): ePOS-Print's `response` element, `success`,
//!    `code` and `status`, the decimal value of the ASB flags ([`asb_flags`]; ePOS-Print
//!    XML: `ASB_PRINT_SUCCESS` 0x2, `ASB_OFF_LINE` 0x8, `ASB_COVER_OPEN` 0x20,
//!    `ASB_MECHANICAL_ERR` 0x400, `ASB_AUTOCUTTER_ERR` 0x800, `ASB_RECEIPT_NEAR_END`
//!    0x20000, `ASB_RECEIPT_END` 0x80000).
//!
//! After a complete acquisition the printer waits the "Interval" setting (`--poll-ms`)
//! before the next GetRequest; a failed request is tried again after the interval, a
//! failed SetResponse before the next GetRequest. With the "Status Notification" setting
//! (`--status-ms`) the printer also sends *SetStatus*
//! (`ConnectionType=SetStatus&ID=<id>&Status=<xml>`, [`set_status_form`], a
//! `statusmonitor` document with the ASB flags as `asbstatus="0x…"`, [`status_xml`]) at
//! start, every status interval, and at once when its condition changes.
//!
//! Every request uses HTTP Digest authentication (RFC 7616, MD5, `qop=auth`,
//! [`DigestAuth`]): the first request goes without credentials, the `401` challenge's
//! nonce is used from then on with a counted `nc`, and a challenge with `stale=true` is
//! answered with the new nonce. A `401` to credentials (not stale) or a `403` is a refusal:
//! reported as `refused STATUS` when the status changes, and tried again after the interval.
//!
//! Choices of this simulator where Epson's documents say nothing (or nothing was found):
//!
//! - The condition comes from the state file `{out}/state` with [`crate::raw_printer`]'s
//!   words, as in [`crate::cloudprnt`], read before each request and watched between
//!   them: `offline` is a printer switched off (no requests at all; switched on, it polls
//!   at once); `paper-out` and `cover-open` fail jobs; `paper-near-end` prints.
//! - The printer does not dedupe: Epson documents no memory of `printjobid`s, so a job
//!   offered again is printed again.
//! - Only `<command>` is drawn; any other ePOS-Print element (`text`, `image`, `cut`,
//!   `feed`…) and `<command>` text that is not hex make the job a `SchemaError`. A job
//!   whose ESC/POS draws nothing succeeds without a PNG. `devid` (echoed in the result)
//!   and `timeout` are not checked: every job prints on this printer, at once. The code
//!   page at power-on is PC437 (Epson's default).
//! - XML that does not parse, or whose root is not `PrintRequestInfo`, is ignored with a
//!   warning (no SetResponse). A job whose PNG cannot be written fails `EPTR_MECHANICAL`.
//! - The Digest client follows RFC 7616: `opaque` is echoed when the challenge has one,
//!   the `cnonce` is 128 random bits in hex, and at most two challenges are answered per
//!   request. Only `algorithm=MD5` with `qop=auth` is spoken; another challenge is a
//!   refusal.
//! - A failed SetStatus is not sent again before the next one is due. `--skip-confirm N`
//!   drops the first N SetResponses that report a printed job (printed, result lost), as
//!   [`crate::cloudprnt`] drops confirmations. Redirects are not followed; no proxy is
//!   used; the `User-Agent` is [`USER_AGENT`].

use crate::cloudprnt::{http_client, read_condition, reported, url_encode, write_job, BasicAuth, Event, STATE_TICK};
use crate::printer::{print_bytes, PrinterSettings};
use anyhow::{Context, Result};
use md5::{Digest, Md5};
use preview::escpos::status::PrinterCondition;
use render::codepage::CodePage;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{StatusCode, Url};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The ePOS-Print XML namespace of `epos-print` and `response`.
pub const EPOS_PRINT_NS: &str = "http://www.epson-pos.com/schemas/2011/03/epos-print";

/// The `devid` of the printer itself (ePOS-Print: `local_printer`).
pub const LOCAL_PRINTER: &str = "local_printer";

/// The `Content-Type` of every request.
pub const FORM: &str = "application/x-www-form-urlencoded";

/// `User-Agent` of every request (the simulator's own; Epson's is not documented).
pub const USER_AGENT: &str = concat!("printer-sim/", env!("CARGO_PKG_VERSION"), " (Epson TM Server Direct Print)");

/// ePOS-Print `ASB_PRINT_SUCCESS`: the job was printed.
pub const ASB_PRINT_SUCCESS: u32 = 0x2;
/// ePOS-Print `ASB_OFF_LINE`: the printer is offline.
pub const ASB_OFF_LINE: u32 = 0x8;
/// ePOS-Print `ASB_COVER_OPEN`: the cover is open.
pub const ASB_COVER_OPEN: u32 = 0x20;
/// ePOS-Print `ASB_MECHANICAL_ERR`: a mechanical error.
pub const ASB_MECHANICAL_ERR: u32 = 0x400;
/// ePOS-Print `ASB_AUTOCUTTER_ERR`: an autocutter error (not simulated).
pub const ASB_AUTOCUTTER_ERR: u32 = 0x800;
/// ePOS-Print `ASB_RECEIPT_NEAR_END`: the roll is nearly out.
pub const ASB_RECEIPT_NEAR_END: u32 = 0x20000;
/// ePOS-Print `ASB_RECEIPT_END`: the roll is out.
pub const ASB_RECEIPT_END: u32 = 0x80000;

/// The ASB flags of a printer in condition `c`, without [`ASB_PRINT_SUCCESS`]: paper out
/// `0x80008`, cover open `0x28`, near end `0x20000`, ready 0; offline (`0x8`) whenever it
/// cannot print.
pub fn asb_flags(c: &PrinterCondition) -> u32 {
    let bit = |on: bool, flag: u32| if on { flag } else { 0 };
    bit(c.cover_open, ASB_COVER_OPEN)
        | bit(c.paper_out, ASB_RECEIPT_END)
        | bit(c.paper_near_end, ASB_RECEIPT_NEAR_END)
        | bit(!c.can_print(), ASB_OFF_LINE)
}

/// `s` with XML's special characters escaped, for text and attribute values.
fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            _ => out.push(ch),
        }
    }
    out
}

/// The GetRequest body: `ConnectionType=GetRequest&ID=<id>`.
pub fn get_request_form(id: &str) -> String {
    format!("ConnectionType=GetRequest&ID={}", url_encode(id))
}

/// The SetResponse body: `ConnectionType=SetResponse&ID=<id>&ResponseFile=<xml>`.
pub fn set_response_form(id: &str, xml: &str) -> String {
    format!("ConnectionType=SetResponse&ID={}&ResponseFile={}", url_encode(id), url_encode(xml))
}

/// The SetStatus body: `ConnectionType=SetStatus&ID=<id>&Status=<xml>`.
pub fn set_status_form(id: &str, xml: &str) -> String {
    format!("ConnectionType=SetStatus&ID={}&Status={}", url_encode(id), url_encode(xml))
}

/// What one `ePOSPrint` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobBody {
    /// Every `<command>`'s bytes, in order.
    Commands(Vec<u8>),
    /// Not simulated (a `SchemaError`): why, e.g. the element that is not `<command>`.
    Unsupported(String),
}

/// One `ePOSPrint` of a `PrintRequestInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdpJob {
    /// `Parameter/devid` (empty if missing).
    pub devid: String,
    /// `Parameter/timeout`, ms, if given and a number.
    pub timeout: Option<u64>,
    /// `Parameter/printjobid` (empty if missing).
    pub printjobid: String,
    /// The print data.
    pub body: JobBody,
}

/// The element children of `node` named `name` (namespace ignored).
fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children().find(|n| n.is_element() && n.tag_name().name() == name)
}

/// The text of `node` and its descendants, trimmed.
fn text(node: Option<roxmltree::Node<'_, '_>>) -> String {
    let Some(node) = node else { return String::new() };
    node.descendants().filter(|n| n.is_text()).filter_map(|n| n.text()).collect::<String>().trim().to_string()
}

/// Parses a GetRequest answer: the `ePOSPrint` jobs of a `PrintRequestInfo`, in order.
///
/// # Errors
/// Not XML, or the root is not `PrintRequestInfo`.
pub fn parse_request(xml: &str) -> Result<Vec<SdpJob>> {
    let doc = roxmltree::Document::parse(xml).context("the answer is not XML")?;
    let root = doc.root_element();
    anyhow::ensure!(
        root.tag_name().name() == "PrintRequestInfo",
        "the answer's root is <{}>, not <PrintRequestInfo>",
        root.tag_name().name()
    );
    let jobs = root.children().filter(|n| n.is_element() && n.tag_name().name() == "ePOSPrint").map(|job| {
        let parameter = child(job, "Parameter");
        let param = |name: &str| text(parameter.and_then(|p| child(p, name)));
        SdpJob {
            devid: param("devid"),
            timeout: param("timeout").parse().ok(),
            printjobid: param("printjobid"),
            body: job_body(job),
        }
    });
    Ok(jobs.collect())
}

/// The print data of one `ePOSPrint`: its `PrintData/epos-print`'s commands.
fn job_body(job: roxmltree::Node<'_, '_>) -> JobBody {
    let Some(epos) = child(job, "PrintData").and_then(|d| child(d, "epos-print")) else {
        return JobBody::Unsupported("no PrintData/epos-print".into());
    };
    let mut bytes = Vec::new();
    for element in epos.children().filter(|n| n.is_element()) {
        let name = element.tag_name().name();
        if name != "command" {
            return JobBody::Unsupported(format!("<{name}> is not simulated"));
        }
        let digits: String = text(Some(element)).chars().filter(|c| !c.is_ascii_whitespace()).collect();
        match hex::decode(&digits) {
            Ok(b) => bytes.extend(b),
            Err(e) => return JobBody::Unsupported(format!("<command> is not hex: {e}")),
        }
    }
    JobBody::Commands(bytes)
}

/// What the printer does with `body` in condition `c`: `Ok(bytes)` to print, or the
/// failed job's `code` and `status` (`SchemaError` for print data that is not simulated,
/// then `EPTR_COVER_OPEN`, `EPTR_REC_EMPTY`, `EPTR_MECHANICAL` for a printer that cannot
/// print).
pub fn decide<'b>(body: &'b JobBody, c: &PrinterCondition) -> Result<&'b [u8], (&'static str, u32)> {
    let flags = asb_flags(c);
    match body {
        JobBody::Unsupported(_) => Err(("SchemaError", flags)),
        _ if c.cover_open => Err(("EPTR_COVER_OPEN", flags)),
        _ if c.paper_out => Err(("EPTR_REC_EMPTY", flags)),
        _ if !c.can_print() => Err(("EPTR_MECHANICAL", flags | ASB_MECHANICAL_ERR | ASB_OFF_LINE)),
        JobBody::Commands(bytes) => Ok(bytes),
    }
}

/// The result of one job, one `ePOSPrint` of the SetResponse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobResult {
    /// The job's `devid`.
    pub devid: String,
    /// The job's `printjobid` (empty: none).
    pub printjobid: String,
    /// Printed.
    pub success: bool,
    /// Empty when printed, else the ePOS-Print error code.
    pub code: String,
    /// ASB flags.
    pub status: u32,
}

/// The SetResponse's `PrintResponseInfo` for `results`, in order.
pub fn response_xml(results: &[JobResult]) -> String {
    let mut xml = String::from(r#"<?xml version="1.0" encoding="utf-8"?><PrintResponseInfo Version="2.00">"#);
    for r in results {
        xml += &format!("<ePOSPrint><Parameter><devid>{}</devid>", xml_escape(&r.devid));
        if !r.printjobid.is_empty() {
            xml += &format!("<printjobid>{}</printjobid>", xml_escape(&r.printjobid));
        }
        xml += &format!(
            r#"</Parameter><PrintResponse><response xmlns="{EPOS_PRINT_NS}" success="{}" code="{}" status="{}" battery="0"/></PrintResponse></ePOSPrint>"#,
            r.success,
            xml_escape(&r.code),
            r.status
        );
    }
    xml + "</PrintResponseInfo>"
}

/// The SetStatus's `statusmonitor` for ASB `flags` (`asbstatus="0x00080008"`).
pub fn status_xml(flags: u32) -> String {
    format!(
        r#"<?xml version="1.0" encoding="utf-8"?><statusmonitor Version="1.00"><printerstatus devicename="{LOCAL_PRINTER}" asbstatus="0x{flags:08X}"/></statusmonitor>"#
    )
}

/// A Digest challenge (`WWW-Authenticate: Digest …`, RFC 7616 §3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// `realm`.
    pub realm: String,
    /// `nonce`.
    pub nonce: String,
    /// `opaque`, echoed back when present.
    pub opaque: Option<String>,
    /// `stale=true`: the nonce expired, the credentials were right.
    pub stale: bool,
}

/// The `auth-param`s of a challenge, names lower case, quoted values unquoted.
fn auth_params(mut s: &str) -> Vec<(String, String)> {
    let mut params = Vec::new();
    loop {
        s = s.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        let Some((name, rest)) = s.split_once('=') else { return params };
        let rest = rest.trim_start();
        let value;
        if let Some(quoted) = rest.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, ch)) = chars.next() {
                match ch {
                    '\\' => v.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    _ => v.push(ch),
                }
            }
            value = v;
            s = &quoted[end..];
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            value = rest[..end].trim().to_string();
            s = &rest[end..];
        }
        params.push((name.trim().to_ascii_lowercase(), value));
    }
}

/// The Digest challenge in a `WWW-Authenticate` value, if it is one this printer can
/// answer: `realm` and `nonce` given, `algorithm` MD5 (or absent), `qop` offering `auth`.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim_start();
    let (scheme, rest) = header.split_once(char::is_whitespace)?;
    if !scheme.eq_ignore_ascii_case("Digest") {
        return None;
    }
    let params = auth_params(rest);
    let get = |name: &str| params.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    if get("algorithm").is_some_and(|a| !a.eq_ignore_ascii_case("MD5")) {
        tracing::warn!(header, "only algorithm=MD5 is simulated");
        return None;
    }
    if !get("qop").is_some_and(|q| q.split(',').any(|q| q.trim().eq_ignore_ascii_case("auth"))) {
        tracing::warn!(header, "only qop=auth is simulated");
        return None;
    }
    Some(Challenge {
        realm: get("realm")?,
        nonce: get("nonce")?,
        opaque: get("opaque"),
        stale: get("stale").is_some_and(|s| s.eq_ignore_ascii_case("true")),
    })
}

/// Lower-case hex MD5 of `s`.
pub fn md5_hex(s: &str) -> String {
    hex::encode(Md5::digest(s.as_bytes()))
}

/// The Digest `response` for `qop=auth`, MD5 (RFC 7616 §3.4.1): MD5(HA1:nonce:nc:cnonce:
/// auth:HA2), HA1 = MD5(user:realm:password), HA2 = MD5(method:uri).
#[allow(clippy::too_many_arguments)]
pub fn digest_response(
    user: &str,
    realm: &str,
    password: &str,
    method: &str,
    uri: &str,
    nonce: &str,
    nc: &str,
    cnonce: &str,
) -> String {
    let ha1 = md5_hex(&format!("{user}:{realm}:{password}"));
    let ha2 = md5_hex(&format!("{method}:{uri}"));
    md5_hex(&format!("{ha1}:{nonce}:{nc}:{cnonce}:auth:{ha2}"))
}

/// `s` as a quoted-string's content (`\` and `"` escaped).
fn quote(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A fresh client nonce: 128 random bits, lower-case hex.
fn cnonce() -> String {
    let mut bytes = [0u8; 16];
    if rustls::crypto::ring::default_provider().secure_random.fill(&mut bytes).is_err() {
        // Not expected; a cnonce only needs to differ between requests.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        bytes = nanos.as_nanos().to_le_bytes();
    }
    hex::encode(bytes)
}

/// The printer's Digest client: its credentials, the challenge it answers and the count
/// of requests sent with its nonce.
#[derive(Debug, Clone)]
pub struct DigestAuth {
    credentials: BasicAuth,
    challenge: Option<Challenge>,
    nc: u32,
}

impl DigestAuth {
    /// A client with `credentials`, not challenged yet (its first request goes without).
    pub fn new(credentials: BasicAuth) -> DigestAuth {
        DigestAuth { credentials, challenge: None, nc: 0 }
    }

    /// Takes a server's challenge; a new nonce starts counting again at 1.
    pub fn challenged(&mut self, challenge: Challenge) {
        if self.challenge.as_ref().is_none_or(|c| c.nonce != challenge.nonce) {
            self.nc = 0;
        }
        self.challenge = Some(challenge);
    }

    /// The `Authorization` value of the next request (`method` to `uri`, client nonce
    /// `cnonce`), counting it; none before a challenge.
    pub fn authorization(&mut self, method: &str, uri: &str, cnonce: &str) -> Option<String> {
        let ch = self.challenge.as_ref()?;
        self.nc += 1;
        let nc = format!("{:08x}", self.nc);
        let BasicAuth { user, password } = &self.credentials;
        let response = digest_response(user, &ch.realm, password, method, uri, &ch.nonce, &nc, cnonce);
        let mut header = format!(
            r#"Digest username="{}", realm="{}", nonce="{}", uri="{}", algorithm=MD5, qop=auth, nc={nc}, cnonce="{}", response="{response}""#,
            quote(user),
            quote(&ch.realm),
            quote(&ch.nonce),
            quote(uri),
            quote(cnonce)
        );
        if let Some(opaque) = &ch.opaque {
            header += &format!(r#", opaque="{}""#, quote(opaque));
        }
        Some(header)
    }
}

/// How the simulated Server Direct Print printer is set up.
#[derive(Debug, Clone)]
pub struct SdpOptions {
    /// The Server Direct Print URL (`http` or, with `ca`, `https`).
    pub url: Url,
    /// The printer's "ID" setting (`ID=`).
    pub id: String,
    /// The Digest user name and password.
    pub credentials: BasicAuth,
    /// The CA certificate(s) (PEM) https servers are verified against, the only roots.
    pub ca: Option<PathBuf>,
    /// The "Interval": time between GetRequests.
    pub poll: Duration,
    /// Paper width, mm: 58 or 80.
    pub paper_mm: u8,
    /// Where PNGs, `.bin`s and `jobs.jsonl` go; the state file is `{out}/state`.
    pub out: PathBuf,
    /// The first this many SetResponses of printed jobs are not sent.
    pub skip_confirm: u64,
    /// "Status Notification": SetStatus this often (and on a change); none: off.
    pub status_every: Option<Duration>,
}

/// The simulated printer.
pub struct SdpPrinter {
    opts: SdpOptions,
    http: reqwest::Client,
    digest: DigestAuth,
    settings: PrinterSettings,
    condition: PrinterCondition,
    /// Jobs printed (the file counter).
    seq: u64,
    /// SetResponses reporting a printed job so far (for `skip_confirm`).
    printed_responses: u64,
    /// The status of the last refused request, until one is accepted.
    refused: Option<u16>,
    /// `polling URL` was reported.
    announced: bool,
    /// The ResponseFile of a SetResponse not sent yet.
    pending: Option<String>,
    /// When the last SetStatus was sent, and for which condition.
    status_sent: Option<(Instant, PrinterCondition)>,
}

impl SdpPrinter {
    /// A printer with `opts`, nothing printed yet.
    ///
    /// # Errors
    /// Paper other than 58 or 80 mm, an `https` URL without a CA, an unreadable CA file,
    /// or a client that cannot be built.
    pub fn new(opts: SdpOptions) -> Result<SdpPrinter> {
        anyhow::ensure!(matches!(opts.paper_mm, 58 | 80), "--paper must be 58 or 80, not {}", opts.paper_mm);
        let (_, http) = http_client(&opts.url, opts.ca.as_deref(), USER_AGENT)?;
        Ok(SdpPrinter {
            digest: DigestAuth::new(opts.credentials.clone()),
            settings: PrinterSettings::for_paper(opts.paper_mm, CodePage::Cp437),
            opts,
            http,
            condition: PrinterCondition::default(),
            seq: 0,
            printed_responses: 0,
            refused: None,
            announced: false,
            pending: None,
            status_sent: None,
        })
    }

    /// The condition now, from `{out}/state` (see the module documentation).
    pub fn condition(&mut self) -> PrinterCondition {
        self.condition = read_condition(&self.opts.out.join("state"), self.condition);
        self.condition
    }

    /// Runs until the process ends, reporting [`Event::Polling`] once (at the first
    /// GetRequest answered 200), then [`Event::Printed`] and [`Event::Refused`] as they
    /// happen. A failed request is logged and tried again after the interval.
    pub async fn run(mut self, report: &mut (dyn FnMut(&Event) + Send)) {
        loop {
            let c = self.condition();
            self.notify_status(&c, report).await;
            if !c.offline {
                if let Err(e) = self.cycle(report).await {
                    tracing::warn!(url = %self.opts.url, "{e:#}");
                }
            }
            self.wait(&c, report).await;
        }
    }

    /// Waits for the interval: sends SetStatus as it falls due, and returns at once when a
    /// printer that was off (`offline` in `polled`) is switched on.
    async fn wait(&mut self, polled: &PrinterCondition, report: &mut (dyn FnMut(&Event) + Send)) {
        let deadline = Instant::now() + self.opts.poll;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.min(STATE_TICK)).await;
            let c = self.condition();
            if polled.offline && !c.offline {
                tracing::debug!(condition = ?c, "switched on: polling at once");
                return;
            }
            self.notify_status(&c, report).await;
        }
    }

    /// Sends SetStatus for `c` if status notification is on and one is due (first, a
    /// change, or the status interval passed). Nothing while offline.
    async fn notify_status(&mut self, c: &PrinterCondition, report: &mut (dyn FnMut(&Event) + Send)) {
        let Some(every) = self.opts.status_every else { return };
        if c.offline {
            // Switched off: on again, it notifies as at start.
            self.status_sent = None;
            return;
        }
        let due = match self.status_sent {
            None => true,
            Some((at, sent)) => reported(&sent) != reported(c) || at.elapsed() >= every,
        };
        if !due {
            return;
        }
        self.status_sent = Some((Instant::now(), *c));
        let flags = asb_flags(c);
        match self.send(set_status_form(&self.opts.id, &status_xml(flags)), report).await {
            Ok(Some(resp)) if resp.status().is_success() => {
                tracing::debug!(asbstatus = format_args!("0x{flags:08X}"), "status sent");
            }
            Ok(Some(resp)) => tracing::warn!(status = %resp.status(), "SetStatus not accepted"),
            Ok(None) => {}
            Err(e) => tracing::warn!("SetStatus: {e:#}"),
        }
    }

    /// A result not sent yet, then one GetRequest and its jobs.
    ///
    /// # Errors
    /// A request failed or was not accepted.
    pub async fn cycle(&mut self, report: &mut (dyn FnMut(&Event) + Send)) -> Result<()> {
        self.send_result(report).await?;
        self.poll(report).await
    }

    /// One GetRequest: prints the jobs of the answer and sends their results.
    ///
    /// # Errors
    /// A request failed or was not accepted (the result is then kept for the next cycle).
    pub async fn poll(&mut self, report: &mut (dyn FnMut(&Event) + Send)) -> Result<()> {
        let Some(resp) = self.send(get_request_form(&self.opts.id), report).await? else { return Ok(()) };
        let status = resp.status();
        anyhow::ensure!(status.is_success(), "GetRequest answered {status}");
        if status == StatusCode::OK && !self.announced {
            self.announced = true;
            report(&Event::Polling(self.opts.url.to_string()));
        }
        let body = resp.text().await.context("reading the GetRequest answer")?;
        if body.trim().is_empty() {
            return Ok(());
        }
        let jobs = match parse_request(&body) {
            Ok(jobs) => jobs,
            Err(e) => {
                tracing::warn!("GetRequest answer ignored: {e:#}");
                return Ok(());
            }
        };
        if jobs.is_empty() {
            tracing::warn!("a PrintRequestInfo without ePOSPrint: nothing to do");
            return Ok(());
        }
        let mut results = Vec::with_capacity(jobs.len());
        for job in &jobs {
            let c = self.condition();
            results.push(self.job(job, &c, report));
        }
        if results.iter().any(|r| r.success) {
            self.printed_responses += 1;
            if self.printed_responses <= self.opts.skip_confirm {
                tracing::info!(n = self.printed_responses, "SetResponse skipped (--skip-confirm)");
                return Ok(());
            }
        }
        self.pending = Some(response_xml(&results));
        self.send_result(report).await
    }

    /// Prints one job in condition `c`; its result.
    fn job(&mut self, job: &SdpJob, c: &PrinterCondition, report: &mut (dyn FnMut(&Event) + Send)) -> JobResult {
        tracing::debug!(devid = job.devid, printjobid = job.printjobid, timeout = job.timeout, "job");
        let (success, code, status) = match decide(&job.body, c) {
            Err((code, status)) => {
                tracing::info!(printjobid = job.printjobid, code, body = ?job.body, condition = ?c, "job not printed");
                (false, code, status)
            }
            Ok(bytes) => match self.print(bytes, &job.printjobid, report) {
                Ok(()) => (true, "", ASB_PRINT_SUCCESS | asb_flags(c)),
                Err(e) => {
                    tracing::error!(printjobid = job.printjobid, "{e:#}");
                    (false, "EPTR_MECHANICAL", asb_flags(c) | ASB_MECHANICAL_ERR | ASB_OFF_LINE)
                }
            },
        };
        JobResult {
            devid: job.devid.clone(),
            printjobid: job.printjobid.clone(),
            success,
            code: code.to_string(),
            status,
        }
    }

    /// Draws `bytes` and writes the paper (`{seq:04}-print.png`, its record, the bytes as
    /// `{seq:04}-print.bin`), reporting it.
    ///
    /// # Errors
    /// A file could not be written.
    fn print(&mut self, bytes: &[u8], printjobid: &str, report: &mut (dyn FnMut(&Event) + Send)) -> Result<()> {
        let (decoded, png) = print_bytes(bytes, &self.settings);
        let Some(png) = png else {
            tracing::info!(printjobid, bytes = bytes.len(), "the ESC/POS printed nothing");
            return Ok(());
        };
        let seq = self.seq + 1;
        let token = Some(printjobid).filter(|t| !t.is_empty());
        crate::effect::write_file(&self.opts.out.join(format!("{seq:04}-print.bin")), bytes)?;
        let (width, height) = (decoded.image.width(), decoded.image.height());
        let path = write_job(&self.opts.out, seq, &png, token, width, height)?;
        self.seq = seq;
        report(&Event::Printed { path, token: token.map(str::to_string) });
        Ok(())
    }

    /// Sends the SetResponse not sent yet, if any.
    ///
    /// # Errors
    /// It failed or was not accepted (it is kept).
    async fn send_result(&mut self, report: &mut (dyn FnMut(&Event) + Send)) -> Result<()> {
        let Some(xml) = self.pending.clone() else { return Ok(()) };
        let resp = self.send(set_response_form(&self.opts.id, &xml), report).await.context("SetResponse")?;
        let Some(resp) = resp else { anyhow::bail!("SetResponse refused") };
        anyhow::ensure!(resp.status().is_success(), "SetResponse answered {}", resp.status());
        tracing::info!("result sent");
        self.pending = None;
        Ok(())
    }

    /// POSTs `form` to the URL with Digest authentication: the answer, or none when the
    /// server refused (reported as [`Event::Refused`] when the status changes).
    ///
    /// # Errors
    /// The request failed.
    async fn send(
        &mut self,
        form: String,
        report: &mut (dyn FnMut(&Event) + Send),
    ) -> Result<Option<reqwest::Response>> {
        let url = &self.opts.url;
        let uri = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        };
        let mut challenges = 0;
        loop {
            let mut request = self.http.post(url.clone()).header(CONTENT_TYPE, FORM).body(form.clone());
            let authorization = self.digest.authorization("POST", &uri, &cnonce());
            let with_credentials = authorization.is_some();
            if let Some(a) = authorization {
                request = request.header(AUTHORIZATION, a);
            }
            let resp = request.send().await?;
            let status = resp.status();
            if status == StatusCode::UNAUTHORIZED {
                let challenge = resp
                    .headers()
                    .get_all(WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .find_map(parse_challenge);
                match challenge {
                    Some(ch) => {
                        let again = !with_credentials || ch.stale;
                        self.digest.challenged(ch);
                        challenges += 1;
                        if again && challenges <= 2 {
                            continue;
                        }
                    }
                    None => tracing::warn!("401 without a Digest challenge this printer can answer"),
                }
            } else if status != StatusCode::FORBIDDEN {
                self.refused = None;
                return Ok(Some(resp));
            }
            if self.refused != Some(status.as_u16()) {
                report(&Event::Refused(status.as_u16()));
            }
            self.refused = Some(status.as_u16());
            return Ok(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw_printer::parse_condition;

    fn cond(words: &str) -> PrinterCondition {
        parse_condition(words).unwrap()
    }

    /// RFC 7616 §3.9.1, the MD5 example (response `8ca523f5…eebdbec`, the value other
    /// Digest implementations' tests and MDN's `Authorization` page give for it).
    #[test]
    fn digest_rfc7616_example() {
        let response = digest_response(
            "Mufasa",
            "http-auth@example.org",
            "Circle of Life",
            "GET",
            "/dir/index.html",
            "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v",
            "00000001",
            "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ",
        );
        assert_eq!(response, "8ca523f5e9506fed4657c9700eebdbec");

        let mut auth = DigestAuth::new(BasicAuth { user: "Mufasa".into(), password: "Circle of Life".into() });
        assert_eq!(auth.authorization("GET", "/dir/index.html", "x"), None, "no credentials before a challenge");
        let header = r#"Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm=MD5, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS""#;
        auth.challenged(parse_challenge(header).unwrap());
        let cn = "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ";
        assert_eq!(
            auth.authorization("GET", "/dir/index.html", cn).unwrap(),
            r#"Digest username="Mufasa", realm="http-auth@example.org", nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", uri="/dir/index.html", algorithm=MD5, qop=auth, nc=00000001, cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ", response="8ca523f5e9506fed4657c9700eebdbec", opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS""#
        );
        assert!(auth.authorization("GET", "/dir/index.html", cn).unwrap().contains("nc=00000002"));
        // The same nonce keeps counting; a new one starts again.
        auth.challenged(parse_challenge(header).unwrap());
        assert!(auth.authorization("GET", "/", cn).unwrap().contains("nc=00000003"));
        auth.challenged(parse_challenge(r#"Digest realm="r", nonce="n2", qop="auth", stale=true"#).unwrap());
        let h = auth.authorization("POST", "/sdp", cn).unwrap();
        assert!(h.contains(r#"nonce="n2""#) && h.contains("nc=00000001") && !h.contains("opaque"), "{h}");
        let c1 = cnonce();
        assert_eq!(c1.len(), 32);
        assert_ne!(c1, cnonce());
    }

    #[test]
    fn challenges() {
        let c =
            parse_challenge(r#"Digest realm="pix gate, \"sdp\"", qop="auth", algorithm=MD5, nonce="abc=", stale=TRUE"#)
                .unwrap();
        assert_eq!(
            c,
            Challenge { realm: r#"pix gate, "sdp""#.into(), nonce: "abc=".into(), opaque: None, stale: true }
        );
        let c = parse_challenge(r#"digest nonce="n",realm="r",qop=auth"#).unwrap();
        assert_eq!((c.realm.as_str(), c.nonce.as_str(), c.stale), ("r", "n", false));
        assert_eq!(parse_challenge(r#"Basic realm="r""#), None);
        assert_eq!(parse_challenge(r#"Digest realm="r", nonce="n", qop="auth", algorithm=SHA-256"#), None);
        assert_eq!(parse_challenge(r#"Digest realm="r", nonce="n", qop="auth-int""#), None);
        assert_eq!(parse_challenge(r#"Digest realm="r", nonce="n""#), None, "no qop");
        assert_eq!(parse_challenge(r#"Digest realm="r", qop="auth""#), None, "no nonce");
    }

    #[test]
    fn forms_and_xml() {
        assert_eq!(get_request_form("TM T88VI/1"), "ConnectionType=GetRequest&ID=TM%20T88VI%2F1");
        assert_eq!(
            set_response_form("p1", "<a b=\"c\"/>"),
            "ConnectionType=SetResponse&ID=p1&ResponseFile=%3Ca%20b%3D%22c%22%2F%3E"
        );
        assert_eq!(set_status_form("p1", "<x/>"), "ConnectionType=SetStatus&ID=p1&Status=%3Cx%2F%3E");
        let results = [
            JobResult {
                devid: LOCAL_PRINTER.into(),
                printjobid: "ABC123".into(),
                success: true,
                code: String::new(),
                status: 2,
            },
            JobResult {
                devid: LOCAL_PRINTER.into(),
                printjobid: "a&b".into(),
                success: false,
                code: "EPTR_REC_EMPTY".into(),
                status: 0x80008,
            },
        ];
        assert_eq!(
            response_xml(&results[..1]),
            r#"<?xml version="1.0" encoding="utf-8"?><PrintResponseInfo Version="2.00"><ePOSPrint><Parameter><devid>local_printer</devid><printjobid>ABC123</printjobid></Parameter><PrintResponse><response xmlns="http://www.epson-pos.com/schemas/2011/03/epos-print" success="true" code="" status="2" battery="0"/></PrintResponse></ePOSPrint></PrintResponseInfo>"#
        );
        let xml = response_xml(&results);
        let doc = roxmltree::Document::parse(&xml).unwrap();
        let responses: Vec<_> = doc.descendants().filter(|n| n.has_tag_name((EPOS_PRINT_NS, "response"))).collect();
        assert_eq!(responses.len(), 2);
        assert_eq!(responses[1].attribute("code"), Some("EPTR_REC_EMPTY"));
        assert_eq!(responses[1].attribute("status"), Some("524296"));
        assert!(xml.contains("<printjobid>a&amp;b</printjobid>"));
        assert_eq!(
            status_xml(asb_flags(&cond("paper-out"))),
            r#"<?xml version="1.0" encoding="utf-8"?><statusmonitor Version="1.00"><printerstatus devicename="local_printer" asbstatus="0x00080008"/></statusmonitor>"#
        );
        assert!(status_xml(asb_flags(&cond("ready"))).contains(r#"asbstatus="0x00000000""#));
    }

    #[test]
    fn print_request_with_two_jobs() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?>
<PrintRequestInfo Version="2.00">
  <ePOSPrint>
    <Parameter><devid>local_printer</devid><timeout>10000</timeout><printjobid>ABC123</printjobid></Parameter>
    <PrintData><epos-print xmlns="http://www.epson-pos.com/schemas/2011/03/epos-print">
      <command>1b40</command><command>48690A</command>
      <command>1d564100</command>
    </epos-print></PrintData>
  </ePOSPrint>
  <ePOSPrint>
    <Parameter><devid>local_printer</devid><timeout>5000</timeout><printjobid>DEF</printjobid></Parameter>
    <PrintData><epos-print xmlns="http://www.epson-pos.com/schemas/2011/03/epos-print">
      <text>Hi&#10;</text><cut type="feed"/>
    </epos-print></PrintData>
  </ePOSPrint>
</PrintRequestInfo>"#;
        let jobs = parse_request(xml).unwrap();
        assert_eq!(
            jobs,
            [
                SdpJob {
                    devid: "local_printer".into(),
                    timeout: Some(10000),
                    printjobid: "ABC123".into(),
                    body: JobBody::Commands(b"\x1b@Hi\n\x1dVA\x00".to_vec()),
                },
                SdpJob {
                    devid: "local_printer".into(),
                    timeout: Some(5000),
                    printjobid: "DEF".into(),
                    body: JobBody::Unsupported("<text> is not simulated".into()),
                },
            ]
        );
        assert!(parse_request("<PrintRequestInfo><ePOSPrint>").is_err());
        assert!(parse_request("<PrintResponseInfo/>").is_err());
        let bad_hex = parse_request(
            "<PrintRequestInfo><ePOSPrint><PrintData><epos-print><command>1b4</command></epos-print></PrintData></ePOSPrint></PrintRequestInfo>",
        )
        .unwrap();
        assert!(matches!(bad_hex[0].body, JobBody::Unsupported(_)));
        assert_eq!(bad_hex[0].printjobid, "");
    }

    #[test]
    fn decisions() {
        let commands = JobBody::Commands(vec![0x1b, 0x40]);
        let schema = JobBody::Unsupported("<text>".into());
        assert_eq!(decide(&commands, &cond("ready")), Ok(&[0x1b, 0x40][..]));
        assert_eq!(decide(&commands, &cond("paper-near-end")), Ok(&[0x1b, 0x40][..]));
        assert_eq!(ASB_PRINT_SUCCESS | asb_flags(&cond("paper-near-end")), 0x20002);
        assert_eq!(decide(&commands, &cond("paper-out")), Err(("EPTR_REC_EMPTY", 0x80008)));
        assert_eq!(decide(&commands, &cond("cover-open")), Err(("EPTR_COVER_OPEN", 0x28)));
        assert_eq!(decide(&commands, &cond("cover-open paper-out")), Err(("EPTR_COVER_OPEN", 0x80028)));
        assert_eq!(decide(&commands, &cond("offline")), Err(("EPTR_MECHANICAL", 0x408)));
        assert_eq!(decide(&schema, &cond("ready")), Err(("SchemaError", 0)));
        assert_eq!(decide(&schema, &cond("paper-out")), Err(("SchemaError", 0x80008)));
        assert_eq!(ASB_AUTOCUTTER_ERR, 0x800);
    }
}
