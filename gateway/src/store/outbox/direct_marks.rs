//! Direct printers' being-written marks: a raw printer cannot dedupe by message id, so the
//! outbox records, synced, which job is being written and whether it was written whole.
//! Epson printers on Server Direct Print remember no job ids either: their last job handed
//! out is marked here too (`deliver/sdp/server.rs`).

use super::error::{err, OutboxError};
use super::schema::DIRECT_WRITING;
use super::Outbox;
use redb::Durability;

/// A direct printer's last job as the outbox recorded it ([`Outbox::mark_direct`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectMark {
    /// The job's seq.
    pub seq: u64,
    /// The job's message id.
    pub message_id: String,
    /// Written whole (`true`), or being written (`false`: cut short if found at start-up).
    pub done: bool,
}

impl Outbox {
    /// Records, durably (synced when it returns), that `device`'s job `seq`
    /// (`message_id`) is being written to its direct printer (`done` false) or was written
    /// whole (`done` true). One row per device: its jobs are written one at a time, in
    /// `seq` order.
    ///
    /// # Errors
    /// Disk or database failure: the caller must not write the job.
    pub fn mark_direct(&self, device: &str, mark: &DirectMark) -> Result<(), OutboxError> {
        let mut tx = self.db.begin_write().map_err(err)?;
        tx.set_durability(Durability::Immediate).map_err(err)?;
        {
            let mut t = tx.open_table(DIRECT_WRITING).map_err(err)?;
            t.insert(device, (mark.seq, mark.message_id.as_str(), mark.done)).map_err(err)?;
        }
        tx.commit().map_err(err)
    }

    /// `device`'s last [`Outbox::mark_direct`], if any.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn direct_mark(&self, device: &str) -> Result<Option<DirectMark>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let t = tx.open_table(DIRECT_WRITING).map_err(err)?;
        Ok(t.get(device).map_err(err)?.map(|v| {
            let (seq, message_id, done) = v.value();
            DirectMark { seq, message_id: message_id.to_string(), done }
        }))
    }
}
