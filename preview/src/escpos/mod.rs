//! ESC/POS decoder: turns the bytes a receipt printer receives into the paper it prints
//! (a 1-bit PNG-able image exactly as wide as the print head) plus a text transcript.
//!
//! Layout: [`parser`] splits the stream into commands, [`state`] holds the print modes
//! `ESC @` resets, [`raster`] is the paper, [`text`] draws character cells, [`qr`] and
//! [`barcode`] draw symbols, [`images`] decodes `GS v 0`, `GS ( L` and `ESC *` data.
//! For a printer on a byte transport, [`stream`] splits a stream arriving in pieces into
//! whole commands and [`status`] answers `DLE EOT`.
//!
//! Printing follows an Epson TM-T20-class printer in standard mode: characters collect in a
//! line buffer and are printed by LF, `ESC d`, `ESC J` (or when the line is full), bottom
//! aligned, justified by the `ESC a` in force when the line started. Raster images, QR
//! codes and barcodes print as blocks of their own at the current justification.
//! Unknown commands are skipped whole where their length is known and counted in
//! [`Decoded::skipped`]; malformed input produces warnings, never a panic, and memory use is
//! bounded by the input length and [`DecodeOptions::max_height_dots`]. Once the paper
//! reaches that length the rest of the stream is parsed (so `DLE EOT` is still answered)
//! but not drawn, which also bounds the time a hostile stream costs.

pub mod barcode;
pub mod images;
pub mod parser;
pub mod qr;
pub mod raster;
pub mod state;
pub mod status;
pub mod stream;
pub mod text;

#[cfg(test)]
mod tests;

use parser::{Command, Parser};
use raster::{Bitmap, Page};
use render::codepage::CodePage;
use render::profile::{profile_for_model, ModelProfile, GENERIC};
use state::{Font, Justify, PrintState};
use std::collections::BTreeMap;
use text::Glyphs;

/// How the simulated printer is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Print head width in dots: 384 for 58 mm paper, 576 for 80 mm.
    pub width_dots: u32,
    /// The code table in force at power-on and after `ESC @` (usually CP437).
    pub initial_code_page: CodePage,
    /// The printer model whose `ESC t n` numbering to follow (vendors number their code
    /// tables differently: `render::profile`). [`GENERIC`] (Epson numbering) by default.
    pub model: &'static ModelProfile,
    /// Longest paper drawn, in dots (8 dots per mm): [`raster::MAX_HEIGHT`] (2.5 m) for a
    /// simulated printer, [`PREVIEW_MAX_HEIGHT`] for a dashboard preview.
    pub max_height_dots: u32,
}

/// Paper length a preview draws, in dots: 4000 dots is 50 cm, several receipts long.
pub const PREVIEW_MAX_HEIGHT: u32 = 4_000;

impl DecodeOptions {
    /// 58 mm paper (384 dots), CP437 at power-on.
    pub fn mm58() -> Self {
        DecodeOptions::preview(384).with_max_height(raster::MAX_HEIGHT)
    }

    /// 80 mm paper (576 dots), CP437 at power-on.
    pub fn mm80() -> Self {
        DecodeOptions::preview(576).with_max_height(raster::MAX_HEIGHT)
    }

    /// A preview of a job for a `width_dots` print head: CP437 at power-on, generic
    /// numbering, paper cut off at [`PREVIEW_MAX_HEIGHT`].
    pub fn preview(width_dots: u32) -> Self {
        DecodeOptions {
            width_dots,
            initial_code_page: CodePage::Cp437,
            model: &GENERIC,
            max_height_dots: PREVIEW_MAX_HEIGHT,
        }
    }

    /// These options with the paper cut off at `dots` (at least 1).
    pub fn with_max_height(self, dots: u32) -> Self {
        DecodeOptions { max_height_dots: dots.max(1), ..self }
    }

    /// These options, following the `ESC t` numbering of the model named `model` (a
    /// registry `model` string; unknown → generic, see `render::profile::profile_for_model`).
    pub fn with_model(self, model: &str) -> Self {
        DecodeOptions { model: profile_for_model(model), ..self }
    }
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions::mm80()
    }
}

