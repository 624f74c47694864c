//! `pixgate-load`: the load harness (see `pixgate_tests::load`); `scripts/load.sh` builds
//! it in release and runs it.

use clap::Parser;
use pixgate_tests::{gateway, load};
use std::path::PathBuf;
use std::time::Duration;

/// Measures pixgate on a real broker with a simulated fleet: a backlog of charge events
/// produced while pixgate is down, drained with the fleet connected (accept rate, delivery
/// rate, RSS over time, peak RSS), compared with a bare Kafka consumer reading the same
/// topic; then live traffic at a fixed rate (latency produce → device ack, p50/p99, and
/// pixgate's added latency by stage, timed from a bare consumer reading beside it).
#[derive(Parser)]
struct Args {
    /// Charge events in the backlog.
    #[arg(long, default_value_t = 1_000_000)]
    events: usize,
    /// Devices (printers and card machines), all simulated in this process.
    #[arg(long, default_value_t = 500)]
    devices: usize,
    /// Charge events per second in the live phase (0: skip it).
    #[arg(long, default_value_t = 50.0)]
    live_rate: f64,
    /// Length of the live phase, seconds.
    #[arg(long, default_value_t = 60)]
    live_seconds: u64,
    /// Scenario seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Working folder (broker data, outbox, logs).
    #[arg(long)]
    work: Option<PathBuf>,
    /// Keep the working folder.
    #[arg(long)]
    keep: bool,
    /// Longest wait for any phase, seconds.
    #[arg(long, default_value_t = 6 * 3600)]
    timeout_s: u64,
    /// Extra pixgate setting, e.g. `--pixgate-env PIXGATE_OUTBOX__MAX_JOBS=50000` (repeatable).
    #[arg(long, value_parser = load::parse_env)]
    pixgate_env: Vec<(String, String)>,
    /// How the fleet connects: plain TCP (anonymous), or TLS with a throwaway CA and a
    /// secret or a client certificate per device.
    #[arg(long, value_enum, default_value_t = load::FleetTls::Plain)]
    tls: load::FleetTls,
    /// Longest wait for the whole fleet to connect, seconds.
    #[arg(long, default_value_t = 600)]
    connect_timeout_s: u64,
    /// Device connections cut at random per minute over the drain and live phase, as a
    /// real network drops them (0: none); each device reconnects by itself.
    #[arg(long, default_value_t = 0.0)]
    churn_per_minute: f64,
    /// Run the central shape's hand-off: every job through `pixgate.device-jobs`, created
    /// with this many partitions, and read back (0: the edge box's outbox write).
    #[arg(long, default_value_t = 0)]
    cluster_partitions: i32,
    /// `fetch.wait.max.ms` of the bare consumer that reads the live phase beside pixgate,
    /// stamping when each record became readable (the reference for pixgate's added
    /// latency).
    #[arg(long, default_value_t = 5)]
    tail_fetch_wait_ms: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cfg = load::LoadConfig {
        events: a.events,
        devices: a.devices,
        live_rate: a.live_rate,
        live_seconds: a.live_seconds,
        seed: a.seed,
        pixgate_bin: gateway::find_binary()?,
        work: a.work.unwrap_or_else(load::default_work_dir),
        keep: a.keep,
        timeout: Duration::from_secs(a.timeout_s),
        env: a.pixgate_env,
        fleet_tls: a.tls,
        connect_timeout: Duration::from_secs(a.connect_timeout_s),
        churn_per_minute: a.churn_per_minute,
        cluster_partitions: a.cluster_partitions,
        tail_fetch_wait_ms: a.tail_fetch_wait_ms,
    };
    println!("[pixgate-load] pixgate binary {}; work folder {}", cfg.pixgate_bin.display(), cfg.work.display());
    // Ctrl-C or SIGTERM: dropping the run stops the broker and pixgate it started (a
    // SIGTERM used to leave tansu running).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let report = tokio::select! {
        r = load::run(&cfg) => r?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; everything started is stopped"),
        _ = term.recv() => anyhow::bail!("terminated; everything started is stopped"),
    };
    println!("{}", load::table(&cfg, &report));
    Ok(())
}
