//! The receipts a thermal printer prints for a Pix charge, as ESC/POS bytes:
//! [`ReceiptKind::Paid`] (the charge was paid), [`ReceiptKind::PayWithPix`] (a slip with
//! the QR to pay, for printers set to print one when a charge becomes `ACTIVE`) and
//! [`ReceiptKind::Expired`] (the charge expired unpaid).
//!
//! Layout of the paid receipt (font A, 12 × 24-dot cells; Epson ESC/POS Command Reference):
//!
//! 1. `ESC @` then `ESC t n` for the profile's code page (always right after `ESC @`);
//! 2. centred, bold, double-size merchant name (wrapped at word boundaries), city, title;
//! 3. the amount in the receipt's locale format, bold and double size;
//! 4. line items as two columns (name left, wrapped at words; value right), comment (at
//!    most 8 lines), payer, paid-at in the receipt's time zone;
//! 5. the reference lines in **font B** (`ESC M 1`, 9 × 17-dot cells: 64 columns on 80 mm,
//!    42 on 58 mm, [`PrinterSetup::columns_font_b`]), the small print that identifies the
//!    payment for support and disputes rather than for the customer's eye: end-to-end id,
//!    charge id and txid, each after its label in the receipt's locale, on one line where
//!    it fits, else wrapped; then `ESC M 0`;
//! 6. a rule and the centred thanks;
//! 7. `ESC d 3` feed and `GS V A n` cut (`GS V B n` on models that cut partially).
//!
//! Never a QR on the paid receipt, even when [`Receipt::brcode`] is set: a static BR Code
//! carries the amount and stays payable, so a QR on proof of payment invites a second
//! payment. The end-to-end id and the txid identify the payment instead.
//!
//! The pay-with-Pix slip: the same header with the title "Pague com Pix", the amount,
//! items, charge id and txid (font B), then the BR Code as a QR (always: a slip without
//! one is an error; native `GS ( k` or a `GS v 0` raster, at half resolution with m = 3 on
//! models that take quadruple, centred and fitting the paper with a 4-module quiet zone,
//! module ≤ 6 dots), the scan hint and the expiry ("Válido até …") in the receipt's time
//! zone.
//!
//! The expiry notice: the same header with the title "Cobrança expirada", the amount, when
//! it expired, charge id and txid (font B), and the hint to ask for a new charge. Never a QR, even
//! when [`Receipt::brcode`] is set: an expired code must not be scannable from paper.
//!
//! Which `ESC t n`, how many dots, native QR or not and which cut come from the printer's
//! settings ([`PrinterProfile`]) on its model ([`crate::profile::ModelProfile`]), joined
//! by [`PrinterProfile::on_model`]; [`render_receipt`] assumes the generic model.
//!
//! All text goes through [`crate::escpos::printable`] (emoji dropped, control characters
//! neutralised) and [`crate::codepage::CodePage::encode_lossy`]; raw UTF-8 never reaches
//! the printer. Commands are written by [`crate::escpos::EscPos`].
//!
//! Text that is measured or wrapped is encoded once into a scratch buffer (one per receipt),
//! its spaces squeezed, and its lines copied from there into the job as slices: no vector
//! per line or per string. [`render_receipt_into`] also reuses the caller's job buffer.

use crate::codepage::CodePage;
use crate::escpos::{Align, EscPos, Font, RasterScale};
use crate::locale::{Label, Locale};
use crate::money::push_amount;
use crate::profile::{profile_for_model, CutStyle, ModelProfile, GENERIC};
use crate::qr;
use chrono::{DateTime, Utc};
use thiserror::Error;

/// Quiet zone around a printed QR, in modules (ISO/IEC 18004: 4).
pub const QR_QUIET_MODULES: u32 = 4;

/// Largest QR module printed, in dots (6 dots = 0.75 mm at 203 dpi). A bigger module only
/// wastes paper: a 186-byte BR Code (version 10, 57 modules) is then 43 mm wide, easy for
/// any phone camera. Smaller papers get the largest module that fits.
pub const MAX_MODULE_DOTS: u32 = 6;

/// Comments longer than this many lines are cut, ending in `...` (paper is not free).
pub const MAX_COMMENT_LINES: usize = 8;

/// A receipt printer's relevant settings (from the device registry's `printer` object).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrinterProfile {
    /// Paper roll width in millimetres: 58 or 80 (other values are treated as 80 when
    /// ≥ 70, else 58).
    pub paper_width_mm: u8,
    /// Character code table the printer is set to; selected with `ESC t n` on every job.
    pub code_page: CodePage,
    /// Whether the printer understands `GS ( k` QR commands; otherwise a `GS v 0` raster
    /// QR is sent.
    pub native_qr: bool,
}

impl PrinterProfile {
    /// Printable dots per line at 203 dpi: 58 mm → 384, 80 mm → 576.
    pub fn dots(&self) -> u32 {
        if self.paper_width_mm >= 70 {
            576
        } else {
            384
        }
    }

    /// Font A columns (12-dot cells): 58 mm → 32, 80 mm → 48.
    pub fn columns(&self) -> usize {
        (self.dots() / crate::profile::FONT_A_DOTS) as usize
    }

    /// Font B columns (9-dot cells): 58 mm → 42, 80 mm → 64.
    pub fn columns_font_b(&self) -> usize {
        (self.dots() / crate::profile::FONT_B_DOTS) as usize
    }

    /// These settings on the printer model named `model` (a registry `model` string, looked
    /// up with [`profile_for_model`]; unknown or empty → the generic ESC/POS model).
    pub fn on_model(self, model: &str) -> PrinterSetup {
        PrinterSetup { printer: self, model: profile_for_model(model) }
    }

    /// These settings on the generic ESC/POS model (what [`render_receipt`] uses).
    pub fn generic(self) -> PrinterSetup {
        PrinterSetup { printer: self, model: &GENERIC }
    }
}

/// A printer's settings ([`PrinterProfile`]) on its model ([`ModelProfile`]): everything a
/// receipt needs to know about the printer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrinterSetup {
    /// The device registry's settings.
    pub printer: PrinterProfile,
    /// What the model can do.
    pub model: &'static ModelProfile,
}

