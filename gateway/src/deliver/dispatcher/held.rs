//! The held payload budget: how many bytes of queued jobs' wire bytes stay in memory.
//!
//! A queued job keeps its wire bytes while the budget (`delivery.held_payload_bytes`, all
//! devices together) has room; beyond it only its header is kept and the bytes are read
//! back from the outbox when the job is sent, so memory stays flat however full the outbox
//! gets. Without an outbox to read back from, every job keeps its bytes. In-flight jobs
//! (at most one per device) are not counted.

use super::queue::Waiting;
use crate::model::Queued;
use bytes::Bytes;

/// Bytes held by queued jobs, and the most they may hold.
#[derive(Debug, Default)]
pub struct Held {
    /// Wire bytes held by queued jobs, bytes.
    bytes: usize,
    /// The most `bytes` may reach, bytes; `None`: no limit (nowhere to read bytes back from).
    budget: Option<usize>,
}

impl Held {
    /// Every job keeps its bytes: there is nothing to read them back from.
    pub fn unlimited() -> Held {
        Held { bytes: 0, budget: None }
    }

    /// Jobs keep their bytes while the total stays within `budget` bytes; the others are
    /// read back when sent.
    pub fn up_to(budget: usize) -> Held {
        Held { bytes: 0, budget: Some(budget) }
    }

    /// Whether jobs beyond the budget are read back (an outbox is attached).
    pub fn reads_back(&self) -> bool {
        self.budget.is_some()
    }

    /// A job to wait in a queue: its wire bytes kept while the budget has room.
    pub fn shelve(&mut self, q: Queued) -> Waiting {
        let keep = self.budget.is_none_or(|budget| self.bytes + q.wire.len() <= budget);
        let wire = keep.then_some(q.wire);
        self.bytes += wire.as_ref().map_or(0, Bytes::len);
        Waiting { stored: q.stored, wire, accepted_at: q.accepted_at }
    }

    /// `w` left its queue (sent, superseded, expired): its bytes no longer count.
    pub fn release(&mut self, w: &Waiting) {
        self.bytes -= w.held();
    }

    /// Wire bytes held by queued jobs, bytes.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
