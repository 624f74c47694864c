//! The receipt layout written the plain way, not into the job's buffer directly: `wrap`
//! into `Vec<Vec<u8>>`, one vector per encoded string and line, text encoded as
//! [`printable`] then [`CodePage::encode_lossy`]. Test-only: the oracle that
//! `tests::layout_matches_the_previous_layout` compares the current layout with, byte
//! for byte, on generated receipts.

use super::{PrinterSetup, Receipt, ReceiptError, ReceiptKind, MAX_COMMENT_LINES, MAX_MODULE_DOTS, QR_QUIET_MODULES};
use crate::codepage::CodePage;
use crate::escpos::{printable, Align, EscPos, Font};
use crate::locale::Label;
use crate::money::format_amount;
use crate::qr;

/// The job writer, with text encoded by the definition ([`printable`] then
/// [`CodePage::encode_lossy`]) rather than by [`EscPos`]'s own encoder.
struct E {
    e: EscPos,
    page: CodePage,
}

impl std::ops::Deref for E {
    type Target = EscPos;
    fn deref(&self) -> &EscPos {
        &self.e
    }
}

impl std::ops::DerefMut for E {
    fn deref_mut(&mut self) -> &mut EscPos {
        &mut self.e
    }
}

impl E {
    fn encode(&mut self, s: &str) -> Vec<u8> {
        self.page.encode_lossy(&printable(s)).0
    }

    fn text(&mut self, s: &str) -> &mut EscPos {
        let b = self.encode(s);
        self.e.raw_text(&b)
    }
}

