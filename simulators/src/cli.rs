//! Small helpers shared by the simulator binaries.

use crate::device::{DeviceIdentity, MqttSecurity};
use anyhow::{Context, Result};
use std::path::PathBuf;

/// Logs to stderr; `RUST_LOG` overrides the default `info`.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Splits `HOST:PORT` (IPv6 as `[::1]:1883`).
///
/// # Errors
/// No port, or the port is not a number.
pub fn parse_host_port(s: &str) -> Result<(String, u16)> {
    let (host, port) = s.rsplit_once(':').with_context(|| format!("{s:?} is not HOST:PORT"))?;
    let port = port.parse().with_context(|| format!("bad port in {s:?}"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok((if host.is_empty() { "127.0.0.1".into() } else { host.to_string() }, port))
}

/// Resolves on Ctrl-C (SIGINT) or, on Unix, SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port() {
        assert_eq!(parse_host_port("127.0.0.1:1883").unwrap(), ("127.0.0.1".into(), 1883));
        assert_eq!(parse_host_port("[::1]:1883").unwrap(), ("::1".into(), 1883));
        assert!(parse_host_port("nohost").is_err());
    }

    #[derive(Debug, clap::Parser)]
    struct Flags {
        #[command(flatten)]
        security: MqttSecurityArgs,
    }

    fn parse(args: &[&str]) -> Result<MqttSecurity> {
        use clap::Parser;
        let flags = Flags::try_parse_from(std::iter::once("sim").chain(args.iter().copied()))?;
        flags.security.security()
    }

    #[test]
    fn security_flags() {
        assert!(matches!(parse(&[]).unwrap(), MqttSecurity::Plain));
        let tls = parse(&["--mqtt-ca", "ca.crt", "--mqtt-cert-dir", "certs"]).unwrap();
        assert!(
            matches!(&tls, MqttSecurity::Tls { ca, identity: DeviceIdentity::Certificate { dir } }
                if ca.as_os_str() == "ca.crt" && dir.as_os_str() == "certs"),
            "{tls:?}"
        );
        let dir = std::env::temp_dir().join(format!("sim-cli-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secrets.json");
        std::fs::write(&file, r#"{"abc": "s3cret", "def": "other"}"#).unwrap();
        let tls = parse(&["--mqtt-ca", "ca.crt", "--mqtt-secrets", file.to_str().unwrap()]).unwrap();
        match &tls {
            MqttSecurity::Tls { identity: DeviceIdentity::Secret { secrets }, .. } => {
                assert_eq!(secrets.get("abc").map(String::as_str), Some("s3cret"));
                assert_eq!(secrets.len(), 2);
            }
            other => panic!("{other:?}"),
        }
        assert!(!format!("{tls:?}").contains("s3cret"), "Debug must not print secrets: {tls:?}");
        std::fs::write(&file, r#"["abc"]"#).unwrap();
        assert!(parse(&["--mqtt-ca", "ca.crt", "--mqtt-secrets", file.to_str().unwrap()]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
        // TLS needs an identity; an identity needs TLS; one identity only.
        assert!(parse(&["--mqtt-ca", "ca.crt"]).is_err());
        assert!(parse(&["--mqtt-cert-dir", "certs"]).is_err());
        assert!(parse(&["--mqtt-ca", "ca.crt", "--mqtt-cert-dir", "c", "--mqtt-secrets", "s.json"]).is_err());
    }
}

/// The arguments every `run` subcommand (`printer-sim`, `terminal-sim`) takes.
#[derive(Debug, clap::Args)]
pub struct DeviceArgs {
    /// Device registry id.
    #[arg(long)]
    pub id: String,
    /// Broker address.
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub mqtt: String,
    /// Output directory (files go to DIR/ID/).
    #[arg(long)]
    pub out: std::path::PathBuf,
    /// Carry out jobs even after their expires_at.
    #[arg(long)]
    pub ignore_expiry: bool,
    /// Plain TCP or TLS, and the device's credentials.
    #[command(flatten)]
    pub security: MqttSecurityArgs,
}

/// How simulated devices connect to the broker: `--mqtt-ca FILE` turns TLS on, with
/// `--mqtt-cert-dir DIR` or `--mqtt-secrets FILE` for the device's identity; without
/// `--mqtt-ca`, plain TCP and no credentials.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct MqttSecurityArgs {
    /// Connect over TLS, verifying the broker's certificate against this CA file (PEM). The
    /// host of --mqtt is the TLS server name (a name, or an IP the certificate carries as a
    /// SAN). Needs --mqtt-cert-dir or --mqtt-secrets. Without it: plain TCP, no credentials.
    #[arg(long, value_name = "FILE", requires = "mqtt_identity")]
    pub mqtt_ca: Option<PathBuf>,
    /// With --mqtt-ca: authenticate with a client certificate, DIR/ID.crt and DIR/ID.key
    /// (PEM; subject CN = device id, signed by the fleet CA).
    #[arg(long, value_name = "DIR", group = "mqtt_identity", requires = "mqtt_ca")]
    pub mqtt_cert_dir: Option<PathBuf>,
    /// With --mqtt-ca: authenticate with MQTT username = device id and password = the
    /// device's secret from FILE, a JSON object {"<device id>": "<secret>", ...}.
    #[arg(long, value_name = "FILE", group = "mqtt_identity", requires = "mqtt_ca")]
    pub mqtt_secrets: Option<PathBuf>,
    /// The MQTT version the device speaks: 3.1.1 or 5.
    #[arg(long, value_name = "VERSION", default_value = "3.1.1")]
    pub mqtt_version: crate::mqtt_link::Protocol,
}

impl MqttSecurityArgs {
    /// The [`MqttSecurity`] these flags ask for (reads the secrets file).
    ///
    /// # Errors
    /// An identity flag without `--mqtt-ca` or the reverse, both identity flags, or an
    /// unreadable secrets file.
    pub fn security(&self) -> Result<MqttSecurity> {
        let identity = match (&self.mqtt_cert_dir, &self.mqtt_secrets) {
            (Some(_), Some(_)) => anyhow::bail!("--mqtt-cert-dir and --mqtt-secrets exclude each other"),
            (Some(dir), None) => Some(DeviceIdentity::Certificate { dir: dir.clone() }),
            (None, Some(file)) => Some(DeviceIdentity::secrets_from_json(file)?),
            (None, None) => None,
        };
        match (&self.mqtt_ca, identity) {
            (None, None) => Ok(MqttSecurity::Plain),
            (Some(ca), Some(identity)) => Ok(MqttSecurity::Tls { ca: ca.clone(), identity }),
            (Some(_), None) => anyhow::bail!("--mqtt-ca needs --mqtt-cert-dir or --mqtt-secrets"),
            (None, Some(_)) => anyhow::bail!("--mqtt-cert-dir and --mqtt-secrets need --mqtt-ca (TLS)"),
        }
    }
}

/// Runs one simulated device (`spec`, whose id is `args.id`) until Ctrl-C or SIGTERM, then
/// prints its counters as JSON on stderr (the `run` subcommand of `printer-sim` and
/// `terminal-sim`).
///
/// # Errors
/// `args.mqtt` is not HOST:PORT, the security flags are inconsistent, the device's TLS
/// material or secret cannot be read, or the counters cannot be serialised.
pub async fn run_single_device(spec: &crate::registry::DeviceSpec, args: &DeviceArgs) -> Result<()> {
    let (mqtt_host, mqtt_port) = parse_host_port(&args.mqtt)?;
    let opts = crate::device::DeviceOptions {
        mqtt_host,
        mqtt_port,
        out_dir: args.out.clone(),
        honor_expiry: !args.ignore_expiry,
        security: args.security.security()?,
        protocol: args.security.mqtt_version,
    };
    let stats = std::sync::Arc::new(crate::device::Stats::default());
    let dev = crate::device::spawn_device(spec, &opts, stats.clone())?;
    shutdown_signal().await;
    dev.shutdown().await;
    eprintln!("{}", serde_json::to_string(&stats.snapshot())?);
    Ok(())
}
