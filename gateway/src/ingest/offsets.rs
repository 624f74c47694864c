//! Which Kafka offset may be stored: the contiguous done prefix of each partition.
//!
//! Records of one partition finish out of order (one device is slower than another). The
//! offset stored for a partition is the lowest offset still pending, or one past the
//! highest read when none is: never a position past a record whose effects are not
//! finished (Confluent Parallel Consumer's "highest committable offset").

use crate::model::Partition;
use std::collections::{BTreeSet, HashMap};

/// A record read and not yet finished: its partition and offset.
#[derive(Debug, Clone)]
pub struct RecordRef {
    /// Its partition.
    pub part: Partition,
    /// Its offset in the partition.
    pub offset: i64,
    /// Its `traceparent`'s trace id, for the log line about its effects.
    pub trace: Option<String>,
    /// When it was planned (read, or released after waiting for the registry): the start
    /// of the `accept` stage ([`crate::telemetry::latency::Stage::Accept`]).
    pub planned_at: tokio::time::Instant,
}

#[derive(Debug, Default)]
struct State {
    pending: BTreeSet<i64>,
    next_read: i64,
    stored: i64,
}

/// Pending records and committable positions per partition.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    parts: HashMap<Partition, State>,
}

impl OffsetTracker {
    /// Records that `offset` of `part` was read and is now pending.
    pub fn read(&mut self, part: &Partition, offset: i64) {
        let s = self.parts.entry(part.clone()).or_insert_with(|| State {
            next_read: offset,
            stored: offset,
            ..State::default()
        });
        s.pending.insert(offset);
        s.next_read = s.next_read.max(offset + 1);
    }

    /// Records that every effect of `offset` is finished. Returns the new position to store
    /// (the next offset to consume, as `rd_kafka_offsets_store` takes it) when it moved.
    pub fn done(&mut self, part: &Partition, offset: i64) -> Option<i64> {
        let s = self.parts.get_mut(part)?;
        s.pending.remove(&offset);
        let committable = s.pending.first().copied().unwrap_or(s.next_read);
        (committable > s.stored).then(|| {
            s.stored = committable;
            committable
        })
    }

    /// The lowest offset of `part` not yet stored (every record below it is finished and
    /// its position stored); `None` when nothing of `part` was read since it was last
    /// forgotten.
    pub fn unstored_from(&self, part: &Partition) -> Option<i64> {
        self.parts.get(part).map(|s| s.stored)
    }

    /// Records of `part` read and not yet finished.
    pub fn pending(&self, part: &Partition) -> usize {
        self.parts.get(part).map_or(0, |s| s.pending.len())
    }

    /// Records not yet finished, all partitions.
    pub fn total_pending(&self) -> usize {
        self.parts.values().map(|s| s.pending.len()).sum()
    }

    /// Forgets a partition (revoked in a rebalance); its new owner resumes from the last
    /// committed position and redelivers the rest, which the devices' dedupe absorbs.
    pub fn forget(&mut self, part: &Partition) {
        self.parts.remove(part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_unstored_offset_is_where_a_partition_reads_again() {
        let p = ("t".to_string(), 0);
        let mut t = OffsetTracker::default();
        assert_eq!(t.unstored_from(&p), None, "nothing read");
        for o in 10..15 {
            t.read(&p, o);
        }
        assert_eq!(t.unstored_from(&p), Some(10));
        t.done(&p, 11);
        assert_eq!(t.unstored_from(&p), Some(10), "10 still pending");
        t.done(&p, 10);
        assert_eq!(t.unstored_from(&p), Some(12), "10 and 11 stored");
        t.forget(&p);
        assert_eq!(t.unstored_from(&p), None);
    }

    #[test]
    fn stores_only_the_contiguous_prefix() {
        let p = ("t".to_string(), 0);
        let mut t = OffsetTracker::default();
        for o in 10..15 {
            t.read(&p, o);
        }
        assert_eq!(t.done(&p, 12), None, "10 and 11 still pending");
        assert_eq!(t.done(&p, 11), None);
        assert_eq!(t.done(&p, 10), Some(13), "10..=12 done: next to consume is 13");
        assert_eq!(t.done(&p, 14), None);
        assert_eq!(t.pending(&p), 1);
        assert_eq!(t.done(&p, 13), Some(15));
        assert_eq!(t.total_pending(), 0);
    }

    #[test]
    fn exhaustive_orders_never_pass_a_pending_record() {
        // Every completion order of 5 records: the stored position never passes a pending one.
        let p = ("t".to_string(), 3);
        let mut orders = vec![vec![]];
        for _ in 0..5 {
            orders = orders
                .into_iter()
                .flat_map(|o: Vec<i64>| {
                    (0..5)
                        .filter(|x| !o.contains(x))
                        .map(|x| {
                            let mut n = o.clone();
                            n.push(x);
                            n
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
        }
        assert_eq!(orders.len(), 120);
        for order in orders {
            let mut t = OffsetTracker::default();
            (0..5).for_each(|o| t.read(&p, o));
            let mut done = Vec::new();
            let mut stored = 0;
            for o in order {
                done.push(o);
                if let Some(s) = t.done(&p, o) {
                    assert!((0..s).all(|x| done.contains(&x)));
                    stored = s;
                }
            }
            assert_eq!(stored, 5);
        }
    }
}
