//! Star CloudPRNT printers on pixgate's own listener: CloudPRNT Version MQTT, Full MQTT /
//! Pass URL (Star CloudPRNT protocol guide v2.4.0, "MQTT method reference").
//!
//! Such a printer connects with the client id, username and password the CloudPRNT
//! server's settings gave it (`deliver::cloudprnt`: `dev-{id}`, the device id and its
//! secret), so it is authenticated as every device is. What differs is its topics, all
//! under its MAC (`printer.mac`, lower case with colons, as Star's topics write it):
//!
//! | what | allowed | anything else |
//! |---|---|---|
//! | client id | `dev-{id}`, or the printer's MAC (firmware that keeps its own) | CONNACK 2 |
//! | SUBSCRIBE filter | `star/cloudprnt/to-device/{mac}/#`, `…/{mac}/+`, `…/{mac}/{method}` | SUBACK 0x80 |
//! | PUBLISH topic | `star/cloudprnt/to-server/{mac}/{method}` | connection closed |
//! | will topic | `star/cloudprnt/to-server/{mac}/client-will` | CONNACK 5 |
//!
//! pixgate's own device topics are not the printer's, and Star's are no other device's.
//! Its jobs go out on `star/cloudprnt/to-device/{mac}/print-job` (the payload is made by
//! the CloudPRNT side); what it publishes goes to [`StarPrinters::published`], not to the
//! device protocol's decoder.

use std::future::Future;
use std::pin::Pin;

/// Where a printer's topics start, towards it and from it.
const TO_DEVICE: &str = "star/cloudprnt/to-device/";
const TO_SERVER: &str = "star/cloudprnt/to-server/";

/// The method jobs are sent as.
pub const PRINT_JOB: &str = "print-job";

/// The method of a printer's will.
pub const CLIENT_WILL: &str = "client-will";

/// A boxed future, so that [`StarPrinters`] can be a trait object.
pub type Pending<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// The CloudPRNT side of the Star printers that use the MQTT method: who they are, and
/// what they publish.
pub trait StarPrinters: Send + Sync + 'static {
    /// `device`'s MAC (normalized) if it is a Star printer set to the MQTT method now.
    fn mac_of(&self, device: &str) -> Option<String>;

    /// The Star printer on the MQTT method whose MAC is `mac` (normalized), if exactly one
    /// has it.
    fn device_of(&self, mac: &str) -> Option<String>;

    /// A session of `device` came up (`true`) or ended (`false`). A printer with no session
    /// left is offline.
    fn session(&self, device: &str, up: bool);

    /// `device` published `payload` as `method` (`client-status`, `print-result`,
    /// `client-will`, …), or left it as its will.
    ///
    /// # Errors
    /// The payload is not what `method` carries: the session counts and drops it.
    fn published<'a>(&'a self, device: &'a str, method: &'a str, payload: &'a [u8]) -> Pending<'a>;
}

/// The topic `mac`'s jobs are sent on.
pub fn jobs_topic(mac: &str) -> String {
    format!("{TO_DEVICE}{mac}/{PRINT_JOB}")
}

/// The topic of `message` to printer `mac`: `star/cloudprnt/to-device/{mac}/{title}`, its
/// JSON `title` naming the method (`print-job`, `request-get-server-info`…); the jobs topic
/// when it names none.
pub fn to_device_topic(mac: &str, message: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Titled<'a> {
        #[serde(borrow)]
        title: Option<&'a str>,
    }
    match serde_json::from_slice::<Titled<'_>>(message).ok().and_then(|t| t.title) {
        Some(title) if single_level(title) => format!("{TO_DEVICE}{mac}/{title}"),
        _ => jobs_topic(mac),
    }
}

/// Whether printer `mac` may subscribe to `filter`: `None` if not; `Some(true)` if the
/// filter covers its jobs, `Some(false)` for another of its own methods.
pub fn may_subscribe(mac: &str, filter: &str) -> Option<bool> {
    let method = filter.strip_prefix(TO_DEVICE)?.strip_prefix(mac)?.strip_prefix('/')?;
    match method {
        "#" | "+" => Some(true),
        m if m == PRINT_JOB => Some(true),
        m if single_level(m) => Some(false),
        _ => None,
    }
}

/// The method of a PUBLISH (or will) topic printer `mac` may use: its own
/// `star/cloudprnt/to-server/{mac}/{method}`.
pub fn method_of<'t>(mac: &str, topic: &'t [u8]) -> Option<&'t str> {
    let topic = std::str::from_utf8(topic).ok()?;
    let method = topic.strip_prefix(TO_SERVER)?.strip_prefix(mac)?.strip_prefix('/')?;
    single_level(method).then_some(method)
}

/// The filter of every Star printer's messages to the server (an external broker's
/// subscriber, which receives what the broker let each printer publish).
pub const ALL_TO_SERVER: &str = "star/cloudprnt/to-server/+/+";

