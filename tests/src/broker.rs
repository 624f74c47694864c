//! A Kafka-protocol broker on loopback for one run: `scripts/kafka-broker.sh` (tansu with
//! SQLite storage, `sqlite://tansu.db` in the broker's folder), stopped when dropped.
//!
//! Topics, records and committed group offsets live in that SQLite file, so
//! [`KafkaBroker::restart`] (kill, then start on the same folder and port) brings back the
//! same broker state, as a restarted Kafka broker with persistent storage would.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

/// A running broker; dropping it stops the broker.
pub struct KafkaBroker {
    dir: PathBuf,
    addr: String,
    /// Started and not stopped or killed since (so drop does not run the script again:
    /// it would recreate a folder the caller removed).
    running: AtomicBool,
}

impl KafkaBroker {
    /// Starts a fresh broker keeping its data in `dir` (installs tansu first if missing).
    ///
    /// # Errors
    /// The script failed (its stderr is in the error).
    pub fn start(dir: &Path) -> anyhow::Result<KafkaBroker> {
        let addr = run_start(dir, None)?;
        Ok(KafkaBroker { dir: dir.to_path_buf(), addr, running: AtomicBool::new(true) })
    }

    /// `HOST:PORT` for `bootstrap.servers`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The broker's process id (from `broker.pid`), for CPU accounting; `None` if stopped.
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("broker.pid")).ok()?.trim().parse().ok()
    }

    /// The folder with the broker's SQLite file and `broker.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops the broker (also done on drop). SIGTERM to its process group, SIGKILL after 5 s.
    pub fn stop(&self) {
        self.running.store(false, Ordering::SeqCst);
        let script = crate::repo_root().join("scripts/kafka-broker.sh");
        let _ =
            Command::new("bash").arg(script).arg("stop").arg(&self.dir).stderr(std::process::Stdio::null()).status();
    }

    /// Freezes the broker (SIGSTOP to its process group): its connections stay open and
    /// nothing is answered, as a broker whose disk or network hangs. [`KafkaBroker::thaw`]
    /// lets it go on.
    ///
    /// # Errors
    /// It is not running, or the signal was refused.
    pub fn freeze(&self) -> anyhow::Result<()> {
        self.signal("-STOP")
    }

    /// SIGCONT to a broker [`KafkaBroker::freeze`] stopped.
    ///
    /// # Errors
    /// As [`KafkaBroker::freeze`].
    pub fn thaw(&self) -> anyhow::Result<()> {
        self.signal("-CONT")
    }

    fn signal(&self, sig: &str) -> anyhow::Result<()> {
        let pid = self.pid().ok_or_else(|| anyhow::anyhow!("the broker is not running"))?;
        let ok = Command::new("kill").args([sig, "--", &format!("-{pid}")]).status()?.success();
        anyhow::ensure!(ok, "kill {sig} -{pid} failed");
        Ok(())
    }

    /// Kills the broker at once (SIGKILL to its process group): a broker crash. What it
    /// acknowledged is in its SQLite file.
    pub fn kill(&self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("broker.pid")) {
            let pid = pid.trim();
            let quiet = |args: &[&str]| {
                Command::new("kill").args(args).stderr(std::process::Stdio::null()).status().is_ok_and(|s| s.success())
            };
            quiet(&["-KILL", "--", &format!("-{pid}")]);
            for _ in 0..50 {
                if !quiet(&["-0", pid]) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        self.stop();
    }

    /// Kills the broker ([`KafkaBroker::kill`]) and starts it again on the same folder (same
    /// SQLite file: topics, records and committed offsets) and the same port, so clients
    /// reconnect to the address they know. The earlier log is kept as `broker.log.N`.
    ///
    /// A kill, not SIGTERM: on SIGTERM tansu 0.6.0 stops its storage service first but keeps
    /// answering requests, with `UNKNOWN_SERVER_ERROR`, until it is killed 5 s later; an
    /// idempotent producer takes that error as fatal for the record (seen in
    /// `tests/tests/kafka_restart.rs`). A real Kafka broker closes its connections instead.
    ///
    /// # Errors
    /// The restart failed (e.g. the port was taken meanwhile).
    pub fn restart(&self) -> anyhow::Result<()> {
        self.kill();
        self.start_again()
    }

    /// Starts the broker again after [`KafkaBroker::kill`] or [`KafkaBroker::stop`], on the
    /// same folder and port.
    ///
    /// # Errors
    /// The start failed (e.g. the port was taken meanwhile).
    pub fn start_again(&self) -> anyhow::Result<()> {
        let log = self.dir.join("broker.log");
        let mut n = 1;
        while self.dir.join(format!("broker.log.{n}")).exists() {
            n += 1;
        }
        let _ = std::fs::rename(&log, self.dir.join(format!("broker.log.{n}")));
        let port = self.addr.rsplit(':').next().context("broker address has no port")?;
        let addr = run_start(&self.dir, Some(port))?;
        self.running.store(true, Ordering::SeqCst);
        anyhow::ensure!(addr == self.addr, "restarted broker listens on {addr}, not {}", self.addr);
        Ok(())
    }
}

fn run_start(dir: &Path, port: Option<&str>) -> anyhow::Result<String> {
    let script = crate::repo_root().join("scripts/kafka-broker.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).arg("start").arg(dir);
    if let Some(p) = port {
        cmd.arg(p);
    }
    let out = cmd.output().with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("kafka-broker.sh start failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().lines().last().unwrap_or_default().to_string())
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        if self.running.load(Ordering::SeqCst) {
            self.stop();
        }
    }
}
