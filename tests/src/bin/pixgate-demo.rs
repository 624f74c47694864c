//! `pixgate-demo [FIXTURES] [OUT]`: the main job end to end (see `pixgate_tests::demo`).

use clap::Parser;
use pixgate_tests::{demo, gateway};
use std::path::PathBuf;
use std::time::Duration;

/// Runs pixgate end to end on a fixtures folder: a Kafka-protocol broker, pixgate with its
/// embedded MQTT broker, one simulated printer or card machine per registry entry, and the
/// capture simulator feeding the fixtures. Leaves PNGs, transcripts and summary.json in OUT.
#[derive(Parser)]
struct Args {
    /// Fixtures folder with devices.jsonl, charges.jsonl, edge-cases.jsonl.
    #[arg(default_value_os_t = demo::default_fixtures())]
    fixtures: PathBuf,
    /// Output folder.
    #[arg(default_value = "out")]
    out: PathBuf,
    /// Longest wait for delivery, seconds.
    #[arg(long, default_value_t = 300)]
    timeout_s: u64,
    /// Feed all charge events at once instead of as recorded (devices keeping up): shows
    /// queued QR codes superseded by their charge's paid/expired screen.
    #[arg(long)]
    burst: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    pixgate_tests::init_cli_logs();
    if !demo::is_fixtures_dir(&args.fixtures) {
        anyhow::bail!("{} has no devices.jsonl: not a fixtures folder", args.fixtures.display());
    }
    let cfg = demo::DemoConfig {
        fixtures: args.fixtures,
        out: args.out,
        pixgate_bin: gateway::find_binary()?,
        timeout: Duration::from_secs(args.timeout_s),
        pace: if args.burst { demo::Pace::Burst } else { demo::Pace::KeepingUp },
    };
    // Ctrl-C drops the run future: the broker and pixgate guards stop what was started.
    tokio::select! {
        r = demo::run(&cfg) => r.map(|_| ()),
        _ = tokio::signal::ctrl_c() => {
            eprintln!("[pixgate-demo] interrupted; stopping everything started");
            Ok(())
        }
    }
}
