//! Debian's `mosquitto-clients` (`mosquitto_sub`, `mosquitto_pub`) as an outside MQTT peer:
//! a device that is not our code, speaking MQTT 3.1.1 to pixgate's embedded broker.
//! `scripts/ensure-mosquitto.sh` installs them (`scripts/test.sh` runs it).
//!
//! [`Subscriber`] runs `mosquitto_sub -d` and reads its standard output: the debug lines
//! (`Client … received SUBACK`, `Subscribed (mid: 1): 1`) say when the subscription is in
//! place, and every other line is one message payload (the jobs are one-line JSON).
//!
//! [`Broker`] is Debian's `mosquitto` broker itself (package `mosquitto`, also installed by
//! the script), as a real TLS broker that checks device credentials; [`ClientAuth`] makes
//! the clients speak TLS to it, with a client certificate or a username and password.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// Fails with how to install them when `mosquitto_sub` or `mosquitto_pub` is not on `PATH`.
///
/// # Errors
/// A client is missing: run `scripts/ensure-mosquitto.sh` (or `apt-get install mosquitto-clients`).
pub fn require_clients() -> anyhow::Result<()> {
    for bin in ["mosquitto_sub", "mosquitto_pub"] {
        let found =
            std::process::Command::new(bin).arg("--help").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
        if !found {
            bail!("{bin} not found on PATH: run scripts/ensure-mosquitto.sh (Debian package mosquitto-clients)");
        }
    }
    Ok(())
}

/// How `mosquitto_pub`/`mosquitto_sub` connect: plain TCP (the default), or TLS verifying
/// the broker against a CA file (host `127.0.0.1`, so the broker's certificate must carry
/// that IP) with a client certificate or a username and password.
#[derive(Debug, Clone, Default)]
pub struct ClientAuth {
    args: Vec<String>,
}

impl ClientAuth {
    /// Plain TCP, no credentials.
    pub fn plain() -> ClientAuth {
        ClientAuth::default()
    }

    /// TLS with a client certificate: `--cafile CA --cert CERT --key KEY`.
    pub fn certificate(ca: &Path, cert: &Path, key: &Path) -> ClientAuth {
        let args = [("--cafile", ca), ("--cert", cert), ("--key", key)]
            .into_iter()
            .flat_map(|(flag, path)| [flag.to_string(), path.display().to_string()])
            .collect();
        ClientAuth { args }
    }

    /// TLS with the server checked against `ca` and no credential: `--cafile CA`.
    pub fn server_only(ca: &Path) -> ClientAuth {
        ClientAuth { args: vec!["--cafile".into(), ca.display().to_string()] }
    }

    /// These and `extra` arguments (e.g. `--will-topic T --will-payload P`).
    pub fn with_args(mut self, extra: &[&str]) -> ClientAuth {
        self.args.extend(extra.iter().map(|a| a.to_string()));
        self
    }

    /// The command-line arguments for `mosquitto_pub`/`mosquitto_sub`.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// TLS with a username and password: `--cafile CA -u USER -P PASSWORD`.
    pub fn password(ca: &Path, user: &str, password: &str) -> ClientAuth {
        let args =
            vec!["--cafile".into(), ca.display().to_string(), "-u".into(), user.into(), "-P".into(), password.into()];
        ClientAuth { args }
    }
}

/// `mosquitto_pub -h 127.0.0.1 -p PORT -i CLIENT_ID -q QOS -t TOPIC -m PAYLOAD [-r]`: one
/// message, published and acknowledged (PUBACK for QoS 1) before it exits.
///
/// # Errors
/// It could not run, or exited non-zero (its stderr is in the error).
pub async fn publish(
    port: u16,
    client_id: &str,
    topic: &str,
    payload: &str,
    qos: u8,
    retain: bool,
) -> anyhow::Result<()> {
    publish_as(port, &ClientAuth::plain(), client_id, topic, payload, qos, retain).await
}

