//! One device's line: its FIFO queue of waiting jobs, its in-flight [`Slot`], and what its
//! last status said about whether it can take jobs.

use super::slot::Slot;
use crate::model::StoredJob;
use bytes::Bytes;
use device_protocol::PrinterState;
use std::collections::VecDeque;
use tokio::time::Instant;

/// A job waiting in its device's queue.
#[derive(Debug)]
pub struct Waiting {
    /// The job without its payload.
    pub stored: StoredJob,
    /// What to send, while the held budget allows ([`super::held::Held`]); `None`: read
    /// back from the outbox when sent (or, without an outbox, serialized from `stored`,
    /// which then holds the whole job).
    pub wire: Option<Bytes>,
    /// When its record was durably accepted ([`crate::model::Queued::accepted_at`]).
    pub accepted_at: Option<Instant>,
}

impl Waiting {
    /// Wire bytes this job holds in memory, bytes.
    pub fn held(&self) -> usize {
        self.wire.as_ref().map_or(0, Bytes::len)
    }
}

/// One device's queue, in-flight slot and status.
#[derive(Debug, Default)]
pub struct DeviceQueue {
    /// Jobs not yet sent, in `seq` order.
    pub queue: VecDeque<Waiting>,
    /// The job between the queue and the device, if any.
    pub slot: Slot,
    /// The last status's `online`; `None` before the first status.
    pub online: Option<bool>,
    /// The last status's printer state (printers only).
    pub printer: Option<PrinterState>,
}

impl DeviceQueue {
    /// Whether a job sent now could be carried out. Unknown status counts as reachable: the
    /// ack timeout covers a device that is not.
    pub fn can_send(&self) -> bool {
        self.online != Some(false) && self.printer.is_none_or(PrinterState::can_print)
    }

    /// Takes the queued jobs `pred` picks out of the queue, in queue order; the rest stay
    /// in order. The queue is only rebuilt when `pred` picks one.
    pub fn take_where(&mut self, pred: impl Fn(&Waiting) -> bool) -> VecDeque<Waiting> {
        if !self.queue.iter().any(&pred) {
            return VecDeque::new();
        }
        let (taken, kept) = std::mem::take(&mut self.queue).into_iter().partition(pred);
        self.queue = kept;
        taken
    }
}
