//! What can go wrong with the outbox file ([`OutboxError`]).

/// Outbox failure: the disk or the database file. pixgate cannot accept effects without
/// it, so the consumer stops reading (and retries) rather than commit past them.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The database (redb): opening the file, a transaction, a table, storage, a commit.
    #[error("outbox: {0}")]
    Database(#[from] redb::Error),
    /// A stored row or dead letter that cannot be written or read back as JSON.
    #[error("outbox row: {0}")]
    Row(#[from] serde_json::Error),
    /// A `jobs` row that is not in this version's format.
    #[error("outbox: {0}")]
    Format(&'static str),
    /// The folder for the outbox file cannot be made.
    #[error("outbox folder: {0}")]
    Folder(#[from] std::io::Error),
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for OutboxError {
            fn from(e: $t) -> Self {
                OutboxError::Database(e.into())
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

/// `?` with any of the errors an [`OutboxError`] keeps as its source.
pub(crate) fn err(e: impl Into<OutboxError>) -> OutboxError {
    e.into()
}
