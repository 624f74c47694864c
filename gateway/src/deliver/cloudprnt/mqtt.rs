//! CloudPRNT's MQTT method on the board (Star CloudPRNT protocol guide v2.4.0, "MQTT
//! method reference", Full MQTT / Pass URL): what a printer publishes, read, and the
//! `print-job` that tells it of its job.
//!
//! Every job is sent as `jobType: "url"` (Pass URL): the printer GETs the picture from this
//! server's `/cloudprnt` exactly as the HTTP method does, with the token, and publishes a
//! `print-result`. Not `raw` (Full MQTT): Star's pages do not say how a binary media type
//! travels in `printData`, while a URL keeps the picture on the documented GET, drawn
//! once per offer, and a `print-job` sent again is a few hundred bytes.
//!
//! | topic (`star/cloudprnt/to-server/{mac}/…`) | payload read | what it does |
//! |---|---|---|
//! | `client-status` | `statusCode`, `status` (ASB hex) | the printer's condition, as a poll's |
//! | `print-result` | `statusCode`, `jobToken`, `printSucceeded` | the confirmation ([`Confirmation::of_print_result`]) |
//! | `client-will` | nothing | offline |
//! | any other | nothing | ignored |

use super::board::{Board, Confirmation};
use super::media;
use super::status::Condition;
use crate::deliver::mqtt::star::{Pending, StarPrinters, CLIENT_WILL, PRINT_JOB};
use bytes::Bytes;
use device_protocol::Status;
use serde::Deserialize;

/// A `client-status`'s fields pixgate reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClientStatus {
    status_code: String,
    #[serde(default)]
    status: Option<String>,
}

/// A `print-result`'s fields pixgate reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PrintResult {
    status_code: String,
    #[serde(default)]
    job_token: Option<String>,
    #[serde(default)]
    print_succeeded: Option<bool>,
}

/// The method that makes a printer ask for its settings again (Star: "Make a printer
/// perform Server setting information request (GET)").
pub const REQUEST_SETTINGS: &str = "request-get-server-info";

impl Board {
    /// The message telling `device` (a printer on the MQTT method) of the job `message_id`: the
    /// `print-job` `{"title": "print-job", "jobToken": MESSAGE_ID, "jobType": "url",
    /// "mediaTypes": ["image/png"], "printData": URL}`; or, while no URL is known for it
    /// (it has not asked for its settings since pixgate started), `{"title":
    /// "request-get-server-info"}`, which makes it ask: the job's resend then names the
    /// URL. `None` for a printer on another protocol, and once the board is closed
    /// ([`Board::close`]) or the job is no longer offered ([`Board::announce`]).
    pub fn print_job(&self, device: &str, message_id: &str) -> Option<Bytes> {
        self.mac_of(device)?;
        let Some(url) = self.url(device) else {
            tracing::info!(device, "CloudPRNT printer on MQTT asked to fetch its settings (none since the start)");
            return Some(Bytes::from(serde_json::json!({ "title": REQUEST_SETTINGS }).to_string()));
        };
        if !self.announce(device, message_id) {
            return None;
        }
        let message = serde_json::json!({
            "title": PRINT_JOB,
            "jobToken": message_id,
            "jobType": "url",
            "mediaTypes": [media::PNG],
            "printData": url,
        });
        Some(Bytes::from(message.to_string()))
    }
}

impl StarPrinters for Board {
    fn mac_of(&self, device: &str) -> Option<String> {
        self.settings(device).filter(|c| c.method == cdc::CloudMethod::Mqtt).and_then(|c| c.mac)
    }

    fn device_of(&self, mac: &str) -> Option<String> {
        self.printers().cloud_by_mac(mac, cdc::CloudMethod::Mqtt)
    }

    fn session(&self, device: &str, up: bool) {
        Board::session(self, device, up);
    }

