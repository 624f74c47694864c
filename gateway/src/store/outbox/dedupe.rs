//! The end of the dedupe window: message ids forgotten after `outbox.dedupe_retention_hours`.

use super::error::{err, OutboxError};
use super::schema::SEEN;
use super::Outbox;
use redb::Durability;

impl Outbox {
    /// Forgets message ids accepted before `cutoff_ms` (the end of the dedupe window).
    /// Returns how many were forgotten.
    ///
    /// An event is accepted after it happened, so only ids of events older than the
    /// cutoff can be old: the scan reads the window from its oldest event up to the
    /// cutoff, not the whole window, and keeps an old event's ids that were accepted late
    /// (a backlog read after an outage: they stay a full window, and are looked at again
    /// at each prune until then). It reads under a read transaction, which does not hold
    /// redb's single writer; only the ids found old are removed, [`PRUNE_CHUNK`] per write
    /// transaction. An id found old stays old: its accepted-at is written once, and an id
    /// in the window is never accepted again.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn prune_seen(&self, cutoff_ms: u64) -> Result<usize, OutboxError> {
        // `clusterTime` seconds are the key's high 32 bits.
        let secs = cutoff_ms / 1000;
        let cutoff_event = if secs > u64::from(u32::MAX) { u64::MAX } else { secs << 32 };
        let old: Vec<(u64, String)> = {
            let tx = self.db.begin_read().map_err(err)?;
            let seen = tx.open_table(SEEN).map_err(err)?;
            let mut old = Vec::new();
            for entry in seen.range(..(cutoff_event, "")).map_err(err)? {
                let (key, at) = entry.map_err(err)?;
                if at.value() < cutoff_ms {
                    let (t, id) = key.value();
                    old.push((t, id.to_string()));
                }
            }
            old
        };
        // Not synced: a removal lost in a crash only keeps an id in the window a while longer.
        self.remove_in_chunks(&old, Durability::None, |tx, chunk| {
            let mut seen = tx.open_table(SEEN).map_err(err)?;
            for (t, id) in chunk {
                seen.remove((*t, id.as_str())).map_err(err)?;
            }
            Ok(())
        })?;
        Ok(old.len())
    }
}
