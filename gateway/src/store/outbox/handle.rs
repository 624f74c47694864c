//! The outbox's redb handle, opened again after an I/O error.
//!
//! redb latches the first I/O error of a database (a write refused with `No space left on
//! device`, say): every later transaction fails with `PreviousIo` ("Please close and
//! re-open the database") until the handle is closed and the file opened again. Without
//! this, a disk that filled up and was then given room (a log rotated, the file system
//! grown) stayed refused until pixgate was restarted; on an edge box nobody is there to
//! do it. A transaction begun on a latched handle opens the file again first (at most
//! every [`REOPEN_EVERY`]), so the writes retried by the consumer
//! (`ingest::retry::until_stored`) go through once the disk takes them, and what they
//! report meanwhile is the disk's own error, not `PreviousIo`.

use redb::{Database, ReadTransaction, ReadableDatabase, StorageError, TransactionError, WriteTransaction};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// Least time between two attempts to open the file again.
pub const REOPEN_EVERY: Duration = Duration::from_millis(500);

/// The handle (see the module docs).
#[derive(Debug)]
pub(in crate::store) struct Handle {
    path: PathBuf,
    cache_bytes: usize,
    /// The database, or why it is not open again yet (the open's error, kept to be
    /// reported by every transaction meanwhile).
    db: RwLock<Result<Arc<Database>, (std::io::ErrorKind, String)>>,
    last_reopen: Mutex<Option<Instant>>,
}

impl Handle {
    /// A handle on `db`, opened from `path` with a page cache of `cache_bytes`.
    pub(in crate::store) fn new(db: Database, path: PathBuf, cache_bytes: usize) -> Handle {
        Handle { path, cache_bytes, db: RwLock::new(Ok(Arc::new(db))), last_reopen: Mutex::new(None) }
    }

    /// `Database::begin_write`, on a handle opened again first if the last one latched an
    /// I/O error.
    ///
    /// # Errors
    /// redb's; while the file cannot be opened again, `Storage(Io)` with the open's error
    /// (`No space left on device`, say), or `Storage(PreviousIo)` until the next attempt.
    pub(in crate::store) fn begin_write(&self) -> Result<WriteTransaction, TransactionError> {
        self.begin(Database::begin_write)
    }

    /// `Database::begin_read`, as [`Handle::begin_write`].
    ///
    /// # Errors
    /// As [`Handle::begin_write`].
    pub(in crate::store) fn begin_read(&self) -> Result<ReadTransaction, TransactionError> {
        self.begin(Database::begin_read)
    }

    fn begin<T>(&self, f: impl Fn(&Database) -> Result<T, TransactionError>) -> Result<T, TransactionError> {
        if let Ok(db) = self.current() {
            match f(&db) {
                Err(TransactionError::Storage(StorageError::PreviousIo)) => {}
                other => return other,
            }
        }
        self.reopen();
        match self.current() {
            Ok(db) => f(&db),
            Err((kind, why)) => Err(TransactionError::Storage(StorageError::Io(std::io::Error::new(
                kind,
                format!("the outbox could not be opened again after an I/O error: {why}"),
            )))),
        }
    }

    fn current(&self) -> Result<Arc<Database>, (std::io::ErrorKind, String)> {
        self.db.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Closes the handle and opens the file again, unless another thread just did or the
    /// last attempt was less than [`REOPEN_EVERY`] ago. The old handle closes once its
    /// last transaction ends (redb defers the close); until then the file is still
    /// locked, the open fails, and the next attempt tries again.
    fn reopen(&self) {
        {
            let mut last = self.last_reopen.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|t| t.elapsed() < REOPEN_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        let mut slot = self.db.write().unwrap_or_else(PoisonError::into_inner);
        if let Ok(db) = slot.as_ref() {
            // Opened again by another thread meanwhile (or a write of another thread is
            // under way on it): nothing to do. The transaction tried is dropped, aborted.
            if !matches!(db.try_begin_write(), Err(TransactionError::Storage(StorageError::PreviousIo))) {
                return;
            }
        }
        // Dropped before the open: its file lock goes with it (or with its last transaction).
        *slot = Err((std::io::ErrorKind::Other, "closed to be opened again".into()));
        match redb::Builder::new().set_cache_size(self.cache_bytes).create(&self.path) {
            Ok(db) => {
                tracing::warn!(path = %self.path.display(), "outbox opened again after an I/O error");
                *slot = Ok(Arc::new(db));
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "outbox not opened again yet after an I/O error; trying again");
                let kind = match &e {
                    redb::DatabaseError::Storage(StorageError::Io(io)) => io.kind(),
                    _ => std::io::ErrorKind::Other,
                };
                *slot = Err((kind, e.to_string()));
            }
        }
    }
}
