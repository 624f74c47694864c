//! How the dispatcher reaches a device: the [`Transport`] seam.
//!
//! The dispatcher decides what goes to which device and when (one job in flight per
//! device, resends, expiry); a transport only carries bytes. Both directions:
//! - **to a device**: [`Transport::send`] hands one job's wire bytes to one device;
//! - **from a device**: acks and status reports arrive as [`crate::model::Incoming`] on a
//!   channel the transport was given when it was started (e.g.
//!   [`crate::deliver::mqtt::start`]'s `incoming`), which the wiring forwards to the
//!   dispatcher as [`crate::model::Command::Device`]. A transport never calls the
//!   dispatcher.
//!
//! Implemented by the embedded MQTT broker's [`crate::deliver::mqtt::Publisher`], by an
//! external MQTT broker's [`crate::deliver::broker::BrokerPublisher`], and by
//! [`crate::deliver::direct::Routed`]: printers pixgate drives itself, the rest through
//! another transport.

use bytes::Bytes;
use std::future::Future;

/// A send that did not reach the transport. The dispatcher logs it and does nothing else:
/// the job stays in flight and its ack timeout sends it again, as for any job whose ack
/// does not come.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The transport's link is gone (e.g. the thread that owns the MQTT broker link
    /// stopped); nothing sent through it reaches any device.
    #[error("the {0} link is gone")]
    Closed(&'static str),
    /// The transport's link is down for now and reconnecting on its own (an external MQTT
    /// broker restarting), or too busy to take more (its queue full); an outage is logged
    /// once and fails readiness, and a link that takes nothing for long shows as a stalled
    /// delivery, so a send refused meanwhile is not worth a log line of its own.
    #[error("the {0} link is down, reconnecting")]
    Down(&'static str),
    /// The device's own queue in the transport is full (a direct printer still busy with
    /// the job and its resends): this send is dropped, the job it repeats is still there.
    #[error("{0}'s queue is full")]
    Full(String),
}

/// A way to hand jobs to devices.
///
/// Implementations are shared by the dispatcher for its whole run (`&self`, `Send + Sync`);
/// the future [`send`](Transport::send) returns is `Send` so the dispatcher can run on any
/// tokio worker.
pub trait Transport: Send + Sync + 'static {
    /// Hands one job's wire bytes (its JSON, [`device_protocol::Job`], exactly as the outbox
    /// stored it) to `device`, addressed however the transport addresses devices (MQTT: the
    /// topic `pixgate/v1/devices/{device}/jobs`).
    ///
    /// `Ok` means the transport took the bytes, not that the device got them or carried the
    /// job out: only the device's ack says that. The same bytes may be sent again (same
    /// message id and seq) when the ack does not come; the device dedupes. May wait while
    /// the transport is busy (a full link), which slows the dispatcher, never drops a job.
    ///
    /// # Errors
    /// [`TransportError`]: the bytes were not taken.
    fn send(&self, device: &str, wire: Bytes) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// The dispatcher ended `device`'s job `message_id` without the device's answer (its
    /// time to live passed, it ran out of deliveries, it failed or was superseded): a
    /// transport that keeps a job for its device to fetch (a CloudPRNT or Epson printer's
    /// offer) drops it, so that it is never handed out after. Nothing by default: a job
    /// pushed is gone already, and a device checks `expires_at` itself.
    fn withdraw(&self, device: &str, message_id: &str) {
        let _ = (device, message_id);
    }
}
