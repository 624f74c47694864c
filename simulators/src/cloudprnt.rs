//! A simulated Star CloudPRNT printer, HTTP method: the printer fetches its own jobs by
//! polling a server, as a Star mC-Print3 or TSP100IV set to a CloudPRNT URL does. Written
//! from Star's documents (Star CloudPRNT guide v2.4.0, "protocol-reference"; Star CloudPRNT
//! Developer Guide Rev 1.4; Star Line Mode Command Specifications, ASB). `printer-sim
//! cloudprnt` first asks the server which method it wants ([`crate::cloudprnt_mqtt`]) and
//! runs this one ([`CloudPrinter::run`]) when the answer is HTTP.
//!
//! One cycle (guide: *Server Polling (POST)*, *Job Request (GET)*, *Job Confirmation
//! (DELETE)*; Rev 1.4: "All CloudPRNT communication is handled via a single URL"):
//!
//! 1. `POST URL`, JSON [`PollRequest`]: the condition as a `statusCode` ([`status_code`])
//!    and ASB bytes ([`asb_status`]). HTTP Basic authentication when a user is set (guide:
//!    *Client settings*).
//! 2. The JSON answer ([`PollAnswer`]). With `jobReady` and a condition that can print,
//!    `GET` the job as `image/png` from `jobGetUrl` or URL with
//!    `?type=image%2Fpng&mac=…&token=…` (guide: *Job Request (GET)*; "While the printer
//!    is offline it does not GET", *JSON Response*).
//! 3. Print it: the PNG as received goes to `{out}/{seq:04}-print.png` and a line to
//!    `{out}/jobs.jsonl` ([`JobRecord`]).
//! 4. `DELETE` to `jobConfirmationUrl` or URL with `?mac=…&code=OK&token=…` (guide and Rev
//!    1.4: code `OK` on success). A job it cannot take is confirmed with a 5xx code
//!    (guide: *Printer Status Codes*): 510 no `image/png` offered or another type served,
//!    511 a PNG that does not decode, 520 a download that failed (guide: *Job Request
//!    (GET) response*: "520 (or 521)" on a non-200 answer).
//!
//! The poll repeats every poll interval (default 5 s on mC-Print3 and TSP100IV, guide:
//! *Client settings*), at once after a job, and at once when the condition changes (guide:
//! *Polling time*). The condition comes from a state file with [`crate::raw_printer`]'s
//! words, read before each poll and watched between polls: `offline` is a printer switched
//! off (no requests at all); `paper-out` and `cover-open` poll with a 4xx code and fetch
//! nothing; `paper-near-end` prints.
//!
//! Choices of this simulator where Star's documents say nothing (or nothing was found):
//! the printer keeps the tokens of its last [`REMEMBERED_TOKENS`] printed jobs and does not
//! print a token twice, confirming it `OK` again (Star's guide says this of the MQTT
//! `print-job`; for HTTP it is not stated); the poll is sent as `application/json`;
//! redirects are not followed; no proxy is used; `clientAction` requests and
//! `deleteMethod: "GET"` are not simulated (logged; confirmations stay `DELETE`).

use crate::raw_printer::parse_condition;
use anyhow::{Context, Result};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use preview::escpos::status::PrinterCondition;
use reqwest::{Method, StatusCode, Url};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The media type this printer asks for: PNG, "printed pixel for pixel, without scaling"
/// (Rev 1.4, *Media types*).
pub const MEDIA_TYPE: &str = "image/png";

/// How many printed job tokens the printer remembers for [duplicate](Event::Duplicate)
/// detection (the number Star gives for the MQTT `print-job`).
pub const REMEMBERED_TOKENS: usize = 10;

/// How often the state file is read between polls, to poll at once on a change.
pub const STATE_TICK: Duration = Duration::from_millis(100);

/// How long one request may take before it counts as failed (the simulator's choice).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `User-Agent` of every request, in the shape Star printers send (`CloudPRNT/5.1
/// TSP100IV/2.2` was seen, github star-micronics/cloudprnt-sdk issue 11).
pub const USER_AGENT: &str = concat!("CloudPRNT/5.1 printer-sim/", env!("CARGO_PKG_VERSION"));

/// RFC 3986 unreserved characters stay as they are; everything else is `%XX` (a space is
/// `%20`, as in the guide's `"statusCode": "200%20OK"`).
const ENCODE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// `s` percent-encoded for a CloudPRNT query value or `statusCode` (`200 OK` →
/// `200%20OK`, `00:11:62:0a:1b:2c` → `00%3A11%3A62%3A0a%3A1b%3A2c`).
pub fn url_encode(s: &str) -> String {
    utf8_percent_encode(s, ENCODE).to_string()
}

/// The printer status code for `c`, not yet URL-encoded (guide: *Printer Status Codes*:
/// 200 OK, 211 paper low, 410 out of paper, 420 cover open). The worst condition wins:
/// cover open, then paper out, then near end.
pub fn status_code(c: &PrinterCondition) -> &'static str {
    if c.cover_open {
        "420 Cover Open"
    } else if c.paper_out {
        "410 Out of Paper"
    } else if c.paper_near_end {
        "211 Paper Low"
    } else {
        "200 OK"
    }
}