/// What the printer printed, and what it made of the stream.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// Exactly `width_dots` wide, white paper (255) with black dots (0); as tall as printed.
    pub image: image::GrayImage,
    /// Text lines as printed, plus one marker line per non-text element:
    /// `[QR model2 ec=M module=6] <data>`, `[RASTER 200x120]`, `[GRAPHICS 200x120]`,
    /// `[BITIMAGE 200x24]`, `[BARCODE CODE128] <data>`, `[PDF417] <data>`, `[CUT full]`,
    /// `[CUT partial]`, `[DRAWER pin2]`.
    pub transcript: String,
    /// Data of each printed `GS ( k` QR symbol, in order.
    pub qr_codes: Vec<String>,
    /// Number of cuts (`GS V`, `ESC i`, `ESC m`).
    pub cuts: usize,
    /// Where each cut fell, in dots from the top of `image`, in order: the paper above a
    /// cut is one piece (the dashed line drawn for the cut lies below it).
    pub cut_rows: Vec<u32>,
    /// Unknown or unsupported commands, by name (`"GS L"`, `"ESC 0x07"`), counted.
    pub skipped: BTreeMap<String, usize>,
    /// Problems in the stream: truncation, lying lengths, raw UTF-8 text, short `ESC p` …
    pub warnings: Vec<String>,
    /// The `n` of every `DLE EOT n` real-time status request, in order (a transport may
    /// answer them; see [`status`] for the reply bytes).
    pub status_requests: Vec<u8>,
}

/// Warnings with a cap, so a hostile stream cannot grow them without bound.
#[derive(Debug, Default)]
pub struct Warnings {
    list: Vec<String>,
    dropped: usize,
}

impl Warnings {
    const MAX: usize = 200;

    /// Records warning `w`, or only counts it once 200 are held.
    pub fn push(&mut self, w: String) {
        if self.list.len() < Self::MAX {
            self.list.push(w);
        } else {
            self.dropped += 1;
        }
    }

    /// The warnings held, oldest first (without the ones only counted).
    pub fn list(&self) -> &[String] {
        &self.list
    }

    /// Every warning pushed, including the ones dropped past the cap.
    pub fn len(&self) -> usize {
        self.list.len() + self.dropped
    }

    /// Whether no warning was pushed at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn finish(mut self) -> Vec<String> {
        if self.dropped > 0 {
            self.list.push(format!("... and {} more warnings", self.dropped));
        }
        self.list
    }
}

/// Decodes a whole ESC/POS stream. Never panics; see the module documentation.
pub fn decode(bytes: &[u8], opts: &DecodeOptions) -> Decoded {
    let mut d = Decoder::new(opts);
    let mut parser = Parser::new(bytes);
    loop {
        let start = parser.offset();
        let Some(cmd) = parser.next_command(&mut d.warnings) else { break };
        if d.page.overflowed && !matches!(cmd, Command::StatusRequest(_)) {
            d.not_printed += 1;
            continue;
        }
        d.execute(cmd, bytes, start);
    }
    d.finish()
}

/// One element of the line buffer: a character cell or a piece of `ESC *` bit image.
struct LineItem {
    bitmap: std::rc::Rc<Bitmap>,
    /// Empty for bit images; the character(s) for text.
    text: String,
}

#[derive(Default)]
struct Line {
    items: Vec<LineItem>,
    width: u32,
    justify: Option<Justify>,
    bit_image: bool,
}

