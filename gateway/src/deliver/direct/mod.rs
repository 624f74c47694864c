//! Printers pixgate drives itself, without MQTT: a raw TCP socket (port 9100), a serial
//! line or a USB line-printer device ([`endpoint`]), written in chunks under a stall
//! deadline, with the real-time status asked before and after ([`link`], [`status`]).
//!
//! Today this serves `pixgate print` (a technician's first test at a shop); the dispatcher
//! reaching such printers through the transport seam builds on it.

pub mod endpoint;
pub mod link;
pub mod status;

pub use endpoint::Endpoint;
pub use link::Link;
pub use status::PrinterStatus;
