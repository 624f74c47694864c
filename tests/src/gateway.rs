//! The `pixgate` binary as a child process, configured through `PIXGATE_*` variables.

use crate::net::http_get;
pub use ::gateway::ops::report::StatsReport;
use anyhow::{bail, Context};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Runs the `pixgate` CLI `bin` with `args` against a gateway whose HTTP listener is on
/// loopback `http_port` (`PIXGATE_HTTP__LISTEN`), with `env` besides: (success, stdout,
/// stderr).
///
/// # Panics
/// The binary cannot be started.
pub fn cli(bin: &Path, http_port: u16, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(bin)
        .args(args)
        .env("PIXGATE_HTTP__LISTEN", format!("127.0.0.1:{http_port}"))
        .envs(env.iter().copied())
        .output()
        .expect("pixgate starts");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Where the `pixgate` binary is: `$PIXGATE_BIN`, or next to the running executable (or
/// its parent, for test binaries in `target/*/deps/`).
///
/// # Errors
/// Not found: build it first (`cargo build -p gateway`).
pub fn find_binary() -> anyhow::Result<PathBuf> {
    if let Ok(p) = std::env::var("PIXGATE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join("pixgate");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!("pixgate binary not found next to {}; run `cargo build -p gateway` or set PIXGATE_BIN", exe.display())
}

/// Ports and names of one gateway instance.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// Kafka `bootstrap.servers`.
    pub brokers: String,
    /// Consumer group.
    pub group_id: String,
    /// MQTT listen port on 127.0.0.1.
    pub mqtt_port: u16,
    /// HTTP listen port on 127.0.0.1.
    pub http_port: u16,
    /// Device ack timeout, ms.
    pub ack_timeout_ms: u64,
    /// The durable outbox file (keep it across restarts of the same gateway).
    pub outbox_path: PathBuf,
}

/// A running gateway; dropping it kills the process.
pub struct GatewayProcess {
    child: Child,
    log: PathBuf,
    /// The settings it runs with.
    pub settings: GatewaySettings,
}

impl GatewayProcess {
    /// Spawns `bin` with `settings`, logging to `log`, and waits until `/readyz` is 200.
    ///
    /// # Errors
    /// Spawn failure, or not ready within `timeout` (the log path is in the error).
    pub fn spawn(
        bin: &Path,
        settings: GatewaySettings,
        log: &Path,
        timeout: Duration,
    ) -> anyhow::Result<GatewayProcess> {
        GatewayProcess::spawn_with_env(bin, settings, &[], log, timeout)
    }

    /// [`GatewayProcess::spawn`] with more `PIXGATE_*` settings (`env`, applied last, so
    /// they override the ones `settings` gives).
    ///
    /// # Errors
    /// Spawn failure, or not ready within `timeout` (the log path is in the error).
    pub fn spawn_with_env(
        bin: &Path,
        settings: GatewaySettings,
        env: &[(&str, String)],
        log: &Path,
        timeout: Duration,
    ) -> anyhow::Result<GatewayProcess> {
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.env("PIXGATE_KAFKA__BROKERS", &settings.brokers)
            .env("PIXGATE_KAFKA__GROUP_ID", &settings.group_id)
            .env("PIXGATE_KAFKA__INSTANCE_ID", format!("{}-1", settings.group_id))
            .env("PIXGATE_MQTT__LISTEN", format!("127.0.0.1:{}", settings.mqtt_port))
            // Loopback without TLS or credentials unless `env` says otherwise (the device
            // security tests do); the access rules hold either way.
            .env("PIXGATE_MQTT__PLAIN", "true")
            .env("PIXGATE_MQTT__ANONYMOUS", "true")
            .env("PIXGATE_MQTT__REQUIRE_REGISTERED", "false")
            // Every simulated device connects from 127.0.0.1, and acks its jobs at loopback
            // speed (a backlog of hundreds per device in the crash and load runs).
            .env("PIXGATE_MQTT__MAX_PER_ADDRESS", "1000000")
            .env("PIXGATE_MQTT__MAX_HANDSHAKES_PER_ADDRESS", "1000000")
            .env("PIXGATE_MQTT__MAX_MESSAGES_PER_SECOND", "1000000")
            .env("PIXGATE_MQTT__MAX_BYTES_PER_SECOND", "1000000000")
            .env("PIXGATE_HTTP__LISTEN", format!("127.0.0.1:{}", settings.http_port))
            .env("PIXGATE_DELIVERY__ACK_TIMEOUT_MS", settings.ack_timeout_ms.to_string())
            .env("PIXGATE_OUTBOX__PATH", &settings.outbox_path)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", std::env::var("PIXGATE_TEST_LOG").unwrap_or_else(|_| "info,librdkafka=info".into()));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let mut gw = GatewayProcess { child, log: log.to_path_buf(), settings };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = gw.child.try_wait()? {
                bail!("pixgate exited with {status} during start-up; see {}", log.display());
            }
            if matches!(gw.get("/readyz"), Ok((200, _))) {
                return Ok(gw);
            }
            if Instant::now() > deadline {
                bail!("pixgate not ready within {timeout:?}; see {}", log.display());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `GET path` on the gateway's HTTP endpoint.
    ///
    /// # Errors
    /// Connection failure.
    pub fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(&format!("127.0.0.1:{}", self.settings.http_port), path)
    }

    /// `POST path` (empty body) on the gateway's HTTP endpoint, e.g. `/clock/advance?ms=N`.
    ///
    /// # Errors
    /// Connection failure.
    pub fn post(&self, path: &str) -> anyhow::Result<(u16, String)> {
        crate::net::http_post(&format!("127.0.0.1:{}", self.settings.http_port), path)
    }

    /// `method path` (empty body) with the extra `headers`, e.g.
    /// `[("Authorization", "Bearer TOKEN")]` for an admin endpoint.
    ///
    /// # Errors
    /// Connection failure.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<(u16, String)> {
        crate::net::http_request_with(&format!("127.0.0.1:{}", self.settings.http_port), method, path, headers)
    }

    /// The gateway's `/stats`, read into the gateway's own type: the compiler checks every
    /// field a test looks at, and a body that does not match fails here instead of reading
    /// as 0 or null.
    ///
    /// # Errors
    /// Connection failure, or a body that is not a [`StatsReport`] (the body is in the
    /// error).
    pub fn stats(&self) -> anyhow::Result<StatsReport> {
        let (_, body) = self.get("/stats")?;
        serde_json::from_str(&body).with_context(|| format!("/stats is not a StatsReport: {body}"))
    }

    /// Waits until the consumer has partitions assigned (`assigned_partitions` on `/stats`):
    /// its consumer group join is complete. `/readyz` is green before that.
    ///
    /// Crash tests wait for this before killing pixgate again: killing a static member
    /// while its join is still in progress leaves tansu 0.6.0's group in `Forming` with a
    /// leader member id that no longer exists, and the restarted member never gets its
    /// partitions back (a broker bug; a real Kafka broker replaces the static member).
    ///
    /// # Errors
    /// No assignment within `timeout` (the last stats are in the error).
    pub async fn wait_assigned(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.stats();
            if let Ok(s) = &s {
                if s.counters.assigned_partitions > 0 {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("no partitions assigned within {timeout:?}; stats {}", stats_or_error(&s));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls `/readyz` every 200 ms until `want(code, body)` holds; returns that body.
    ///
    /// # Panics
    /// `want` never held within `timeout` (the message names `what` and the last answer).
    pub async fn readyz_until(&self, what: &str, timeout: Duration, want: impl Fn(u16, &str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.get("/readyz");
            if let Ok((code, body)) = &got {
                if want(*code, body) {
                    return body.clone();
                }
            }
            assert!(Instant::now() < deadline, "/readyz never {what} within {timeout:?}; last {got:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `GET /readyz` answered 200.
    pub fn is_ready(&self) -> bool {
        matches!(self.get("/readyz"), Ok((200, _)))
    }

    /// The file its stdout and stderr go to (its `tracing` log).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size now and its peak (`VmRSS`, `VmHWM` of `/proc/PID/status`), KiB.
    ///
    /// # Errors
    /// The process is gone or `/proc` has no such fields (not Linux).
    pub fn memory_kib(&self) -> anyhow::Result<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            let line = status
                .lines()
                .find(|l| l.starts_with(name))
                .with_context(|| format!("no {name} in /proc/PID/status"))?;
            line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).with_context(|| format!("bad line {line:?}"))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// The settings it was started with.
    pub fn settings(&self) -> &GatewaySettings {
        &self.settings
    }

    /// SIGKILL: the process dies at once, mid-whatever it was doing.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits up to `grace` for a clean exit, then SIGKILL. Returns whether it
    /// exited cleanly with status 0.
    pub fn stop(&mut self, grace: Duration) -> bool {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `key`'s entry in one of `/stats`' counter maps (`events_read` by topic, `ignored` and
/// `dead_lettered_*` by reason, `effects_done` and `expired` by kind). The gateway adds a
/// key at its first count, so a key with no entry has counted nothing yet: zero.
pub fn count(map: &BTreeMap<String, u64>, key: &str) -> u64 {
    map.get(key).copied().unwrap_or(0)
}

/// The sum of one of `/stats`' counter maps (e.g. every topic's `events_read`).
pub fn total(map: &BTreeMap<String, u64>) -> u64 {
    map.values().sum()
}

/// `s` as compact JSON, the shape `/stats` serves, for progress lines and failure messages.
pub fn stats_json(s: &StatsReport) -> String {
    // Plain maps, numbers and strings: serializing cannot fail; say so if it ever does.
    serde_json::to_string(s).unwrap_or_else(|e| format!("{s:?} (not serializable: {e})"))
}

/// The outcome of a [`GatewayProcess::stats`] call for a failure message: the stats as
/// JSON ([`stats_json`]), or why there were none.
pub fn stats_or_error(s: &anyhow::Result<StatsReport>) -> String {
    match s {
        Ok(s) => stats_json(s),
        Err(e) => format!("unavailable ({e:#})"),
    }
}