impl Line {
    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// How far to feed after printing the line buffer.
enum Feed {
    /// LF / `ESC d n`: n lines at the current line spacing (the first one at least as tall as the line).
    Lines(u32),
    /// `ESC J n`: n dots (at least the line's height).
    Dots(u32),
}

struct Decoder {
    opts: DecodeOptions,
    page: Page,
    state: PrintState,
    glyphs: Glyphs,
    line: Line,
    transcript: Vec<String>,
    /// Index in `transcript` of the last `[BITIMAGE]` marker, while bit-image lines follow each other.
    bit_image_marker: Option<(usize, u32, u32)>,
    qr_codes: Vec<String>,
    cuts: usize,
    cut_rows: Vec<u32>,
    skipped: BTreeMap<String, usize>,
    warnings: Warnings,
    status_requests: Vec<u8>,
    /// `GS ( L` fn 112: the graphic waiting for fn 50.
    graphics: Option<(Bitmap, (u32, u32))>,
    /// `GS ( k` PDF417 symbol storage.
    pdf417: Option<Vec<u8>>,
    /// An `ESC t n` selected a table this decoder does not know.
    unknown_table: bool,
    /// Commands parsed after the paper reached its maximum length.
    not_printed: usize,
}

impl Decoder {
    fn new(opts: &DecodeOptions) -> Self {
        Decoder {
            opts: opts.clone(),
            page: Page::new(opts.width_dots, opts.max_height_dots),
            state: PrintState::new(opts.initial_code_page),
            glyphs: Glyphs::new(opts.width_dots.max(1)),
            line: Line::default(),
            transcript: vec![],
            bit_image_marker: None,
            qr_codes: vec![],
            cuts: 0,
            cut_rows: Vec::new(),
            skipped: BTreeMap::new(),
            warnings: Warnings::default(),
            status_requests: vec![],
            graphics: None,
            pdf417: None,
            unknown_table: false,
            not_printed: 0,
        }
    }

    fn width(&self) -> u32 {
        self.page.width()
    }

    fn skip(&mut self, name: impl Into<String>) {
        *self.skipped.entry(name.into()).or_insert(0) += 1;
    }

