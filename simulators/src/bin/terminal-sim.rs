//! terminal-sim: a simulated card machine showing pixgate screens.
//!
//! `terminal-sim run --id ID --mqtt HOST:PORT --out DIR [--width 720 --height 1280 --locale pt-BR]
//! [--mqtt-ca CA.crt (--mqtt-cert-dir DIR | --mqtt-secrets FILE)]`

use anyhow::Result;
use clap::{Parser, Subcommand};
use simulators::cli::{init_tracing, run_single_device, DeviceArgs};
use simulators::registry::{DeviceSpec, DEFAULT_TIME_ZONE};

#[derive(Parser)]
#[command(about = "Simulated card machine")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Be device ID on the MQTT broker until Ctrl-C (plain TCP, or TLS with --mqtt-ca and
    /// --mqtt-cert-dir or --mqtt-secrets).
    Run {
        #[command(flatten)]
        device: DeviceArgs,
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
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    init_tracing();
    let Cmd::Run { device, width, height, locale, time_zone } = Cli::parse().cmd;
    let spec = DeviceSpec::Terminal { id: device.id.clone(), width_px: width, height_px: height, locale, time_zone };
    run_single_device(&spec, &device).await
}