/// The MAC and method of a message to the server: `star/cloudprnt/to-server/{mac}/{method}`.
pub fn to_server(topic: &str) -> Option<(&str, &str)> {
    let (mac, method) = topic.strip_prefix(TO_SERVER)?.split_once('/')?;
    (single_level(mac) && single_level(method)).then_some((mac, method))
}

/// Whether printer `mac` may leave a will on `topic`: its own `client-will`.
pub fn may_will(mac: &str, topic: &[u8]) -> bool {
    method_of(mac, topic) == Some(CLIENT_WILL)
}

/// Whether `client_id` is printer `mac`'s MAC (any case, `:` or `-`).
pub fn is_mac(mac: &str, client_id: &str) -> bool {
    cdc::value::normalize_mac(client_id).is_some_and(|m| m == mac)
}

fn single_level(m: &str) -> bool {
    !m.is_empty() && !m.contains(['/', '+', '#'])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: &str = "00:11:62:0a:1b:2c";
    const OTHER: &str = "00:11:62:0a:1b:2d";

    #[test]
    fn a_printer_subscribes_to_its_own_device_topics_only() {
        for (f, jobs) in [
            (format!("star/cloudprnt/to-device/{MAC}/#"), true),
            (format!("star/cloudprnt/to-device/{MAC}/+"), true),
            (format!("star/cloudprnt/to-device/{MAC}/print-job"), true),
            (format!("star/cloudprnt/to-device/{MAC}/request-client-status"), false),
        ] {
            assert_eq!(may_subscribe(MAC, &f), Some(jobs), "{f}");
        }
        for f in [
            "#".to_string(),
            "star/#".into(),
            "star/cloudprnt/to-device/#".into(),
            "star/cloudprnt/to-device/+/print-job".into(),
            format!("star/cloudprnt/to-device/{OTHER}/#"),
            format!("star/cloudprnt/to-device/{MAC}"),
            format!("star/cloudprnt/to-device/{MAC}/"),
            format!("star/cloudprnt/to-device/{MAC}/a/b"),
            format!("star/cloudprnt/to-server/{MAC}/#"),
            format!("pixgate/v1/devices/{MAC}/jobs"),
        ] {
            assert_eq!(may_subscribe(MAC, &f), None, "{f}");
        }
    }

    #[test]
    fn a_printer_publishes_and_wills_on_its_own_server_topics_only() {
        let t = |s: String| s.into_bytes();
        assert_eq!(method_of(MAC, &t(format!("star/cloudprnt/to-server/{MAC}/print-result"))), Some("print-result"));
        assert_eq!(method_of(MAC, &t(format!("star/cloudprnt/to-server/{MAC}/client-status"))), Some("client-status"));
        for bad in [
            format!("star/cloudprnt/to-server/{OTHER}/print-result"),
            format!("star/cloudprnt/to-device/{MAC}/print-job"),
            format!("star/cloudprnt/to-server/{MAC}/+"),
            format!("star/cloudprnt/to-server/{MAC}/a/b"),
            format!("star/cloudprnt/to-server/{MAC}/"),
            format!("pixgate/v1/devices/{MAC}/acks"),
        ] {
            assert_eq!(method_of(MAC, bad.as_bytes()), None, "{bad}");
        }
        assert!(may_will(MAC, format!("star/cloudprnt/to-server/{MAC}/client-will").as_bytes()));
        assert!(!may_will(MAC, format!("star/cloudprnt/to-server/{MAC}/client-status").as_bytes()));
        assert!(!may_will(MAC, format!("star/cloudprnt/to-server/{OTHER}/client-will").as_bytes()));
        let topic = format!("star/cloudprnt/to-server/{MAC}/print-result");
        assert_eq!(to_server(&topic), Some((MAC, "print-result")));
        assert_eq!(to_server("star/cloudprnt/to-server/x/a/b"), None);
        assert_eq!(to_server("star/cloudprnt/to-device/x/print-job"), None);
        assert_eq!(jobs_topic(MAC), format!("star/cloudprnt/to-device/{MAC}/print-job"));
        let topic = |m: &[u8]| to_device_topic(MAC, m);
        assert_eq!(
            topic(br#"{"title":"request-get-server-info"}"#),
            format!("star/cloudprnt/to-device/{MAC}/request-get-server-info")
        );
        assert_eq!(topic(br#"{"title":"print-job","jobToken":"t"}"#), jobs_topic(MAC));
        assert_eq!(topic(br#"{"title":"a/#"}"#), jobs_topic(MAC), "never another level");
        assert_eq!(topic(b"not json"), jobs_topic(MAC));
    }

    #[test]
    fn a_mac_client_id_in_any_spelling() {
        assert!(is_mac(MAC, "00:11:62:0A:1B:2C"));
        assert!(is_mac(MAC, "00-11-62-0a-1b-2c"));
        assert!(!is_mac(MAC, OTHER));
        assert!(!is_mac(MAC, "dev-00:11:62:0a:1b:2c"));
    }
}
