//! Printers pixgate drives itself, without MQTT: a raw TCP socket (port 9100), a serial
//! line or a USB line-printer device ([`Endpoint`]), written in chunks under a stall
//! deadline, with the real-time status asked before and after ([`link`], [`status`]).
//!
//! The dispatcher reaches them through [`Routed`], the transport that hands a direct
//! printer's jobs to its own task ([`printer`]) and every other device's to MQTT; a job
//! cut short is printed again under a header ([`reprint`]); at shutdown the writes under
//! way are let finish ([`writes`]). `pixgate print` uses the same link by hand.

pub mod link;
pub mod printer;
pub mod reprint;
pub mod routed;
pub mod status;
pub mod writes;

pub use crate::model::endpoint::Endpoint;
pub use link::Link;
pub use routed::Routed;
pub use status::PrinterStatus;
pub use writes::Writes;
