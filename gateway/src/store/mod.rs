//! The durable per-device outbox ([`outbox`]): every device's job queue, the dedupe window,
//! charge states, the device registry and parked dead letters, in one redb file, with the
//! effect flags of a cutover ([`flags`]) and the reconciliation counts ([`reconcile`]); and the
//! devices' secrets ([`credentials`]), kept as keyed hashes; and the free bytes of the
//! outbox's file system against its watermark ([`free_space`]).

pub mod credentials;
pub mod flags;
pub mod free_space;
pub mod outbox;
pub mod reconcile;

pub use outbox::{
    Accept, ChargeState, DeviceEntry, DirectMark, Outbox, OutboxError, ParkedDeadLetter, Removal, ReplayError, Written,
};
