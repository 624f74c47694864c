//! The effect flags ([`crate::model::flags`]) in the outbox file: table `effect_flags`,
//! kind name → on. Kept with the outbox so that a restart, or `pixgate flags set` while
//! no gateway runs, sees the same switches; a kind with no row is on.

use crate::store::outbox::schema::FLAGS;
use crate::store::outbox::{Outbox, OutboxError};
use redb::{Durability, ReadableTable};

impl Outbox {
    /// The stored flags: (kind name, on), by name; empty when none was ever set.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn effect_flags(&self) -> Result<Vec<(String, bool)>, OutboxError> {
        let tx = self.db.begin_read().map_err(redb::Error::from)?;
        let table = tx.open_table(FLAGS).map_err(redb::Error::from)?;
        let mut out = Vec::new();
        for item in table.iter().map_err(redb::Error::from)? {
            let (k, v) = item.map_err(redb::Error::from)?;
            out.push((k.value().to_string(), v.value()));
        }
        Ok(out)
    }

    /// Stores `kind`'s flag, durably (synced when it returns).
    ///
    /// # Errors
    /// Disk or database failure; then nothing changed.
    pub fn set_effect_flag(&self, kind: &str, on: bool) -> Result<(), OutboxError> {
        let mut tx = self.db.begin_write().map_err(redb::Error::from)?;
        tx.set_durability(Durability::Immediate).map_err(redb::Error::from)?;
        {
            let mut table = tx.open_table(FLAGS).map_err(redb::Error::from)?;
            table.insert(kind, on).map_err(redb::Error::from)?;
        }
        tx.commit().map_err(redb::Error::from)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn flags_are_kept_in_the_file_across_opens() {
        let (dir, o) = crate::test_fixtures::temp_outbox("flags-store");
        assert!(o.effect_flags().unwrap().is_empty(), "no row before the first switch");
        o.set_effect_flag("display_qr", false).unwrap();
        o.set_effect_flag("print_receipt", false).unwrap();
        o.set_effect_flag("print_receipt", true).unwrap();
        let path = dir.outbox_path();
        drop(o);
        let o = crate::store::Outbox::open(&path).unwrap();
        assert_eq!(
            o.effect_flags().unwrap(),
            vec![("display_qr".to_string(), false), ("print_receipt".to_string(), true)]
        );
    }
}
