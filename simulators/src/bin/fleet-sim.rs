//! fleet-sim: every printer and card machine of a device registry, on one MQTT broker.
//!
//! `fleet-sim --devices fixtures/cdc/devices.jsonl --mqtt HOST:PORT --out DIR
//! [--mqtt-ca CA.crt (--mqtt-cert-dir DIR | --mqtt-secrets FILE)] [--churn-per-minute N]`.
//! A progress bar on stderr shows devices connected, connects per second and jobs carried
//! out; with `--churn-per-minute`, that many connections a minute are cut at random (as a
//! network would) and reconnect by themselves. On Ctrl-C the devices go offline cleanly,
//! the figures are printed (connections held, handshakes/s, jobs/s, cuts, failed
//! attempts) and `DIR/effects.json` gets the [`simulators::fleet::FleetReport`].

use anyhow::{Context, Result};
use clap::Parser;
use simulators::cli::{init_tracing, parse_host_port, shutdown_signal, MqttSecurityArgs};
use simulators::fleet::FleetHandle;
use simulators::fleet::{start_with_options, FleetConfig, FleetOptions};
use simulators::registry::devices_from_jsonl;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "Simulated fleet of printers and card machines")]
struct Cli {
    /// device.upserted JSONL (fixtures/cdc/devices.jsonl).
    #[arg(long)]
    devices: PathBuf,
    /// Broker address.
    #[arg(long, default_value = "127.0.0.1:1883")]
    mqtt: String,
    /// Output directory (DIR/ID/ per device, DIR/effects.json at the end).
    #[arg(long)]
    out: PathBuf,
    /// Carry out jobs even after their expires_at (for replaying old fixtures).
    #[arg(long)]
    ignore_expiry: bool,
    /// How long to wait for every device to connect before warning.
    #[arg(long, default_value_t = 30)]
    connect_timeout_s: u64,
    /// Connections cut at random per minute (0: none).
    #[arg(long, default_value_t = 0.0)]
    churn_per_minute: f64,
    /// Plain TCP, or TLS with each device's certificate or secret (the same for all).
    #[command(flatten)]
    security: MqttSecurityArgs,
}

#[tokio::main]
async fn main() -> Result<()> {
    init_tracing();
    let cli = Cli::parse();
    let (mqtt_host, mqtt_port) = parse_host_port(&cli.mqtt)?;
    let devices = devices_from_jsonl(&cli.devices)?;
    tracing::info!(devices = devices.len(), "starting fleet");
    let security = cli.security.security()?;
    let options = FleetOptions {
        honor_expiry: !cli.ignore_expiry,
        protocol: cli.security.mqtt_version,
        ..FleetOptions::default()
    };
    let fleet =
        start_with_options(FleetConfig { mqtt_host, mqtt_port, out_dir: cli.out.clone(), devices, security }, options)
            .await?;
    let signal = shutdown_signal();
    tokio::pin!(signal);
    let progress = run_until_signal(&fleet, &cli, &mut signal).await;
    tracing::info!("stopping fleet");
    let secs = progress.started.elapsed().as_secs_f64().max(0.001);
    let latency = fleet.ack_latency().map_or("no acks".into(), |(p50, p99)| {
        format!("ack latency p50 {:.1} ms, p99 {:.1} ms", p50.as_secs_f64() * 1e3, p99.as_secs_f64() * 1e3)
    });
    let figures = format!(
        "{} jobs in {secs:.0} s ({:.0} jobs/s); {latency}; {} connections cut, {} failed attempts",
        fleet.carried_out(),
        fleet.carried_out() as f64 / secs,
        fleet.dropped_connections(),
        fleet.connection_failures()
    );
    let report = fleet.shutdown().await;
    eprintln!("{progress}");
    eprintln!("{figures}");
    let path = cli.out.join("effects.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "{} effects, {} raw jobs, {} duplicates, {} order violations -> {}",
        report.effects.len(),
        report.stats.raw_jobs,
        report.stats.duplicates,
        report.stats.order_violations,
        path.display()
    );
    Ok(())
}

