//! # render
//!
//! Everything pixgate puts in front of a shop's customer, as pure functions of a charge:
//! the Pix BR Code payload, its QR image, the ESC/POS receipt for the thermal printer and
//! the card machine's screens. No I/O here: the gateway and the simulators call in.
//!
//! - [`brcode`]: parse, validate and write Pix BR Codes (EMV-MPM, CRC16).
//! - [`money`], [`locale`]: amounts in centavos as text; languages and labels.
//! - [`qr`]: QR matrices at error correction M, PNGs, module sizing.
//! - [`qr_fast`]: the QR encoder behind [`qr`] (optimal numeric/alphanumeric/byte
//!   segments), about 100x faster than the `qrcode` crate.
//! - [`escpos`], [`receipt`]: ESC/POS command writer and the receipts (paid, pay-with-Pix
//!   slip, expiry notice).
//! - [`profile`]: printer models (dots, columns, `ESC t` numbers per vendor, QR, cut).
//! - [`screen`]: card-machine screens as pictures.
//! - [`codepage`], [`font`]: printer code pages and bundled fonts.

pub mod brcode;
pub mod codepage;
pub mod escpos;
pub mod font;
pub mod locale;
pub mod money;
pub mod paint;
pub mod profile;
pub mod qr;
pub mod qr_fast;
pub mod receipt;
pub mod screen;

#[cfg(test)]
mod testgen;

pub use locale::Locale;