impl PrinterSetup {
    /// The `n` of `ESC t n` that selects the configured code page on this model.
    ///
    /// # Errors
    /// [`ReceiptError::CodePageUnsupported`] when the model has no such table (sending some
    /// other number would print the wrong letters without any error).
    pub fn esc_t(&self) -> Result<u8, ReceiptError> {
        self.model.esc_t(self.printer.code_page).ok_or(ReceiptError::CodePageUnsupported {
            code_page: self.printer.code_page.name(),
            model: self.model.model,
        })
    }

    /// Printable dots per line, in dots, for the configured paper on this model.
    pub fn dots(&self) -> u32 {
        self.model.dots_per_line(self.printer.paper_width_mm)
    }

    /// Font A columns (12-dot cells) for the configured paper on this model.
    pub fn columns(&self) -> usize {
        self.model.columns_font_a(self.printer.paper_width_mm)
    }

    /// Font B columns (9-dot cells) for the configured paper on this model: the small print.
    pub fn columns_font_b(&self) -> usize {
        self.model.columns_font_b(self.printer.paper_width_mm)
    }

    /// Whether to send a native `GS ( k` QR: the device is set to (`nativeQr`) *and* the
    /// model is known to print it; otherwise a `GS v 0` raster.
    pub fn native_qr(&self) -> bool {
        self.printer.native_qr && self.model.native_qr
    }

    /// How the job ends: the model's cut.
    pub fn cut(&self) -> CutStyle {
        self.model.cut
    }
}

/// What a receipt is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReceiptKind {
    /// A Pix charge was paid (charge `status` `COMPLETED`): proof of payment, never a QR
    /// (see the module documentation).
    #[default]
    Paid,
    /// A "Pay with Pix" slip: the QR to pay, amount, merchant and expiry, for printers set
    /// to print one when a charge becomes `ACTIVE`. Needs [`Receipt::brcode`].
    PayWithPix {
        /// The charge's `expiresDate`, printed in [`Receipt::time_zone`]; none → not printed.
        expires_at: Option<DateTime<Utc>>,
    },
    /// The charge expired unpaid (`status` `EXPIRED`): an expiry notice, never a QR.
    Expired {
        /// When it expired (`expiresDate`), printed in [`Receipt::time_zone`]; none → not printed.
        expired_at: Option<DateTime<Utc>>,
    },
}

/// Everything printed on a receipt, taken from a charge document.
#[derive(Debug, Clone, PartialEq)]
pub struct Receipt {
    /// Receipt type.
    pub kind: ReceiptKind,
    /// `merchant.name`, as spelled (accents kept; the code page decides what prints).
    pub merchant_name: String,
    /// `merchant.city`.
    pub merchant_city: String,
    /// Charge `value`, in centavos.
    pub amount_cents: u64,
    /// `additionalInfo` as (key, value) pairs, e.g. ("Pão de queijo", "3x").
    pub items: Vec<(String, String)>,
    /// Charge `comment`.
    pub comment: Option<String>,
    /// `payer.name`.
    pub payer_name: Option<String>,
    /// `paidAt`.
    pub paid_at: Option<DateTime<Utc>>,
    /// Time zone in which `paid_at` is printed (the shop's).
    pub time_zone: chrono_tz::Tz,
    /// `endToEndId` of the Pix transaction (32 characters, `E…`).
    pub end_to_end_id: Option<String>,
    /// The charge's `_id`.
    pub charge_id: String,
    /// `transactionID`.
    pub txid: Option<String>,
    /// The BR Code to print as a QR (dynamic `brCode` or the static payload) on a
    /// [`ReceiptKind::PayWithPix`] slip, which needs it. The paid receipt and the expiry
    /// notice never print it: a code that can still be paid must not be on their paper.
    pub brcode: Option<String>,
    /// Language of labels, date and amount format.
    pub locale: Locale,
}

/// Why a receipt could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReceiptError {
    /// The BR Code could not be encoded as a QR.
    #[error("cannot encode the BR Code as a QR code: {0}")]
    Qr(#[from] qr::QrError),
    /// The QR does not fit the paper even at 1 dot per module.
    #[error("a QR of {modules} modules (plus quiet zone) does not fit {dots} dots")]
    QrTooWide {
        /// The symbol's width, modules.
        modules: usize,
        /// The paper's printable width, dots.
        dots: u32,
    },
    /// The printer's model has no `ESC t` table for the configured code page.
    #[error("printer model {model} has no code table {code_page}")]
    CodePageUnsupported {
        /// The configured code page, e.g. `WPC1252`.
        code_page: &'static str,
        /// The printer model's profile name.
        model: &'static str,
    },
    /// A pay-with-Pix slip without a BR Code to print.
    #[error("a pay-with-Pix slip needs a BR Code")]
    NoBrCode,
}

/// Collapses the spaces of `text[from..]` (encoded text, one byte per cell) in place: no
/// leading or trailing space, one space between words. Wrapping splits at spaces and drops
/// them, so this changes no line [`Lines`] makes, and makes every line a slice of the text.
fn squeeze_spaces(text: &mut Vec<u8>, from: usize) {
    let mut w = from;
    let mut space = false;
    for r in from..text.len() {
        let b = text[r];
        if b == b' ' {
            space = w > from;
        } else {
            if space {
                text[w] = b' ';
                w += 1;
                space = false;
            }
            text[w] = b;
            w += 1;
        }
    }
    text.truncate(w);
}

/// The lines of squeezed text ([`squeeze_spaces`]) of at most `width` cells, as slices of
/// it: greedy, breaking at spaces (dropped); a word longer than a line is cut hard and its
/// rest starts the next line. Empty text is one empty line (never no line).
struct Lines<'a> {
    rest: &'a [u8],
    width: usize,
    done: bool,
}

impl<'a> Lines<'a> {
    fn new(squeezed: &'a [u8], width: usize) -> Self {
        Lines { rest: squeezed, width: width.max(1), done: false }
    }
}

