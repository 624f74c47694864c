//! Card-machine ("maquininha") screens as pictures: waiting for a Pix payment with the QR
//! code, payment confirmed, charge expired.
//!
//! Layout is relative to the screen (designed at 720 × 1280 px, the fixtures' terminal
//! size, and scaled by `min(width / 720, height / 1280)`): a coloured header band with the
//! merchant's name, then the state's content on white. The QR is drawn with whole pixels per
//! module (crisp edges), as large as fits, with a 4-module white quiet zone (ISO/IEC 18004),
//! so the payer's camera can read it from the screen. Colours: Pix teal `#32BCAD` for the
//! QR screen, green `#16A34A` for paid, slate grey `#64748B` for expired.

use crate::font::{self, Face};
use crate::locale::{Label, Locale};
use crate::money::format_amount;
use crate::paint;
use crate::qr;
use chrono::{DateTime, Utc};
use image::{ImageEncoder, Rgb, RgbImage};

/// What the card machine shows.
#[derive(Debug, Clone, PartialEq)]
pub enum Screen {
    /// Charge `ACTIVE`: the Pix QR code to scan.
    PayWithPix {
        /// `merchant.name`, as spelled.
        merchant_name: String,
        /// Charge `value` in centavos.
        amount_cents: u64,
        /// The BR Code the QR encodes (exactly these bytes).
        brcode: String,
        /// `expiresDate`, shown as a time of day in the screen's time zone.
        expires_at: Option<DateTime<Utc>>,
    },
    /// Charge `COMPLETED`: green check and "Payment confirmed".
    Paid {
        /// `merchant.name`.
        merchant_name: String,
        /// Charge `value` in centavos.
        amount_cents: u64,
        /// `payer.name`.
        payer_name: Option<String>,
        /// `paidAt`.
        paid_at: Option<DateTime<Utc>>,
    },
    /// Charge `EXPIRED`: neutral grey "Charge expired"; no QR.
    Expired {
        /// `merchant.name`.
        merchant_name: String,
        /// Charge `value` in centavos.
        amount_cents: u64,
    },
}

const WHITE: Rgb<u8> = Rgb([255, 255, 255]);
const INK: Rgb<u8> = Rgb([17, 24, 39]);
const MUTED: Rgb<u8> = Rgb([100, 116, 139]);
const PIX_TEAL: Rgb<u8> = Rgb([50, 188, 173]);
const PIX_DARK: Rgb<u8> = Rgb([14, 116, 104]);
const GREEN: Rgb<u8> = Rgb([22, 163, 74]);
const GREEN_DARK: Rgb<u8> = Rgb([21, 128, 61]);
const GREY: Rgb<u8> = Rgb([100, 116, 139]);
const GREY_LIGHT: Rgb<u8> = Rgb([203, 213, 225]);
const PANEL: Rgb<u8> = Rgb([241, 245, 249]);

struct Ctx {
    w: f32,
    h: f32,
    s: f32,
}

impl Ctx {
    fn cx(&self) -> f32 {
        self.w / 2.0
    }
    fn text_w(&self) -> f32 {
        self.w - 2.0 * 40.0 * self.s
    }
}

