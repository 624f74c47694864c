//! An operator's replay of a dead letter, carried out by the consumer loop: a job's dead
//! letter (`delivery_failed`, `expired`) queues its job again (`Outbox::replay`); a
//! record-level dead letter whose cause can go away (`unknown_terminal`,
//! `terminal_of_another_company`) routes its record again with the current device registry
//! (`ingest::record_replay`).

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
    /// What was queued again, or why not.
    pub reply: oneshot::Sender<Result<Replayed, ReplayError>>,
}

/// What a replay queued.
#[derive(Debug, Clone)]
pub enum Replayed {
    /// A job's dead letter: the job, queued again with a new `seq`.
    Job(StoredJob),
    /// A record-level dead letter: the record routed again. `jobs` is empty when the
    /// charge has moved on meanwhile (a newer version was applied: nothing to do).
    Record {
        /// The jobs queued, with their original message ids.
        jobs: Vec<StoredJob>,
        /// Ids of dead letters parked for effects that cannot be carried out.
        deadletters: Vec<u64>,
    },
}