    fn execute(&mut self, cmd: Command<'_>, bytes: &[u8], start: usize) {
        match cmd {
            Command::Text(b) => {
                if (0xC2..=0xF4).contains(&b) && !self.unknown_table {
                    self.check_utf8(bytes, start);
                }
                let c = self.state.code_page.decode_byte(b);
                self.add_char(c);
            }
            Command::LineFeed | Command::FormFeed => self.flush_line(Feed::Lines(1)),
            Command::CarriageReturn => {}
            Command::Tab => self.tab(),
            Command::Init => {
                if !self.line.is_empty() {
                    self.warnings.push(format!(
                        "ESC @ at offset {start} discarded {} unprinted characters",
                        self.line.items.len()
                    ));
                }
                self.line = Line::default();
                self.graphics = None;
                self.state = PrintState::new(self.opts.initial_code_page);
                self.unknown_table = false;
            }
            Command::CodeTable(n) => match self.opts.model.page_for_esc_t(n) {
                Some(p) => {
                    self.state.code_page = p;
                    self.unknown_table = false;
                }
                None => {
                    // The stream deliberately uses a table this decoder lacks: its bytes are
                    // shown under the previous table and not second-guessed as UTF-8.
                    self.unknown_table = true;
                    self.skip(format!("ESC t {n}"));
                }
            },
            Command::PrintMode(n) => self.state.apply_print_mode(n),
            Command::CharSize(n) => {
                if !self.state.apply_char_size(n) {
                    self.warnings.push(format!("GS ! 0x{n:02X} at offset {start}: size out of range, ignored"));
                }
            }
            Command::Emphasis(on) => self.state.style.bold = on,
            Command::Underline(n) => match n {
                0 | 48 => self.state.style.underline = 0,
                1 | 49 => self.state.style.underline = 1,
                2 | 50 => self.state.style.underline = 2,
                _ => {}
            },
            Command::Justify(n) => self.state.justify = Justify::from_param(n),
            Command::Font(n) => {
                self.state.style.font = match n {
                    0 | 48 => Font::A,
                    1 | 49 => Font::B,
                    _ => {
                        self.skip(format!("ESC M {n}"));
                        Font::B
                    }
                }
            }
            Command::CharSpacing(n) => self.state.style.right_spacing = n as u32,
            Command::FeedLines(n) => self.flush_line(Feed::Lines(n as u32)),
            Command::FeedDots(n) => self.flush_line(Feed::Dots(n as u32)),
            Command::ReverseFeed(name, _) => {
                self.skip(name);
                self.flush_line(Feed::Lines(1));
            }
            Command::DefaultLineSpacing => self.state.line_spacing = state::DEFAULT_LINE_SPACING,
            Command::LineSpacing(n) => self.state.line_spacing = n as u32,
            Command::Reverse(on) => self.state.style.reverse = on,
            Command::Symbol { cn, func, params } => self.symbol(cn, func, params, start),
            Command::Graphics { func, params } => self.graphics(func, params, start),
            Command::RasterImage { mode, x_bytes, height, data } => {
                let (b, (w, h), warn) = images::raster(mode, x_bytes, height, data, self.width());
                if let Some(warn) = warn {
                    self.warnings.push(format!("GS v 0 at offset {start}: {warn}"));
                }
                let marker = format!("[RASTER {w}x{h}]");
                self.print_block(b, marker);
            }
            Command::BitImage { mode, columns, data } => {
                let (b, w) = images::bit_image(mode, columns, data, self.width());
                if let Some(w) = w {
                    self.warnings.push(format!("ESC * at offset {start}: {w}"));
                }
                if b.width > 0 {
                    if self.line.width + b.width > self.width() && !self.line.is_empty() {
                        self.flush_line(Feed::Lines(1));
                    }
                    self.line.justify.get_or_insert(self.state.justify);
                    self.line.width += b.width;
                    self.line.bit_image = true;
                    self.line.items.push(LineItem { bitmap: b.into(), text: String::new() });
                }
            }
            Command::Barcode { kind, data } => self.barcode(kind, data, start),
            Command::BarcodeHeight(n) => self.state.barcode_height = (n as u32).max(1),
            Command::BarcodeWidth(n) => self.state.barcode_module = (n as u32).clamp(1, 6),
            Command::HriPosition(n) => {
                let n = if n >= 48 { n - 48 } else { n };
                self.state.hri_position = n & 3;
            }
            Command::HriFont(n) => self.state.hri_font = if n & 1 == 1 { Font::B } else { Font::A },
            Command::Cut { partial, feed } => {
                self.flush_pending();
                self.page.feed(feed as u32);
                self.cut_rows.push(self.page.y);
                let y = self.page.y + 4;
                self.page.dashed_line(y);
                self.page.feed(10);
                self.cuts += 1;
                self.push_marker(format!("[CUT {}]", if partial { "partial" } else { "full" }));
            }
            Command::Drawer { pin } => {
                let pin = if pin & 1 == 1 { 5 } else { 2 };
                self.push_marker(format!("[DRAWER pin{pin}]"));
            }
            Command::StatusRequest(n) => {
                if !(1..=4).contains(&n) && !(7..=8).contains(&n) && n != 18 {
                    self.warnings.push(format!("DLE EOT {n} at offset {start}: unknown status type"));
                }
                self.status_requests.push(n);
            }
            Command::Skipped(name) => self.skip(name),
            Command::Unknown(name) => self.skip(name),
        }
    }

    /// Warns when the text at `start` is a valid UTF-8 multi-byte sequence: the gateway
    /// must encode to the printer's code page and never send raw UTF-8.
    fn check_utf8(&mut self, bytes: &[u8], start: usize) {
        let lead = bytes[start];
        let len = match lead {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            _ => 4,
        };
        if let Some(seq) = bytes.get(start..start + len) {
            let Ok(s) = std::str::from_utf8(seq) else { return };
            // Only characters a Latin receipt would contain (accented letters, typographic
            // punctuation, currency): other valid sequences are far more likely legacy
            // code-page text that happens to look like UTF-8.
            let c = s.chars().next().unwrap_or(' ');
            let latin = matches!(c as u32, 0xA0..=0x24F | 0x2010..=0x2027 | 0x20A0..=0x20BF | 0x2122);
            if latin {
                self.warnings.push(format!(
                    "UTF-8 sequence {} ({s:?}) in text at offset {start}: printers do not decode UTF-8; it prints as {} characters",
                    seq.iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(" "),
                    len
                ));
            }
        }
    }

