//! Small helpers shared by the simulator binaries.

use anyhow::{Context, Result};

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
}

/// Runs one simulated device (`spec`, whose id is `args.id`) until Ctrl-C or SIGTERM, then
/// prints its counters as JSON on stderr (the `run` subcommand of `printer-sim` and
/// `terminal-sim`).
///
/// # Errors
/// `args.mqtt` is not HOST:PORT, or the counters cannot be serialised.
pub async fn run_single_device(spec: &crate::registry::DeviceSpec, args: &DeviceArgs) -> Result<()> {
    let (mqtt_host, mqtt_port) = parse_host_port(&args.mqtt)?;
    let opts = crate::device::DeviceOptions {
        mqtt_host,
        mqtt_port,
        out_dir: args.out.clone(),
        honor_expiry: !args.ignore_expiry,
    };
    let stats = std::sync::Arc::new(crate::device::Stats::default());
    let dev = crate::device::spawn_device(spec, &opts, stats.clone());
    shutdown_signal().await;
    dev.shutdown().await;
    eprintln!("{}", serde_json::to_string(&stats.snapshot())?);
    Ok(())
}
