//! The XML of Epson Server Direct Print (Epson Server Direct Print User's Manual; ePOS-Print
//! XML User's Manual): the job pixgate answers a poll with, and the result and status
//! documents a printer posts.
//!
//! A job is one `ePOSPrint` of a `PrintRequestInfo` version 2.00, its ESC/POS carried whole
//! in an ePOS-Print `<command>` element as hex digits (lower case, two per byte, as Epson's
//! own SDK writes them): the printer prints the bytes pixgate rendered, `GS ( k` QR and
//! `GS v 0` rasters included, exactly as a printer on a cable does. `printjobid` allows 1
//! to 30 letters, digits, `_`, `-`, `.`: the first 30 hex digits of the message id.
//!
//! The result's `status` and a status notification's `asbstatus` are the same ASB flags,
//! decimal in the one and `0x` hex in the other: ASB_OFF_LINE 0x8, ASB_COVER_OPEN 0x20,
//! ASB_MECHANICAL_ERR 0x400, ASB_AUTOCUTTER_ERR 0x800, ASB_UNRECOVER_ERR 0x2000,
//! ASB_AUTORECOVER_ERR 0x4000, ASB_RECEIPT_NEAR_END 0x20000, ASB_RECEIPT_END 0x80000; other
//! bits are not read.

use crate::deliver::cloudprnt::status::Condition;

/// Longest `printjobid`, characters.
pub const MAX_JOB_ID: usize = 30;

/// The print timeout given with each job, ms (Epson's examples use it).
pub const PRINT_TIMEOUT_MS: u32 = 10_000;

/// ASB flags read (module docs).
const ASB_OFF_LINE: u32 = 0x8;
const ASB_COVER_OPEN: u32 = 0x20;
const ASB_ERRORS: u32 = 0x400 | 0x800 | 0x2000 | 0x4000;
const ASB_RECEIPT_NEAR_END: u32 = 0x20000;
const ASB_RECEIPT_END: u32 = 0x80000;

/// The `printjobid` of the job whose message id is `message_id`.
pub fn job_id(message_id: &str) -> &str {
    message_id.get(..MAX_JOB_ID).unwrap_or(message_id)
}

/// The answer to a poll carrying one job: `escpos` under `printjobid` [`job_id`]`(message_id)`.
pub fn print_request(message_id: &str, escpos: &[u8]) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<PrintRequestInfo Version=\"2.00\"><ePOSPrint><Parameter>\
         <devid>local_printer</devid><timeout>{PRINT_TIMEOUT_MS}</timeout><printjobid>{}</printjobid></Parameter>\
         <PrintData><epos-print xmlns=\"http://www.epson-pos.com/schemas/2011/03/epos-print\"><command>{}</command>\
         </epos-print></PrintData></ePOSPrint></PrintRequestInfo>",
        job_id(message_id),
        hex::encode(escpos)
    )
}

/// One job's result from a `PrintResponseInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobResult {
    /// Its `printjobid`; `None` in a version 1.00 document, which names no job.
    pub job_id: Option<String>,
    /// `success` (`true`/`1`).
    pub success: bool,
    /// `code`: empty on success, else `EPTR_REC_EMPTY`, `SchemaError`…
    pub code: String,
    /// `status`: the ASB flags.
    pub asb: u32,
}

/// The results of a `ResponseFile`, in document order.
///
/// # Errors
/// Not XML, or no `response` element.
pub fn print_results(xml: &str) -> Result<Vec<JobResult>, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| e.to_string())?;
    let read = |response: roxmltree::Node<'_, '_>, job_id: Option<String>| JobResult {
        job_id,
        success: matches!(response.attribute("success"), Some("true" | "1")),
        code: response.attribute("code").unwrap_or_default().to_string(),
        asb: response.attribute("status").and_then(|s| s.trim().parse().ok()).unwrap_or(0),
    };
    let named = |n: &roxmltree::Node<'_, '_>, name: &str| n.is_element() && n.tag_name().name() == name;
    let mut out = Vec::new();
    for job in doc.descendants().filter(|n| named(n, "ePOSPrint")) {
        let id =
            job.descendants().find(|n| named(n, "printjobid")).and_then(|n| n.text()).map(|t| t.trim().to_string());
        if let Some(response) = job.descendants().find(|n| named(n, "response")) {
            out.push(read(response, id));
        }
    }
    if out.is_empty() {
        // Version 1.00: the responses sit under the root, naming no job.
        out.extend(doc.descendants().filter(|n| named(n, "response")).map(|r| read(r, None)));
    }
    if out.is_empty() {
        return Err("no response element".into());
    }
    Ok(out)
}

/// The ASB flags of a status notification's first `printerstatus` (`asbstatus="0x…"`).
///
/// # Errors
/// Not XML, or no readable `asbstatus`.
pub fn status_flags(xml: &str) -> Result<u32, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| e.to_string())?;
    let text = doc
        .descendants()
        .find(|n| n.is_element() && n.tag_name().name() == "printerstatus")
        .and_then(|n| n.attribute("asbstatus"))
        .ok_or("no printerstatus asbstatus")?;
    let hex = text.trim().trim_start_matches("0x").trim_start_matches("0X");
    u32::from_str_radix(hex, 16).map_err(|e| format!("asbstatus {text:?}: {e}"))
}

