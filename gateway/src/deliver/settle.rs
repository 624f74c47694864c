//! What a shutdown waits for on the printers pixgate serves without MQTT: the jobs cloud
//! printers were told of and have not confirmed ([`super::cloudprnt::board`]) and those
//! direct printers are writing ([`super::direct::writes`]), each a [`PendingJob`], waited
//! for by [`settle`] until a deadline.

use std::time::Duration;

/// How often [`settle`] looks again.
const SETTLE_CHECK: Duration = Duration::from_millis(20);

/// A job a printer may be printing and has not finished with: a cloud printer was told of
/// it and has not confirmed it, or a direct printer is writing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingJob {
    /// The printer.
    pub device: String,
    /// The job's seq in its queue.
    pub seq: u64,
    /// Its message id (a CloudPRNT printer's `jobToken`).
    pub message_id: String,
}

/// Waits, until `deadline` at most, for the jobs of `waiting` to end, looking every 20 ms:
/// `under_way` tells whether one still is (asked between waits, never across one, so it may
/// take a lock). Returns those still under way at the deadline, in `waiting`'s order; empty
/// once all have ended.
pub async fn settle(
    mut waiting: Vec<PendingJob>,
    deadline: tokio::time::Instant,
    mut under_way: impl FnMut(&PendingJob) -> bool,
) -> Vec<PendingJob> {
    loop {
        waiting.retain(&mut under_way);
        if waiting.is_empty() || tokio::time::Instant::now() >= deadline {
            return waiting;
        }
        tokio::time::sleep(SETTLE_CHECK).await;
    }
}
