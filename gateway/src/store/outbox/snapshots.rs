//! What the outbox keeps besides queues, so a restart routes as the last run did: each
//! charge's last applied `__v` and status, and the device registry.

use super::error::{err, OutboxError};
use super::schema::{CHARGES, DEVICES};
use super::Outbox;
use cdc::ChargeStatus;
use redb::ReadableTable;

/// A device registry change to store ([`Outbox::write`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceEntry {
    /// Device id.
    pub id: String,
    /// Oplog position of the change.
    pub cluster_time: u64,
    /// `fullDocument`; `None` for a delete.
    pub document: Option<serde_json::Value>,
}

/// The charge state the router applied, to persist with the jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChargeState {
    /// `__v`.
    pub version: i64,
    /// Status.
    pub status: ChargeStatus,
}

pub(super) fn status_code(s: ChargeStatus) -> u8 {
    match s {
        ChargeStatus::Active => 0,
        ChargeStatus::Completed => 1,
        ChargeStatus::Expired => 2,
    }
}

pub(super) fn status_from(c: u8) -> ChargeStatus {
    match c {
        1 => ChargeStatus::Completed,
        2 => ChargeStatus::Expired,
        _ => ChargeStatus::Active,
    }
}

impl Outbox {
    /// One charge's last applied state; `None` if none was ever stored.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn charge(&self, id: &str) -> Result<Option<ChargeState>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(CHARGES).map_err(err)?;
        Ok(table.get(id).map_err(err)?.map(|v| {
            let (version, code) = v.value();
            ChargeState { version, status: status_from(code) }
        }))
    }

    /// Stores each of `states` whose `__v` is newer than the charge's stored one (a charge
    /// partition taken, its changelog read, `ingest::route_changelog`); returns how many.
    ///
    /// # Errors
    /// Disk or database failure (nothing stored).
    pub fn store_charge_states(&self, states: &[(String, ChargeState)]) -> Result<usize, OutboxError> {
        let tx = self.db.begin_write().map_err(err)?;
        let mut stored = 0;
        {
            let mut table = tx.open_table(CHARGES).map_err(err)?;
            for (id, state) in states {
                let newer = table.get(id.as_str()).map_err(err)?.is_none_or(|v| v.value().0 < state.version);
                if newer {
                    table.insert(id.as_str(), (state.version, status_code(state.status))).map_err(err)?;
                    stored += 1;
                }
            }
        }
        tx.commit().map_err(err)?;
        Ok(stored)
    }

    /// Every registry entry stored by [`Outbox::write`] ([`Accept::device`]): id, oplog
    /// position, document.
    ///
    /// # Errors
    /// Disk or database failure, or a stored document that no longer parses.
    pub fn devices(&self) -> Result<Vec<(String, u64, Option<serde_json::Value>)>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(DEVICES).map_err(err)?;
        let mut out = Vec::new();
        for item in table.iter().map_err(err)? {
            let (k, v) = item.map_err(err)?;
            let (at, bytes) = v.value();
            let doc = if bytes.is_empty() { None } else { Some(serde_json::from_slice(bytes).map_err(err)?) };
            out.push((k.value().to_string(), at, doc));
        }
        Ok(out)
    }

    /// The registry entry of device `id` stored by [`Outbox::write`]: its document, `None`
    /// when the registry has none (never seen, or removed).
    ///
    /// # Errors
    /// Disk or database failure, or a stored document that no longer parses.
    pub fn device(&self, id: &str) -> Result<Option<serde_json::Value>, OutboxError> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(DEVICES).map_err(err)?;
        let Some(v) = table.get(id).map_err(err)? else { return Ok(None) };
        let (_, bytes) = v.value();
        if bytes.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(bytes).map(Some).map_err(err)
    }
}