impl<'a> Iterator for Lines<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.done {
            return None;
        }
        let (t, w) = (self.rest, self.width);
        if t.len() <= w {
            self.done = true;
            return Some(t);
        }
        // The last word end within the line: a space at 1..=w (t[0] starts a word).
        match t[1..=w].iter().rposition(|&b| b == b' ') {
            Some(k) => {
                self.rest = &t[k + 2..];
                Some(&t[..k + 1])
            }
            None => {
                self.rest = &t[w..];
                Some(&t[..w])
            }
        }
    }
}

/// `text` (already encoded and squeezed) wrapped to `width`, each line then LF.
fn put_lines(e: &mut EscPos, text: &[u8], width: usize) {
    for l in Lines::new(text, width) {
        e.raw_text(l).lf();
    }
}

/// `text` encoded, wrapped at words to `width` cells. `scratch` is the receipt's text
/// buffer (one per receipt, reused by every line).
fn wrapped(e: &mut EscPos, scratch: &mut Vec<u8>, text: &str, width: usize) {
    scratch.clear();
    e.encode_into(text, scratch);
    squeeze_spaces(scratch, 0);
    put_lines(e, scratch, width);
}

/// "Label: value" on one line if it fits, otherwise the label on its own line and the value
/// wrapped below.
fn labelled(e: &mut EscPos, scratch: &mut Vec<u8>, label: &str, value: &str, cols: usize) {
    scratch.clear();
    e.encode_into(label, scratch);
    scratch.push(b':');
    let l = scratch.len();
    e.encode_into(value, scratch);
    if scratch.len() < cols {
        e.raw_text(&scratch[..l]).raw_text(b" ").raw_text(&scratch[l..]).lf();
    } else {
        e.raw_text(&scratch[..l]).lf();
        squeeze_spaces(scratch, l);
        put_lines(e, &scratch[l..], cols);
    }
}

fn separator(e: &mut EscPos, cols: usize) {
    e.fill(b'-', cols).lf();
}

/// Renders `r` as an ESC/POS job for printer `p` on the generic ESC/POS model (Epson
/// `ESC t` numbers, 384/576 dots, full cut): `render_receipt_for(r, &p.generic())`.
///
/// # Errors
/// As [`render_receipt_for`].
pub fn render_receipt(r: &Receipt, p: &PrinterProfile) -> Result<Vec<u8>, ReceiptError> {
    render_receipt_for(r, &p.generic())
}

/// Renders `r` as an ESC/POS job for printer `p` (layouts in the module docs).
///
/// The QR, on the pay-with-Pix slip only: native `GS ( k` with the module size (`fn 167`)
/// chosen so that the symbol a printer makes from the data in byte mode, plus a 4-module
/// quiet zone, fits `p.dots()`;
/// or a `GS v 0` raster of [`qr::encode`]'s matrix, centred by `ESC a 1` (m = 3 at half
/// resolution where the model takes it and the module is even, see
/// [`ModelProfile::raster_quadruple`]). Either way the module is the largest whole number
/// of dots that fits, capped at [`MAX_MODULE_DOTS`].
/// A comment is printed after its label, wrapped, at most [`MAX_COMMENT_LINES`] lines.
/// The job is [`render_receipt_into`] a new vector sized for it.
///
/// # Errors
/// [`ReceiptError::CodePageUnsupported`] when the model lacks the configured code page;
/// for a slip, [`ReceiptError::Qr`] when the BR Code cannot be a QR,
/// [`ReceiptError::QrTooWide`] when it cannot fit the paper and [`ReceiptError::NoBrCode`]
/// without a BR Code.
pub fn render_receipt_for(r: &Receipt, p: &PrinterSetup) -> Result<Vec<u8>, ReceiptError> {
    let mut out = Vec::with_capacity(size_hint(r, p));
    render_receipt_into(&mut out, r, p)?;
    Ok(out)
}

