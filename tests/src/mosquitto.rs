//! Debian's `mosquitto-clients` (`mosquitto_sub`, `mosquitto_pub`) as an outside MQTT peer:
//! a device that is not our code, speaking MQTT 3.1.1 to pixgate's embedded broker.
//! `scripts/ensure-mosquitto.sh` installs them (`scripts/test.sh` runs it).
//!
//! [`Subscriber`] runs `mosquitto_sub -d` and reads its standard output: the debug lines
//! (`Client … received SUBACK`, `Subscribed (mid: 1): 1`) say when the subscription is in
//! place, and every other line is one message payload (the jobs are one-line JSON).

use anyhow::{bail, Context};
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
    let mut cmd = Command::new("mosquitto_pub");
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
        // Line-buffered (coreutils `stdbuf`): into a pipe, mosquitto_sub's stdio would hold
        // its debug lines and payloads in a 4 KiB buffer.
        let mut cmd = Command::new("stdbuf");
        cmd.args([
            "-oL",
            "mosquitto_sub",
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
            "-d",
        ]);
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
        anyhow::ensure!(
            granted.ends_with(&format!(": {qos}")),
            "subscription to {topic} not granted at QoS {qos}: {granted:?}"
        );
        Ok(sub)
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
