//! Per-device delivery: one FIFO queue per device, one job in flight, the next sent only
//! after the device acknowledges the current one (Azure IoT Hub's cloud-to-device model:
//! completed / rejected / abandoned feedback, a maximum delivery count).
//!
//! Lifecycle of a job: queued → in flight → done | failed (dead letter) | expired |
//! superseded.
//! - No ack within `ack_timeout_ms`: sent again (same message id and seq; the device
//!   dedupes), with exponential backoff between attempts.
//! - `failed` ack: permanent → dead letter at once; transient → retried with backoff.
//! - `max_deliveries` sends without a `done` → dead letter.
//! - Its `expires_at` passed (by the injectable [`crate::clock::Clock`]) before it was done
//!   → expired: never sent again, dead-lettered with reason `expired` (a device that cannot
//!   take jobs has its queued ones checked every second, and the one in flight when its ack
//!   timeout passes, so they leave the outbox on time).
//! - A device whose status says offline, or a printer that cannot print (paper out, cover
//!   open), is not sent anything; its queue waits and resumes on the next good status.
//! - A queued `display_qr` for a charge whose paid/expired screen (or, on a printer that
//!   prints pay-with-Pix slips, whose receipt) is enqueued to the same device is
//!   superseded: a customer must never see the QR of a charge that is over.
//!
//! The dispatcher is one task owning the in-memory mirror of the durable outbox
//! ([`crate::store::outbox`]): jobs arrive already stored (with their `seq`), and at start-up
//! it is given every job the outbox still holds. Its queues are bounded by the outbox bound
//! (see [`crate::ingest::consumer`]). A job arrives with its wire bytes (its JSON as the
//! outbox stored it), sent as they are. Queued jobs keep them in memory up to
//! `delivery.held_payload_bytes` in all; beyond that, and for jobs reloaded at start-up, only
//! the job's header is kept and the bytes are read back from the outbox when the job is
//! sent ([`Dispatcher::with_outbox`]): memory stays flat however full the outbox gets.
//!
//! Where things are (one concept per file):
//! - `machine.rs`: the rules, as a state machine without I/O: events in, with the time they
//!   happen at, `Action`s (`action.rs`) out;
//! - `slot.rs`: a device's in-flight slot (idle, scheduled, awaiting its ack);
//! - `queue.rs`: a device's queue, slot and status; `held.rs`: the held payload budget;
//! - `run.rs`: the runner, [`Dispatcher`]: channels, timers, outbox read-back and the
//!   [`Transport`](crate::deliver::transport::Transport), carrying out the machine's
//!   actions;
//! - `tests.rs`: the dispatcher end to end (runner and machine), on paused time.

mod action;
mod held;
mod machine;
mod queue;
mod run;
mod slot;
#[cfg(test)]
mod tests;

pub use run::Dispatcher;
