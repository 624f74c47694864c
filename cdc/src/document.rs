//! What pixgate reads from a change event: the envelope and the `Charge` and `Device`
//! documents inside it, as decoded shapes (contract: `fixtures/cdc/README.md`).

use chrono::{DateTime, Utc};
use serde_json::Value;

/// What happened to the document (`operationType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `insert`
    Insert,
    /// `update`
    Update,
    /// `replace`
    Replace,
    /// `delete`
    Delete,
}

/// A change event envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// `eventId`: deterministic, the same for a redelivery of the same change.
    pub event_id: String,
    /// `operationType`.
    pub operation: Operation,
    /// `documentKey._id`.
    pub document_id: String,
    /// `clusterTime` as `(t << 32) | i`: the change's position in the oplog.
    pub cluster_time: u64,
    /// `fullDocument`, the document after the change; `None` for deletes, and for updates
    /// whose document was deleted before the capture job looked it up.
    pub full_document: Option<Value>,
}

/// Pix charge status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChargeStatus {
    /// Waiting for payment.
    Active,
    /// Paid.
    Completed,
    /// Expired unpaid.
    Expired,
}

/// The fields of a `Charge` document pixgate uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Charge {
    /// `_id`.
    pub id: String,
    /// `company`.
    pub company: String,
    /// `value`, in centavos.
    pub value_cents: u64,
    /// `status`.
    pub status: ChargeStatus,
    /// `__v`: grows with every change of the charge.
    pub version: i64,
    /// `terminal`: the card machine the charge was created on.
    pub terminal: Option<String>,
    /// `brCode`: the payload of a dynamic charge.
    pub brcode: Option<String>,
    /// `pixKey`, for static payloads.
    pub pix_key: Option<String>,
    /// `transactionID`, the static payload's txid.
    pub transaction_id: Option<String>,
    /// `merchant.name`.
    pub merchant_name: String,
    /// `merchant.city`.
    pub merchant_city: String,
    /// `additionalInfo` as `(key, value)` line items.
    pub items: Vec<(String, String)>,
    /// `comment`.
    pub comment: Option<String>,
    /// `payer.name`.
    pub payer_name: Option<String>,
    /// `paidAt`.
    pub paid_at: Option<DateTime<Utc>>,
    /// `expiresDate`.
    pub expires_at: Option<DateTime<Utc>>,
    /// `endToEndId` of the Pix transfer.
    pub end_to_end_id: Option<String>,
}

/// A printer pixgate drives itself, over raw TCP, a serial line or a USB line-printer
/// device: `printer.transport` `tcp`, `serial` or `usb`, with the pixgate extensions
/// `printer.endpoint` and `printer.interruptedJob`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectPrinter {
    /// `printer.endpoint`: a URL whose scheme is the transport, e.g. `tcp://10.0.0.5:9100`,
    /// `serial:///dev/ttyUSB0?baud=19200&flow=rtscts`, `usb:///dev/usb/lp0`. Its settings
    /// are checked by the gateway's endpoint parser.
    pub endpoint: String,
    /// `printer.interruptedJob`: what to do with a job whose writing was cut short.
    pub interrupted: Interrupted,
}

/// A printer that fetches its own jobs from pixgate over its maker's cloud protocol, with
/// no box beside it: `printer.transport` `cloudprnt-http` or `cloudprnt-mqtt` (Star
/// CloudPRNT) with the pixgate extension `printer.mac`, or `epson-sdp` (Epson Server
/// Direct Print).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudPrinter {
    /// `printer.mac`: the MAC address a Star printer reports (CloudPRNT `printerMAC`),
    /// normalized to lower-case hex pairs joined by `:`, e.g. `00:11:62:0a:1b:2c`; `None`
    /// for Epson's, whose requests name no MAC (their `ID` is the device id).
    pub mac: Option<String>,
    /// How it is told of its jobs.
    pub method: CloudMethod,
}

