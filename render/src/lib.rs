//! # render
//!
//! Everything pixgate puts in front of a shop's customer, as pure functions of a charge:
//! the Pix BR Code payload, its QR image, the ESC/POS receipt for the thermal printer and
//! the card machine's screens. No I/O here: the gateway and the simulators call in.

pub mod codepage;
pub mod font;