/// What the run showed, for the closing lines.
struct Progress {
    devices: usize,
    started: Instant,
    all_connected: Option<Duration>,
    /// Fewest devices connected at a tick after all had connected once.
    min_held: Option<usize>,
    connects_at_all_connected: u64,
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.all_connected {
            Some(t) => write!(
                f,
                "all {} connected after {:.1} s ({:.0} handshakes/s); at least {} held afterwards",
                self.devices,
                t.as_secs_f64(),
                self.connects_at_all_connected as f64 / t.as_secs_f64().max(0.001),
                self.min_held.unwrap_or(self.devices)
            ),
            None => write!(f, "never all {} connected in {:.0} s", self.devices, self.started.elapsed().as_secs_f64()),
        }
    }
}

/// Draws the progress bar each second, cuts connections at the churn rate, and returns at
/// the signal.
async fn run_until_signal(
    fleet: &FleetHandle,
    cli: &Cli,
    signal: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Progress {
    let devices = fleet.device_ids().len();
    let mut p = Progress {
        devices,
        started: Instant::now(),
        all_connected: None,
        min_held: None,
        connects_at_all_connected: 0,
    };
    let terminal = std::io::stderr().is_terminal();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let churn_every = (cli.churn_per_minute > 0.0).then(|| Duration::from_secs_f64(60.0 / cli.churn_per_minute));
    let mut churn = tokio::time::interval(churn_every.unwrap_or(Duration::from_secs(3600)));
    churn.tick().await;
    let mut seed = 0x2545_F491_4F6C_DD1D_u64;
    let (mut last_jobs, mut last_connects, mut warned) = (0, 0, false);
    loop {
        tokio::select! {
            () = &mut *signal => break,
            _ = churn.tick(), if churn_every.is_some() => {
                if let Some(id) = fleet.drop_random_connection(&mut seed) {
                    tracing::debug!(device = id, "churn: connection cut");
                }
            }
            _ = tick.tick() => {
                let connected = fleet.connected();
                let (jobs, connects) = (fleet.carried_out(), fleet.connects());
                if p.all_connected.is_none() && connected == devices {
                    p.all_connected = Some(p.started.elapsed());
                    p.connects_at_all_connected = connects;
                    tracing::info!("all devices connected");
                } else if p.all_connected.is_some() {
                    p.min_held = Some(p.min_held.map_or(connected, |m| m.min(connected)));
                }
                if p.all_connected.is_none() && !warned && p.started.elapsed() > Duration::from_secs(cli.connect_timeout_s) {
                    warned = true;
                    tracing::warn!(connected, devices, errors = ?fleet.last_errors(3), "not every device connected yet (they keep retrying)");
                }
                let width = 30;
                let filled = (connected * width).checked_div(devices).unwrap_or(width);
                let latency = fleet.ack_latency().map_or("-".into(), |(p50, p99)| format!("{}/{} ms", p50.as_millis(), p99.as_millis()));
                let line = format!(
                    "t={:>4}s [{}{}] {connected}/{devices} connected, {} connects/s, {jobs} jobs ({} /s), ack p50/p99 {latency}, {} cut, {} failed attempts",
                    p.started.elapsed().as_secs(),
                    "#".repeat(filled),
                    ".".repeat(width - filled),
                    connects - last_connects,
                    jobs - last_jobs,
                    fleet.dropped_connections(),
                    fleet.connection_failures(),
                );
                (last_jobs, last_connects) = (jobs, connects);
                if terminal {
                    eprint!("\r{line}");
                } else if p.started.elapsed().as_secs().is_multiple_of(5) {
                    eprintln!("{line}");
                }
            }
        }
    }
    if terminal {
        eprintln!();
    }
    p
}
