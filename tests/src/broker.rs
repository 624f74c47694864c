//! A Kafka-protocol broker on loopback for one run: `scripts/kafka-broker.sh` (tansu),
//! stopped when dropped.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A running broker; dropping it stops the broker.
pub struct KafkaBroker {
    dir: PathBuf,
    addr: String,
}

impl KafkaBroker {
    /// Starts a fresh broker keeping its data in `dir` (installs tansu first if missing).
    ///
    /// # Errors
    /// The script failed (its stderr is in the error).
    pub fn start(dir: &Path) -> anyhow::Result<KafkaBroker> {
        let script = crate::repo_root().join("scripts/kafka-broker.sh");
        let out = Command::new("bash").arg(&script).arg("start").arg(dir).output().with_context(|| format!("running {}", script.display()))?;
        if !out.status.success() {
            bail!("kafka-broker.sh start failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let addr = String::from_utf8_lossy(&out.stdout).trim().lines().last().unwrap_or_default().to_string();
        Ok(KafkaBroker { dir: dir.to_path_buf(), addr })
    }

    /// `HOST:PORT` for `bootstrap.servers`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Stops the broker (also done on drop).
    pub fn stop(&self) {
        let script = crate::repo_root().join("scripts/kafka-broker.sh");
        let _ = Command::new("bash").arg(script).arg("stop").arg(&self.dir).status();
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        self.stop();
    }
}
