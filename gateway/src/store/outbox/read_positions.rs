//! Positions of a topic read outside any consumer group (the central shape's device
//! registry, [`crate::ingest::cluster_reader`]): Kafka keeps no committed offset for such a
//! reader, so the outbox does, next to the registry entries those records wrote.
//!
//! A position is saved only after the records below it are in the outbox (their registry
//! entries written by an earlier batch): a crash between the two reads a few records again,
//! and applying a device record twice changes nothing (the registry keeps the newer of two
//! `clusterTime`s, dead letters are parked once per source).

use super::error::{err, OutboxError};
use super::schema::READ_POSITIONS;
use super::Outbox;
use redb::Durability;
use std::collections::BTreeMap;

impl Outbox {
    /// The saved positions of `topic`: partition → the next offset to read.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn read_positions(&self, topic: &str) -> Result<BTreeMap<i32, i64>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let t = tx.open_table(READ_POSITIONS).map_err(err)?;
        let mut out = BTreeMap::new();
        for row in t.range((topic, i32::MIN)..=(topic, i32::MAX)).map_err(err)? {
            let (k, v) = row.map_err(err)?;
            out.insert(k.value().1, v.value());
        }
        Ok(out)
    }

    /// Saves `positions` of `topic` (partition → the next offset to read), durably; a
    /// partition not named keeps what it had.
    ///
    /// # Errors
    /// Disk or database failure: nothing was saved.
    pub fn save_read_positions(&self, topic: &str, positions: &BTreeMap<i32, i64>) -> Result<(), OutboxError> {
        let mut tx = self.db.begin_write().map_err(err)?;
        tx.set_durability(Durability::Immediate).map_err(err)?;
        {
            let mut t = tx.open_table(READ_POSITIONS).map_err(err)?;
            for (p, next) in positions {
                t.insert((topic, *p), *next).map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_kept_per_topic_and_a_save_updates_only_what_it_names() {
        let dir = crate::test_fixtures::TempDir::new("read-positions");
        let path = dir.outbox_path();
        {
            let o = Outbox::open(&path).unwrap();
            assert!(o.read_positions("device.upserted").unwrap().is_empty());
            o.save_read_positions("device.upserted", &BTreeMap::from([(0, 5), (1, 9)])).unwrap();
            o.save_read_positions("device.upserted", &BTreeMap::from([(1, 12)])).unwrap();
            o.save_read_positions("other", &BTreeMap::from([(0, 1)])).unwrap();
        }
        let o = Outbox::open(&path).unwrap();
        assert_eq!(o.read_positions("device.upserted").unwrap(), BTreeMap::from([(0, 5), (1, 12)]));
        assert_eq!(o.read_positions("other").unwrap(), BTreeMap::from([(0, 1)]));
    }
}
