//! capture-sim: the upstream capture job's stand-in.
//!
//! - `capture-sim create-topics --brokers HOST:PORT` creates `device.upserted`,
//!   `charge.upserted` (3 partitions each) and `pixgate.deadletter` (1).
//! - `capture-sim publish --brokers HOST:PORT FILE...` publishes JSONL event files in order.
//! - `capture-sim generate --brokers HOST:PORT [--devices devices.jsonl] [--rate 10] [--count 100] [--seed 1]`
//!   publishes synthetic charge lifecycles for load.

use anyhow::Result;
use clap::{Parser, Subcommand};
use simulators::capture::{ensure_topics, generate, publish_file, PIXGATE_TOPICS};
use simulators::cli::init_tracing;
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "Publishes CDC change events to Kafka")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create pixgate's topics (existing ones are fine).
    CreateTopics {
        /// Bootstrap servers.
        #[arg(long, default_value = "127.0.0.1:9092")]
        brokers: String,
    },
    /// Publish each FILE's lines ({"topic","key","value"}) in order, one file after another.
    Publish {
        /// Bootstrap servers.
        #[arg(long, default_value = "127.0.0.1:9092")]
        brokers: String,
        /// JSONL event files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Publish synthetic charge lifecycles for load (ACTIVE, then COMPLETED or EXPIRED).
    Generate {
        /// Bootstrap servers.
        #[arg(long, default_value = "127.0.0.1:9092")]
        brokers: String,
        /// device.upserted JSONL whose enabled terminals the charges are created on.
        #[arg(long)]
        devices: Option<PathBuf>,
        /// New charges per second.
        #[arg(long, default_value_t = 10.0)]
        rate: f64,
        /// Number of charges.
        #[arg(long, default_value_t = 100)]
        count: usize,
        /// Seed (same seed, same charges).
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    init_tracing();
    match Cli::parse().cmd {
        Cmd::CreateTopics { brokers } => ensure_topics(&brokers, &PIXGATE_TOPICS).await?,
        Cmd::Publish { brokers, files } => {
            let mut total = 0;
            for f in &files {
                let n = tokio::select! {
                    r = publish_file(&brokers, f) => r?,
                    _ = simulators::cli::shutdown_signal() => anyhow::bail!("interrupted"),
                };
                println!("{}: {n} records", f.display());
                total += n;
            }
            println!("total: {total} records");
        }
        Cmd::Generate {
            brokers,
            devices,
            rate,
            count,
            seed,
        } => {
            let terminals = match devices {
                Some(p) => generate::terminals_from_jsonl(&p)?,
                None => Vec::new(),
            };
            let n = tokio::select! {
                r = generate::generate(&brokers, rate, count, seed, &terminals) => r?,
                _ = simulators::cli::shutdown_signal() => anyhow::bail!("interrupted"),
            };
            println!("generated: {n} records");
        }
    }
    Ok(())
}