/// [`render_receipt_for`] appended to `out`, a caller's buffer (reuse one across receipts
/// and a receipt allocates only its small text scratch, plus the QR for a raster). On an
/// error `out` is left as it was.
///
/// # Errors
/// As [`render_receipt_for`].
pub fn render_receipt_into(out: &mut Vec<u8>, r: &Receipt, p: &PrinterSetup) -> Result<(), ReceiptError> {
    let esc_t = p.esc_t()?;
    let start = out.len();
    let mut e = EscPos::with_buffer(std::mem::take(out), p.printer.code_page, esc_t);
    let result = layout(&mut e, r, p);
    *out = e.into_bytes();
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// Bytes a receipt takes, about (commands, labels and rules, the texts, the native QR's data;
/// a raster QR grows the buffer once, when it is written).
fn size_hint(r: &Receipt, p: &PrinterSetup) -> usize {
    let opt = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    let items: usize = r.items.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    512 + 4 * p.columns()
        + r.merchant_name.len()
        + r.merchant_city.len()
        + items
        + opt(&r.comment)
        + opt(&r.payer_name)
        + opt(&r.end_to_end_id)
        + r.charge_id.len()
        + opt(&r.txid)
        + if p.native_qr() && matches!(r.kind, ReceiptKind::PayWithPix { .. }) { opt(&r.brcode) } else { 0 }
}

/// The receipt's commands and text, after `ESC @` `ESC t n`... up to the cut.
fn layout(e: &mut EscPos, r: &Receipt, p: &PrinterSetup) -> Result<(), ReceiptError> {
    let cols = p.columns();
    let loc = r.locale;
    // Encoded text waiting to be measured or wrapped, and a formatted amount or date: one
    // of each per receipt, reused by every line.
    let mut scratch: Vec<u8> = Vec::with_capacity(128);
    let mut formatted = String::with_capacity(32);
    e.init();

    // Header.
    e.align(Align::Center).bold(true).size(2, 2);
    wrapped(e, &mut scratch, &r.merchant_name, cols / 2);
    e.size(1, 1).bold(false);
    if !r.merchant_city.trim().is_empty() {
        wrapped(e, &mut scratch, &r.merchant_city, cols);
    }
    e.lf();
    scratch.clear();
    match r.kind {
        ReceiptKind::Paid => {
            e.encode_upper_into(loc.label(Label::PixReceipt), &mut scratch);
            e.encode_into(" - ", &mut scratch);
            e.encode_upper_into(loc.label(Label::Paid), &mut scratch);
        }
        ReceiptKind::PayWithPix { .. } => e.encode_upper_into(loc.label(Label::PayWithPix), &mut scratch),
        ReceiptKind::Expired { .. } => e.encode_upper_into(loc.label(Label::ChargeExpired), &mut scratch),
    }
    squeeze_spaces(&mut scratch, 0);
    e.bold(true);
    put_lines(e, &scratch, cols);
    e.bold(false);

    // Amount.
    push_amount(r.amount_cents.min(i64::MAX as u64) as i64, loc, &mut formatted);
    scratch.clear();
    e.encode_into(&formatted, &mut scratch);
    e.text(loc.label(Label::Total)).lf();
    e.bold(true);
    if scratch.len() <= cols / 2 {
        e.size(2, 2);
    } else {
        e.size(1, 2);
    }
    e.raw_text(&scratch).lf();
    e.size(1, 1).bold(false).align(Align::Left);
    separator(e, cols);

    // When: "dd/mm/yyyy HH:MM" (or en-US's form) in the receipt's time zone, into `formatted`.
    let when = |t: &DateTime<Utc>, formatted: &mut String| {
        formatted.clear();
        loc.push_datetime(&t.with_timezone(&r.time_zone), formatted);
    };
    match r.kind {
        ReceiptKind::Paid => {
            items(e, &mut scratch, r, cols);
            comment(e, &mut scratch, r, cols);
            if let Some(n) = r.payer_name.as_deref().filter(|c| !c.trim().is_empty()) {
                labelled(e, &mut scratch, loc.label(Label::Payer), n, cols);
            }
            if let Some(t) = r.paid_at {
                when(&t, &mut formatted);
                labelled(e, &mut scratch, loc.label(Label::Date), &formatted, cols);
            }
            small_print(e, p, |e, cols| {
                if let Some(id) = r.end_to_end_id.as_deref().filter(|c| !c.trim().is_empty()) {
                    labelled(e, &mut scratch, loc.label(Label::EndToEndId), id, cols);
                }
                ids(e, &mut scratch, r, cols);
            });
            separator(e, cols);
            e.align(Align::Center);
            e.text(loc.label(Label::ThankYou)).lf();
        }
        ReceiptKind::PayWithPix { expires_at } => {
            let code = r.brcode.as_deref().filter(|c| !c.is_empty()).ok_or(ReceiptError::NoBrCode)?;
            items(e, &mut scratch, r, cols);
            small_print(e, p, |e, cols| ids(e, &mut scratch, r, cols));
            e.lf();
            qr_block(e, code, p)?;
            e.align(Align::Center);
            wrapped(e, &mut scratch, loc.label(Label::ScanHint), cols);
            if let Some(t) = expires_at {
                e.bold(true);
                scratch.clear();
                e.encode_into(loc.label(Label::ValidUntil), &mut scratch);
                e.encode_into(": ", &mut scratch);
                when(&t, &mut formatted);
                e.encode_into(&formatted, &mut scratch);
                squeeze_spaces(&mut scratch, 0);
                put_lines(e, &scratch, cols);
                e.bold(false);
            }
        }
        ReceiptKind::Expired { expired_at } => {
            if let Some(t) = expired_at {
                when(&t, &mut formatted);
                labelled(e, &mut scratch, loc.label(Label::ExpiredAt), &formatted, cols);
            }
            small_print(e, p, |e, cols| ids(e, &mut scratch, r, cols));
            separator(e, cols);
            e.align(Align::Center).bold(true);
            wrapped(e, &mut scratch, loc.label(Label::NotPaid), cols);
            e.bold(false);
            wrapped(e, &mut scratch, loc.label(Label::NewChargeHint), cols);
        }
    }

    e.align(Align::Left);
    e.feed_lines(3).cut_with(p.cut(), 3);
    Ok(())
}

/// Line items: name left (wrapped), value right-aligned on the name's first line; then a
/// separator. Nothing when there are none.
fn items(e: &mut EscPos, scratch: &mut Vec<u8>, r: &Receipt, cols: usize) {
    if r.items.is_empty() {
        return;
    }
    for (name, value) in &r.items {
        // The value (cut to half a line), then the name after it in the same scratch.
        scratch.clear();
        e.encode_into(value, scratch);
        let v = scratch.len().min(cols / 2);
        scratch.truncate(v);
        e.encode_into(name, scratch);
        squeeze_spaces(scratch, v);
        let (value_b, name_b) = scratch.split_at(v);
        let name_end = cols - v;
        for (i, nl) in Lines::new(name_b, name_end - 1).enumerate() {
            if i == 0 {
                let nl = &nl[..nl.len().min(name_end)];
                e.raw_text(nl).fill(b' ', name_end - nl.len()).raw_text(value_b);
            } else {
                e.raw_text(nl);
            }
            e.lf();
        }
    }
    separator(e, cols);
}

/// The comment after its label, wrapped, at most [`MAX_COMMENT_LINES`] lines; when there
/// are more, the last one printed ends in `...`.
fn comment(e: &mut EscPos, scratch: &mut Vec<u8>, r: &Receipt, cols: usize) {
    if let Some(c) = r.comment.as_deref().filter(|c| !c.trim().is_empty()) {
        scratch.clear();
        e.encode_into(r.locale.label(Label::Comment), scratch);
        scratch.extend_from_slice(b": ");
        e.encode_into(c, scratch);
        squeeze_spaces(scratch, 0);
        let mut lines = Lines::new(scratch, cols).peekable();
        let mut n = 0;
        while let Some(l) = lines.next() {
            n += 1;
            if n == MAX_COMMENT_LINES && lines.peek().is_some() {
                e.raw_text(&l[..l.len().min(cols.saturating_sub(3))]).raw_text(b"...").lf();
                break;
            }
            e.raw_text(l).lf();
        }
    }
}

/// Lines written by `body` (given the font B columns) in font B (`ESC M 1`), then back to
/// font A (`ESC M 0`). Every line `body` writes ends with LF, so the switch back happens at
/// a line start and never changes a line already in the printer's buffer.
fn small_print(e: &mut EscPos, p: &PrinterSetup, body: impl FnOnce(&mut EscPos, usize)) {
    e.font(Font::B);
    body(e, p.columns_font_b());
    e.font(Font::A);
}

/// Charge id and txid lines.
fn ids(e: &mut EscPos, scratch: &mut Vec<u8>, r: &Receipt, cols: usize) {
    labelled(e, scratch, r.locale.label(Label::Charge), &r.charge_id, cols);
    if let Some(t) = r.txid.as_deref().filter(|c| !c.trim().is_empty()) {
        labelled(e, scratch, r.locale.label(Label::Txid), t, cols);
    }
}

/// The BR Code as a centred QR (native or raster, see [`render_receipt_for`]), then LF.
fn qr_block(e: &mut EscPos, code: &str, p: &PrinterSetup) -> Result<(), ReceiptError> {
    e.align(Align::Center);
    let dots = p.dots();
    if p.native_qr() {
        let width = qr::byte_mode_width(code.len()).ok_or(qr::QrError::DataTooLong { len: code.len() })?;
        let module = dots / (width as u32 + 2 * QR_QUIET_MODULES);
        if module == 0 {
            return Err(ReceiptError::QrTooWide { modules: width, dots });
        }
        e.qr_native(code.as_bytes(), module.min(MAX_MODULE_DOTS) as u8);
    } else {
        let m = qr::encode(code)?;
        let module = qr::module_size_for_width(&m, dots, QR_QUIET_MODULES);
        if module == 0 {
            return Err(ReceiptError::QrTooWide { modules: m.width, dots });
        }
        raster_qr(e, &m, module.min(MAX_MODULE_DOTS), p.model);
    }
    e.lf();
    Ok(())
}

/// `m` with its quiet zone as a `GS v 0` raster of `module`-dot modules, its own bitmap
/// (`ESC a 1` centres it on the paper). On a model that takes quadruple
/// ([`ModelProfile::raster_quadruple`]) an even module goes at half resolution with m = 3:
/// the same dots on paper from a quarter of the bytes. (The row padding to whole bytes is
/// then up to 8 dots wider, which moves the centred symbol by at most 4 dots, 0.5 mm.)
fn raster_qr(e: &mut EscPos, m: &qr::QrMatrix, module: u32, model: &ModelProfile) {
    if model.raster_quadruple && module.is_multiple_of(2) {
        let (side, rows) = m.to_raster(module / 2, QR_QUIET_MODULES);
        e.raster_packed_scaled(RasterScale::Quadruple, side, side, &rows);
    } else {
        let (side, rows) = m.to_raster(module, QR_QUIET_MODULES);
        e.raster_packed(side, side, &rows);
    }
}

#[cfg(test)]
mod oracle;

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of `bytes` wrapped to `width`, as the receipt prints them.
    fn wrap(bytes: &[u8], width: usize) -> Vec<Vec<u8>> {
        let mut t = bytes.to_vec();
        squeeze_spaces(&mut t, 0);
        Lines::new(&t, width).map(<[u8]>::to_vec).collect()
    }

    #[test]
    fn wrap_breaks_at_words_and_cuts_long_words() {
        let w = wrap(b"Tapioca de coco com leite condensado", 12);
        assert_eq!(w, vec![b"Tapioca de".to_vec(), b"coco com".to_vec(), b"leite".to_vec(), b"condensado".to_vec()]);
        let w = wrap(b"E25328704202611271201yxv2kgafrfwXYZ", 32);
        assert_eq!(w[0].len(), 32);
        assert_eq!(w[1], b"XYZ".to_vec());
        assert_eq!(wrap(b"", 10), vec![Vec::<u8>::new()]);
    }

    #[test]
    fn profile_geometry() {
        let p58 = PrinterProfile { paper_width_mm: 58, code_page: CodePage::Cp860, native_qr: true };
        let p80 = PrinterProfile { paper_width_mm: 80, ..p58 };
        assert_eq!((p58.dots(), p58.columns(), p58.columns_font_b()), (384, 32, 42));
        assert_eq!((p80.dots(), p80.columns(), p80.columns_font_b()), (576, 48, 64));
        for p in [p58, p80] {
            assert_eq!((p.generic().columns(), p.generic().columns_font_b()), (p.columns(), p.columns_font_b()));
        }
    }

    fn sample(kind: ReceiptKind) -> Receipt {
        Receipt {
            kind,
            merchant_name: "Padaria São João".into(),
            merchant_city: "São Paulo".into(),
            amount_cents: 1250,
            items: vec![("Pão de queijo".into(), "3x".into())],
            comment: None,
            payer_name: Some("Maria".into()),
            paid_at: None,
            time_zone: chrono_tz::America::Sao_Paulo,
            end_to_end_id: None,
            charge_id: "c1".into(),
            txid: Some("tx1".into()),
            brcode: Some("00020101021226".into()),
            locale: Locale::PtBr,
        }
    }

    fn p(code_page: CodePage, native_qr: bool) -> PrinterProfile {
        PrinterProfile { paper_width_mm: 80, code_page, native_qr }
    }

    #[test]
    fn esc_t_follows_the_model() {
        let r = sample(ReceiptKind::Paid);
        for (model, n) in
            [("generic", 3), ("Epson TM-T20X", 3), ("Elgin i9", 4), ("Bematech MP-4200 TH", 4), ("Nobody X1", 3)]
        {
            let b = render_receipt_for(&r, &p(CodePage::Cp860, true).on_model(model)).unwrap();
            assert_eq!(b[..5], [0x1B, 0x40, 0x1B, 0x74, n], "{model}");
        }
        // The plain entry point is the generic model: unchanged bytes.
        assert_eq!(
            render_receipt(&r, &p(CodePage::Cp860, true)).unwrap(),
            render_receipt_for(&r, &p(CodePage::Cp860, true).on_model("")).unwrap()
        );
    }

    #[test]
    fn a_code_page_the_model_lacks_is_an_error() {
        let r = sample(ReceiptKind::Paid);
        let err = render_receipt_for(&r, &p(CodePage::Wpc1252, true).on_model("Bematech MP-4200 TH")).unwrap_err();
        assert_eq!(err, ReceiptError::CodePageUnsupported { code_page: "WPC1252", model: "Bematech MP-4200 TH" });
        assert!(render_receipt_for(&r, &p(CodePage::Cp865, true).on_model("Elgin i9")).is_err());
        assert!(render_receipt_for(&r, &p(CodePage::Wpc1252, true).on_model("Elgin i9")).is_ok());
    }

    #[test]
    fn cut_and_qr_follow_the_model() {
        let r = sample(ReceiptKind::PayWithPix { expires_at: None });
        let has = |b: &[u8], w: &[u8]| b.windows(w.len()).any(|x| x == w);
        let epson = render_receipt_for(&r, &p(CodePage::Cp850, true).on_model("Epson TM-T20X")).unwrap();
        assert!(epson.ends_with(&[0x1D, 0x56, 0x42, 3]), "partial cut");
        assert!(has(&epson, &[0x1D, 0x28, 0x6B]), "native QR");
        let bema = render_receipt_for(&r, &p(CodePage::Cp860, true).on_model("Bematech MP-4200 TH")).unwrap();
        assert!(!has(&bema, &[0x1D, 0x28, 0x6B]) && has(&bema, &[0x1D, 0x76, 0x30]), "raster QR on Bematech");
        let elgin = render_receipt_for(&r, &p(CodePage::Cp860, true).on_model("Elgin i9")).unwrap();
        assert!(elgin.ends_with(&[0x1D, 0x56, 0x41, 3]), "full cut");
    }

    /// The paid receipt prints no QR of the BR Code it is given, native or raster, on any
    /// model, paper or locale (nor its bytes as text), and names the payment instead: the
    /// end-to-end id and the txid after their labels in the receipt's locale.
    #[test]
    fn a_paid_receipt_prints_no_qr_but_the_end_to_end_id_and_txid() {
        let brcode = crate::brcode::encode_dynamic(
            "https://pix.example.com/qr/v2/635956be31135de9953857d7f18bde0e",
            Some(990),
            "Pagamentos Exemplo",
            "São Paulo",
        )
        .unwrap();
        let e2e = "E25328704202611271201yxv2kgafrfw";
        for locale in [Locale::PtBr, Locale::EnUs, Locale::EsEs] {
            let r = Receipt {
                brcode: Some(brcode.clone()),
                end_to_end_id: Some(e2e.into()),
                locale,
                ..sample(ReceiptKind::Paid)
            };
            for model in ["generic", "Epson TM-T20X", "Elgin i9", "Bematech MP-4200 TH"] {
                for (mm, native) in [(58u8, true), (58, false), (80, true), (80, false)] {
                    let setup = PrinterProfile { paper_width_mm: mm, code_page: CodePage::Cp850, native_qr: native }
                        .on_model(model);
                    let b = render_receipt_for(&r, &setup).unwrap();
                    let what = format!("{} {model} {mm} mm native {native}", locale.tag());
                    assert!(!b.windows(3).any(|w| w == [0x1D, 0x28, 0x6B] || w == [0x1D, 0x76, 0x30]), "{what}: a QR");
                    assert!(!b.windows(brcode.len()).any(|w| w == brcode.as_bytes()), "{what}: the BR Code's bytes");
                    let text = CodePage::Cp850.decode(&b).split_whitespace().collect::<Vec<_>>().join(" ");
                    for (label, value) in [(Label::EndToEndId, e2e), (Label::Txid, "tx1")] {
                        let want = format!("{}: {value}", locale.label(label));
                        assert!(text.contains(&want), "{what}: no {want:?} in {text}");
                    }
                }
            }
        }
        // The same receipt with no BR Code at all is the same job.
        let with = sample(ReceiptKind::Paid);
        let without = Receipt { brcode: None, ..with.clone() };
        assert_eq!(
            render_receipt(&with, &p(CodePage::Cp860, false)),
            render_receipt(&without, &p(CodePage::Cp860, false))
        );
    }

    /// The first `GS v 0` of a job: (m, bytes per row, rows, data).
    fn first_raster(b: &[u8]) -> (u8, usize, usize, &[u8]) {
        let at = b.windows(3).position(|w| w == [0x1D, 0x76, 0x30]).expect("a GS v 0");
        let h = &b[at + 3..at + 8];
        let (x, y) = (h[1] as usize + 256 * h[2] as usize, h[3] as usize + 256 * h[4] as usize);
        (h[0], x, y, &b[at + 8..at + 8 + x * y])
    }

    /// The dots a raster prints, as rows of booleans `dots` wide: each bit of an m = 3
    /// raster is 2 × 2 dots (`GS v 0`, notes §b); columns past `dots` are row padding.
    fn printed(m: u8, x: usize, y: usize, data: &[u8], dots: usize) -> Vec<Vec<bool>> {
        let s = if m == 3 { 2 } else { 1 };
        (0..y * s)
            .map(|row| {
                (0..dots)
                    .map(|col| {
                        let (bx, by) = (col / s, row / s);
                        bx < x * 8 && data[by * x + bx / 8] & (0x80 >> (bx % 8)) != 0
                    })
                    .collect()
            })
            .collect()
    }

    /// On a model whose `GS v 0` takes quadruple, an even module goes at half resolution
    /// with m = 3 and prints exactly the dots the same QR prints with m = 0 on a model
    /// without it, from about a quarter of the bytes; an odd module stays m = 0.
    #[test]
    fn a_quadruple_raster_prints_the_same_dots_from_a_quarter_of_the_bytes() {
        use crate::profile::BEMATECH_MP4200TH;
        static BEMA_NORMAL: ModelProfile = ModelProfile { raster_quadruple: false, ..BEMATECH_MP4200TH };
        let brcode = crate::brcode::encode_dynamic(
            "https://pix.example.com/qr/v2/635956be31135de9953857d7f18bde0e",
            Some(990),
            "Pagamentos Exemplo",
            "São Paulo",
        )
        .unwrap();
        let r = Receipt { brcode: Some(brcode.clone()), ..sample(ReceiptKind::PayWithPix { expires_at: None }) };
        for mm in [58, 80] {
            let printer = PrinterProfile { paper_width_mm: mm, code_page: CodePage::Cp860, native_qr: false };
            let quad = render_receipt_for(&r, &PrinterSetup { printer, model: &BEMATECH_MP4200TH }).unwrap();
            let normal = render_receipt_for(&r, &PrinterSetup { printer, model: &BEMA_NORMAL }).unwrap();
            let (mq, xq, yq, dq) = first_raster(&quad);
            let (mn, xn, yn, dn) = first_raster(&normal);
            let module = qr::module_size_for_width(
                &qr::encode(&brcode).unwrap(),
                PrinterSetup { printer, model: &BEMA_NORMAL }.dots(),
                QR_QUIET_MODULES,
            )
            .min(MAX_MODULE_DOTS);
            assert_eq!(module, 6, "{mm} mm: this BR Code gets the largest module");
            assert_eq!((mq, mn), (3, 0), "{mm} mm");
            assert_eq!(yq * 2, yn, "{mm} mm: half the rows, each printed twice");
            assert!(dq.len() * 4 <= dn.len() + 4 * yq, "{mm} mm: {} bytes against {}", dq.len(), dn.len());
            assert_eq!(
                printed(mq, xq, yq, dq, xn * 8),
                printed(mn, xn, yn, dn, xn * 8),
                "{mm} mm: the same dots on paper"
            );
            // Everything around the QR is the same bytes.
            let head = quad.windows(3).position(|w| w == [0x1D, 0x76, 0x30]).unwrap();
            assert_eq!(quad[..head], normal[..head]);
            assert_eq!(quad[head + 8 + dq.len()..], normal[head + 8 + dn.len()..]);
        }
        // A 5-dot module (a longer code on 58 mm) cannot be halved: m = 0, as before.
        let printer = PrinterProfile { paper_width_mm: 58, code_page: CodePage::Cp860, native_qr: false };
        let setup = PrinterSetup { printer, model: &BEMATECH_MP4200TH };
        let odd = (20..400)
            .map(|n| Receipt { brcode: Some(format!("{brcode}{}", "0".repeat(n))), ..r.clone() })
            .find(|r| {
                qr::module_size_for_width(
                    &qr::encode(r.brcode.as_deref().unwrap()).unwrap(),
                    setup.dots(),
                    QR_QUIET_MODULES,
                ) % 2
                    == 1
            })
            .expect("some length gives an odd module");
        assert_eq!(first_raster(&render_receipt_for(&odd, &setup).unwrap()).0, 0);
    }

    /// The reference lines, and only they, are in font B, sized to its columns: on 80 mm
    /// "ID fim a fim: E…" (46 characters) is one line, which font A's 48 columns would also
    /// hold, but on 58 mm "Cobrança: <24-char id>" (34) needs font B's 42.
    #[test]
    fn reference_lines_are_small_print_in_font_b() {
        let mut r = sample(ReceiptKind::Paid);
        r.end_to_end_id = Some("E25328704202611271201yxv2kgafrfw".into());
        r.charge_id = "6748a1f0c2b3d4e5f6a7b8c9".into();
        for mm in [58u8, 80] {
            let b =
                render_receipt(&r, &PrinterProfile { paper_width_mm: mm, code_page: CodePage::Cp860, native_qr: true })
                    .unwrap();
            let on = b.windows(3).position(|w| w == [0x1B, 0x4D, 1]).expect("ESC M 1");
            let off = b.windows(3).position(|w| w == [0x1B, 0x4D, 0]).expect("ESC M 0");
            assert_eq!(b.windows(3).filter(|w| w[..2] == [0x1B, 0x4D]).count(), 2, "one font B block");
            let small = CodePage::Cp860.decode(&b[on + 3..off]);
            let lines: Vec<&str> = small.lines().collect();
            assert!(lines.contains(&"Cobrança: 6748a1f0c2b3d4e5f6a7b8c9"), "{mm} mm: {lines:?}");
            assert!(lines.iter().any(|l| l.contains("ID da transação") && l.ends_with("tx1")), "{lines:?}");
            let cols_b = if mm == 80 { 64 } else { 42 };
            assert!(lines.iter().all(|l| l.chars().count() <= cols_b), "{lines:?}");
            assert_eq!(lines.contains(&"ID fim a fim: E25328704202611271201yxv2kgafrfw"), mm == 80, "{lines:?}");
        }
    }

    #[test]
    fn slip_needs_a_qr_and_the_notice_never_prints_one() {
        let mut r = sample(ReceiptKind::PayWithPix { expires_at: None });
        let slip = render_receipt(&r, &p(CodePage::Cp860, true)).unwrap();
        assert!(slip.windows(3).any(|x| x == [0x1D, 0x28, 0x6B]));
        r.brcode = None;
        assert_eq!(render_receipt(&r, &p(CodePage::Cp860, true)), Err(ReceiptError::NoBrCode));
        let mut r = sample(ReceiptKind::Expired { expired_at: None });
        for native in [true, false] {
            let b = render_receipt(&r, &p(CodePage::Cp860, native)).unwrap();
            assert!(!b.windows(3).any(|x| x == [0x1D, 0x28, 0x6B] || x == [0x1D, 0x76, 0x30]));
        }
        r.brcode = None;
        assert!(render_receipt(&r, &p(CodePage::Cp860, true)).is_ok());
    }

    /// Narrow heads (3 and 8 font A columns on "58 mm", 20 on "80 mm") for the wrapping
    /// edge cases; not real models.
    static TINY: ModelProfile = ModelProfile {
        model: "tiny",
        paper_widths_mm: &[58, 80],
        dots_58mm: 40,
        dots_80mm: 240,
        code_tables: GENERIC.code_tables,
        native_qr: true,
        raster_quadruple: false,
        cut: CutStyle::Partial,
        source: "test",
    };
    static NARROW: ModelProfile = ModelProfile {
        model: "narrow",
        paper_widths_mm: &[58],
        dots_58mm: 100,
        dots_80mm: 100,
        code_tables: GENERIC.code_tables,
        native_qr: true,
        raster_quadruple: true,
        cut: CutStyle::Full,
        source: "test",
    };

    /// A receipt from the generator: every kind, every locale; merchant names, cities, items,
    /// comments, payers and ids from [`Gen::text`] (long words, accents, emoji, controls,
    /// runs of spaces, empty), items with values longer than half a line, comments past
    /// [`MAX_COMMENT_LINES`], amounts up to `u64::MAX`, dates from 1970 to past year 9999
    /// in several time zones, BR Codes real, random, too long for a QR, or none.
    fn generated_receipt(g: &mut crate::testgen::Gen, payloads: &[String]) -> Receipt {
        let date = |g: &mut crate::testgen::Gen| match g.below(6) {
            0 => None,
            1 => DateTime::from_timestamp(253_402_300_800 + g.below(1 << 36) as i64, 0), // year 10000 on
            _ => DateTime::from_timestamp(g.below(4_200_000_000) as i64, 0),
        };
        let kind = match g.below(4) {
            0 => ReceiptKind::PayWithPix { expires_at: date(g) },
            1 => ReceiptKind::Expired { expired_at: date(g) },
            _ => ReceiptKind::Paid,
        };
        let opt = |g: &mut crate::testgen::Gen, max: u64| if g.below(4) == 0 { None } else { Some(g.text(max)) };
        let mut items = Vec::new();
        for _ in 0..g.below(4) {
            let name = g.text(70);
            let long = g.below(3) == 0;
            items.push((name, g.text(if long { 40 } else { 6 })));
        }
        Receipt {
            kind,
            merchant_name: g.text(60),
            merchant_city: g.text(30),
            amount_cents: match g.below(4) {
                0 => g.next(),
                1 => 0,
                _ => g.below(10_000_000),
            },
            items,
            comment: if g.below(3) == 0 { Some(g.text(500)) } else { opt(g, 60) },
            payer_name: opt(g, 50),
            paid_at: date(g),
            time_zone: *g.pick(&[
                &chrono_tz::America::Sao_Paulo,
                &chrono_tz::UTC,
                &chrono_tz::Asia::Tokyo,
                &chrono_tz::America::New_York,
                &chrono_tz::Pacific::Chatham,
            ]),
            end_to_end_id: opt(g, 70),
            charge_id: g.text(40),
            txid: opt(g, 40),
            brcode: match g.below(6) {
                0 => None,
                1 => Some(String::new()),
                2 => Some("x".repeat(g.below(3000) as usize)),
                _ => Some(payloads[g.below(payloads.len() as u64) as usize].clone()),
            },
            locale: *g.pick(&[&Locale::PtBr, &Locale::EnUs, &Locale::EsEs]),
        }
    }

    /// The layout writing into the job's buffer gives, byte for byte (and error for error),
    /// what the previous layout (`oracle`: `Vec<Vec<u8>>` per wrap, a vector per string,
    /// text encoded as `printable` then `encode_lossy`) gave, on 4,000 generated receipts
    /// over every paper, code page and model, native and raster QR; and
    /// `render_receipt_into` appends exactly those bytes to a buffer already in use.
    #[test]
    fn layout_matches_the_previous_layout() {
        use crate::brcode::{encode_dynamic, encode_static, StaticPix};
        let mut payloads = vec![
            encode_static(&StaticPix {
                key: "padaria.paoeacucar@example.com".into(),
                amount_cents: Some(123_456),
                merchant_name: "Padaria Pão e Açúcar".into(),
                merchant_city: "São Paulo".into(),
                txid: Some("PIXGATEBENCH0001".into()),
                description: None,
            })
            .unwrap(),
            encode_dynamic(
                "https://pix.example.com/qr/v2/635956be31135de9953857d7f18bde0e",
                Some(990),
                "Pagamentos Exemplo",
                "São Paulo",
            )
            .unwrap(),
            "00020101021226".into(),
        ];
        payloads.push(format!("{}{}", payloads[0], "0".repeat(300)));
        let mut g = crate::testgen::Gen(0x5EED_F00D_7EC0_1A7E);
        let (mut ok, mut raster) = (0, 0);
        for i in 0..4_000 {
            let r = generated_receipt(&mut g, &payloads);
            let printer = PrinterProfile {
                paper_width_mm: *g.pick(&[&58u8, &80, &76, &60]),
                code_page: *g.pick(&CodePage::ALL.each_ref()),
                native_qr: g.below(8) != 0,
            };
            let setup = match g.below(8) {
                0 => PrinterSetup { printer, model: &TINY },
                1 => PrinterSetup { printer, model: &NARROW },
                _ => {
                    let model: &str =
                        g.pick(&["generic", "", "Epson TM-T20X", "Elgin i9", "Bematech MP-4200 TH", "Nobody X1"]);
                    printer.on_model(model)
                }
            };
            let new = render_receipt_for(&r, &setup);
            let old = oracle::render_receipt_for(&r, &setup);
            if new != old {
                let page = setup.printer.code_page;
                let show = |x: &Result<Vec<u8>, ReceiptError>| -> Result<String, ReceiptError> {
                    x.clone().map(|b| page.decode(&b))
                };
                panic!("#{i}: {r:?} on {setup:?}\nnew: {:?}\nold: {:?}", show(&new), show(&old));
            }
            let mut buf = b"earlier job".to_vec();
            let into = render_receipt_into(&mut buf, &r, &setup);
            match &new {
                Ok(b) => {
                    assert_eq!((into, &buf[..11], &buf[11..]), (Ok(()), &b"earlier job"[..], &b[..]), "#{i}");
                    ok += 1;
                    raster += usize::from(b.windows(3).any(|w| w == [0x1D, 0x76, 0x30]));
                }
                Err(e) => assert_eq!((into, &buf[..]), (Err(e.clone()), &b"earlier job"[..]), "#{i}"),
            }
        }
        assert!(ok > 2_000 && raster > 100, "the generator reaches too few receipts ({ok}, {raster} raster)");
    }
}