/// [`publish`], connecting as `auth` says (e.g. TLS with a client certificate).
///
/// # Errors
/// As [`publish`].
pub async fn publish_as(
    port: u16,
    auth: &ClientAuth,
    client_id: &str,
    topic: &str,
    payload: &str,
    qos: u8,
    retain: bool,
) -> anyhow::Result<()> {
    let mut cmd = Command::new("mosquitto_pub");
    cmd.args(&auth.args);
    cmd.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-i",
        client_id,
        "-q",
        &qos.to_string(),
        "-t",
        topic,
        "-m",
        payload,
    ]);
    if retain {
        cmd.arg("-r");
    }
    let out = cmd.stdin(Stdio::null()).output().await.context("running mosquitto_pub")?;
    if !out.status.success() {
        bail!("mosquitto_pub -t {topic} exited with {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The retained message on `topic`, as a new subscriber receives it
/// (`mosquitto_sub --retained-only -C 1 -W SECS`).
///
/// # Errors
/// No retained message within `timeout`, or `mosquitto_sub` failed.
pub async fn retained(port: u16, topic: &str, timeout: Duration) -> anyhow::Result<String> {
    let secs = timeout.as_secs().max(1).to_string();
    let out = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", topic, "--retained-only", "-C", "1", "-W", &secs])
        .stdin(Stdio::null())
        .output()
        .await
        .context("running mosquitto_sub")?;
    if !out.status.success() {
        bail!(
            "no retained message on {topic} within {timeout:?} (mosquitto_sub exited with {}: {})",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
}

/// A running `mosquitto_sub`, killed when dropped.
pub struct Subscriber {
    child: Child,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
    client_id: String,
}

impl Subscriber {
    /// Starts `stdbuf -oL mosquitto_sub -h 127.0.0.1 -p PORT -i CLIENT_ID -q QOS -t TOPIC -d`, plus
    /// `-c` (a persistent session, `clean_session = false`) when `persistent`, and waits until
    /// the broker granted the subscription at `qos`.
    ///
    /// # Errors
    /// It could not start, exited, or was not subscribed at `qos` within `timeout`.
    pub async fn start(
        port: u16,
        client_id: &str,
        topic: &str,
        qos: u8,
        persistent: bool,
        timeout: Duration,
    ) -> anyhow::Result<Subscriber> {
        Subscriber::start_as(port, &ClientAuth::plain(), client_id, topic, qos, persistent, timeout).await
    }

    /// [`Subscriber::start`], connecting as `auth` says (e.g. TLS with a client certificate).
    ///
    /// # Errors
    /// As [`Subscriber::start`].
    pub async fn start_as(
        port: u16,
        auth: &ClientAuth,
        client_id: &str,
        topic: &str,
        qos: u8,
        persistent: bool,
        timeout: Duration,
    ) -> anyhow::Result<Subscriber> {
        let (sub, granted) =
            Subscriber::start_granted(port, auth, client_id, &[topic], qos, persistent, timeout).await?;
        anyhow::ensure!(granted == [qos], "subscription to {topic} not granted at QoS {qos}: SUBACK {granted:?}");
        Ok(sub)
    }

    /// [`Subscriber::start_as`] on several `topics` (one SUBSCRIBE), returning the SUBACK's
    /// return codes whatever they are (the granted QoS, or 128 for a refused filter) with
    /// the subscriber. `mosquitto_sub` exits when every filter is refused.
    ///
    /// # Errors
    /// It could not start, or exited (a refused CONNECT) before a SUBACK within `timeout`.
    #[allow(clippy::too_many_arguments)]
    pub async fn start_granted(
        port: u16,
        auth: &ClientAuth,
        client_id: &str,
        topics: &[&str],
        qos: u8,
        persistent: bool,
        timeout: Duration,
    ) -> anyhow::Result<(Subscriber, Vec<u8>)> {
        // Line-buffered (coreutils `stdbuf`): into a pipe, mosquitto_sub's stdio would hold
        // its debug lines and payloads in a 4 KiB buffer.
        let mut cmd = Command::new("stdbuf");
        cmd.args(["-oL", "mosquitto_sub"]);
        cmd.args(&auth.args);
        cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-i", client_id, "-q", &qos.to_string(), "-d"]);
        for t in topics {
            cmd.args(["-t", t]);
        }
        if persistent {
            cmd.arg("-c");
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting mosquitto_sub")?;
        let stdout = child.stdout.take().context("mosquitto_sub stdout")?;
        let mut sub = Subscriber { child, lines: BufReader::new(stdout).lines(), client_id: client_id.to_string() };
        let granted = tokio::time::timeout(timeout, async {
            loop {
                match sub.lines.next_line().await? {
                    // `Subscribed (mid: 1): 1`: the granted QoS of each filter, 128 = refused.
                    Some(line) if line.starts_with("Subscribed (mid") => return anyhow::Ok(line),
                    Some(_) => {}
                    None => bail!("mosquitto_sub exited before its SUBACK"),
                }
            }
        })
        .await
        .with_context(|| format!("mosquitto_sub -i {client_id}: no SUBACK within {timeout:?}"))??;
        // `Subscribed (mid: 1): 1, 128`
        let codes = granted.split_once("): ").map(|(_, c)| c.split(", ").map(|c| c.trim().parse()).collect());
        let codes = codes.and_then(Result::ok).with_context(|| format!("unreadable SUBACK line {granted:?}"))?;
        Ok((sub, codes))
    }

    /// The next message payload, or `None` if none arrives within `timeout`.
    ///
    /// # Errors
    /// `mosquitto_sub` exited (its output ended).
    pub async fn next_message(&mut self, timeout: Duration) -> anyhow::Result<Option<String>> {
        let prefix = format!("Client {} ", self.client_id);
        let read = async {
            loop {
                match self.lines.next_line().await? {
                    Some(line) if line.starts_with(&prefix) || line.starts_with("Subscribed (mid") => {}
                    Some(line) => return anyhow::Ok(line),
                    None => bail!("mosquitto_sub -i {} exited", self.client_id),
                }
            }
        };
        match tokio::time::timeout(timeout, read).await {
            Ok(line) => line.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Stops it (SIGKILL; a persistent session stays on the broker).
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The `mosquitto` broker binary: on `PATH`, or Debian's `/usr/sbin/mosquitto` (not on a
/// normal user's `PATH`).
///
/// # Errors
/// Not installed: run `scripts/ensure-mosquitto.sh` (or `apt-get install mosquitto`).
pub fn broker_binary() -> anyhow::Result<PathBuf> {
    let runs = |bin: &Path| {
        std::process::Command::new(bin).arg("-h").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
    };
    for bin in [PathBuf::from("mosquitto"), PathBuf::from("/usr/sbin/mosquitto")] {
        if runs(&bin) {
            return Ok(bin);
        }
    }
    bail!("the mosquitto broker is not installed: run scripts/ensure-mosquitto.sh (Debian package mosquitto)")
}

/// Writes a mosquitto password file at `path` holding `users` (name, password), with
/// `mosquitto_passwd -b` (hashed as the installed mosquitto does).
///
/// # Errors
/// `mosquitto_passwd` is missing or fails.
pub async fn password_file(path: &Path, users: &[(&str, &str)]) -> anyhow::Result<()> {
    std::fs::write(path, "").with_context(|| format!("creating {}", path.display()))?;
    for (user, password) in users {
        let out = Command::new("mosquitto_passwd")
            .arg("-b")
            .arg(path)
            .args([user, password])
            .stdin(Stdio::null())
            .output()
            .await
            .context("running mosquitto_passwd (Debian package mosquitto)")?;
        if !out.status.success() {
            bail!(
                "mosquitto_passwd -b {} {user} exited with {}: {}",
                path.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(())
}

/// A running `mosquitto -c DIR/mosquitto.conf`, its output in `DIR/mosquitto.log`; killed
/// when dropped.
pub struct Broker {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Broker {
    /// Writes `config` (the whole mosquitto.conf: listeners, TLS files, authentication;
    /// `user root` is put first) into `dir/mosquitto.conf`, starts the broker and waits until `port` accepts TCP
    /// connections.
    ///
    /// # Errors
    /// No broker binary, it exited (its log is in the error), or `port` did not open
    /// within `timeout`.
    pub async fn start(dir: &Path, config: &str, port: u16, timeout: Duration) -> anyhow::Result<Broker> {
        Broker::start_logging(dir, config, port, timeout, true).await
    }

    /// [`Broker::start`], logging everything (`-v`) only when `verbose`: a benchmark keeps
    /// to the `log_type` lines of its `config`.
    ///
    /// # Errors
    /// As [`Broker::start`].
    pub async fn start_logging(
        dir: &Path,
        config: &str,
        port: u16,
        timeout: Duration,
        verbose: bool,
    ) -> anyhow::Result<Broker> {
        let bin = broker_binary()?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let conf = dir.join("mosquitto.conf");
        // Started as root, mosquitto would switch to the `mosquitto` user and could not read
        // the test's keys (owner-only, as pixgate writes them); as another user this is
        // ignored.
        let config = format!("user root\n{config}");
        std::fs::write(&conf, config).with_context(|| format!("writing {}", conf.display()))?;
        let log = dir.join("mosquitto.log");
        let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("-c").arg(&conf);
        if verbose {
            cmd.arg("-v");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .context("starting mosquitto")?;
        let mut broker = Broker { child, port, log };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = broker.child.try_wait()? {
                bail!("mosquitto exited with {status}: {}", broker.log_text());
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return Ok(broker);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("mosquitto did not listen on port {port} within {timeout:?}: {}", broker.log_text());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The port it was started for.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its log so far (`-v`: connections, refusals, subscriptions).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its process id (for its memory and CPU).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Stops it (SIGKILL).
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