/// The condition ASB `flags` say.
pub fn condition(flags: u32) -> Condition {
    Condition {
        offline: flags & ASB_OFF_LINE != 0 && flags & (ASB_COVER_OPEN | ASB_RECEIPT_END | ASB_ERRORS) == 0,
        cover_open: flags & ASB_COVER_OPEN != 0,
        paper_out: flags & ASB_RECEIPT_END != 0,
        paper_near_end: flags & ASB_RECEIPT_NEAR_END != 0,
        error: flags & ASB_ERRORS != 0,
    }
}

/// What a failed result's `code` means for its job: `true` when the job itself cannot
/// print (`SchemaError`, `RequestEntityTooLarge`: sending it again changes nothing), `false`
/// when the printer's condition or a passing fault stopped it (`EPTR_REC_EMPTY`,
/// `EPTR_COVER_OPEN`, `EX_TIMEOUT`…): it is offered again.
pub fn permanent(code: &str) -> bool {
    matches!(code, "SchemaError" | "RequestEntityTooLarge")
}

/// Whether a failed result's `code` says its job never reached the print mechanism: the
/// document refused (`SchemaError`, `RequestEntityTooLarge`) or the printer device not
/// reached (`DeviceNotFound`, `EX_BADPORT`, `JobNotFound`). The others (`EPTR_REC_EMPTY`,
/// `EPTR_COVER_OPEN`, `EPTR_CUTTER`, `EX_TIMEOUT`…) may come part-way through the job or
/// after it printed (a cutter fault), or are not known here: some of it may be on paper.
pub fn never_printed(code: &str) -> bool {
    permanent(code) || matches!(code, "DeviceNotFound" | "EX_BADPORT" | "JobNotFound")
}

#[cfg(test)]
mod tests {
    use super::*;
    use device_protocol::PrinterState;

    #[test]
    fn a_job_is_its_escpos_in_hex_under_its_job_id() {
        let id = "0123456789abcdef0123456789abcdef";
        let xml = print_request(id, &[0x1b, 0x40, b'O', b'K', 0x0a]);
        let doc = roxmltree::Document::parse(&xml).unwrap();
        let text = |name: &str| doc.descendants().find(|n| n.tag_name().name() == name).unwrap().text().unwrap();
        assert_eq!(doc.root_element().attribute("Version"), Some("2.00"));
        assert_eq!(text("printjobid"), "0123456789abcdef0123456789abcd");
        assert_eq!(text("printjobid").len(), MAX_JOB_ID);
        assert_eq!(text("devid"), "local_printer");
        assert_eq!(text("command"), "1b404f4b0a");
        let epos = doc.descendants().find(|n| n.tag_name().name() == "epos-print").unwrap();
        assert_eq!(epos.tag_name().namespace(), Some("http://www.epson-pos.com/schemas/2011/03/epos-print"));
    }

    #[test]
    fn results_of_both_versions_are_read() {
        let v2 = r#"<PrintResponseInfo Version="2.00"><ePOSPrint><Parameter><devid>local_printer</devid><printjobid>abc</printjobid></Parameter><PrintResponse><response xmlns="http://www.epson-pos.com/schemas/2011/03/epos-print" success="false" code="EPTR_REC_EMPTY" status="524296" battery="0"/></PrintResponse></ePOSPrint><ePOSPrint><Parameter><printjobid>def</printjobid></Parameter><PrintResponse><response success="true" code="" status="2"/></PrintResponse></ePOSPrint></PrintResponseInfo>"#;
        let got = print_results(v2).unwrap();
        assert_eq!(
            got,
            [
                JobResult { job_id: Some("abc".into()), success: false, code: "EPTR_REC_EMPTY".into(), asb: 0x80008 },
                JobResult { job_id: Some("def".into()), success: true, code: String::new(), asb: 2 },
            ]
        );
        let v1 = r#"<PrintResponseInfo><response success="1" code="" status="2"/></PrintResponseInfo>"#;
        assert_eq!(print_results(v1).unwrap()[0].job_id, None);
        assert!(print_results(v1).unwrap()[0].success);
        assert!(print_results("<a/>").is_err());
        assert!(print_results("not xml").is_err());
    }

    #[test]
    fn status_flags_read_as_conditions() {
        let xml = r#"<statusmonitor Version="1.00"><printerstatus devicename="local_printer" asbstatus="0x00080008"/></statusmonitor>"#;
        let flags = status_flags(xml).unwrap();
        assert_eq!(flags, 0x80008);
        assert_eq!(condition(flags).status().printer, Some(PrinterState::PaperOut));
        assert_eq!(condition(0x28).status().printer, Some(PrinterState::CoverOpen));
        assert!(!condition(0x8).status().online, "off line alone");
        assert_eq!(condition(0).status().printer, Some(PrinterState::Ready));
        assert_eq!(condition(0x20000).status().printer, Some(PrinterState::PaperNearEnd));
        // Epson's manual's own example value, with bits it does not list.
        assert!(condition(0x0F03_0016).status().online);
        assert!(status_flags("<statusmonitor/>").is_err());
        assert!(permanent("SchemaError") && !permanent("EPTR_REC_EMPTY") && !permanent("EX_TIMEOUT"));
    }
}