/// `text` without characters the bundled fonts cannot draw (emoji, other scripts), with
/// whitespace collapsed.
fn displayable(text: &str) -> String {
    let kept: String =
        text.chars().map(|c| if c.is_whitespace() || font::has_glyph(Face::SansBold, c) { c } else { ' ' }).collect();
    kept.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Header band with the merchant's name: one line if it fits at a readable size, otherwise
/// two lines broken at a word, the second ellipsised if needed. Returns the band height.
fn header(img: &mut RgbImage, c: &Ctx, merchant: &str, color: Rgb<u8>) -> f32 {
    let hh = (140.0 * c.s).round();
    paint::fill_rect(img, 0, 0, c.w as i64, hh as i64, color);
    let name = displayable(merchant);
    let (px, t) = paint::fit_text(Face::SansBold, &name, 44.0 * c.s, 34.0 * c.s, c.text_w());
    if !t.ends_with('…') {
        paint::text_centered(img, Face::SansBold, px, px, c.cx(), (hh - px * 1.16) / 2.0, c.text_w(), &t, WHITE);
        return hh;
    }
    let px = 34.0 * c.s;
    let words: Vec<&str> = name.split(' ').collect();
    let mut n = 1;
    while n < words.len() && font::text_width(Face::SansBold, px, &words[..n + 1].join(" ")) <= c.text_w() {
        n += 1;
    }
    let (l1, l2) = (words[..n].join(" "), words[n..].join(" "));
    let line_h = px * 1.2;
    let y = (hh - 2.0 * line_h) / 2.0;
    paint::text_centered(img, Face::SansBold, px, px, c.cx(), y, c.text_w(), &l1, WHITE);
    paint::text_centered(img, Face::SansBold, px, px, c.cx(), y + line_h, c.text_w(), &l2, WHITE);
    hh
}

fn footer(img: &mut RgbImage, c: &Ctx, text: &str) {
    let y = c.h - 70.0 * c.s;
    paint::line(img, (40.0 * c.s, y - 20.0 * c.s), (c.w - 40.0 * c.s, y - 20.0 * c.s), 2.0 * c.s, GREY_LIGHT);
    paint::text_centered(img, Face::Sans, 26.0 * c.s, 12.0 * c.s, c.cx(), y, c.text_w(), text, MUTED);
}

/// Renders `s` at `width_px` × `height_px` with labels, amount and times in `locale`, times
/// shown in `tz`. Never fails: text that does not fit is shrunk, then ellipsised; a BR Code
/// that cannot be a QR shows an error panel instead of a QR.
pub fn render_screen(s: &Screen, width_px: u32, height_px: u32, locale: Locale, tz: chrono_tz::Tz) -> RgbImage {
    let (w, h) = (width_px.max(1), height_px.max(1));
    let mut img = RgbImage::from_pixel(w, h, WHITE);
    let c = Ctx { w: w as f32, h: h as f32, s: (w as f32 / 720.0).min(h as f32 / 1280.0) };
    match s {
        Screen::PayWithPix { merchant_name, amount_cents, brcode, expires_at } => {
            let top = header(&mut img, &c, merchant_name, PIX_TEAL);
            let mut y = top + 36.0 * c.s;
            paint::text_centered(
                &mut img,
                Face::Sans,
                40.0 * c.s,
                16.0 * c.s,
                c.cx(),
                y,
                c.text_w(),
                locale.label(Label::PayWithPix),
                MUTED,
            );
            y += 58.0 * c.s;
            let amount = format_amount(*amount_cents as i64, locale);
            let px = paint::text_centered(
                &mut img,
                Face::SansBold,
                96.0 * c.s,
                30.0 * c.s,
                c.cx(),
                y,
                c.text_w(),
                &amount,
                INK,
            );
            y += px * 1.25 + 24.0 * c.s;

            // Bottom block: hint and expiry.
            let bottom = c.h - 230.0 * c.s;
            let avail_h = (bottom - y).max(0.0);
            let avail_w = c.w - 2.0 * 32.0 * c.s;
            match qr::encode(brcode) {
                Ok(m) => {
                    let module = qr::module_size_for_width(&m, avail_w.min(avail_h) as u32, 4).max(1);
                    let side = (m.width as u32 + 8) * module;
                    let x0 = ((c.w - side as f32) / 2.0).round() as i64;
                    let y0 = (y + (avail_h - side as f32).max(0.0) / 2.0).round() as i64;
                    // A light card behind the white quiet zone frames the code.
                    let pad = 14.0 * c.s;
                    paint::fill_rounded_rect(
                        &mut img,
                        x0 as f32 - pad,
                        y0 as f32 - pad,
                        x0 as f32 + side as f32 + pad,
                        y0 as f32 + side as f32 + pad,
                        22.0 * c.s,
                        PANEL,
                    );
                    paint::fill_rect(&mut img, x0, y0, x0 + side as i64, y0 + side as i64, WHITE);
                    for my in 0..m.width {
                        for mx in 0..m.width {
                            if m.get(mx, my) {
                                let px0 = x0 + ((mx as u32 + 4) * module) as i64;
                                let py0 = y0 + ((my as u32 + 4) * module) as i64;
                                paint::fill_rect(
                                    &mut img,
                                    px0,
                                    py0,
                                    px0 + module as i64,
                                    py0 + module as i64,
                                    Rgb([0, 0, 0]),
                                );
                            }
                        }
                    }
                }
                Err(e) => {
                    paint::fill_rounded_rect(&mut img, 40.0 * c.s, y, c.w - 40.0 * c.s, bottom, 22.0 * c.s, PANEL);
                    paint::text_centered(
                        &mut img,
                        Face::Sans,
                        28.0 * c.s,
                        12.0 * c.s,
                        c.cx(),
                        (y + bottom) / 2.0,
                        c.text_w(),
                        &e.to_string(),
                        MUTED,
                    );
                }
            }
            let mut y = bottom + 26.0 * c.s;
            paint::text_centered(
                &mut img,
                Face::Sans,
                30.0 * c.s,
                14.0 * c.s,
                c.cx(),
                y,
                c.text_w(),
                locale.label(Label::ScanHint),
                INK,
            );
            y += 56.0 * c.s;
            if let Some(t) = expires_at {
                let txt = format!("{} {}", locale.label(Label::ExpiresAt), locale.format_time(&t.with_timezone(&tz)));
                // Clock icon + text, centred together.
                let px = 30.0 * c.s;
                let tw = font::text_width(Face::SansBold, px, &txt);
                let icon = 30.0 * c.s;
                let x = c.cx() - (tw + icon + 12.0 * c.s) / 2.0;
                let (icx, icy, r) = (x + icon / 2.0, y + px * 0.58, icon / 2.0 - 1.5 * c.s);
                paint::stroke_circle(&mut img, icx, icy, r, 3.0 * c.s, PIX_DARK);
                paint::line(&mut img, (icx, icy), (icx, icy - r * 0.6), 3.0 * c.s, PIX_DARK);
                paint::line(&mut img, (icx, icy), (icx + r * 0.45, icy), 3.0 * c.s, PIX_DARK);
                font::draw_rgb(&mut img, Face::SansBold, px, x + icon + 12.0 * c.s, y, &txt, PIX_DARK);
            }
            footer(&mut img, &c, "Pix");
        }
        Screen::Paid { merchant_name, amount_cents, payer_name, paid_at } => {
            let top = header(&mut img, &c, merchant_name, GREEN);
            let r = 110.0 * c.s;
            let (cx, cy) = (c.cx(), top + 90.0 * c.s + r);
            paint::fill_circle(&mut img, cx, cy, r + 18.0 * c.s, Rgb([220, 252, 231]));
            paint::fill_circle(&mut img, cx, cy, r, GREEN);
            let t = 22.0 * c.s;
            paint::line(&mut img, (cx - 0.48 * r, cy + 0.02 * r), (cx - 0.14 * r, cy + 0.36 * r), t, WHITE);
            paint::line(&mut img, (cx - 0.14 * r, cy + 0.36 * r), (cx + 0.50 * r, cy - 0.32 * r), t, WHITE);
            let mut y = cy + r + 70.0 * c.s;
            paint::text_centered(
                &mut img,
                Face::SansBold,
                52.0 * c.s,
                20.0 * c.s,
                c.cx(),
                y,
                c.text_w(),
                locale.label(Label::PaymentConfirmed),
                GREEN_DARK,
            );
            y += 100.0 * c.s;
            let amount = format_amount(*amount_cents as i64, locale);
            paint::text_centered(&mut img, Face::SansBold, 96.0 * c.s, 30.0 * c.s, c.cx(), y, c.text_w(), &amount, INK);
            y += 150.0 * c.s;
            let mut rows: Vec<(&str, String)> = Vec::new();
            if let Some(p) = payer_name.as_deref().filter(|p| !p.trim().is_empty()) {
                rows.push((locale.label(Label::Payer), p.to_string()));
            }
            if let Some(t) = paid_at {
                rows.push((locale.label(Label::Date), locale.format_datetime(&t.with_timezone(&tz))));
            }
            if !rows.is_empty() {
                let row_h = 96.0 * c.s;
                let x0 = 48.0 * c.s;
                paint::fill_rounded_rect(
                    &mut img,
                    x0,
                    y,
                    c.w - x0,
                    y + row_h * rows.len() as f32 + 24.0 * c.s,
                    22.0 * c.s,
                    PANEL,
                );
                let mut ry = y + 22.0 * c.s;
                for (label, value) in rows {
                    font::draw_rgb(&mut img, Face::Sans, 24.0 * c.s, x0 + 28.0 * c.s, ry, label, MUTED);
                    let (px, v) =
                        paint::fit_text(Face::SansBold, &value, 34.0 * c.s, 16.0 * c.s, c.w - 2.0 * x0 - 56.0 * c.s);
                    font::draw_rgb(&mut img, Face::SansBold, px, x0 + 28.0 * c.s, ry + 30.0 * c.s, &v, INK);
                    ry += row_h;
                }
            }
            footer(&mut img, &c, locale.label(Label::ThankYou));
        }
        Screen::Expired { merchant_name, amount_cents } => {
            let top = header(&mut img, &c, merchant_name, GREY);
            let r = 110.0 * c.s;
            let (cx, cy) = (c.cx(), top + 90.0 * c.s + r);
            paint::fill_circle(&mut img, cx, cy, r + 18.0 * c.s, PANEL);
            paint::fill_circle(&mut img, cx, cy, r, GREY_LIGHT);
            // Clock face: the charge ran out of time.
            paint::stroke_circle(&mut img, cx, cy, r * 0.62, 14.0 * c.s, GREY);
            paint::line(&mut img, (cx, cy), (cx, cy - r * 0.40), 14.0 * c.s, GREY);
            paint::line(&mut img, (cx, cy), (cx + r * 0.30, cy + r * 0.18), 14.0 * c.s, GREY);
            let mut y = cy + r + 70.0 * c.s;
            paint::text_centered(
                &mut img,
                Face::SansBold,
                52.0 * c.s,
                20.0 * c.s,
                c.cx(),
                y,
                c.text_w(),
                locale.label(Label::ChargeExpired),
                INK,
            );
            y += 100.0 * c.s;
            let amount = format_amount(*amount_cents as i64, locale);
            let px = paint::text_centered(
                &mut img,
                Face::SansBold,
                80.0 * c.s,
                30.0 * c.s,
                c.cx(),
                y,
                c.text_w(),
                &amount,
                GREY,
            );
            // Struck through: this amount is no longer payable.
            let aw = font::text_width(Face::SansBold, px, &amount);
            let sy = y + px * 0.62;
            paint::line(
                &mut img,
                (c.cx() - aw / 2.0 - 6.0 * c.s, sy),
                (c.cx() + aw / 2.0 + 6.0 * c.s, sy),
                3.0 * c.s,
                GREY,
            );
            y += px * 1.25 + 50.0 * c.s;
            paint::text_centered(
                &mut img,
                Face::Sans,
                32.0 * c.s,
                14.0 * c.s,
                c.cx(),
                y,
                c.text_w(),
                locale.label(Label::NewChargeHint),
                MUTED,
            );
            footer(&mut img, &c, "Pix");
        }
    }
    img
}

/// Encodes a screen picture as an RGB PNG.
pub fn to_png(img: &RgbImage) -> Vec<u8> {
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out)
        .write_image(img.as_raw(), img.width(), img.height(), image::ExtendedColorType::Rgb8)
        .expect("encoding a PNG into memory cannot fail");
    out
}
