//! What a device makes of a job: the paper an ESC/POS receipt printer prints from the bytes
//! it receives ([`escpos`]), and the screen a card machine draws from a screen job
//! ([`screen`]).
//!
//! The simulated devices (`simulators`) print and draw with it, and so does the gateway's
//! dashboard for its pictures of recent jobs, so what the operator sees is what the device
//! shows.

pub mod escpos;
pub mod screen;
