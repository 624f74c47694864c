//! For unit tests: the bundled CDC fixtures as Kafka records (from `cdc::fixtures`),
//! temporary outboxes and jobs.

use crate::store::Outbox;
use device_protocol::{EffectKind, Job};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A test's own temporary folder (`pixgate-{name}-{pid}`), emptied when made and removed
/// when dropped, also when the test fails.
pub struct TempDir(PathBuf);

impl TempDir {
    /// The folder for `name`, unique per test within the process.
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("pixgate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }

    /// Where an outbox in it lives.
    pub fn outbox_path(&self) -> PathBuf {
        self.0.join("outbox.redb")
    }

    /// The folder (created by whoever writes into it).
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh outbox in its own [`TempDir`] (keep the folder alive as long as the outbox).
pub fn temp_outbox(name: &str) -> (TempDir, Arc<Outbox>) {
    let dir = TempDir::new(name);
    let outbox = Arc::new(Outbox::open(&dir.outbox_path()).unwrap());
    (dir, outbox)
}

pub use cdc::fixtures::{path, records};

/// The documents of fixture `file` (`charges.jsonl`, `devices.jsonl`) that `decode`
/// accepts, in file order (charges: `cdc::decode_charge`; devices: `cdc::decode_device`).
pub fn documents<T>(file: &str, decode: fn(&serde_json::Value) -> Result<T, cdc::DecodeError>) -> Vec<T> {
    records(file)
        .into_iter()
        .filter_map(|(_, bytes)| cdc::decode_envelope(&bytes).ok()?.full_document)
        .filter_map(|doc| decode(&doc).ok())
        .collect()
}

/// A job with message id `id`, of `kind`, for charge `charge`; event id `ev-{id}`, no
/// payload, no expiry, `seq` 0 (the outbox assigns it).
pub fn job(id: &str, kind: EffectKind, charge: &str) -> Job {
    Job {
        v: 1,
        message_id: id.into(),
        seq: 0,
        kind,
        event_id: format!("ev-{id}"),
        charge_id: charge.into(),
        content_type: "x".into(),
        payload: String::new(),
        expires_at: None,
    }
}