/// The Automatic Status Back bytes for `c` (Star Line Mode Command Specifications, ASB):
/// 9 bytes, header 1 `0x23`, header 2 `0x86`; byte 3 bit 5 (`0x20`) cover open and bit 3
/// (`0x08`) offline (cover open or paper out); byte 6 bit 3 (`0x08`) paper end and bit 2
/// (`0x04`) paper near end (inner sensor). Every other bit is 0: no drawer, cutter,
/// mechanical, temperature or presenter condition is simulated.
pub fn asb_bytes(c: &PrinterCondition) -> [u8; 9] {
    let bit = |on: bool, mask: u8| if on { mask } else { 0 };
    let mut b = [0x23, 0x86, 0, 0, 0, 0, 0, 0, 0];
    b[2] = bit(c.cover_open, 0x20) | bit(c.cover_open || c.paper_out, 0x08);
    b[5] = bit(c.paper_out, 0x08) | bit(c.paper_near_end, 0x04);
    b
}

/// [`asb_bytes`] as the poll's `status` text: two-digit lower-case hex separated by single
/// spaces (`"23 86 00 00 00 00 00 00 00"`, the form cputil's readme shows).
pub fn asb_status(c: &PrinterCondition) -> String {
    asb_bytes(c).iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

/// The JSON body of a poll (guide: *Server Polling (POST) JSON Request*; every field but
/// `statusCode` is optional there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollRequest {
    /// [`status_code`], URL-encoded (`200%20OK`).
    pub status_code: String,
    /// [`asb_status`].
    pub status: String,
    /// The printer's MAC address as configured (e.g. `00:11:62:0a:1b:2c`).
    #[serde(rename = "printerMAC")]
    pub printer_mac: String,
    /// Always false: this printer prints between one poll and the next.
    pub printing_in_progress: bool,
}

impl PollRequest {
    /// The poll of printer `mac` in condition `c`.
    pub fn new(c: &PrinterCondition, mac: &str) -> PollRequest {
        PollRequest {
            status_code: url_encode(status_code(c)),
            status: asb_status(c),
            printer_mac: mac.to_string(),
            printing_in_progress: false,
        }
    }
}

/// The fields of a poll answer this printer reads (guide: *Server Polling (POST) JSON
/// Response*). Missing and `null` fields read as absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollAnswer {
    /// A job is waiting.
    #[serde(default)]
    pub job_ready: Option<bool>,
    /// The media types the server can produce the job in.
    #[serde(default)]
    pub media_types: Option<Vec<String>>,
    /// Echoed as `token=` on the job GET and the confirmation.
    #[serde(default)]
    pub job_token: Option<String>,
    /// Where to GET the job instead of the poll URL (absolute, or relative to it).
    #[serde(default)]
    pub job_get_url: Option<String>,
    /// Where to confirm the job instead of the poll URL (absolute, or relative to it).
    #[serde(default)]
    pub job_confirmation_url: Option<String>,
    /// `DELETE` (default) or `GET`; only `DELETE` is simulated.
    #[serde(default)]
    pub delete_method: Option<String>,
    /// Requests to the printer; not simulated.
    #[serde(default)]
    pub client_action: Option<serde_json::Value>,
}

/// One line of `{out}/jobs.jsonl`: a printed job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The PNG's file name in the output folder (`0001-print.png`).
    pub file: String,
    /// The job token the server gave, if any.
    pub token: Option<String>,
    /// Image width, pixels (= dots: printed unscaled).
    pub width: u32,
    /// Image height, pixels.
    pub height: u32,
}

/// What the printer reports as it goes (one stdout line each in `printer-sim cloudprnt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Started; polls this URL.
    Polling(String),
    /// A poll was answered 401 or 403 (reported again only when the status changes).
    Refused(u16),
    /// A job with a token it had already printed: not printed, confirmed `OK` again.
    Duplicate(String),
    /// A job was printed to this PNG.
    Printed {
        /// `{out}/{seq:04}-print.png`.
        path: PathBuf,
        /// The job token, if any.
        token: Option<String>,
    },
}

impl std::fmt::Display for Event {
    /// `polling URL`, `refused STATUS`, `duplicate TOKEN`, `printed PATH token=TOKEN`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Polling(url) => write!(f, "polling {url}"),
            Event::Refused(status) => write!(f, "refused {status}"),
            Event::Duplicate(token) => write!(f, "duplicate {token}"),
            Event::Printed { path, token } => {
                write!(f, "printed {} token={}", path.display(), token.as_deref().unwrap_or(""))
            }
        }
    }
}

/// HTTP Basic credentials (the printer's "User Name" and "Password" settings).
#[derive(Clone)]
pub struct BasicAuth {
    /// User name.
    pub user: String,
    /// Password.
    pub password: String,
}