    fn add_char(&mut self, c: char) {
        let style = self.state.style;
        let b = self.glyphs.render(c, &style);
        if self.line.width + b.width > self.width() && !self.line.is_empty() {
            // The line is full: the printer prints it and goes on on the next one.
            self.flush_line(Feed::Lines(1));
        }
        self.line.justify.get_or_insert(self.state.justify);
        self.line.width += b.width;
        self.line.items.push(LineItem { bitmap: b, text: c.to_string() });
    }

    fn tab(&mut self) {
        let s = self.state.style;
        let (cw, ch) = s.font.cell();
        let col = (cw + s.right_spacing) * s.width_mul;
        let stop = 8 * col;
        let next = (self.line.width / stop + 1) * stop;
        if next > self.width() {
            return;
        }
        let gap = next - self.line.width;
        self.line.justify.get_or_insert(self.state.justify);
        self.line.width = next;
        let spaces = (gap / col.max(1)).max(1) as usize;
        self.line.items.push(LineItem { bitmap: Bitmap::new(gap, ch * s.height_mul).into(), text: " ".repeat(spaces) });
    }

    /// Prints what is in the line buffer (if anything) as if by LF.
    fn flush_pending(&mut self) {
        if !self.line.is_empty() {
            self.flush_line(Feed::Lines(1));
        }
    }

    fn flush_line(&mut self, feed: Feed) {
        let spacing = self.state.line_spacing;
        if self.line.is_empty() {
            match feed {
                Feed::Lines(n) => self.page.feed(n * spacing),
                Feed::Dots(n) => self.page.feed(n),
            }
            self.transcript.push(String::new());
            self.bit_image_marker = None;
            return;
        }
        let line = std::mem::take(&mut self.line);
        let h = line.items.iter().map(|i| i.bitmap.height).max().unwrap_or(0);
        let justify = line.justify.unwrap_or(Justify::Left);
        let mut x = justify.x(line.width, self.width());
        let top = self.page.y;
        let mut text = String::new();
        for item in &line.items {
            self.page.blit(&item.bitmap, x, top + (h - item.bitmap.height));
            x += item.bitmap.width;
            text.push_str(&item.text);
        }
        let text = text.trim_end().to_string();
        if line.bit_image {
            let w = line.width;
            match self.bit_image_marker {
                Some((i, mw, mh)) if text.is_empty() && i + 1 == self.transcript.len() => {
                    let (mw, mh) = (mw.max(w), mh + h);
                    self.transcript[i] = format!("[BITIMAGE {mw}x{mh}]");
                    self.bit_image_marker = Some((i, mw, mh));
                }
                _ => {
                    self.transcript.push(format!("[BITIMAGE {w}x{h}]"));
                    self.bit_image_marker = Some((self.transcript.len() - 1, w, h));
                }
            }
            if !text.is_empty() {
                self.transcript.push(text);
                self.bit_image_marker = None;
            }
        } else {
            self.transcript.push(text);
            self.bit_image_marker = None;
        }
        let advance = match feed {
            Feed::Lines(0) => h,
            Feed::Lines(n) => spacing.max(h + spacing.saturating_sub(24)) + (n - 1) * spacing,
            Feed::Dots(n) => n.max(h),
        };
        self.page.feed(advance);
    }

    fn push_marker(&mut self, m: String) {
        self.transcript.push(m);
        self.bit_image_marker = None;
    }

    /// Prints a block (image, symbol) at the current justification, on a line of its own.
    fn print_block(&mut self, b: Bitmap, marker: String) {
        self.flush_pending();
        if b.width > self.width() {
            let m: String = marker.chars().take(40).collect();
            self.warnings.push(format!(
                "{m} is {} dots wide, wider than the {}-dot paper: clipped",
                b.width,
                self.width()
            ));
        }
        let x = self.state.justify.x(b.width, self.width());
        let y = self.page.y;
        self.page.blit(&b, x, y);
        self.page.feed(b.height);
        self.push_marker(marker);
    }

