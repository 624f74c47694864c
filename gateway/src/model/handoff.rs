//! What passes between the stages that feed the dispatcher and the dispatcher itself:
//! jobs the outbox has stored ([`Command::Enqueue`]), device messages
//! ([`Command::Device`]), and jobs that left a device's queue ([`Finished`]), reported back
//! so the consumer can remove them from the outbox and release its bounds.

use crate::model::Queued;
use crate::model::StoredJob;
use device_protocol::{Ack, Status, Topic};

/// A message from a device, as the dispatcher needs it.
#[derive(Debug, Clone)]
pub enum Incoming {
    /// An [`Ack`] on `pixgate/v1/devices/{device}/acks`.
    Ack {
        /// Device id from the topic.
        device: String,
        /// The ack.
        ack: Ack,
    },
    /// A [`Status`] on `pixgate/v1/devices/{device}/status` (retained, or the last will).
    Status {
        /// Device id from the topic.
        device: String,
        /// The status.
        status: Status,
    },
}

impl Incoming {
    /// Decodes a device message from its topic and payload: an [`Ack`] on
    /// `pixgate/v1/devices/{id}/acks`, a [`Status`] on `…/status`. `Ok(None)` for any other
    /// topic.
    ///
    /// # Errors
    /// The payload is not what the topic carries (a device's bug, not an event pixgate
    /// owns: the caller counts it and drops it).
    pub fn parse(topic: &str, payload: &[u8]) -> Result<Option<Incoming>, serde_json::Error> {
        let Some(topic) = Topic::parse(topic) else { return Ok(None) };
        match topic {
            Topic::Acks(device) => serde_json::from_slice(payload).map(|ack| Some(Incoming::Ack { device, ack })),
            Topic::Status(device) => {
                serde_json::from_slice(payload).map(|status| Some(Incoming::Status { device, status }))
            }
            Topic::Jobs(_) => Ok(None),
        }
    }
}

/// Work for the dispatcher.
#[derive(Debug)]
pub enum Command {
    /// Queue a job the outbox has stored (its `seq` assigned there).
    Enqueue(Queued),
    /// A message from a device.
    Device(Incoming),
    /// The central shape: these devices' partition went to another replica; their queues
    /// and jobs in flight are dropped, nothing more is sent to them, and nothing of them is
    /// reported finished.
    Forget(Vec<String>),
    /// The central shape: the queues of a partition just taken, as its delivery log had
    /// them (headers, each device's jobs in `seq` order; the wire bytes are read back from
    /// the outbox). Queued as at start-up, the supersede rule applied again.
    Restore(Vec<StoredJob>),
    /// Answered once every command sent before it is handled, and every device message
    /// sent to the dispatcher's incoming channel before it (`Dispatcher::with_incoming`):
    /// each job those finished is then already reported (`Finished` is sent as a job
    /// leaves its queue).
    Barrier(tokio::sync::oneshot::Sender<()>),
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The device acknowledged it as done (or an earlier run finished it: its row is
    /// no longer in the outbox).
    Done,
    /// Dropped because its charge's next screen came first.
    Superseded,
    /// Cannot be delivered: goes to the dead-letter topic with this reason.
    Failed(String),
    /// Its time to live passed first: recorded on the dead-letter topic (reason `expired`).
    Expired,
}

/// A finished job, reported to the consumer so it can remove it from the outbox (after
/// writing its dead letter, if it failed).
#[derive(Debug, Clone)]
pub struct Finished {
    /// The job as stored.
    pub stored: StoredJob,
    /// How it ended.
    pub outcome: Outcome,
}
