//! Byte stream → ESC/POS commands.
//!
//! The parser only splits the stream: it knows how long every command it recognises is
//! (so that an unsupported command is skipped whole and its parameters never print as
//! text), and it never trusts a length field beyond the bytes that are really there.
//! What a command *does* is up to [`super::decode`].

use super::Warnings;

/// One parsed element of the stream. Slices borrow from the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// A byte 0x20..=0xFF outside a command: a character in the code table in force.
    Text(u8),
    /// LF: print the line buffer and feed one line.
    LineFeed,
    /// FF in standard mode: treated as print and feed one line.
    FormFeed,
    /// HT: move to the next tab stop.
    Tab,
    /// CR: ignored (auto line feed off, as on most thermal models).
    CarriageReturn,
    /// ESC @
    Init,
    /// ESC t n
    CodeTable(u8),
    /// ESC ! n
    PrintMode(u8),
    /// GS ! n
    CharSize(u8),
    /// ESC E n / ESC G n (LSB = on)
    Emphasis(bool),
    /// ESC - n (0 off, 1 one dot, 2 two dots)
    Underline(u8),
    /// ESC a n (0 left, 1 centre, 2 right)
    Justify(u8),
    /// ESC M n (0 font A, 1 font B, 2 font C)
    Font(u8),
    /// ESC SP n: right-side character spacing in dots
    CharSpacing(u8),
    /// ESC d n: print and feed n lines
    FeedLines(u8),
    /// ESC J n: print and feed n dots
    FeedDots(u8),
    /// ESC e n / ESC K n: print and feed n lines backwards (cannot be shown on a roll)
    ReverseFeed(&'static str, u8),
    /// ESC 2
    DefaultLineSpacing,
    /// ESC 3 n
    LineSpacing(u8),
    /// GS B n (LSB = on)
    Reverse(bool),
    /// GS ( k pL pH cn fn params…: 2-D symbols. `params` excludes cn and fn.
    Symbol {
        /// Symbol type `cn`: 49 QR code, 48 PDF417.
        cn: u8,
        /// Function byte `fn`. QR: 65 model, 67 module size, 69 error correction, 80 store
        /// data, 81 print, 82 size information (Epson's functions 165..=182); PDF417: 80
        /// store data, 81 print.
        func: u8,
        /// The bytes after cn and fn, as far as the length field `pL pH` covers and the
        /// stream holds.
        params: &'a [u8],
    },
    /// GS ( L / GS 8 L: graphics. `params` excludes m and fn.
    Graphics {
        /// Function number `fn`: 112 stores a graphic, 50 (or 2) prints it.
        func: u8,
        /// The bytes after m and fn, as far as the length field covers and the stream
        /// holds.
        params: &'a [u8],
    },
    /// GS v 0 m xL xH yL yH d…: `data` may be shorter than `x_bytes * height` when truncated.
    RasterImage {
        /// `m`: 0..=3 or `'0'..='3'`; bit 0 doubles the width, bit 1 the height.
        mode: u8,
        /// `xL xH`: bytes per row (8 dots each, MSB leftmost).
        x_bytes: u16,
        /// `yL yH`: rows, in dots.
        height: u16,
        /// The row data, `x_bytes` bytes per row.
        data: &'a [u8],
    },
    /// ESC * m nL nH d…: one line of column-format bit image.
    BitImage {
        /// `m`: 0 / 1 8-dot single / double density, 32 / 33 24-dot single / double
        /// density.
        mode: u8,
        /// `nL nH`: dot columns.
        columns: u16,
        /// 1 byte (8-dot modes) or 3 bytes (24-dot modes) per column, MSB at the top; may
        /// be shorter than `columns` says when the stream is truncated.
        data: &'a [u8],
    },
    /// GS k m: function A (m <= 6, NUL-terminated) or B (m >= 65, length-prefixed).
    Barcode {
        /// `m`, the barcode system: 0..=6 in function A, 65..=79 in function B (e.g. 73
        /// CODE128).
        kind: u8,
        /// The barcode data, without the NUL terminator or the length byte `n`.
        data: &'a [u8],
    },
    /// GS h n
    BarcodeHeight(u8),
    /// GS w n
    BarcodeWidth(u8),
    /// GS H n
    HriPosition(u8),
    /// GS f n
    HriFont(u8),
    /// GS V / ESC i / ESC m. `feed` is the n of functions B, C and D.
    Cut {
        /// `true` for a partial cut (one point left uncut), `false` for a full cut.
        partial: bool,
        /// Feed before cutting, in motion units (dots); 0 for the forms without it.
        feed: u8,
    },
    /// ESC p m t1 t2 / DLE DC4 1 m t
    Drawer {
        /// `m`, the connector pin: even (0 or 48) pin 2, odd (1 or 49) pin 5.
        pin: u8,
    },
    /// DLE EOT n: real-time status request
    StatusRequest(u8),
    /// A command that is recognised and consumed whole but not rendered.
    Skipped(&'static str),
    /// A byte sequence this parser does not know, consumed as `ESC x` / `GS x` / a control byte.
    Unknown(String),
}

const ESC: u8 = 0x1B;
const GS: u8 = 0x1D;
const FS: u8 = 0x1C;
const DLE: u8 = 0x10;

/// Iterates over the commands of a byte stream. Warnings about truncated or lying
/// commands go to the `Warnings` given to [`Parser::next_command`].
pub struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    /// A parser at the start of `bytes`, the whole stream.
    pub fn new(bytes: &'a [u8]) -> Self {
        Parser { bytes, pos: 0 }
    }

    /// Offset of the next unread byte.
    pub fn offset(&self) -> usize {
        self.pos
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Takes `n` bytes, or `None` (leaving the position at the end) when fewer remain.
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.remaining() < n {
            self.pos = self.bytes.len();
            return None;
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Some(s)
    }

    /// Takes up to `n` bytes; warns when fewer remain (a length field that lies).
    fn take_lying(&mut self, n: usize, what: &str, start: usize, w: &mut Warnings) -> &'a [u8] {
        let avail = self.remaining().min(n);
        if avail < n {
            w.push(format!(
                "{what} at offset {start}: length field says {n} data bytes but only {avail} remain; decoded what is there"
            ));
        }
        let s = &self.bytes[self.pos..self.pos + avail];
        self.pos += avail;
        s
    }

    /// Returns the next command, or `None` at the end of the stream (including when the
    /// stream ends in the middle of a command, which is recorded as a warning).
    pub fn next_command(&mut self, w: &mut Warnings) -> Option<Command<'a>> {
        let start = self.pos;
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        let cmd = match b {
            0x0A => Some(Command::LineFeed),
            0x0D => Some(Command::CarriageReturn),
            0x0C => Some(Command::FormFeed),
            0x09 => Some(Command::Tab),
            ESC => self.esc(start, w),
            GS => self.gs(start, w),
            FS => self.fs(start, w),
            DLE => self.dle(start, w),
            0x00 => Some(Command::Skipped("NUL")),
            0x01..=0x1F => Some(Command::Unknown(format!("0x{b:02X}"))),
            _ => Some(Command::Text(b)),
        };
        if cmd.is_none() {
            let name = describe_prefix(&self.bytes[start..]);
            w.push(format!("stream ends in the middle of {name} at offset {start}"));
            self.pos = self.bytes.len();
        }
        cmd
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }

    fn u16le(&mut self) -> Option<u16> {
        self.take(2).map(|s| u16::from_le_bytes([s[0], s[1]]))
    }

    fn esc(&mut self, start: usize, w: &mut Warnings) -> Option<Command<'a>> {
        let c = self.byte()?;
        Some(match c {
            b'@' => Command::Init,
            b't' => Command::CodeTable(self.byte()?),
            b'!' => Command::PrintMode(self.byte()?),
            b'E' | b'G' => Command::Emphasis(self.byte()? & 1 == 1),
            b'-' => Command::Underline(self.byte()?),
            b'a' => Command::Justify(self.byte()?),
            b'M' => Command::Font(self.byte()?),
            b' ' => Command::CharSpacing(self.byte()?),
            b'd' => Command::FeedLines(self.byte()?),
            b'J' => Command::FeedDots(self.byte()?),
            b'e' => Command::ReverseFeed("ESC e", self.byte()?),
            b'K' => Command::ReverseFeed("ESC K", self.byte()?),
            b'2' => Command::DefaultLineSpacing,
            b'3' => Command::LineSpacing(self.byte()?),
            b'i' => Command::Cut { partial: false, feed: 0 },
            b'm' => Command::Cut { partial: true, feed: 0 },
            b'p' => {
                let m = self.byte()?;
                let t = self.bytes.get(self.pos..self.pos + 2);
                match t {
                    Some(t) => {
                        if t.iter().any(|&x| matches!(x, ESC | GS | FS | DLE)) {
                            w.push(format!(
                                "ESC p at offset {start} is missing t1/t2: its pulse-time bytes {:02X} {:02X} start another command, which the printer swallows",
                                t[0], t[1]
                            ));
                        }
                        self.pos += 2;
                    }
                    None => {
                        w.push(format!("ESC p at offset {start} is missing t1/t2 (stream ends)"));
                        self.pos = self.bytes.len();
                    }
                }
                Command::Drawer { pin: m }
            }
            b'*' => {
                let m = self.byte()?;
                let n = self.u16le()?;
                let per_col = if m == 32 || m == 33 { 3 } else { 1 };
                let data = self.take_lying(n as usize * per_col, "ESC *", start, w);
                Command::BitImage { mode: m, columns: n, data }
            }
            b'R' => {
                let n = self.byte()?;
                if n == 0 {
                    Command::Skipped("ESC R 0")
                } else {
                    Command::Skipped("ESC R")
                }
            }
            b'{' => {
                self.byte()?;
                Command::Skipped("ESC {")
            }
            b'V' => {
                self.byte()?;
                Command::Skipped("ESC V")
            }
            b'r' => {
                self.byte()?;
                Command::Skipped("ESC r")
            }
            b'U' => {
                self.byte()?;
                Command::Skipped("ESC U")
            }
            b'T' => {
                self.byte()?;
                Command::Skipped("ESC T")
            }
            b'%' => {
                self.byte()?;
                Command::Skipped("ESC %")
            }
            b'?' => {
                self.byte()?;
                Command::Skipped("ESC ?")
            }
            b'=' => {
                self.byte()?;
                Command::Skipped("ESC =")
            }
            b'u' => {
                self.byte()?;
                Command::Skipped("ESC u")
            }
            b'v' => Command::Skipped("ESC v"),
            b'L' => Command::Skipped("ESC L"),
            b'S' => Command::Skipped("ESC S"),
            b'<' => Command::Skipped("ESC <"),
            b'$' => {
                self.take(2)?;
                Command::Skipped("ESC $")
            }
            b'\\' => {
                self.take(2)?;
                Command::Skipped("ESC \\")
            }
            b'W' => {
                self.take(8)?;
                Command::Skipped("ESC W")
            }
            b'c' => {
                self.take(2)?;
                Command::Skipped("ESC c")
            }
            b'f' => {
                self.take(2)?;
                Command::Skipped("ESC f")
            }
            b'D' => {
                // Tab positions: up to 32 bytes, NUL-terminated.
                let rest = &self.bytes[self.pos..];
                let end = rest.iter().take(33).position(|&x| x == 0);
                match end {
                    Some(i) => self.pos += i + 1,
                    None if rest.len() <= 32 => return None,
                    None => self.pos += 32,
                }
                Command::Skipped("ESC D")
            }
            b'&' => {
                // Define user characters: y c1 c2 then, per character, x and y*x bytes.
                let y = self.byte()? as usize;
                let c1 = self.byte()?;
                let c2 = self.byte()?;
                if c2 >= c1 {
                    for _ in c1..=c2 {
                        let x = self.byte()? as usize;
                        self.take_lying(x * y, "ESC &", start, w);
                    }
                }
                Command::Skipped("ESC &")
            }
            b'(' => {
                let f = self.byte()?;
                let len = self.u16le()? as usize;
                self.take_lying(len, "ESC (", start, w);
                Command::Unknown(format!("ESC ( {}", printable(f)))
            }
            other => Command::Unknown(format!("ESC {}", printable(other))),
        })
    }

    fn gs(&mut self, start: usize, w: &mut Warnings) -> Option<Command<'a>> {
        let c = self.byte()?;
        Some(match c {
            b'!' => Command::CharSize(self.byte()?),
            b'B' => Command::Reverse(self.byte()? & 1 == 1),
            b'h' => Command::BarcodeHeight(self.byte()?),
            b'w' => Command::BarcodeWidth(self.byte()?),
            b'H' => Command::HriPosition(self.byte()?),
            b'f' => Command::HriFont(self.byte()?),
            b'V' => {
                let m = self.byte()?;
                match m {
                    0 | 48 => Command::Cut { partial: false, feed: 0 },
                    1 | 49 => Command::Cut { partial: true, feed: 0 },
                    65 | 97 | 103 => Command::Cut { partial: false, feed: self.byte()? },
                    66 | 98 | 104 => Command::Cut { partial: true, feed: self.byte()? },
                    _ => Command::Unknown(format!("GS V {m}")),
                }
            }
            b'k' => {
                let m = self.byte()?;
                if m <= 6 {
                    // Function A: NUL-terminated.
                    let rest = &self.bytes[self.pos..];
                    match rest.iter().position(|&x| x == 0) {
                        Some(i) => {
                            self.pos += i + 1;
                            Command::Barcode { kind: m, data: &rest[..i] }
                        }
                        None => {
                            // Truncated or unterminated: real printers wait; we stop here.
                            w.push(format!("GS k at offset {start}: barcode data is not NUL-terminated"));
                            self.pos = self.bytes.len();
                            Command::Barcode { kind: m, data: rest }
                        }
                    }
                } else {
                    let n = self.byte()? as usize;
                    let data = self.take_lying(n, "GS k", start, w);
                    Command::Barcode { kind: m, data }
                }
            }
            b'v' => {
                let sub = self.byte()?;
                if sub != b'0' {
                    return Some(Command::Unknown(format!("GS v {}", printable(sub))));
                }
                let m = self.byte()?;
                let x = self.u16le()?;
                let y = self.u16le()?;
                let data = self.take_lying(x as usize * y as usize, "GS v 0", start, w);
                Command::RasterImage { mode: m, x_bytes: x, height: y, data }
            }
            b'(' => {
                let f = self.byte()?;
                let len = self.u16le()? as usize;
                let what = format!("GS ( {}", printable(f));
                let body = self.take_lying(len, &what, start, w);
                match f {
                    b'k' if body.len() >= 2 => Command::Symbol { cn: body[0], func: body[1], params: &body[2..] },
                    b'L' if body.len() >= 2 => Command::Graphics { func: body[1], params: &body[2..] },
                    b'k' | b'L' => {
                        w.push(format!("{what} at offset {start} is too short ({len} bytes)"));
                        Command::Unknown(what)
                    }
                    _ => Command::Unknown(what),
                }
            }
            b'8' => {
                let f = self.byte()?;
                let p = self.take(4)?;
                let len = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
                let what = format!("GS 8 {}", printable(f));
                let body = self.take_lying(len, &what, start, w);
                if f == b'L' && body.len() >= 2 {
                    Command::Graphics { func: body[1], params: &body[2..] }
                } else {
                    Command::Unknown(what)
                }
            }
            b'L' => {
                self.take(2)?;
                Command::Skipped("GS L")
            }
            b'W' => {
                self.take(2)?;
                Command::Skipped("GS W")
            }
            b'$' => {
                self.take(2)?;
                Command::Skipped("GS $")
            }
            b'\\' => {
                self.take(2)?;
                Command::Skipped("GS \\")
            }
            b'P' => {
                self.take(2)?;
                Command::Skipped("GS P")
            }
            b'a' => {
                self.byte()?;
                Command::Skipped("GS a")
            }
            b'b' => {
                self.byte()?;
                Command::Skipped("GS b")
            }
            b'r' => {
                self.byte()?;
                Command::Skipped("GS r")
            }
            b'I' => {
                self.byte()?;
                Command::Skipped("GS I")
            }
            b'T' => {
                self.byte()?;
                Command::Skipped("GS T")
            }
            b'E' => {
                self.byte()?;
                Command::Skipped("GS E")
            }
            b'j' => {
                self.byte()?;
                Command::Skipped("GS j")
            }
            b'/' => {
                self.byte()?;
                Command::Skipped("GS /")
            }
            b'^' => {
                self.take(3)?;
                Command::Skipped("GS ^")
            }
            b'z' => {
                self.take(3)?;
                Command::Skipped("GS z")
            }
            b'g' => {
                self.take(4)?;
                Command::Skipped("GS g")
            }
            b':' => Command::Skipped("GS :"),
            b'c' => Command::Skipped("GS c"),
            b'*' => {
                let x = self.byte()? as usize;
                let y = self.byte()? as usize;
                self.take_lying(x * y * 8, "GS *", start, w);
                Command::Skipped("GS *")
            }
            other => Command::Unknown(format!("GS {}", printable(other))),
        })
    }

    fn fs(&mut self, start: usize, w: &mut Warnings) -> Option<Command<'a>> {
        let c = self.byte()?;
        Some(match c {
            b'!' | b'-' | b'C' | b'W' => {
                self.byte()?;
                Command::Skipped(match c {
                    b'!' => "FS !",
                    b'-' => "FS -",
                    b'C' => "FS C",
                    _ => "FS W",
                })
            }
            b'&' => Command::Skipped("FS &"),
            b'.' => Command::Skipped("FS ."),
            b'S' => {
                self.take(2)?;
                Command::Skipped("FS S")
            }
            b'p' => {
                self.take(2)?;
                Command::Skipped("FS p")
            }
            b'2' => {
                self.take(2)?;
                self.take_lying(72, "FS 2", start, w);
                Command::Skipped("FS 2")
            }
            b'q' => {
                let n = self.byte()?;
                for _ in 0..n {
                    let x = self.u16le()? as usize;
                    let y = self.u16le()? as usize;
                    self.take_lying(x * y * 8, "FS q", start, w);
                }
                Command::Skipped("FS q")
            }
            b'(' => {
                let f = self.byte()?;
                let len = self.u16le()? as usize;
                let what = format!("FS ( {}", printable(f));
                self.take_lying(len, &what, start, w);
                Command::Unknown(what)
            }
            other => Command::Unknown(format!("FS {}", printable(other))),
        })
    }

    fn dle(&mut self, _start: usize, _w: &mut Warnings) -> Option<Command<'a>> {
        let c = self.byte()?;
        Some(match c {
            0x04 => Command::StatusRequest(self.byte()?),
            0x05 => {
                self.byte()?;
                Command::Skipped("DLE ENQ")
            }
            0x14 => {
                let f = self.byte()?;
                match f {
                    1 => {
                        let p = self.take(2)?;
                        Command::Drawer { pin: p[0] }
                    }
                    2 => {
                        self.take(2)?;
                        Command::Skipped("DLE DC4 2")
                    }
                    7 => {
                        self.take(1)?;
                        Command::Skipped("DLE DC4 7")
                    }
                    8 => {
                        self.take(7)?;
                        Command::Skipped("DLE DC4 8")
                    }
                    _ => Command::Unknown(format!("DLE DC4 {f}")),
                }
            }
            other => Command::Unknown(format!("DLE 0x{other:02X}")),
        })
    }
}