impl std::fmt::Debug for BasicAuth {
    /// Never prints the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicAuth").field("user", &self.user).finish_non_exhaustive()
    }
}

/// How the simulated CloudPRNT printer is set up.
#[derive(Debug, Clone)]
pub struct CloudPrntOptions {
    /// The CloudPRNT server URL (`http` or, with `ca`, `https`).
    pub url: Url,
    /// The MAC address it reports (`printerMAC`, `mac=`).
    pub mac: String,
    /// Where PNGs and `jobs.jsonl` go.
    pub out: PathBuf,
    /// HTTP Basic credentials, if any.
    pub auth: Option<BasicAuth>,
    /// The CA certificate(s) (PEM) https servers are verified against, the only roots.
    pub ca: Option<PathBuf>,
    /// Time between polls.
    pub poll: Duration,
    /// The condition file (see the module documentation); none: always ready.
    pub state_file: Option<PathBuf>,
    /// The first this many printed jobs are not confirmed (a lost confirmation).
    pub skip_confirm: u64,
    /// Paper width, mm (58, 80 or 112): a wider PNG than the head is warned about.
    pub paper_mm: u8,
    /// How long after printing a job it confirms it (HTTP method): a real printer
    /// confirms once the page is out, a second or more after it fetched the job.
    pub confirm_delay: Duration,
}

/// Print head width in dots for `paper_mm` paper: 832 on 112 mm and 576 on 80 mm (Rev 1.4,
/// *Media types*: "576 pixels wide on 80mm printer models, 832 pixels on 112mm"), 384 on
/// 58 mm (48 mm printable at 8 dots/mm).
pub fn head_dots(paper_mm: u8) -> u32 {
    match paper_mm {
        100.. => 832,
        70..=99 => 576,
        _ => 384,
    }
}

/// The simulated printer.
pub struct CloudPrinter {
    pub(crate) opts: CloudPrntOptions,
    /// The roots https servers (and, in [`crate::cloudprnt_mqtt`], a TLS broker) are
    /// verified against: `ca`'s certificates, or none.
    pub(crate) roots: Arc<rustls::RootCertStore>,
    http: reqwest::Client,
    condition: PrinterCondition,
    /// Tokens of the last [`REMEMBERED_TOKENS`] printed jobs, oldest first.
    tokens: VecDeque<String>,
    /// Jobs printed (the file counter).
    seq: u64,
    /// The status of the last refused poll, until a poll is accepted.
    refused: Option<StatusCode>,
}

/// What a job ended with (the confirmation's `code`, or none).
enum Outcome {
    /// Confirm with this status code.
    Confirm(&'static str),
    /// Printed but the confirmation is skipped (`skip_confirm`).
    Unconfirmed,
}

impl CloudPrinter {
    /// A printer with `opts`, nothing printed yet.
    ///
    /// # Errors
    /// An `https` URL without a CA, an unreadable CA file, or a client that cannot be built.
    pub fn new(opts: CloudPrntOptions) -> Result<CloudPrinter> {
        let (roots, http) = http_client(&opts.url, opts.ca.as_deref(), USER_AGENT)?;
        Ok(CloudPrinter {
            opts,
            roots,
            http,
            condition: PrinterCondition::default(),
            tokens: VecDeque::new(),
            seq: 0,
            refused: None,
        })
    }

    /// The condition now: the state file's (missing: ready; unreadable or a bad word: the
    /// last one, with a warning), or ready without a state file.
    pub fn condition(&mut self) -> PrinterCondition {
        let Some(path) = &self.opts.state_file else { return self.condition };
        self.condition = read_condition(path, self.condition);
        self.condition
    }

    /// Polls until the process ends: reports [`Event::Polling`] once, then every event as
    /// it happens. A failed request is logged and the next poll comes after the interval.
    pub async fn run(mut self, report: &mut (dyn FnMut(&Event) + Send)) {
        report(&Event::Polling(self.opts.url.to_string()));
        loop {
            let c = self.condition();
            let mut at_once = false;
            if !c.offline {
                match self.poll(&c, report).await {
                    Ok(job) => at_once = job,
                    Err(e) => tracing::warn!(url = %self.opts.url, "poll: {e:#}"),
                }
            }
            if !at_once {
                self.wait(&c).await;
            }
        }
    }

