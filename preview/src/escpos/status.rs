//! `DLE EOT n` (`10 04 n`) real-time status: the one byte an Epson TM-T20-class printer
//! sends back at once, whatever it is doing, for its simulated paper and cover sensors.
//!
//! Source: Epson ESC/POS Command Reference, `DLE EOT`, and python-escpos's masks
//! (`constants.py`: online 8, paper 18, low paper 30, no paper 114). Every reply has the
//! fixed pattern `0xx1xx10`: bit 0 = 0, bit 1 = 1, bit 4 = 1, bit 7 = 0, so the baseline
//! ("nothing to report") is `0x12`.
//!
//! | n | what | bits this simulator sets |
//! |---|---|---|
//! | 1 | printer status | bit 3 offline (paper out or cover open). Bit 2 (drawer pin 3) stays 0: no drawer; bits 5, 6 (waiting for recovery, feed button) stay 0 |
//! | 2 | offline cause | bit 2 cover open, bit 5 printing stopped by paper end. Bits 3 (feed button) and 6 (error) stay 0: an idle printer with its cover open or its paper out is offline, not in error |
//! | 3 | error cause | none: autocutter, unrecoverable and auto-recoverable errors are not simulated (`0x12`) |
//! | 4 | roll paper sensor | bits 2+3 near end, bits 5+6 paper end |
//!
//! A roll that has run out also reads "near end" on the near-end sensor (it watches the
//! roll's diameter), so paper out answers `0x7E` to `n = 4`, which python-escpos, masking
//! with 114 (`0x72`), reads as "no paper". Other `n` (7 ink, 8 peeler, 18 multi-byte
//! status) belong to printers with those parts: a TM-T20 has none and sends nothing.

/// The bits every `DLE EOT` reply has set: bit 1 and bit 4 (`0xx1xx10`).
pub const FIXED_BITS: u8 = 0x12;

/// What the simulated sensors and switches say (settable on the command line and at run time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrinterCondition {
    /// The roll-paper end sensor sees no paper: the printer stops and goes offline.
    pub paper_out: bool,
    /// The near-end sensor sees a thin roll: still prints.
    pub paper_near_end: bool,
    /// The roll-paper cover is open: the printer goes offline.
    pub cover_open: bool,
    /// Switched offline (the feed button held, a buffer-full or macro state): answers
    /// `DLE EOT 1` offline and prints nothing until back.
    pub offline: bool,
    /// Busy: takes its input slowly (a small receive buffer, read a little at a time), so a
    /// sender's flow control (a full TCP window, RTS/CTS, XON/XOFF) holds it back.
    pub slow: bool,
}

impl PrinterCondition {
    /// Whether the printer prints what it receives (no paper-out, no open cover).
    pub fn can_print(&self) -> bool {
        !self.paper_out && !self.cover_open && !self.offline
    }

    /// The same condition as the device protocol's printer state (the worst one wins:
    /// cover open, then paper out, then near end).
    pub fn state(&self) -> device_protocol::PrinterState {
        use device_protocol::PrinterState::*;
        if self.cover_open {
            CoverOpen
        } else if self.paper_out {
            PaperOut
        } else if self.paper_near_end {
            PaperNearEnd
        } else {
            Ready
        }
    }
}

/// The byte a TM-T20-class printer in `condition` answers to `DLE EOT n`, or `None` for an
/// `n` it does not answer (see the module table).
pub fn dle_eot_reply(n: u8, condition: &PrinterCondition) -> Option<u8> {
    let c = condition;
    let bit = |on: bool, mask: u8| if on { mask } else { 0 };
    let byte = match n {
        1 => bit(!c.can_print(), 0x08),
        2 => bit(c.cover_open, 0x04) | bit(c.paper_out, 0x20),
        3 => 0,
        4 => bit(c.paper_near_end || c.paper_out, 0x0C) | bit(c.paper_out, 0x60),
        _ => return None,
    };
    Some(FIXED_BITS | byte)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(paper_out: bool, paper_near_end: bool, cover_open: bool) -> PrinterCondition {
        PrinterCondition { paper_out, paper_near_end, cover_open, ..PrinterCondition::default() }
    }

    /// The reply bytes the notes list for each condition.
    #[test]
    fn replies_match_the_reference_values() {
        let ready = cond(false, false, false);
        assert_eq!([1, 2, 3, 4].map(|n| dle_eot_reply(n, &ready)), [Some(0x12); 4]);
        assert_eq!(dle_eot_reply(1, &cond(true, false, false)), Some(0x1A), "offline");
        assert_eq!(dle_eot_reply(2, &cond(false, false, true)), Some(0x16), "cover open");
        assert_eq!(dle_eot_reply(2, &cond(true, false, false)), Some(0x32), "paper end stop");
        assert_eq!(dle_eot_reply(4, &cond(false, true, false)), Some(0x1E), "near end");
        assert_eq!(dle_eot_reply(4, &cond(true, false, false)), Some(0x7E), "out, near-end sensor too");
        assert_eq!(dle_eot_reply(1, &cond(false, true, false)), Some(0x12), "near end still online");
        for n in [0, 5, 7, 8, 18] {
            assert_eq!(dle_eot_reply(n, &ready), None);
        }
    }

    /// Every reply of every condition has the fixed bits `0xx1xx10`, and python-escpos's
    /// masks read it right (paper: 114 no paper, 30 low; online: bit 3 clear).
    #[test]
    fn fixed_bits_and_python_escpos_masks() {
        for bits in 0..8u8 {
            let c = cond(bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
            for n in 1..=4 {
                let b = dle_eot_reply(n, &c).unwrap();
                assert_eq!(b & 0b1001_0011, 0b0001_0010, "n={n} {c:?}: {b:#04x}");
            }
            let paper = dle_eot_reply(4, &c).unwrap();
            assert_eq!(paper & 114 == 114, c.paper_out, "{c:?}");
            assert_eq!(paper & 30 == 30, c.paper_out || c.paper_near_end, "{c:?}");
            assert_eq!(dle_eot_reply(1, &c).unwrap() & 8 == 0, c.can_print(), "{c:?}");
        }
    }
}
