//! fleet-sim: every printer and card machine of a device registry, on one MQTT broker.
//!
//! `fleet-sim --devices fixtures/cdc/devices.jsonl --mqtt HOST:PORT --out DIR
//! [--mqtt-ca CA.crt (--mqtt-cert-dir DIR | --mqtt-secrets FILE)]`; on Ctrl-C the devices go
//! offline cleanly and `DIR/effects.json` gets the [`simulators::fleet::FleetReport`].

use anyhow::{Context, Result};
use clap::Parser;
use simulators::cli::{init_tracing, parse_host_port, shutdown_signal, MqttSecurityArgs};
use simulators::fleet::{start_with, FleetConfig};
use simulators::registry::devices_from_jsonl;
use std::path::PathBuf;
use std::time::Duration;

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
    let fleet = start_with(
        FleetConfig { mqtt_host, mqtt_port, out_dir: cli.out.clone(), devices, security },
        !cli.ignore_expiry,
    )
    .await?;
    let signal = shutdown_signal();
    tokio::pin!(signal);
    tokio::select! {
        r = fleet.wait_connected(Duration::from_secs(cli.connect_timeout_s)) => {
            match r {
                Ok(()) => tracing::info!("all devices connected"),
                Err(e) => tracing::warn!("{e:#} (they keep retrying)"),
            }
            signal.await;
        }
        _ = &mut signal => {}
    }
    tracing::info!("stopping fleet");
    let report = fleet.shutdown().await;
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
