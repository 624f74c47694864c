//! A printer's real-time status: the replies to `DLE EOT n` (`10 04 n`).
//!
//! Each reply is one byte of the form `0xx1xx10` (bits 1 and 4 set, bits 0 and 7 clear);
//! what the other bits mean depends on `n` (Epson ESC/POS reference, `DLE EOT`; the field
//! notes' escpos §b):
//!
//! | n | asks | bits read here |
//! |---|---|---|
//! | 1 | printer | 3 offline |
//! | 2 | offline cause | 2 cover open, 5 printing stopped by paper end, 6 error |
//! | 3 | error cause | 3 autocutter error, 5 unrecoverable error, 6 auto-recoverable error |
//! | 4 | roll paper sensor | 2+3 paper near end, 5+6 paper end |
//!
//! A printer without a sensor does not answer that `n` (a missing reply reads as "not
//! reported", never as "fine").

use device_protocol::PrinterState;
use serde::Serialize;

/// The `DLE EOT` queries, n = 1 to 4, in the order they are asked.
pub const QUERIES: [u8; 4] = [1, 2, 3, 4];

/// Whether `b` has the shape of a `DLE EOT` reply (`0xx1xx10`).
pub fn is_reply(b: u8) -> bool {
    b & 0b1001_0011 == 0b0001_0010
}

/// What the printer answered, decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PrinterStatus {
    /// The raw replies to n = 1, 2, 3, 4 (`None`: no reply in time).
    pub replies: [Option<u8>; 4],
    /// n = 1 bit 3.
    pub offline: bool,
    /// n = 2 bit 2.
    pub cover_open: bool,
    /// n = 2 bit 5, or n = 4 bits 5+6.
    pub paper_out: bool,
    /// n = 4 bits 2+3 (without paper out).
    pub paper_near_end: bool,
    /// n = 2 bit 6, or any of n = 3 bits 3, 5, 6.
    pub error: bool,
}

impl PrinterStatus {
    /// Decodes the replies to n = 1..4 (a byte that is not a reply shape counts as none).
    pub fn decode(replies: [Option<u8>; 4]) -> PrinterStatus {
        let replies = replies.map(|r| r.filter(|b| is_reply(*b)));
        let bit = |i: usize, mask: u8| replies[i].is_some_and(|b| b & mask == mask);
        let paper_out = bit(1, 0x20) || bit(3, 0x60);
        PrinterStatus {
            replies,
            offline: bit(0, 0x08),
            cover_open: bit(1, 0x04),
            paper_out,
            paper_near_end: !paper_out && bit(3, 0x0C),
            error: bit(1, 0x40) || bit(2, 0x08) || bit(2, 0x20) || bit(2, 0x40),
        }
    }

    /// Whether the printer answered at all.
    pub fn answered(&self) -> bool {
        self.replies.iter().any(Option::is_some)
    }

    /// Whether a job written now would be printed: it answered, is online and has no
    /// open cover, paper end or error.
    pub fn can_print(&self) -> bool {
        self.answered() && !self.offline && !self.cover_open && !self.paper_out && !self.error
    }

    /// The device protocol's printer state, as an MQTT printer reports it (the worst wins:
    /// cover open, paper out, near end); `None` for what it has no word for (offline for
    /// another cause, an error, no answer).
    pub fn state(&self) -> Option<PrinterState> {
        if self.cover_open {
            Some(PrinterState::CoverOpen)
        } else if self.paper_out {
            Some(PrinterState::PaperOut)
        } else if !self.can_print() {
            None
        } else if self.paper_near_end {
            Some(PrinterState::PaperNearEnd)
        } else {
            Some(PrinterState::Ready)
        }
    }

    /// One word for people: `ready`, `paper_near_end`, `paper_out`, `cover_open`,
    /// `error`, `offline`, `no_answer`.
    pub fn summary(&self) -> &'static str {
        match self.state() {
            Some(PrinterState::Ready) => "ready",
            Some(PrinterState::PaperNearEnd) => "paper_near_end",
            Some(PrinterState::PaperOut) => "paper_out",
            Some(PrinterState::CoverOpen) => "cover_open",
            None if !self.answered() => "no_answer",
            None if self.error => "error",
            None => "offline",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference replies of the field notes (Epson; python-escpos's masks).
    #[test]
    fn reference_replies_decode_to_their_conditions() {
        let s = |r: [u8; 4]| PrinterStatus::decode(r.map(Some));
        assert_eq!(s([0x12; 4]).summary(), "ready");
        assert_eq!(s([0x16, 0x12, 0x12, 0x12]).summary(), "ready", "drawer pin 3 high is not a fault");
        assert_eq!(s([0x1A, 0x16, 0x12, 0x12]).summary(), "cover_open");
        assert_eq!(s([0x1A, 0x32, 0x12, 0x7E]).summary(), "paper_out");
        assert_eq!(s([0x12, 0x12, 0x12, 0x72]).summary(), "paper_out", "python-escpos's no-paper value");
        assert_eq!(s([0x12, 0x12, 0x12, 0x1E]).summary(), "paper_near_end");
        assert!(s([0x12, 0x12, 0x12, 0x1E]).can_print(), "near end still prints");
        assert_eq!(s([0x1A, 0x52, 0x1A, 0x12]).summary(), "error", "autocutter error");
        assert_eq!(s([0x1A, 0x12, 0x12, 0x12]).summary(), "offline");
        assert_eq!(PrinterStatus::decode([None; 4]).summary(), "no_answer");
        assert!(!PrinterStatus::decode([None; 4]).can_print());
        assert_eq!(PrinterStatus::decode([Some(b'A'), None, None, None]).summary(), "no_answer", "not a reply");
    }

    /// Every reply shape `0xx1xx10` is accepted and nothing else.
    #[test]
    fn reply_shape() {
        let shapes = (0u8..=255).filter(|b| is_reply(*b)).count();
        assert_eq!(shapes, 16, "four free bits");
        assert!(is_reply(0x12) && is_reply(0x7E) && !is_reply(0x13) && !is_reply(0x92) && !is_reply(0x10));
    }
}
