//! An operator's replay of a dead letter, carried out by the consumer loop.

use crate::model::StoredJob;
use crate::store::ReplayError;
use tokio::sync::oneshot;

/// An operator's `pixgate deadletter replay ID` for the running gateway
/// (`POST /deadletters/{id}/replay`): the consumer loop carries it out between two batch
/// writes, so the replayed job's `seq` and its hand-over to the dispatcher keep the order
/// of the jobs around it (`Outbox::replay` takes the device's next `seq`; a batch written
/// concurrently could otherwise take the one after and reach the device first).
#[derive(Debug)]
pub struct Replay {
    /// The dead letter's id.
    pub id: u64,
    /// The job as queued again, or why not.
    pub reply: oneshot::Sender<Result<StoredJob, ReplayError>>,
}
