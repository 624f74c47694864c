//! The bundled CDC fixtures (`fixtures/cdc/`) as Kafka records, and temporary outboxes,
//! for unit tests.

use crate::store::Outbox;
use serde_json::Value;
use std::path::PathBuf;
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

/// Path of a fixtures file, e.g. `expected.json`.
pub fn path(name: &str) -> String {
    format!("{}/../fixtures/cdc/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The records of a `.jsonl` fixtures file as `(topic, value bytes)`: a JSON object value is
/// serialised, a string value (the malformed-input cases) is its raw bytes, as the capture
/// simulator publishes them.
pub fn records(name: &str) -> Vec<(String, Vec<u8>)> {
    std::fs::read_to_string(path(name))
        .unwrap()
        .lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            let bytes = match &r["value"] {
                Value::String(s) => s.clone().into_bytes(),
                v => serde_json::to_vec(v).unwrap(),
            };
            (r["topic"].as_str().unwrap().to_string(), bytes)
        })
        .collect()
}
