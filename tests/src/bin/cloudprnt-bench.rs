//! `cloudprnt-bench`: pixgate's CPU per poll and per receipt of printers on Star CloudPRNT
//! (HTTP and MQTT methods) and Epson Server Direct Print, beside the same printers on
//! pixgate's MQTT device protocol (see `pixgate_tests::cloudprnt_bench`). Figures are printed, never
//! asserted; run it in release on an otherwise idle machine.

use clap::Parser;
use pixgate_tests::cloudprnt_bench::{self, BenchConfig, Mode};
use std::path::PathBuf;

/// Printers on their makers' protocols, measured against the same printers on MQTT.
#[derive(Parser)]
struct Args {
    /// Printers, simulated in this process (one company each).
    #[arg(long, default_value_t = 2_000)]
    printers: usize,
    /// Poll interval of CloudPRNT's HTTP method and of Server Direct Print, ms (Star's
    /// default: 5 s).
    #[arg(long, default_value_t = 5_000)]
    poll_ms: u64,
    /// Idle phase, seconds.
    #[arg(long, default_value_t = 30)]
    idle_seconds: u64,
    /// Paid charges per second in the load phase.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Load phase, seconds.
    #[arg(long, default_value_t = 30)]
    load_seconds: u64,
    /// The modes, in this order: `http`, `star-mqtt`, `sdp`, `mqtt`.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["http", "star-mqtt", "sdp", "mqtt"])]
    modes: Vec<Mode>,
    /// Working folder (emptied).
    #[arg(long)]
    work: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let pixgate_bin = match std::env::var_os("PIXGATE_BIN") {
        Some(p) => PathBuf::from(p),
        None => pixgate_tests::gateway::find_binary()?,
    };
    if !cloudprnt_bench::is_release(&pixgate_bin) {
        eprintln!("[cloudprnt-bench] {} is not a release build: figures mean little", pixgate_bin.display());
    }
    let cfg = BenchConfig {
        pixgate_bin,
        work: args.work.unwrap_or_else(cloudprnt_bench::default_work_dir),
        printers: args.printers,
        poll_ms: args.poll_ms,
        idle_seconds: args.idle_seconds,
        rate: args.rate,
        load_seconds: args.load_seconds,
    };
    for mode in args.modes {
        let report = cloudprnt_bench::run(&cfg, mode).await?;
        println!("{}", report.line(mode, &cfg));
    }
    let _ = std::fs::remove_dir_all(&cfg.work);
    Ok(())
}
