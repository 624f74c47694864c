//! Removals of finished jobs while a batch's write is held (the outbox refuses it, say
//! with `No space left on device`): written apart from the batch, synced, at each of its
//! retries, so that what the devices finish frees pages inside the outbox file for the
//! held batch (redb reuses the pages a durable commit freed), instead of waiting inside
//! the very batch the disk cannot take.
//!
//! Removals are independent of the records beside them: a job being removed was sent, so
//! it is not among the held batch's jobs, which reach the dispatcher only once stored.

use crate::store::{Outbox, OutboxError, Removal};
use std::sync::{Mutex, PoisonError};

/// The removals kept while a write is held (see the module docs); shared by the consumer,
/// which offers them, and the batch's task, which writes them.
#[derive(Debug, Default)]
pub struct HeldRemovals {
    /// Whether a write is held, and the removals offered meanwhile, in one lock: an offer
    /// after [`HeldRemovals::release`] goes back to the consumer's batch, never here.
    state: Mutex<(bool, Vec<Removal>)>,
}

impl HeldRemovals {
    /// A batch's write was refused: removals offered from now on are kept here.
    pub fn hold(&self) {
        self.lock().0 = true;
    }

    /// Whether a write is held (from [`HeldRemovals::hold`] to [`HeldRemovals::release`]).
    pub fn is_held(&self) -> bool {
        self.lock().0
    }

    /// Keeps `removal` while a write is held (`None`); otherwise gives it back for the
    /// next batch.
    pub fn offer(&self, removal: Removal) -> Option<Removal> {
        let mut state = self.lock();
        if state.0 {
            state.1.push(removal);
            None
        } else {
            Some(removal)
        }
    }

    /// The held write is over (landed, or given up): returns the removals not written yet,
    /// for the next batch.
    pub fn release(&self) -> Vec<Removal> {
        let mut state = self.lock();
        state.0 = false;
        std::mem::take(&mut state.1)
    }

    /// Writes `own` (the held batch's removals) and those offered meanwhile in one synced
    /// transaction ([`Outbox::remove_synced`]), `own` emptied on success. Returns how many
    /// were written.
    ///
    /// # Errors
    /// The outbox refused them too: then they are all in `own`, to go with the batch.
    pub fn write_apart(&self, outbox: &Outbox, own: &mut Vec<Removal>) -> Result<usize, OutboxError> {
        own.append(&mut self.lock().1);
        if own.is_empty() {
            return Ok(0);
        }
        outbox.remove_synced(own)?;
        let n = own.len();
        own.clear();
        Ok(n)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (bool, Vec<Removal>)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removal(seq: u64) -> Removal {
        Removal::done("d", seq)
    }

    /// Removals offered while a write is held are written apart, synced, and the job rows
    /// are gone; one offered after the hold goes back to the batch.
    #[test]
    fn removals_offered_while_held_are_written_apart() {
        let (_dir, o) = crate::test_fixtures::temp_outbox("held-removals");
        let jobs: Vec<_> = (0..3)
            .map(|i| {
                (
                    "d".to_string(),
                    crate::test_fixtures::job(&format!("m{i}"), device_protocol::EffectKind::DisplayQr, "c"),
                )
            })
            .collect();
        let a = crate::store::Accept { jobs, ..crate::store::Accept::default() };
        o.write(&mut [a], &[], 1).unwrap();
        let held = HeldRemovals::default();
        assert_eq!(held.offer(removal(1)).map(|r| r.seq), Some(1), "no write held: back to the batch");
        held.hold();
        assert!(held.offer(removal(2)).is_none());
        let mut own = vec![removal(1)];
        assert_eq!(held.write_apart(&o, &mut own).unwrap(), 2);
        assert!(own.is_empty());
        assert_eq!(o.device_jobs("d").unwrap().iter().map(|s| s.job.seq).collect::<Vec<_>>(), [3]);
        assert!(held.offer(removal(3)).is_none());
        assert_eq!(held.release().iter().map(|r| r.seq).collect::<Vec<_>>(), [3], "not written yet: to the batch");
        assert_eq!(held.offer(removal(3)).map(|r| r.seq), Some(3), "released: back to the batch");
    }
}
