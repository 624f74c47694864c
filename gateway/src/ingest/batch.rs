//! The batch being built: records planned since the last outbox write, and the removals
//! of the jobs finished meanwhile, written together in one outbox transaction (one fsync)
//! by the hand-off ([`crate::ingest::handoff`]).
//!
//! A batch is due when it holds `outbox.batch_max_records` records, or
//! `outbox.batch_max_delay_ms` after its first record or removal arrived. While a write is
//! in flight the next batch keeps filling, and reading stops when it is full: at most two
//! batches are held in memory (and, once the write has been held a while, what still
//! arrives after every partition paused: [`crate::ingest::backpressure`]).

use crate::ingest::offsets::RecordRef;
use crate::store::{Accept, Removal};
use std::time::Duration;
use tokio::time::Instant;

/// Records planned and removals, not yet written.
#[derive(Debug)]
pub struct Batch {
    /// The records, in the order read.
    records: Vec<RecordRef>,
    /// What each record of `records` asks the outbox to store.
    accepts: Vec<Accept>,
    /// Finished jobs to remove from the outbox.
    removals: Vec<Removal>,
    /// When the batch must be written: its oldest record or removal's arrival plus the
    /// delay. `None` when empty or handed to the writer.
    due: Option<Instant>,
    max_records: usize,
    max_delay: Duration,
}

/// A batch closed to new records, for the outbox writer.
#[derive(Debug, Default)]
pub struct Sealed {
    /// The records, in the order read; finished once the batch is written.
    pub records: Vec<RecordRef>,
    /// What to store for each of `records` (same order).
    pub accepts: Vec<Accept>,
    /// Finished jobs to remove in the same transaction.
    pub removals: Vec<Removal>,
}

impl Batch {
    /// An empty batch, full at `max_records` records (at least one), due `max_delay` after
    /// its first record or removal.
    pub fn new(max_records: usize, max_delay: Duration) -> Batch {
        Batch {
            records: Vec::new(),
            accepts: Vec::new(),
            removals: Vec::new(),
            due: None,
            max_records: max_records.max(1),
            max_delay,
        }
    }

    /// Adds a planned record.
    pub fn push(&mut self, rec: RecordRef, accept: Accept) {
        self.start_timer();
        self.records.push(rec);
        self.accepts.push(accept);
    }

    /// Adds the removal of a finished job (written within `max_delay`).
    pub fn remove(&mut self, removal: Removal) {
        self.start_timer();
        self.removals.push(removal);
    }

    /// Records in the batch.
    pub fn records(&self) -> usize {
        self.records.len()
    }

    /// Whether it holds `max_records` records: it is written as soon as no write is in
    /// flight, and no record is read meanwhile.
    pub fn is_full(&self) -> bool {
        self.records.len() >= self.max_records
    }

    /// When it must be written, if it holds anything not yet due.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Stops the timer: the batch is being written, or nothing more is written.
    pub fn stop_timer(&mut self) {
        self.due = None;
    }

    /// Closes the batch and starts an empty one (its timer stopped); `None` when there
    /// is nothing to write.
    pub fn take(&mut self) -> Option<Sealed> {
        self.stop_timer();
        if self.records.is_empty() && self.removals.is_empty() {
            return None;
        }
        Some(Sealed {
            records: std::mem::take(&mut self.records),
            accepts: std::mem::take(&mut self.accepts),
            removals: std::mem::take(&mut self.removals),
        })
    }

    fn start_timer(&mut self) {
        if self.due.is_none() {
            self.due = Some(Instant::now() + self.max_delay);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(records: &[RecordRef]) -> Vec<i64> {
        records.iter().map(|r| r.offset).collect()
    }

    fn rec(offset: i64) -> RecordRef {
        RecordRef { part: ("t".to_string(), 0), offset, trace: None, planned_at: Instant::now() }
    }

    #[test]
    fn the_first_record_or_removal_starts_the_timer_and_taking_stops_it() {
        let mut b = Batch::new(3, Duration::from_millis(50));
        assert!(b.due().is_none());
        assert!(b.take().is_none(), "nothing to write");
        b.push(rec(1), Accept::default());
        let due = b.due().expect("timer started");
        b.push(rec(2), Accept::default());
        assert_eq!(b.due(), Some(due), "due with its oldest record");
        let sealed = b.take().expect("two records");
        assert_eq!(offsets(&sealed.records), [1, 2]);
        assert_eq!(sealed.accepts.len(), 2);
        assert!(b.due().is_none() && b.records() == 0);

        b.remove(Removal::done("d", 1));
        assert!(b.due().is_some(), "a removal alone makes a batch");
        let sealed = b.take().expect("one removal");
        assert!(sealed.records.is_empty());
        assert_eq!(sealed.removals.len(), 1);
    }

    #[test]
    fn full_at_max_records() {
        let mut b = Batch::new(2, Duration::from_millis(50));
        b.push(rec(1), Accept::default());
        assert!(!b.is_full());
        b.push(rec(2), Accept::default());
        assert!(b.is_full());
        let mut one = Batch::new(0, Duration::ZERO);
        one.push(rec(1), Accept::default());
        assert!(one.is_full(), "at least one record per batch");
    }
}
