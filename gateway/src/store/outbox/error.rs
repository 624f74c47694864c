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
    /// A job row that is not in this version's format, or a queue that names a row the
    /// file does not have.
    #[error("outbox: {0}")]
    Format(&'static str),
    /// The file is held by a running gateway (redb's lock): the command needs it stopped.
    #[error("the outbox {} is in use by a running gateway: stop it first", .0.display())]
    InUse(std::path::PathBuf),
    /// The folder for the outbox file cannot be made.
    #[error("outbox folder: {0}")]
    Folder(#[from] std::io::Error),
    /// The file fails redb's integrity check (a page whose checksum does not match): it was
    /// changed outside pixgate, by a failing disk or a copy cut short.
    #[error(
        "the outbox {} is damaged ({detail}): it was changed outside pixgate (a failing disk or SD card, a copy cut short), and pixgate will not run on it. `pixgate outbox check {}` tells the same of any copy. `pixgate outbox salvage {} NEW` copies what can still be read into a new file and lists the jobs lost, with the `pixgate kafka reposition --to-time` that reads them again (docs/operations.md, \"A damaged outbox\"); put the new file in place of this one (keep this one)",
        path.display(),
        path.display(),
        path.display()
    )]
    Damaged {
        /// The file.
        path: std::path::PathBuf,
        /// redb's words for what failed.
        detail: String,
    },
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
