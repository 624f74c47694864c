//! What the state machine ([`super::machine`]) asks the runner ([`super::run`]) to do, and
//! what the runner tells it back: the only I/O the dispatcher does.

use crate::model::{Finished, StoredJob};
use bytes::Bytes;

/// One thing for the runner to carry out, in the order the machine returned them.
#[derive(Debug)]
pub enum Action {
    /// Hand a job's wire bytes to its device through the transport.
    Send(Delivery),
    /// Read the wire bytes of `device`'s in-flight job `seq` back from the outbox and give
    /// them to [`super::machine::Machine::read_back`], before anything else happens to
    /// that device.
    ReadBack {
        /// Device id.
        device: String,
        /// The job's seq, the outbox key with `device`.
        seq: u64,
    },
    /// A job left its device's queue: report it to the consumer (count a `Done` as an
    /// effect carried out, an `Expired` as expired).
    Finish(Finished),
    /// A job whose row the outbox no longer held when read back (an earlier run finished
    /// it): report it done, so the consumer's bounds count it out; nothing was sent and the
    /// device did nothing, so no effect is counted.
    Vanished(StoredJob),
}

/// One delivery of one job.
#[derive(Debug)]
pub struct Delivery {
    /// Device id.
    pub device: String,
    /// The job's seq (per device, from the outbox).
    pub seq: u64,
    /// The job's message id, the same on every delivery: the device dedupes by it.
    pub message_id: String,
    /// Which delivery this is: 1 the first, 2 and up a resend.
    pub attempt: u32,
    /// The job's JSON, payload included, exactly as stored.
    pub wire: Bytes,
}

impl Delivery {
    /// Whether the device was sent this job before.
    pub fn is_redelivery(&self) -> bool {
        self.attempt > 1
    }
}

/// What the outbox gave back for an [`Action::ReadBack`].
#[derive(Debug)]
pub enum ReadBack {
    /// The job's wire bytes.
    Wire(Bytes),
    /// No such row: the job was finished (by an earlier run).
    Gone,
    /// The outbox could not be read (logged by the runner); tried again after a backoff.
    Failed,
}
