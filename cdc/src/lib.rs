//! # cdc: the capture job's change events
//!
//! Decodes the records the upstream capture job publishes on `charge.upserted` and
//! `device.upserted` (MongoDB change events in relaxed Extended JSON; contract:
//! `fixtures/cdc/README.md`) into the shapes pixgate routes on ([`document`]).
//!
//! Decoding is strict where a wrong guess would show a wrong amount or send a QR to the
//! wrong shop (an amount must be integer centavos, `company` must be there) and tolerant
//! where the database legitimately varies (`{"$numberLong": "990"}` or `990`; `{"$oid"}`
//! or a plain string). Every failure is a [`DecodeError`] whose [`DecodeError::reason`] is
//! a stable, short dead-letter reason.
//!
//! - [`value`]: the reference decoders (a `serde_json::Value` first), for device events and
//!   as the fallback.
//! - [`charge_record`]: the consumer's typed, borrowing decoder for `charge.upserted`,
//!   which gives exactly what the reference gives.
//!
//! This crate has no Kafka, MQTT or HTTP dependency, so the fuzz target and the decode
//! bench build without them.

pub mod charge_record;
pub mod document;
pub mod error;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod value;

pub use charge_record::{decode_charge_record, decode_with_values, ChargeRecord};
pub use document::{
    Charge, ChargeStatus, CloudMethod, CloudPrinter, Device, DeviceKind, DirectPrinter, Envelope, Interrupted,
    Operation,
};
pub use error::DecodeError;
pub use value::{decode_charge, decode_device, decode_envelope};