    fn symbol(&mut self, cn: u8, func: u8, params: &[u8], start: usize) {
        match cn {
            49 => {
                let mut warns = vec![];
                let action = qr::apply(&mut self.state.qr, func, params, &mut |w| warns.push(w));
                for w in warns {
                    self.warnings.push(format!("{w} (offset {start})"));
                }
                match action {
                    qr::QrAction::Set => {}
                    qr::QrAction::SizeInfo => self.skip("GS ( k QR size info"),
                    qr::QrAction::Unknown(f) => self.skip(format!("GS ( k QR fn={f}")),
                    qr::QrAction::Print => self.print_qr(start),
                }
            }
            48 => {
                self.skip("GS ( k PDF417");
                match func {
                    80 => self.pdf417 = Some(params.get(1..).unwrap_or(&[]).to_vec()),
                    81 => match self.pdf417.clone() {
                        Some(data) => {
                            let text = String::from_utf8_lossy(&data).into_owned();
                            let b = self.placeholder("PDF417", 200.min(self.width()), 60);
                            self.print_block(b, format!("[PDF417] {text}"));
                        }
                        None => {
                            self.warnings.push(format!("GS ( k PDF417 print at offset {start} with no data stored"))
                        }
                    },
                    _ => {}
                }
            }
            other => self.skip(format!("GS ( k cn={other}")),
        }
    }

    fn print_qr(&mut self, start: usize) {
        let qr = self.state.qr.clone();
        let Some(data) = qr.data.as_ref() else {
            self.warnings.push(format!("GS ( k QR print at offset {start} with no data stored"));
            return;
        };
        if qr.model != 2 {
            self.warnings.push(format!("GS ( k QR model {} at offset {start}: drawn as model 2", qr.model));
        }
        match qr::render(&qr, data, self.width()) {
            Ok(b) => {
                let text = String::from_utf8_lossy(data).into_owned();
                let model = match qr.model {
                    1 => "model1",
                    3 => "micro",
                    _ => "model2",
                };
                let marker = format!("[QR {model} ec={} module={}] {text}", qr.ec, qr.module);
                self.print_block(b, marker);
                self.qr_codes.push(text);
            }
            Err(e) => self.warnings.push(format!("GS ( k QR print at offset {start}: {e}")),
        }
    }

    fn graphics(&mut self, func: u8, params: &[u8], start: usize) {
        match func {
            112 => match images::graphics_store(params, self.width()) {
                Ok((b, size, w)) => {
                    if let Some(w) = w {
                        self.warnings.push(format!("GS ( L fn 112 at offset {start}: {w}"));
                    }
                    self.graphics = Some((b, size));
                }
                Err(e) => {
                    self.warnings.push(format!("GS ( L fn 112 at offset {start}: {e}"));
                    self.skip("GS ( L fn=112");
                }
            },
            50 | 2 => match self.graphics.take() {
                Some((b, (w, h))) => {
                    let marker = format!("[GRAPHICS {w}x{h}]");
                    self.print_block(b, marker);
                }
                None => self.warnings.push(format!("GS ( L fn 50 at offset {start}: nothing stored to print")),
            },
            other => self.skip(format!("GS ( L fn={other}")),
        }
    }

