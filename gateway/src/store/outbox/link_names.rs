//! The names a queued job's reconciliation link ([`Link`]) refers to by id: the topics
//! and effect kinds, a handful in a file's life, stored once each (`reconcile_names`) so
//! that a link fits in eight bytes of its `job_live` entry.

use super::error::{err, OutboxError};
use super::schema::{Link, NO_LINK, RECONCILE_NAMES};
use crate::store::reconcile::BUCKET_S;
use redb::{ReadableTable, Table, WriteTransaction};
use std::collections::HashMap;

/// `reconcile_names`, open in a write transaction, with its entries read once.
pub(crate) struct LinkNames<'t> {
    table: Table<'t, u16, &'static str>,
    ids: HashMap<String, u16>,
    names: HashMap<u16, String>,
}

impl<'t> LinkNames<'t> {
    /// Opens (or creates) the table in `tx` and reads its entries.
    ///
    /// # Errors
    /// Database failure.
    pub(crate) fn open(tx: &'t WriteTransaction) -> Result<LinkNames<'t>, OutboxError> {
        let table = tx.open_table(RECONCILE_NAMES).map_err(err)?;
        let mut names = HashMap::new();
        for item in table.iter().map_err(err)? {
            let (id, name) = item.map_err(err)?;
            names.insert(id.value(), name.value().to_string());
        }
        let ids = names.iter().map(|(id, name)| (name.clone(), *id)).collect();
        Ok(LinkNames { table, ids, names })
    }

    fn id(&mut self, name: &str) -> Result<u16, OutboxError> {
        if let Some(id) = self.ids.get(name) {
            return Ok(*id);
        }
        // After the highest id rather than the count: an id taken twice would send links to
        // another name.
        let highest = self.names.keys().max().copied().unwrap_or(0);
        let id = highest
            .checked_add(1)
            .ok_or(OutboxError::Format("more than 65,535 topic and effect kind names to link jobs to"))?;
        self.table.insert(id, name).map_err(err)?;
        self.ids.insert(name.to_string(), id);
        self.names.insert(id, name.to_string());
        Ok(id)
    }

    /// The link of a job of kind `kind` to the minute of `event_time_s` (Unix seconds) on
    /// `topic`, naming `topic` and `kind` in the table if they are new. An event time past
    /// what a `u32` of minutes holds (the year 10,000) is kept as the last minute it holds
    /// ([`link_bucket`]).
    ///
    /// # Errors
    /// Database failure, or every id taken ([`OutboxError::Format`]).
    pub(crate) fn link(&mut self, topic: &str, event_time_s: u64, kind: &str) -> Result<Link, OutboxError> {
        Ok((self.id(topic)?, minute_of(event_time_s), self.id(kind)?))
    }

    /// How many names the table holds.
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// The (topic, bucket start in Unix seconds, kind) of `link`; `None` for [`NO_LINK`]
    /// or a link whose names the table does not have.
    pub(crate) fn resolve(&self, link: Link) -> Option<(&str, u64, &str)> {
        if link == NO_LINK {
            return None;
        }
        let (topic, minute, kind) = link;
        Some((self.names.get(&topic)?, u64::from(minute) * BUCKET_S, self.names.get(&kind)?))
    }
}

/// The bucket start (Unix seconds) a link to the minute of `event_time_s` counts in: the
/// minute's, or the last minute a link holds for an event time past it.
pub(crate) fn link_bucket(event_time_s: u64) -> u64 {
    u64::from(minute_of(event_time_s)) * BUCKET_S
}

/// The minute (since the Unix epoch) a link keeps for `event_time_s`, capped at the last
/// one a `u32` holds.
fn minute_of(event_time_s: u64) -> u32 {
    u32::try_from(event_time_s / BUCKET_S).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::LinkNames;
    use crate::store::outbox::schema::NO_LINK;
    use crate::test_fixtures::temp_outbox;

    #[test]
    fn a_link_names_its_topic_and_kind_once_and_resolves_to_its_minute() {
        let (_dir, o) = temp_outbox("link-names");
        let tx = o.db.begin_write().unwrap();
        let (a, b) = {
            let mut names = LinkNames::open(&tx).unwrap();
            let a = names.link("pixgate.charges", 1_700_000_039, "display_qr").unwrap();
            let b = names.link("pixgate.charges", 1_700_000_040, "print_receipt").unwrap();
            assert_eq!(a.0, b.0, "one id for the topic");
            assert_ne!(a.2, b.2, "one id per kind");
            assert_eq!(names.resolve(a), Some(("pixgate.charges", 1_699_999_980, "display_qr")));
            assert_eq!(names.resolve(NO_LINK), None);
            (a, b)
        };
        tx.commit().unwrap();
        let tx = o.db.begin_write().unwrap();
        let names = LinkNames::open(&tx).unwrap();
        assert_eq!(names.resolve(b), Some(("pixgate.charges", 1_700_000_040, "print_receipt")), "read back");
        assert_eq!(names.resolve(a).map(|l| l.1), Some(1_699_999_980));
    }
}
