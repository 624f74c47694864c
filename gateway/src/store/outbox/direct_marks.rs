//! Direct printers' being-written marks: a raw printer cannot dedupe by message id, so the
//! outbox records, synced, which job is being written and whether it was written whole.
//! Epson printers on Server Direct Print remember no job ids either: their last job handed
//! out is marked here too (`deliver/sdp/server.rs`).

use super::error::{err, OutboxError};
use super::schema::DIRECT_WRITING;
use super::Outbox;
use redb::{Durability, ReadableTable};

/// A direct printer's last job as the outbox recorded it ([`Outbox::mark_direct`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectMark {
    /// The job's seq.
    pub seq: u64,
    /// The job's message id.
    pub message_id: String,
    /// Written whole (`true`), or being written (`false`: cut short if found at start-up).
    /// An Epson printer's mark is always `false`: handed out, perhaps printed.
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

    /// Removes `device`'s mark if it names `message_id`, durably (synced when it returns):
    /// that job is known not to have printed, so a copy of it is neither a duplicate nor a
    /// reprint. Not `done` (a direct printer reads that as printed). Returns whether a mark
    /// was removed.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn clear_direct_mark(&self, device: &str, message_id: &str) -> Result<bool, OutboxError> {
        let mut tx = self.db.begin_write().map_err(err)?;
        tx.set_durability(Durability::Immediate).map_err(err)?;
        let removed = {
            let mut t = tx.open_table(DIRECT_WRITING).map_err(err)?;
            let names = t.get(device).map_err(err)?.is_some_and(|v| v.value().1 == message_id);
            names && t.remove(device).map_err(err)?.is_some()
        };
        tx.commit().map_err(err)?;
        Ok(removed)
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

#[cfg(test)]
mod tests {
    use super::DirectMark;
    use crate::test_fixtures::temp_outbox;

    #[test]
    fn a_mark_is_cleared_only_by_the_job_it_names() {
        let (_dir, o) = temp_outbox("direct-marks-clear");
        let mark = DirectMark { seq: 3, message_id: "m3".into(), done: false };
        o.mark_direct("p", &mark).unwrap();
        assert!(!o.clear_direct_mark("p", "m2").unwrap(), "another job's");
        assert!(!o.clear_direct_mark("q", "m3").unwrap(), "another printer's");
        assert_eq!(o.direct_mark("p").unwrap(), Some(mark));
        assert!(o.clear_direct_mark("p", "m3").unwrap());
        assert_eq!(o.direct_mark("p").unwrap(), None);
        assert!(!o.clear_direct_mark("p", "m3").unwrap(), "gone already");
    }
}