/// The CloudPRNT method a printer is set to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudMethod {
    /// `cloudprnt-http`: the printer polls (POST), GETs the job, DELETEs it when printed.
    Http,
    /// `cloudprnt-mqtt`: the printer connects to pixgate's MQTT listener, is told of each
    /// job there (`print-job`), GETs it over HTTP and reports the result over MQTT
    /// (`print-result`).
    Mqtt,
    /// `epson-sdp`: the printer polls (`ConnectionType=GetRequest`), is answered its job as
    /// ePOS-Print XML, and posts the result (`SetResponse`).
    EpsonSdp,
}

impl CloudMethod {
    /// Its `printer.transport` name: `cloudprnt-http`, `cloudprnt-mqtt`, `epson-sdp`.
    pub fn transport(self) -> &'static str {
        match self {
            CloudMethod::Http => "cloudprnt-http",
            CloudMethod::Mqtt => "cloudprnt-mqtt",
            CloudMethod::EpsonSdp => "epson-sdp",
        }
    }
}

/// What happens to a job a direct printer may or may not have printed (pixgate crashed, or
/// the connection dropped, while writing it): a raw printer cannot dedupe, and nobody can
/// tell whether the paper came out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Interrupted {
    /// `reprint` (default): printed again under a "2ª VIA / REIMPRESSÃO" header, so a
    /// second copy never passes for a second original.
    #[default]
    Reprint,
    /// `hold`: not printed again; handed to an operator as a dead letter, who checks the
    /// paper and replays it or not. The printer's queue goes on.
    Hold,
}

impl Interrupted {
    /// The setting named `name` (`reprint` or `hold`).
    pub fn from_name(name: &str) -> Option<Interrupted> {
        [Interrupted::Reprint, Interrupted::Hold].into_iter().find(|i| i.as_str() == name)
    }

    /// `reprint` or `hold`.
    pub fn as_str(self) -> &'static str {
        match self {
            Interrupted::Reprint => "reprint",
            Interrupted::Hold => "hold",
        }
    }
}

/// What kind of device a `Device` document describes.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceKind {
    /// A receipt printer.
    Printer {
        /// `printer.paperWidthMm`: 58 or 80.
        paper_width_mm: u8,
        /// `printer.codePage`, e.g. `CP860` (default CP860 when absent).
        code_page: render::codepage::CodePage,
        /// `printer.nativeQr`: understands `GS ( k`.
        native_qr: bool,
        /// `printer.printPixSlip` (a pixgate extension of the device document, default
        /// false): when the printer is the one a charge's receipt goes to, it also prints the
        /// "pay with Pix" slip when the charge is `ACTIVE` and an expiry notice when it is
        /// `EXPIRED` (`router`).
        pix_slip: bool,
        /// `printer.transport` other than `mqtt`: pixgate drives the printer itself
        /// ([`DirectPrinter`]); `None` for an MQTT printer (the default).
        direct: Option<DirectPrinter>,
        /// `printer.transport` `cloudprnt-http`: the printer polls pixgate for its jobs
        /// ([`CloudPrinter`]); `None` for every other transport.
        cloud: Option<CloudPrinter>,
    },
    /// A card machine.
    Terminal {
        /// `screen.widthPx`.
        width_px: u32,
        /// `screen.heightPx`.
        height_px: u32,
        /// `pairedPrinter`.
        paired_printer: Option<String>,
    },
}

/// The fields of a `Device` document pixgate uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// `_id`.
    pub id: String,
    /// `company`.
    pub company: String,
    /// `kind` and its sub-document.
    pub kind: DeviceKind,
    /// `model`, e.g. `Bematech MP-4200 TH` (empty when absent): printers follow their
    /// model's `ESC t` numbering and capabilities (`render::profile`).
    pub model: String,
    /// `locale`, e.g. `pt-BR` (default `pt-BR`).
    pub locale: String,
    /// `timeZone` (IANA), if the registry has one.
    pub time_zone: Option<String>,
    /// `enabled` (default true).
    pub enabled: bool,
    /// `defaultForCompany`: the company's printer for charges without a terminal.
    pub default_for_company: bool,
}