    fn published<'a>(&'a self, device: &'a str, method: &'a str, payload: &'a [u8]) -> Pending<'a> {
        Box::pin(async move {
            match method {
                "client-status" => {
                    let s: ClientStatus = serde_json::from_slice(payload).map_err(|e| format!("client-status: {e}"))?;
                    self.condition(device, Condition::read(&s.status_code, s.status.as_deref()).status());
                }
                "print-result" => {
                    let r: PrintResult = serde_json::from_slice(payload).map_err(|e| format!("print-result: {e}"))?;
                    let how = Confirmation::of_print_result(&r.status_code, r.print_succeeded);
                    if let Confirmation::Again(code) = &how {
                        tracing::warn!(device, code = %code, token = r.job_token.as_deref().unwrap_or(""), "CloudPRNT printer did not print its job; offered again");
                    }
                    if !self.confirm(device, r.job_token.as_deref(), how).await {
                        tracing::debug!(
                            device,
                            token = r.job_token.as_deref().unwrap_or(""),
                            "print-result of a job not offered; ignored"
                        );
                    }
                }
                m if m == CLIENT_WILL => self.condition(device, Status { v: 1, online: false, printer: None }),
                other => tracing::debug!(device, method = other, "CloudPRNT message ignored"),
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CloudSettings, DirectPrinters, Incoming};
    use device_protocol::{AckResult, EffectKind, PrinterState};
    use render::codepage::CodePage;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::mpsc;

    const MAC: &str = "00:11:62:00:00:01";

    /// `m` on the MQTT method, `h` on HTTP.
    fn board() -> (Board, mpsc::Receiver<Incoming>) {
        let printers = Arc::new(DirectPrinters::default());
        let s = |method| CloudSettings {
            mac: Some(MAC.into()),
            method,
            width_dots: 576,
            code_page: CodePage::Cp860,
            model: String::new(),
        };
        printers.set_cloud("m", Some(s(cdc::CloudMethod::Mqtt)));
        printers.set_cloud("h", Some(s(cdc::CloudMethod::Http)));
        let (tx, rx) = mpsc::channel(16);
        (Board::new(printers, tx, Duration::from_secs(60), 4), rx)
    }

    fn wire(id: &str, seq: u64) -> Bytes {
        let mut job = crate::test_fixtures::job(id, EffectKind::PrintReceipt, "c");
        job.seq = seq;
        Bytes::from(job.to_json())
    }

    fn status(rx: &mut mpsc::Receiver<Incoming>) -> Status {
        match rx.try_recv() {
            Ok(Incoming::Status { status, .. }) => status,
            other => panic!("expected a status, got {other:?}"),
        }
    }

    /// Online while a session is up; its client-status is its condition; the print-job
    /// names the URL it asked its settings at; its print-result confirms the offer.
    #[tokio::test]
    async fn a_printer_on_mqtt_is_told_of_its_job_and_confirms_it() {
        let (b, mut rx) = board();
        assert_eq!(b.mac_of("m").as_deref(), Some(MAC));
        assert_eq!(b.mac_of("h"), None, "the HTTP method has no MQTT topics");
        b.offer("m", wire("m1", 1));
        assert!(!status(&mut rx).online, "no session yet");
        assert_eq!(
            &b.print_job("m", "m1").unwrap()[..],
            br#"{"title":"request-get-server-info"}"#,
            "no settings asked since the start: it is asked to"
        );
        b.set_url("m", "https://gw.example/cloudprnt".into());
        let job: serde_json::Value = serde_json::from_slice(&b.print_job("m", "m1").unwrap()).unwrap();
        assert_eq!(
            job,
            serde_json::json!({"title": "print-job", "jobToken": "m1", "jobType": "url",
                "mediaTypes": ["image/png"], "printData": "https://gw.example/cloudprnt"})
        );
        assert!(b.print_job("h", "m1").is_none());
        assert!(b.print_job("m", "m9").is_none(), "not the job offered");

        b.session("m", true);
        assert!(status(&mut rx).online);
        b.offer("m", wire("m1", 1));
        assert!(rx.try_recv().is_err(), "connected: no offline report");
        let paper_out =
            br#"{"title":"client-status","printerMAC":"00:11:62:00:00:01","statusCode":"410%20Paper%20Empty"}"#;
        b.published("m", "client-status", paper_out).await.unwrap();
        assert_eq!(status(&mut rx).printer, Some(PrinterState::PaperOut));
        let result =
            br#"{"title":"print-result","jobToken":"m1","statusCode":"410%20Paper%20Empty","printSucceeded":false}"#;
        b.published("m", "print-result", result).await.unwrap();
        let Incoming::Ack { ack, .. } = rx.try_recv().unwrap() else { panic!() };
        assert_eq!((ack.result, ack.permanent), (AckResult::Failed, false), "paper out: offered again");

        b.offer("m", wire("m2", 2));
        let result = br#"{"title":"print-result","jobToken":"m2","statusCode":"200%20OK","printSucceeded":true}"#;
        b.published("m", "print-result", result).await.unwrap();
        let Incoming::Ack { ack, .. } = rx.try_recv().unwrap() else { panic!() };
        assert_eq!((ack.message_id.as_str(), ack.seq, ack.result), ("m2", 2, AckResult::Done));
        b.published("m", "print-result", result).await.unwrap();
        assert!(rx.try_recv().is_err(), "a second result of the same job changes nothing");

        assert!(b.published("m", "print-result", b"{}").await.is_err(), "no statusCode");
        assert!(b.published("m", "client-status", b"not json").await.is_err());
        b.published("m", "some-future-method", b"anything").await.unwrap();

        b.published("m", "client-will", b"{}").await.unwrap();
        assert!(!status(&mut rx).online, "its will: offline");

        b.offer("m", wire("m3", 3));
        b.close();
        assert!(b.print_job("m", "m3").is_none(), "closed: not told of a job any more");
    }

    /// Two sessions of one printer (a reconnect before the old one is seen gone): online
    /// until the last ends.
    #[tokio::test]
    async fn offline_when_its_last_session_ends() {
        let (b, mut rx) = board();
        b.session("m", true);
        assert!(status(&mut rx).online);
        b.session("m", true);
        b.session("m", false);
        assert!(rx.try_recv().is_err(), "one session still up");
        b.session("m", false);
        assert!(!status(&mut rx).online);
    }

    #[test]
    fn print_results_read() {
        assert_eq!(Confirmation::of_print_result("200%20OK", None), Confirmation::Printed);
        assert_eq!(Confirmation::of_print_result("500", Some(true)), Confirmation::Printed);
        assert_eq!(
            Confirmation::of_print_result("510%20Incompatible%20Media", Some(false)),
            Confirmation::Refused("510 Incompatible Media".into())
        );
        assert_eq!(
            Confirmation::of_print_result("420 Cover Open", Some(false)),
            Confirmation::Again("420 Cover Open".into())
        );
    }
}