    fn barcode(&mut self, kind: u8, data: &[u8], start: usize) {
        let name = barcode::kind_name(kind);
        let readable = barcode::readable(kind, data);
        let module = self.state.barcode_module;
        let height = self.state.barcode_height;
        let (bars, hri) = match barcode::encode(kind, data) {
            Some(Ok((modules, hri))) => (barcode::bars(&modules, module, height), hri),
            Some(Err(e)) => {
                self.warnings.push(format!("GS k {name} at offset {start}: {e}; not printed"));
                self.skip(format!("GS k {name} (invalid data)"));
                return;
            }
            None => {
                self.skip(format!("GS k {name} (placeholder)"));
                let w = ((data.len() as u32 * 11 + 35) * module).min(self.width());
                (self.placeholder(&name, w, height), readable.clone())
            }
        };
        let hri_font = self.state.hri_font;
        let hri_bitmap = self.hri(&hri, hri_font);
        let pos = self.state.hri_position;
        let gap = 4;
        let above = pos & 1 == 1;
        let below = pos & 2 == 2;
        let hh = hri_bitmap.height + gap;
        let w = bars.width.max(hri_bitmap.width);
        let h = bars.height + if above { hh } else { 0 } + if below { hh } else { 0 };
        let mut out = Bitmap::new(w, h);
        let mut y = 0;
        let hx = (w - hri_bitmap.width) / 2;
        let put = |out: &mut Bitmap, b: &Bitmap, x: u32, y: u32| {
            for by in 0..b.height {
                for bx in 0..b.width {
                    if b.get(bx, by) {
                        out.set(x + bx, y + by, true);
                    }
                }
            }
        };
        if above {
            put(&mut out, &hri_bitmap, hx, 0);
            y += hh;
        }
        put(&mut out, &bars, (w - bars.width) / 2, y);
        y += bars.height + gap;
        if below {
            put(&mut out, &hri_bitmap, hx, y);
        }
        self.print_block(out, format!("[BARCODE {name}] {readable}"));
    }

    /// A line of HRI (or label) characters in `font`, 1 × 1, no styles.
    fn hri(&mut self, s: &str, font: Font) -> Bitmap {
        let (cw, ch) = font.cell();
        let max_chars = (self.width() / cw) as usize;
        let chars: Vec<char> = s.chars().take(max_chars).collect();
        let mut b = Bitmap::new(cw * chars.len() as u32, ch);
        for (i, c) in chars.iter().enumerate() {
            let g = self.glyphs.cell(*c, font, false).clone();
            for y in 0..ch {
                for x in 0..cw {
                    if g.get(x, y) {
                        b.set(i as u32 * cw + x, y, true);
                    }
                }
            }
        }
        b
    }

    /// A box with `label` in it: a symbol this decoder cannot draw.
    fn placeholder(&mut self, label: &str, w: u32, h: u32) -> Bitmap {
        let w = w.max(20);
        let h = h.max(20);
        let mut b = Bitmap::new(w, h);
        b.fill_rect(0, 0, w, 2, true);
        b.fill_rect(0, h - 2, w, 2, true);
        b.fill_rect(0, 0, 2, h, true);
        b.fill_rect(w - 2, 0, 2, h, true);
        let t = self.hri(label, Font::B);
        if t.width + 4 <= w && t.height + 4 <= h {
            let (x0, y0) = ((w - t.width) / 2, (h - t.height) / 2);
            for y in 0..t.height {
                for x in 0..t.width {
                    if t.get(x, y) {
                        b.set(x0 + x, y0 + y, true);
                    }
                }
            }
        }
        b
    }

    fn finish(mut self) -> Decoded {
        if !self.line.is_empty() {
            let n = self.line.items.len();
            self.flush_line(Feed::Lines(1));
            self.warnings.push(format!(
                "stream ends with {n} characters not followed by LF: a printer would keep them in its buffer; printed here"
            ));
        }
        if self.page.overflowed {
            self.warnings.push(format!(
                "printout longer than {} dots: cut off, {} commands after it not printed",
                self.opts.max_height_dots, self.not_printed
            ));
        }
        // Trailing blank lines from the final feeds say nothing.
        while self.transcript.last().is_some_and(|l| l.is_empty()) {
            self.transcript.pop();
        }
        let mut transcript = self.transcript.join("\n");
        if !transcript.is_empty() {
            transcript.push('\n');
        }
        Decoded {
            image: self.page.into_image(),
            transcript,
            qr_codes: self.qr_codes,
            cuts: self.cuts,
            cut_rows: self.cut_rows,
            skipped: self.skipped,
            warnings: self.warnings.finish(),
            status_requests: self.status_requests,
        }
    }
}
