//! Printers that fetch their own jobs over Epson Server Direct Print: a stock Epson TM
//! printer with SDP (TM-T88VI, TM-m30, TM-i models) pointed at pixgate (its WebConfig:
//! server URL, interval, ID, Digest user and password) prints pixgate's receipts with no
//! box beside it.
//!
//! It shares the CloudPRNT printers' board (`deliver::cloudprnt`): the job the dispatcher
//! has in flight is offered and answered to the printer's poll, here as ePOS-Print XML
//! carrying the ESC/POS pixgate rendered ([`epos`]); its result is the ack. Parts: who may
//! ask ([`digest`]), the endpoint ([`server`]). It is served on the CloudPRNT listener
//! (`cloudprnt.listen`), at `/sdp`.

pub mod digest;
pub mod epos;
pub mod server;

pub use server::{routes, Sdp};