/// `ESC x` style name of a command byte: the ASCII letter when printable, else hex.
fn printable(b: u8) -> String {
    if (0x21..0x7F).contains(&b) {
        (b as char).to_string()
    } else {
        format!("0x{b:02X}")
    }
}

/// A short name for the command a truncated stream starts with.
fn describe_prefix(bytes: &[u8]) -> String {
    let lead = match bytes.first() {
        Some(&ESC) => "ESC",
        Some(&GS) => "GS",
        Some(&FS) => "FS",
        Some(&DLE) => "DLE",
        _ => return "a command".into(),
    };
    match bytes.get(1) {
        Some(&b) => format!("{lead} {}", printable(b)),
        None => lead.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(bytes: &[u8]) -> (Vec<Command<'_>>, Warnings) {
        let mut w = Warnings::default();
        let mut p = Parser::new(bytes);
        let mut out = vec![];
        while let Some(c) = p.next_command(&mut w) {
            out.push(c);
        }
        (out, w)
    }

    #[test]
    fn splits_text_and_commands() {
        let (c, w) = all(b"\x1b@A\x1bE\x01\n\x1dVA\x03");
        assert_eq!(
            c,
            vec![
                Command::Init,
                Command::Text(b'A'),
                Command::Emphasis(true),
                Command::LineFeed,
                Command::Cut { partial: false, feed: 3 }
            ]
        );
        assert!(w.is_empty());
    }

    #[test]
    fn truncated_command_warns() {
        let (c, w) = all(b"AB\x1d(k\x05");
        assert_eq!(c, vec![Command::Text(b'A'), Command::Text(b'B')]);
        assert_eq!(w.len(), 1, "{:?}", w.list());
        assert!(w.list()[0].contains("GS ("), "{:?}", w.list());
    }

    #[test]
    fn lying_length_is_capped_by_input() {
        let (c, w) = all(b"\x1dv0\x00\xff\x00\xff\x00\x01\x02");
        match &c[0] {
            Command::RasterImage { x_bytes: 255, height: 255, data, .. } => assert_eq!(data.len(), 2),
            other => panic!("{other:?}"),
        }
        assert!(w.list()[0].contains("length field"));
    }

    #[test]
    fn three_byte_esc_p_swallows_the_cut() {
        let (c, w) = all(b"\x1bp\x00\x1dVA\x01");
        assert_eq!(c, vec![Command::Drawer { pin: 0 }, Command::Text(b'A'), Command::Unknown("0x01".into())]);
        assert!(w.list()[0].contains("missing t1/t2"));
    }
}
