//! A CloudPRNT printer's condition from its poll: the `statusCode` it sends (always) and
//! its `status`, the printer's Automatic Status Back bytes (ASB) as hex text, read as the
//! device protocol's [`Status`] the dispatcher holds a queue by.
//!
//! `statusCode` (Star CloudPRNT protocol guide, "Printer status codes"): three digits and
//! an optional description, URL-encoded even inside JSON (`200%20OK`); 2xx online (`211`
//! paper low), `410` out of paper, `411`/`412` other paper errors, `42x` cover open, other
//! 4xx an error. 5xx codes are about a job's data, not the printer's condition.
//!
//! `status` (Star Line Mode command specification, "Automatic Status"): bytes as hex
//! separated by white space (`"23 86 00 00 00 00 00 00 00"`, or unpadded `"23 6 0 0 0"`).
//! Counted from 1: byte 3 bit 3 offline, bit 5 cover open; byte 4 bits 2, 3, 5, 6
//! mechanical, auto-cutter, unrecoverable and head-temperature errors; byte 6 bit 3 paper
//! end, bits 1 and 2 paper near end. A status too short to reach byte 6 is not read.
//! Either source reporting a condition is enough: a fault read from one is never cleared
//! by the other.

use device_protocol::{PrinterState, Status};

/// Bytes an ASB must have to be read (up to the paper sensor's byte 6).
const ASB_MIN: usize = 6;

/// What a poll says of the printer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Condition {
    /// Offline: a 4xx code other than those below, no code, or ASB byte 3 bit 3.
    pub offline: bool,
    /// Cover open.
    pub cover_open: bool,
    /// Paper end.
    pub paper_out: bool,
    /// Paper near end (still prints).
    pub paper_near_end: bool,
    /// A mechanical, cutter, temperature or other paper error.
    pub error: bool,
}

impl Condition {
    /// Reads a poll's `statusCode` and `status` (module docs).
    pub fn read(status_code: &str, asb: Option<&str>) -> Condition {
        let code = decode(status_code);
        let digits: String = code.trim_start().chars().take_while(char::is_ascii_digit).collect();
        let code: u16 = digits.parse().unwrap_or(0);
        let mut c = Condition {
            offline: !(200..300).contains(&code) && !(500..600).contains(&code),
            cover_open: (420..430).contains(&code),
            paper_out: code == 410,
            paper_near_end: code == 210 || code == 211,
            error: false,
        };
        let bytes: Option<Vec<u8>> =
            asb.and_then(|t| t.split_whitespace().map(|b| u8::from_str_radix(b, 16)).collect::<Result<_, _>>().ok());
        if let Some(b) = bytes.filter(|b| b.len() >= ASB_MIN) {
            c.offline |= b[2] & 0x08 != 0;
            c.cover_open |= b[2] & 0x20 != 0;
            c.error |= b[3] & (0x04 | 0x08 | 0x20 | 0x40) != 0;
            c.paper_out |= b[5] & 0x08 != 0;
            c.paper_near_end |= b[5] & 0x06 != 0;
        }
        c
    }

    /// As the device protocol says it, the worst first (as a direct printer's `DLE EOT`):
    /// cover open, paper out, then an error or offline for another cause as `online:
    /// false`, then near end, else ready.
    pub fn status(&self) -> Status {
        let (online, printer) = if self.cover_open {
            (true, Some(PrinterState::CoverOpen))
        } else if self.paper_out {
            (true, Some(PrinterState::PaperOut))
        } else if self.offline || self.error {
            (false, None)
        } else if self.paper_near_end {
            (true, Some(PrinterState::PaperNearEnd))
        } else {
            (true, Some(PrinterState::Ready))
        };
        Status { v: 1, online, printer }
    }
}

/// `text` URL-decoded (`%20` and `+` as spaces); as is where it is not valid UTF-8 after.
pub fn decode(text: &str) -> String {
    let spaced = text.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced).decode_utf8().map_or(spaced.clone(), |s| s.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(code: &str, asb: Option<&str>) -> (bool, Option<PrinterState>) {
        let s = Condition::read(code, asb).status();
        (s.online, s.printer)
    }

    /// The guide's codes and the ASB bits, each alone and together; neither clears a
    /// fault the other reports.
    #[test]
    fn status_codes_and_asb_bits() {
        let ready = Some("23 86 00 00 00 00 00 00 00");
        assert_eq!(state("200%20OK", ready), (true, Some(PrinterState::Ready)));
        assert_eq!(state("200 OK", None), (true, Some(PrinterState::Ready)));
        assert_eq!(state("211%20Paper%20Low", ready), (true, Some(PrinterState::PaperNearEnd)));
        assert_eq!(state("410%20Out%20of%20Paper", ready), (true, Some(PrinterState::PaperOut)));
        assert_eq!(state("420%20Cover%20Open", None), (true, Some(PrinterState::CoverOpen)));
        assert_eq!(state("411%20Paper%20Jam", None), (false, None), "another paper error");
        assert_eq!(state("", None), (false, None), "no code is no word that it is fine");
        // ASB alone: the guide's own example, unpadded, is ready.
        assert_eq!(state("200", Some("23 6 0 0 0 0 0 0 0 ")), (true, Some(PrinterState::Ready)));
        assert_eq!(state("200", Some("23 86 28 00 00 00 00 00 00")), (true, Some(PrinterState::CoverOpen)));
        assert_eq!(state("200", Some("23 86 08 00 00 08 00 00 00")), (true, Some(PrinterState::PaperOut)));
        assert_eq!(state("200", Some("23 86 00 00 00 04 00 00 00")), (true, Some(PrinterState::PaperNearEnd)));
        assert_eq!(state("200", Some("23 86 00 08 00 00 00 00 00")), (false, None), "auto-cutter error");
        assert_eq!(state("200", Some("23 86 08 00 00 00 00 00 00")), (false, None), "offline");
        // A short or garbled ASB is not read; the code still is.
        assert_eq!(state("410", Some("23 86 00")), (true, Some(PrinterState::PaperOut)));
        assert_eq!(state("200", Some("zz 86 00 00 00 08")), (true, Some(PrinterState::Ready)));
        // A 5xx is about a job's data: the printer itself is fine.
        assert_eq!(state("510%20Incompatible%20Media", None), (true, Some(PrinterState::Ready)));
    }
}