    /// Waits for the poll interval, or less if the condition changes from `polled`.
    pub(crate) async fn wait(&mut self, polled: &PrinterCondition) {
        let deadline = Instant::now() + self.opts.poll;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.min(STATE_TICK)).await;
            if reported(&self.condition()) != reported(polled) {
                tracing::debug!(condition = ?self.condition, "condition changed: polling at once");
                return;
            }
        }
    }

    /// One poll in condition `c`, and the job it offers. Returns whether a job was handled
    /// (then the next poll is at once).
    ///
    /// # Errors
    /// A request failed, the poll answer was not JSON, or a printed job could not be
    /// written to disk (it is then not confirmed).
    pub async fn poll(&mut self, c: &PrinterCondition, report: &mut (dyn FnMut(&Event) + Send)) -> Result<bool> {
        let body = PollRequest::new(c, &self.opts.mac);
        let resp = self.request(Method::POST, self.opts.url.clone()).json(&body).send().await?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            if self.refused != Some(status) {
                report(&Event::Refused(status.as_u16()));
            }
            self.refused = Some(status);
            return Ok(false);
        }
        self.refused = None;
        anyhow::ensure!(status.is_success(), "poll answered {status}");
        let answer: PollAnswer = resp.json().await.context("poll answer is not CloudPRNT JSON")?;
        if answer.client_action.as_ref().is_some_and(|a| !a.is_null()) {
            tracing::info!(client_action = ?answer.client_action, "clientAction is not simulated; ignored");
        }
        if answer.job_ready != Some(true) {
            return Ok(false);
        }
        if !c.can_print() {
            tracing::info!(condition = ?c, "a job is ready but the printer cannot print: not fetched");
            return Ok(false);
        }
        let token = answer.job_token.clone().filter(|t| !t.is_empty());
        let outcome = self.job(&answer, token.as_deref(), report).await?;
        if let Outcome::Confirm(code) = outcome {
            self.confirm(&answer, code, token.as_deref()).await?;
        }
        Ok(true)
    }

    /// Fetches and prints the job `answer` offers; says how to confirm it.
    async fn job(
        &mut self,
        answer: &PollAnswer,
        token: Option<&str>,
        report: &mut (dyn FnMut(&Event) + Send),
    ) -> Result<Outcome> {
        if let Some(t) = token.filter(|t| self.knows(t)) {
            report(&Event::Duplicate(t.to_string()));
            return Ok(Outcome::Confirm("OK"));
        }
        if !answer.media_types.iter().flatten().any(|m| m.eq_ignore_ascii_case(MEDIA_TYPE)) {
            tracing::warn!(media_types = ?answer.media_types, "no {MEDIA_TYPE} offered");
            return Ok(Outcome::Confirm("510 Incompatible Media Type"));
        }
        let mut query = format!("type={}&mac={}", url_encode(MEDIA_TYPE), url_encode(&self.opts.mac));
        if let Some(t) = token {
            query += &format!("&token={}", url_encode(t));
        }
        let url = self.target(answer.job_get_url.as_deref(), &query)?;
        let png = match self.download(url).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(code)) => return Ok(Outcome::Confirm(code)),
            Err(e) => {
                tracing::warn!("job GET: {e:#}");
                return Ok(Outcome::Confirm("520 Job Download Error"));
            }
        };
        let (width, height) = match self.png_size(&png) {
            Ok(size) => size,
            Err(code) => return Ok(Outcome::Confirm(code)),
        };
        self.print(&png, token, width, height, report)?;
        if self.confirmation_skipped() {
            tracing::info!(seq = self.seq, "confirmation skipped (--skip-confirm)");
            return Ok(Outcome::Unconfirmed);
        }
        tokio::time::sleep(self.opts.confirm_delay).await;
        Ok(Outcome::Confirm("OK"))
    }

    /// Whether `token` is among the last [`REMEMBERED_TOKENS`] printed.
    pub(crate) fn knows(&self, token: &str) -> bool {
        self.tokens.iter().any(|known| known == token)
    }

    /// The size of the PNG `png`, or the status code of one that does not decode (511).
    /// Warns about an image wider than the print head.
    pub(crate) fn png_size(&self, png: &[u8]) -> Result<(u32, u32), &'static str> {
        let (width, height) = match image::load_from_memory_with_format(png, image::ImageFormat::Png) {
            Ok(img) => (img.width(), img.height()),
            Err(e) => {
                tracing::warn!(bytes = png.len(), "the job is not a PNG: {e}");
                return Err("511 Media Decoding Error");
            }
        };
        let dots = head_dots(self.opts.paper_mm);
        if width > dots {
            tracing::warn!(width, dots, "the PNG is wider than the print head: a real printer loses the excess");
        }
        Ok((width, height))
    }

    /// Prints the decoded PNG `png` ([`CloudPrinter::write`]), reports it and remembers
    /// its token.
    ///
    /// # Errors
    /// The PNG or its record could not be written.
    pub(crate) fn print(
        &mut self,
        png: &[u8],
        token: Option<&str>,
        width: u32,
        height: u32,
        report: &mut (dyn FnMut(&Event) + Send),
    ) -> Result<PathBuf> {
        let path = self.write(png, token, width, height)?;
        report(&Event::Printed { path: path.clone(), token: token.map(str::to_string) });
        if let Some(t) = token {
            self.tokens.push_back(t.to_string());
            if self.tokens.len() > REMEMBERED_TOKENS {
                self.tokens.pop_front();
            }
        }
        Ok(path)
    }

    /// Whether the job just printed is one of the first `skip_confirm` (its confirmation
    /// or result is then lost).
    pub(crate) fn confirmation_skipped(&self) -> bool {
        self.seq <= self.opts.skip_confirm
    }

    /// GETs the job at `url`: its bytes, or the confirmation code for an answer that is not
    /// a PNG (520 not 200, 510 another media type).
    ///
    /// # Errors
    /// The request or reading the body failed.
    pub(crate) async fn download(&self, url: Url) -> Result<Result<Vec<u8>, &'static str>> {
        let resp = self.request(Method::GET, url).send().await?;
        if resp.status() != StatusCode::OK {
            tracing::warn!(status = %resp.status(), "job GET not answered 200");
            return Ok(Err("520 Job Download Error"));
        }
        let content_type =
            resp.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let essence = content_type.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case(MEDIA_TYPE) {
            tracing::warn!(content_type, "job GET answered another media type than {MEDIA_TYPE}");
            return Ok(Err("510 Incompatible Media Type"));
        }
        Ok(Ok(resp.bytes().await?.to_vec()))
    }

    /// Confirms the job `answer` offered with `code` (`OK` or a status code).
    ///
    /// # Errors
    /// The request failed (a non-2xx answer is only logged).
    async fn confirm(&self, answer: &PollAnswer, code: &str, token: Option<&str>) -> Result<()> {
        if answer.delete_method.as_deref().is_some_and(|m| !m.eq_ignore_ascii_case("DELETE")) {
            tracing::warn!(delete_method = ?answer.delete_method, "only DELETE confirmations are simulated");
        }
        let mut query = format!("mac={}&code={}", url_encode(&self.opts.mac), url_encode(code));
        if let Some(t) = token {
            query += &format!("&token={}", url_encode(t));
        }
        let url = self.target(answer.job_confirmation_url.as_deref(), &query)?;
        let resp = self.request(Method::DELETE, url).send().await?;
        if resp.status().is_success() {
            tracing::info!(code, token, "confirmed");
        } else {
            tracing::warn!(code, token, status = %resp.status(), "confirmation not accepted");
        }
        Ok(())
    }

    /// `alternative` (resolved against the poll URL) or the poll URL, with `query` after
    /// any query it already has (Rev 1.4 suggests a query on the URL for the server's use).
    ///
    /// # Errors
    /// `alternative` is not a URL.
    fn target(&self, alternative: Option<&str>, query: &str) -> Result<Url> {
        let url = match alternative.filter(|u| !u.is_empty()) {
            Some(u) => self.opts.url.join(u).with_context(|| format!("{u:?} is not a URL"))?,
            None => self.opts.url.clone(),
        };
        Ok(append_query(url, query))
    }

    /// A request with the printer's credentials.
    pub(crate) fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        let r = self.http.request(method, url);
        match &self.opts.auth {
            Some(a) => r.basic_auth(&a.user, Some(&a.password)),
            None => r,
        }
    }

    /// Writes a printed job: `{out}/{seq:04}-print.png` and its [`JobRecord`] line.
    fn write(&mut self, png: &[u8], token: Option<&str>, width: u32, height: u32) -> Result<PathBuf> {
        let path = write_job(&self.opts.out, self.seq + 1, png, token, width, height)?;
        self.seq += 1;
        Ok(path)
    }
}

