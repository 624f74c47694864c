//! `pixgate-replicas`: the central shape's throughput and latency with one, two and three
//! replicas (`pixgate_tests::central` on tansu and mosquitto, the same scenario each time),
//! each run with a bare rdkafka consumer reading the same charge topic on the same broker
//! as its baseline. Figures are printed, never asserted; a run fails only when an expected
//! effect is missing, repeated or out of order.
//!
//! The feed keeps up with the devices (a charge's next event goes out once its last one's
//! effects are carried out), so events/s is what the whole path sustains end to end, and a
//! latency is from an event handed to the producer to one of its effects carried out by its
//! device (just before its `done` ack).

use clap::Parser;
use pixgate_tests::central::{self, CentralOptions};
use std::time::Duration;

/// Runs the central shape with each replica count and prints a table.
#[derive(Parser)]
struct Args {
    /// Replica counts to run, in order (1 to 3: the charge topic has 3 partitions).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    replicas: Vec<usize>,
    /// Charge events of the generated scenario.
    #[arg(long, default_value_t = 4_000)]
    events: usize,
    /// Devices (card machines and printers) of the generated scenario.
    #[arg(long, default_value_t = 200)]
    devices: usize,
    /// The scenario's seed.
    #[arg(long, default_value_t = 20_261_204)]
    seed: u64,
}

/// The `q` quantile (0..=1) of sorted `v`, ms.
fn quantile_ms(v: &[Duration], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i].as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    pixgate_tests::init_cli_logs();
    let args = Args::parse();
    let mut rows = Vec::new();
    for &n in &args.replicas {
        let opts = CentralOptions {
            baseline: true,
            ..CentralOptions::steady(&format!("bench-r{n}"), n, args.events, args.devices, args.seed)
        };
        println!("[replicas] {n} replica(s), {} devices, {} charge events", args.devices, args.events);
        let r = central::run(&opts).await?;
        let rate = r.expected as f64 / r.feed.as_secs_f64();
        let events_rate = args.events as f64 / r.feed.as_secs_f64();
        let (bare_n, bare_t) = r.bare.unwrap_or_default();
        let bare_rate = bare_n as f64 / bare_t.as_secs_f64();
        let row = format!(
            "| {n} | {} effects on {} devices, once and in order | {events_rate:.0} events/s, {rate:.0} effects/s ({:.1} s) | {bare_rate:.0} records/s | {:.4} | p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} effects) |",
            r.delivery.effects,
            r.delivery.devices,
            r.feed.as_secs_f64(),
            events_rate / bare_rate,
            quantile_ms(&r.latencies, 0.5),
            quantile_ms(&r.latencies, 0.99),
            quantile_ms(&r.latencies, 1.0),
            r.latencies.len()
        );
        println!("{row}");
        rows.push(row);
    }
    println!("\n| replicas | delivery | end to end (feed keeping up) | bare consumer, same broker | events/s ÷ bare | produce → effect |");
    println!("|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    Ok(())
}
