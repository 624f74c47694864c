//! terminal-sim: a simulated card machine showing pixgate screens.
//!
//! `terminal-sim run --id ID --mqtt HOST:PORT --out DIR [--width 720 --height 1280 --locale pt-BR]`

use anyhow::Result;
use clap::{Parser, Subcommand};
use simulators::cli::{init_tracing, parse_host_port};
use simulators::device::DeviceOptions;
use simulators::registry::{DeviceSpec, DEFAULT_TIME_ZONE};
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "Simulated card machine")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Be device ID on the MQTT broker until Ctrl-C.
    Run {
        /// Device registry id.
        #[arg(long)]
        id: String,
        /// Broker address.
        #[arg(long, default_value = "127.0.0.1:1883")]
        mqtt: String,
        /// Output directory (files go to DIR/ID/).
        #[arg(long)]
        out: PathBuf,
        /// Screen width in pixels.
        #[arg(long, default_value_t = 720)]
        width: u32,
        /// Screen height in pixels.
        #[arg(long, default_value_t = 1280)]
        height: u32,
        /// Locale used when a job names none.
        #[arg(long, default_value = "pt-BR")]
        locale: String,
        /// Time zone used when a job names none.
        #[arg(long, default_value = DEFAULT_TIME_ZONE)]
        time_zone: String,
        /// Carry out jobs even after their expires_at.
        #[arg(long)]
        ignore_expiry: bool,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    init_tracing();
    let Cmd::Run {
        id,
        mqtt,
        out,
        width,
        height,
        locale,
        time_zone,
        ignore_expiry,
    } = Cli::parse().cmd;
    let (mqtt_host, mqtt_port) = parse_host_port(&mqtt)?;
    let spec = DeviceSpec::Terminal {
        id,
        width_px: width,
        height_px: height,
        locale,
        time_zone,
    };
    simulators::cli::run_single_device(
        &spec,
        &DeviceOptions { mqtt_host, mqtt_port, out_dir: out, honor_expiry: !ignore_expiry },
    )
    .await?;
    Ok(())
}