/// The roots https servers are verified against (`ca`'s certificates, or none for an `http`
/// URL) and an HTTP client trusting only them: ring-based rustls, `user_agent`, the
/// [`REQUEST_TIMEOUT`], no redirects, no proxy.
///
/// # Errors
/// An `https` URL without a CA, an unreadable CA file, or a client that cannot be built.
pub(crate) fn http_client(
    url: &Url,
    ca: Option<&Path>,
    user_agent: &str,
) -> Result<(Arc<rustls::RootCertStore>, reqwest::Client)> {
    let roots = match ca {
        Some(ca) => crate::device::ca_roots(ca)?,
        None => {
            anyhow::ensure!(url.scheme() != "https", "an https URL needs --ca (the CA to verify it against)");
            // http only; reqwest still wants a TLS configuration to build.
            rustls::RootCertStore::empty()
        }
    };
    let roots = Arc::new(roots);
    let tls = crate::device::ring_client_builder(roots.clone())?.with_no_client_auth();
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .user_agent(user_agent)
        .timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .context("building the HTTP client")?;
    Ok((roots, http))
}

/// The condition in the state file `path` (missing: ready; unreadable or a bad word:
/// `last`, with a warning).
pub(crate) fn read_condition(path: &Path, last: PrinterCondition) -> PrinterCondition {
    match std::fs::read_to_string(path) {
        Ok(text) => match parse_condition(&text) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(file = %path.display(), "{e}; keeping {last:?}");
                last
            }
        },
        Err(e) if e.kind() == ErrorKind::NotFound => PrinterCondition::default(),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot read the state file; keeping {last:?}");
            last
        }
    }
}