/// Splits encoded text (one byte per cell) into lines of at most `width` cells, breaking at
/// spaces; a word longer than a line is cut hard. Never returns an empty list.
fn wrap(bytes: &[u8], width: usize) -> Vec<Vec<u8>> {
    let width = width.max(1);
    let mut lines: Vec<Vec<u8>> = Vec::new();
    let mut line: Vec<u8> = Vec::new();
    for word in bytes.split(|&b| b == b' ').filter(|w| !w.is_empty()) {
        let mut word = word;
        loop {
            let need = if line.is_empty() { word.len() } else { line.len() + 1 + word.len() };
            if need <= width {
                if !line.is_empty() {
                    line.push(b' ');
                }
                line.extend_from_slice(word);
                break;
            }
            if !line.is_empty() {
                lines.push(std::mem::take(&mut line));
                continue;
            }
            // Word longer than a whole line: cut it.
            lines.push(word[..width].to_vec());
            word = &word[width..];
            if word.is_empty() {
                break;
            }
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

fn line(e: &mut E, bytes: &[u8]) {
    e.raw_text(bytes).lf();
}

fn wrapped(e: &mut E, text: &str, width: usize) {
    let bytes = e.encode(text);
    for l in wrap(&bytes, width) {
        line(e, &l);
    }
}

/// "Label: value" on one line if it fits, otherwise the label on its own line and the value
/// wrapped below.
fn labelled(e: &mut E, label: &str, value: &str, cols: usize) {
    let mut l = e.encode(label);
    l.push(b':');
    let v = e.encode(value);
    if l.len() + 1 + v.len() <= cols {
        let mut b = l;
        b.push(b' ');
        b.extend_from_slice(&v);
        line(e, &b);
    } else {
        line(e, &l);
        for w in wrap(&v, cols) {
            line(e, &w);
        }
    }
}

fn separator(e: &mut E, cols: usize) {
    line(e, &vec![b'-'; cols]);
}

/// Renders `r` as an ESC/POS job for printer `p` (layouts in the module docs).
///
/// The QR: native `GS ( k` with the module size (`fn 167`) chosen so that the symbol a
/// printer makes from the data in byte mode, plus a 4-module quiet zone, fits `p.dots()`;
/// or a `GS v 0` raster of [`qr::encode`]'s matrix, centred by `ESC a 1`. Either way the
/// module is the largest whole number of dots that fits, capped at [`MAX_MODULE_DOTS`].
/// A comment is printed after its label, wrapped, at most [`MAX_COMMENT_LINES`] lines.
///
/// # Errors
/// [`ReceiptError::CodePageUnsupported`] when the model lacks the configured code page;
/// [`ReceiptError::Qr`] when the BR Code cannot be a QR; [`ReceiptError::QrTooWide`] when
/// it cannot fit the paper; [`ReceiptError::NoBrCode`] for a slip without a BR Code.
pub(super) fn render_receipt_for(r: &Receipt, p: &PrinterSetup) -> Result<Vec<u8>, ReceiptError> {
    let cols = p.columns();
    let loc = r.locale;
    let mut e = E { e: EscPos::with_table(p.printer.code_page, p.esc_t()?), page: p.printer.code_page };
    e.init();

    // Header.
    e.align(Align::Center).bold(true).size(2, 2);
    wrapped(&mut e, &r.merchant_name, cols / 2);
    e.size(1, 1).bold(false);
    if !r.merchant_city.trim().is_empty() {
        wrapped(&mut e, &r.merchant_city, cols);
    }
    e.lf();
    let title = match r.kind {
        ReceiptKind::Paid => format!("{} - {}", loc.label(Label::PixReceipt), loc.label(Label::Paid)),
        ReceiptKind::PayWithPix { .. } => loc.label(Label::PayWithPix).to_string(),
        ReceiptKind::Expired { .. } => loc.label(Label::ChargeExpired).to_string(),
    };
    e.bold(true);
    wrapped(&mut e, &title.to_uppercase(), cols);
    e.bold(false);

    // Amount.
    let amount = format_amount(r.amount_cents.min(i64::MAX as u64) as i64, loc);
    let amount_b = e.encode(&amount);
    e.text(loc.label(Label::Total)).lf();
    e.bold(true);
    if amount_b.len() <= cols / 2 {
        e.size(2, 2);
    } else {
        e.size(1, 2);
    }
    line(&mut e, &amount_b);
    e.size(1, 1).bold(false).align(Align::Left);
    separator(&mut e, cols);

    match r.kind {
        ReceiptKind::Paid => {
            items(&mut e, r, cols);
            comment(&mut e, r, cols);
            if let Some(n) = r.payer_name.as_deref().filter(|c| !c.trim().is_empty()) {
                labelled(&mut e, loc.label(Label::Payer), n, cols);
            }
            if let Some(t) = r.paid_at {
                labelled(&mut e, loc.label(Label::Date), &loc.format_datetime(&t.with_timezone(&r.time_zone)), cols);
            }
            small_print(&mut e, p, |e, cols| {
                if let Some(id) = r.end_to_end_id.as_deref().filter(|c| !c.trim().is_empty()) {
                    labelled(e, loc.label(Label::EndToEndId), id, cols);
                }
                ids(e, r, cols);
            });
            separator(&mut e, cols);
            e.align(Align::Center);
            e.text(loc.label(Label::ThankYou)).lf();
        }
        ReceiptKind::PayWithPix { expires_at } => {
            let code = r.brcode.as_deref().filter(|c| !c.is_empty()).ok_or(ReceiptError::NoBrCode)?;
            items(&mut e, r, cols);
            small_print(&mut e, p, |e, cols| ids(e, r, cols));
            e.lf();
            qr_block(&mut e, code, p)?;
            e.align(Align::Center);
            wrapped(&mut e, loc.label(Label::ScanHint), cols);
            if let Some(t) = expires_at {
                e.bold(true);
                wrapped(
                    &mut e,
                    &format!(
                        "{}: {}",
                        loc.label(Label::ValidUntil),
                        loc.format_datetime(&t.with_timezone(&r.time_zone))
                    ),
                    cols,
                );
                e.bold(false);
            }
        }
        ReceiptKind::Expired { expired_at } => {
            if let Some(t) = expired_at {
                labelled(
                    &mut e,
                    loc.label(Label::ExpiredAt),
                    &loc.format_datetime(&t.with_timezone(&r.time_zone)),
                    cols,
                );
            }
            small_print(&mut e, p, |e, cols| ids(e, r, cols));
            separator(&mut e, cols);
            e.align(Align::Center).bold(true);
            wrapped(&mut e, loc.label(Label::NotPaid), cols);
            e.bold(false);
            wrapped(&mut e, loc.label(Label::NewChargeHint), cols);
        }
    }

    e.align(Align::Left);
    e.feed_lines(3).cut_with(p.cut(), 3);
    Ok(e.e.into_bytes())
}

/// Line items: name left (wrapped), value right-aligned on the name's first line; then a
/// separator. Nothing when there are none.
fn items(e: &mut E, r: &Receipt, cols: usize) {
    if r.items.is_empty() {
        return;
    }
    for (name, value) in &r.items {
        let v = e.encode(value);
        let v = &v[..v.len().min(cols / 2)];
        let name_w = cols - v.len() - 1;
        let name_lines = wrap(&e.encode(name), name_w);
        for (i, nl) in name_lines.iter().enumerate() {
            let mut b = nl.clone();
            if i == 0 {
                b.resize(cols - v.len(), b' ');
                b.extend_from_slice(v);
            }
            line(e, &b);
        }
    }
    separator(e, cols);
}

/// The comment after its label, wrapped, at most [`MAX_COMMENT_LINES`] lines.
fn comment(e: &mut E, r: &Receipt, cols: usize) {
    if let Some(c) = r.comment.as_deref().filter(|c| !c.trim().is_empty()) {
        let mut text = e.encode(r.locale.label(Label::Comment));
        text.extend_from_slice(b": ");
        text.extend(e.encode(c));
        let mut lines = wrap(&text, cols);
        if lines.len() > MAX_COMMENT_LINES {
            lines.truncate(MAX_COMMENT_LINES);
            let last = lines.last_mut().expect("non-empty");
            last.truncate(cols - 3);
            last.extend_from_slice(b"...");
        }
        for l in lines {
            line(e, &l);
        }
    }
}

/// Lines written by `body` (given the font B columns) in font B (`ESC M 1`), then back to
/// font A (`ESC M 0`). Every line `body` writes ends with LF, so the switch back happens at
/// a line start and never changes a line already in the printer's buffer.
fn small_print(e: &mut E, p: &PrinterSetup, body: impl FnOnce(&mut E, usize)) {
    e.font(Font::B);
    body(e, p.columns_font_b());
    e.font(Font::A);
}

/// Charge id and txid lines.
fn ids(e: &mut E, r: &Receipt, cols: usize) {
    labelled(e, r.locale.label(Label::Charge), &r.charge_id, cols);
    if let Some(t) = r.txid.as_deref().filter(|c| !c.trim().is_empty()) {
        labelled(e, r.locale.label(Label::Txid), t, cols);
    }
}

/// The BR Code as a centred QR (native or raster, see [`render_receipt_for`]), then LF.
fn qr_block(e: &mut E, code: &str, p: &PrinterSetup) -> Result<(), ReceiptError> {
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
        super::raster_qr(e, &m, module.min(MAX_MODULE_DOTS), p.model);
    }
    e.lf();
    Ok(())
}
