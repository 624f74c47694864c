//! capture-sim: the upstream capture job's stand-in.
//!
//! - `capture-sim create-topics --brokers HOST:PORT` creates `device.upserted`,
//!   `charge.upserted` (3 partitions each) and `pixgate.deadletter` (1).
//! - `capture-sim publish --brokers HOST:PORT FILE...` publishes JSONL event files in order.
//! - `capture-sim generate --brokers HOST:PORT [--devices devices.jsonl] [--rate 10] [--count 100] [--seed 1]`
//!   publishes synthetic charge lifecycles for load.
//! - `capture-sim scenario --out DIR [--seed 1] [--devices 500] [--events 20000]` writes a
//!   generated world as a fixtures folder: `devices.jsonl`, `charges.jsonl` and
//!   `expected.json` (what the routing rules call for, from `simulators::expected`), the
//!   shapes of `fixtures/cdc`, so `scripts/demo.sh DIR out` runs on it.

use anyhow::Result;
use clap::{Parser, Subcommand};
use simulators::capture::generate::{Scenario, ScenarioConfig};
use simulators::capture::CaptureRecord;
use simulators::capture::{ensure_topics, generate, publish_file, PIXGATE_TOPICS};
use simulators::cli::init_tracing;
use simulators::expected::Model;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

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
    /// Write a generated registry and charge lifecycles as a fixtures folder.
    Scenario {
        /// Output folder (created).
        #[arg(long)]
        out: PathBuf,
        /// Seed (same seed, same world; dates are relative to now).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Devices in the registry.
        #[arg(long, default_value_t = 500)]
        devices: usize,
        /// Charge events.
        #[arg(long, default_value_t = 20_000)]
        events: usize,
    },
}

/// Writes `records` as `{"topic","key","value"}` lines (values are JSON objects).
fn write_jsonl(path: &Path, records: impl IntoIterator<Item = CaptureRecord>) -> Result<usize> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut n = 0;
    for r in records {
        let value: serde_json::Value = serde_json::from_slice(&r.value)?;
        serde_json::to_writer(&mut out, &serde_json::json!({"topic": r.topic, "key": r.key, "value": value}))?;
        out.write_all(b"\n")?;
        n += 1;
    }
    out.flush()?;
    Ok(n)
}

/// `capture-sim scenario`: the fixtures folder of a generated world.
fn write_scenario(out: &Path, seed: u64, devices: usize, events: usize) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let scenario = Scenario::new(ScenarioConfig::new(seed, devices, events));
    let mut model = Model::new();
    for r in scenario.device_records() {
        model.apply_device(&r.value);
    }
    let n_devices = write_jsonl(&out.join("devices.jsonl"), scenario.device_records().iter().cloned())?;
    let mut expected: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let charges: Vec<CaptureRecord> = scenario.charge_events().collect();
    for r in &charges {
        let fate = model.apply_charge(&r.value);
        let v: serde_json::Value = serde_json::from_slice(&r.value)?;
        let Some(key) = r.key.clone() else { continue };
        let entry = expected.entry(key).or_insert_with(|| serde_json::json!({"effects": []}));
        let doc = &v["fullDocument"];
        // The document as applied: a stale or repeated event does not change the charge.
        let applied = !matches!(fate, simulators::expected::Fate::Ignored("stale_version" | "duplicate_event"));
        if doc.is_object() && applied {
            entry["company"] = doc["company"]["$oid"].clone();
            entry["value"] = doc["value"].clone();
            entry["final"] = doc["status"].clone();
        }
        for e in fate.effects() {
            entry["effects"]
                .as_array_mut()
                .expect("array")
                .push(serde_json::json!({"device": e.device, "kind": e.kind.as_str()}));
        }
    }
    let n_charges = write_jsonl(&out.join("charges.jsonl"), charges)?;
    std::fs::write(out.join("expected.json"), serde_json::to_vec_pretty(&expected)?)?;
    let effects: usize = expected.values().map(|c| c["effects"].as_array().map_or(0, Vec::len)).sum();
    println!("{}: {n_devices} devices, {n_charges} charge events, {effects} expected effects", out.display());
    Ok(())
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
        Cmd::Generate { brokers, devices, rate, count, seed } => {
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
        Cmd::Scenario { out, seed, devices, events } => write_scenario(&out, seed, devices, events)?,
    }
    Ok(())
}