/// Writes printed job number `seq`: `{out}/{seq:04}-print.png` and its [`JobRecord`] line
/// in `{out}/jobs.jsonl`. Returns the PNG's path.
///
/// # Errors
/// The PNG or its record could not be written.
pub(crate) fn write_job(
    out: &Path,
    seq: u64,
    png: &[u8],
    token: Option<&str>,
    width: u32,
    height: u32,
) -> Result<PathBuf> {
    let file = format!("{seq:04}-print.png");
    let path = out.join(&file);
    crate::effect::write_file(&path, png)?;
    let record = JobRecord { file, token: token.map(str::to_string), width, height };
    let jobs = out.join("jobs.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&jobs)
        .with_context(|| format!("opening {}", jobs.display()))?;
    writeln!(f, "{}", serde_json::to_string(&record)?).with_context(|| format!("appending to {}", jobs.display()))?;
    Ok(path)
}

/// `url` with `query` after any query it already has (`?query`, or `?old&query`).
pub(crate) fn append_query(mut url: Url, query: &str) -> Url {
    let full = match url.query().filter(|q| !q.is_empty()) {
        Some(q) => format!("{q}&{query}"),
        None => query.to_string(),
    };
    url.set_query(Some(&full));
    url
}

/// The parts of a condition a printer reports (`statusCode`, ASB), and `offline`: a change
/// in them polls at once (HTTP) or publishes a `client-status` (MQTT).
pub(crate) fn reported(c: &PrinterCondition) -> (bool, bool, bool, bool) {
    (c.offline, c.cover_open, c.paper_out, c.paper_near_end)
}

/// Reads a bare password from `path` (surrounding whitespace and the final newline
/// trimmed).
///
/// # Errors
/// The file cannot be read or is empty.
pub fn password_from_file(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let password = text.trim();
    anyhow::ensure!(!password.is_empty(), "{} is empty", path.display());
    Ok(password.to_string())
}

/// The password of `user` in a secrets file (the `--mqtt-secrets` format: one JSON object
/// `{"<id>": "<secret>", ...}`).
///
/// # Errors
/// The file cannot be read, is not such an object, or has no entry for `user`.
pub fn password_from_secrets(path: &Path, user: &str) -> Result<String> {
    let crate::device::DeviceIdentity::Secret { secrets } = crate::device::DeviceIdentity::secrets_from_json(path)?
    else {
        anyhow::bail!("{}: not a secrets file", path.display())
    };
    secrets.get(user).cloned().with_context(|| format!("{}: no secret for {user:?}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

    fn cond(words: &str) -> PrinterCondition {
        parse_condition(words).unwrap()
    }

    #[test]
    fn status_encoding() {
        let cases = [
            ("ready", "200%20OK", "23 86 00 00 00 00 00 00 00"),
            ("paper-near-end", "211%20Paper%20Low", "23 86 00 00 00 04 00 00 00"),
            ("paper-out", "410%20Out%20of%20Paper", "23 86 08 00 00 08 00 00 00"),
            ("cover-open", "420%20Cover%20Open", "23 86 28 00 00 00 00 00 00"),
            ("cover-open paper-out", "420%20Cover%20Open", "23 86 28 00 00 08 00 00 00"),
        ];
        for (words, code, asb) in cases {
            let poll = PollRequest::new(&cond(words), "00:11:62:0a:1b:2c");
            assert_eq!((poll.status_code.as_str(), poll.status.as_str()), (code, asb), "{words}");
        }
        assert_eq!(url_encode("00:11:62:0a:1b:2c"), "00%3A11%3A62%3A0a%3A1b%3A2c");
        assert_eq!(url_encode("image/png"), "image%2Fpng");
        assert_eq!(url_encode("a-b_c.d~e f"), "a-b_c.d~e%20f");
        let json = serde_json::to_value(PollRequest::new(&cond(""), "m")).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"statusCode": "200%20OK", "status": "23 86 00 00 00 00 00 00 00",
                "printerMAC": "m", "printingInProgress": false})
        );
    }

    /// A request the in-test server received.
    #[derive(Debug, Clone)]
    struct Seen {
        method: String,
        target: String,
        headers: HashMap<String, String>,
        body: Vec<u8>,
    }

    impl Seen {
        fn query(&self) -> &str {
            self.target.split_once('?').map_or("", |(_, q)| q)
        }
    }

    /// Serves HTTP/1.1 on `listener`, one request per connection: polls (POST) are
    /// answered with `offer` while it is set, GETs with `png` (but the server setting
    /// request, `/cloudprnt-setting.json`, with 404: an HTTP-only server), DELETEs with 200;
    /// every request is recorded in `seen`.
    async fn serve(
        listener: tokio::net::TcpListener,
        offer: Arc<Mutex<Option<serde_json::Value>>>,
        png: Vec<u8>,
        seen: Arc<Mutex<Vec<Seen>>>,
    ) {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let (offer, png, seen) = (offer.clone(), png.clone(), seen.clone());
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if stream.read_line(&mut line).await.unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push_str(&line);
                }
                let mut lines = head.lines();
                let mut first = lines.next().unwrap_or("").split(' ');
                let (method, target) = (first.next().unwrap_or("").to_string(), first.next().unwrap_or("").to_string());
                let headers: HashMap<String, String> = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                    .collect();
                let len = headers.get("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
                let mut body = vec![0; len];
                stream.read_exact(&mut body).await.unwrap();
                let setting = method == "GET" && target.starts_with("/cloudprnt-setting.json");
                seen.lock().unwrap().push(Seen { method: method.clone(), target, headers, body });
                let (content_type, answer) = match method.as_str() {
                    _ if setting => ("text/plain", Vec::new()),
                    "POST" => {
                        let offer = offer.lock().unwrap().clone().unwrap_or(serde_json::json!({"jobReady": false}));
                        ("application/json", offer.to_string().into_bytes())
                    }
                    "GET" => ("image/png", png),
                    _ => ("text/plain", Vec::new()),
                };
                let status = if setting { "404 Not Found" } else { "200 OK" };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    answer.len()
                );
                let mut stream = stream.into_inner();
                stream.write_all(head.as_bytes()).await.unwrap();
                stream.write_all(&answer).await.unwrap();
                stream.shutdown().await.unwrap();
            });
        }
    }

    /// Poll → GET → print → DELETE against a server offering one PNG job, with Basic
    /// authentication; the same token offered again is confirmed, not printed.
    #[tokio::test]
    async fn prints_and_confirms_a_job_once() {
        let dir = std::env::temp_dir().join(format!("pixgate-cloudprnt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut png = Vec::new();
        image::GrayImage::from_pixel(576, 40, image::Luma([255]))
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/cloudprnt", listener.local_addr().unwrap());
        let offer = Arc::new(Mutex::new(Some(serde_json::json!({
            "jobReady": true, "mediaTypes": ["text/plain", "image/png"], "jobToken": "job 1/a",
            "jobGetUrl": format!("{base}/job"), "jobConfirmationUrl": null,
        }))));
        let seen = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(serve(listener, offer.clone(), png.clone(), seen.clone()));

        let mut printer = CloudPrinter::new(CloudPrntOptions {
            url: Url::parse(&base).unwrap(),
            mac: "00:11:62:0a:1b:2c".into(),
            out: dir.clone(),
            auth: Some(BasicAuth { user: "printer1".into(), password: "s3cret".into() }),
            ca: None,
            poll: Duration::from_millis(50),
            state_file: None,
            skip_confirm: 0,
            paper_mm: 80,
            confirm_delay: Duration::ZERO,
        })
        .unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let log = events.clone();
        let mut report = move |e: &Event| log.lock().unwrap().push(e.clone());
        let ready = PrinterCondition::default();

        assert!(printer.poll(&ready, &mut report).await.unwrap(), "a job was handled");
        let requests = std::mem::take(&mut *seen.lock().unwrap());
        let methods: Vec<&str> = requests.iter().map(|r| r.method.as_str()).collect();
        assert_eq!(methods, ["POST", "GET", "DELETE"]);
        for r in &requests {
            // printer1:s3cret
            assert_eq!(r.headers.get("authorization").map(String::as_str), Some("Basic cHJpbnRlcjE6czNjcmV0"));
        }
        let (poll, get, delete) = (&requests[0], &requests[1], &requests[2]);
        assert_eq!(poll.target, "/cloudprnt");
        assert_eq!(poll.headers.get("content-type").map(String::as_str), Some("application/json"));
        let body: serde_json::Value = serde_json::from_slice(&poll.body).unwrap();
        assert_eq!(body["statusCode"], "200%20OK");
        assert_eq!(body["status"], "23 86 00 00 00 00 00 00 00");
        assert_eq!(body["printerMAC"], "00:11:62:0a:1b:2c");
        assert_eq!(body["printingInProgress"], false);
        assert_eq!(get.target.split('?').next(), Some("/cloudprnt/job"));
        assert_eq!(get.query(), "type=image%2Fpng&mac=00%3A11%3A62%3A0a%3A1b%3A2c&token=job%201%2Fa");
        assert_eq!(delete.target.split('?').next(), Some("/cloudprnt"));
        assert_eq!(delete.query(), "mac=00%3A11%3A62%3A0a%3A1b%3A2c&code=OK&token=job%201%2Fa");

        assert_eq!(std::fs::read(dir.join("0001-print.png")).unwrap(), png, "saved as received");
        let jobs = std::fs::read_to_string(dir.join("jobs.jsonl")).unwrap();
        let record: JobRecord = serde_json::from_str(jobs.trim()).unwrap();
        assert_eq!(
            record,
            JobRecord { file: "0001-print.png".into(), token: Some("job 1/a".into()), width: 576, height: 40 }
        );
        let printed = Event::Printed { path: dir.join("0001-print.png"), token: Some("job 1/a".into()) };
        assert_eq!(printed.to_string(), format!("printed {}/0001-print.png token=job 1/a", dir.display()));
        assert_eq!(*events.lock().unwrap(), std::slice::from_ref(&printed));

        // The confirmation was lost, say: the server offers the job again.
        assert!(printer.poll(&ready, &mut report).await.unwrap());
        let requests = std::mem::take(&mut *seen.lock().unwrap());
        let methods: Vec<&str> = requests.iter().map(|r| r.method.as_str()).collect();
        assert_eq!(methods, ["POST", "DELETE"], "a known token is not fetched again");
        assert_eq!(requests[1].query(), "mac=00%3A11%3A62%3A0a%3A1b%3A2c&code=OK&token=job%201%2Fa");
        assert_eq!(*events.lock().unwrap(), [printed, Event::Duplicate("job 1/a".into())]);
        assert_eq!(std::fs::read_to_string(dir.join("jobs.jsonl")).unwrap(), jobs, "not printed again");

        // Nothing offered: a poll only. No image/png offered: 510, nothing fetched.
        *offer.lock().unwrap() = None;
        assert!(!printer.poll(&ready, &mut report).await.unwrap());
        *offer.lock().unwrap() = Some(serde_json::json!({"jobReady": true, "mediaTypes": ["text/plain"]}));
        assert!(printer.poll(&ready, &mut report).await.unwrap());
        let requests = std::mem::take(&mut *seen.lock().unwrap());
        let methods: Vec<&str> = requests.iter().map(|r| r.method.as_str()).collect();
        assert_eq!(methods, ["POST", "POST", "DELETE"]);
        assert_eq!(requests[2].query(), "mac=00%3A11%3A62%3A0a%3A1b%3A2c&code=510%20Incompatible%20Media%20Type");
        // Paper out: polls with 410 and does not fetch the ready job.
        *offer.lock().unwrap() = Some(serde_json::json!({"jobReady": true, "mediaTypes": ["image/png"]}));
        assert!(!printer.poll(&cond("paper-out"), &mut report).await.unwrap());
        let requests = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(requests.len(), 1);
        let body: serde_json::Value = serde_json::from_slice(&requests[0].body).unwrap();
        assert_eq!(body["statusCode"], "410%20Out%20of%20Paper");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `printer-sim cloudprnt` against an HTTP-only server: the server setting request
    /// (with the poll's credentials) is answered 404, and the printer polls.
    #[tokio::test]
    async fn a_404_server_setting_means_polling() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/cloudprnt", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(serve(listener, Arc::new(Mutex::new(None)), Vec::new(), seen.clone()));
        let printer = CloudPrinter::new(CloudPrntOptions {
            url: Url::parse(&base).unwrap(),
            mac: "00:11:62:0A:1B:2C".into(),
            out: std::env::temp_dir().join(format!("pixgate-cloudprnt-404-{}", std::process::id())),
            auth: Some(BasicAuth { user: "printer1".into(), password: "s3cret".into() }),
            ca: None,
            poll: Duration::from_millis(50),
            state_file: None,
            skip_confirm: 0,
            paper_mm: 80,
            confirm_delay: Duration::ZERO,
        })
        .unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let log = events.clone();
        let mut report = move |e: &Event| log.lock().unwrap().push(e.clone());
        let run = crate::cloudprnt_mqtt::run(printer, Default::default(), &mut report);
        let _ = tokio::time::timeout(Duration::from_millis(400), run).await;

        assert_eq!(*events.lock().unwrap(), [Event::Polling(base.clone())]);
        let requests = std::mem::take(&mut *seen.lock().unwrap());
        let (setting, polls) = requests.split_first().expect("a server setting request");
        assert_eq!(setting.method, "GET");
        assert_eq!(
            setting.target, "/cloudprnt-setting.json?mac=00%3A11%3A62%3A0a%3A1b%3A2c&replaced_path=cloudprnt",
            "the MAC lower case"
        );
        assert_eq!(setting.headers.get("authorization").map(String::as_str), Some("Basic cHJpbnRlcjE6czNjcmV0"));
        assert!(polls.len() >= 2, "{polls:?}");
        for poll in polls {
            assert_eq!((poll.method.as_str(), poll.target.as_str()), ("POST", "/cloudprnt"));
            let body: serde_json::Value = serde_json::from_slice(&poll.body).unwrap();
            assert_eq!(body["printerMAC"], "00:11:62:0A:1B:2C", "HTTP polls report the MAC as given");
        }
    }

    #[test]
    fn passwords() {
        let dir = std::env::temp_dir().join(format!("pixgate-cloudprnt-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pw"), "  s3cret\n").unwrap();
        assert_eq!(password_from_file(&dir.join("pw")).unwrap(), "s3cret");
        std::fs::write(dir.join("secrets.json"), r#"{"printer1": "a", "printer2": "b"}"#).unwrap();
        assert_eq!(password_from_secrets(&dir.join("secrets.json"), "printer2").unwrap(), "b");
        assert!(password_from_secrets(&dir.join("secrets.json"), "printer3").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
