//! `pixgate-central`: the central shape on one machine (see `pixgate_tests::central`):
//! tansu, mosquitto as the devices' broker, several pixgate replicas and a generated
//! scenario's fleet; prints what each replica did and whether every expected effect was
//! carried out once and in order.

use clap::Parser;
use pixgate_tests::central::{self, CentralOptions};

/// Runs the central shape on this machine and prints what it did.
#[derive(Parser)]
struct Args {
    /// pixgate replicas (2 or 3: the charge topic has 3 partitions).
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Charge events of the generated scenario.
    #[arg(long, default_value_t = 2_000)]
    events: usize,
    /// Devices (card machines and printers) of the generated scenario.
    #[arg(long, default_value_t = 60)]
    devices: usize,
    /// The scenario's seed.
    #[arg(long, default_value_t = 20_261_203)]
    seed: u64,
    /// Replicas (not the first) SIGKILLed and started again while the events are fed; each
    /// one's queues move to the others through the delivery log.
    #[arg(long, default_value_t = 0)]
    kills: usize,
    /// Freeze replica r1 (SIGSTOP) a third of the way in and start a replacement with its
    /// identity; continue r1 (SIGCONT) this many ms after the replacement owns its
    /// partitions, then stop it. Shows the fence: which replica's connections the broker
    /// closed for whom. Not with --kills.
    #[arg(long, default_value_t = 0)]
    freeze_ms: u64,
    /// SIGKILL mosquitto (which keeps no sessions) and start it again this many times
    /// while the events are fed: devices and replicas reconnect. Not with --kills or
    /// --freeze-ms.
    #[arg(long, default_value_t = 0)]
    broker_restarts: usize,
    /// Scale out and in: a new replica joins a fifth of the way in, and r1 is stopped with
    /// SIGTERM once the new one holds partitions and delivers. --replicas is the count
    /// before the new one (2). Not with --kills, --freeze-ms or --broker-restarts.
    #[arg(long)]
    scale: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    pixgate_tests::init_cli_logs();
    let opts = CentralOptions {
        kills: args.kills,
        stop_ms: args.freeze_ms,
        broker_restarts: args.broker_restarts,
        scale: args.scale,
        ..CentralOptions::steady("central", args.replicas, args.events, args.devices, args.seed)
    };
    println!(
        "[central] tansu, mosquitto (TLS, client certificates, ACL), {} pixgate replicas, {} devices, {} charge events",
        opts.replicas, opts.devices, opts.events
    );
    let r = central::run(&opts).await?;
    if r.kills > 0 {
        println!(
            "[central] {} replicas SIGKILLed and started again; {} queued jobs restored from the delivery log by the partitions' next owners",
            r.kills, r.restored_jobs
        );
    }
    if r.broker_restarts > 0 {
        println!(
            "[central] mosquitto SIGKILLed and started again {} times; {} partition connections cut and reconnected, {} not back",
            r.broker_restarts,
            r.partition_connections_dropped,
            r.partition_connections_not_back.len()
        );
    }
    if let Some(clean) = r.sigterm_clean {
        println!(
            "[central] a replica joined and r1 left on SIGTERM ({}); queues of {} devices moved in all, the longest take {} ms; {} jobs received again by their devices (deduplicated); {} job copies on the device-jobs topic",
            if clean { "exited cleanly" } else { "did not exit cleanly" },
            r.moved_devices,
            r.longest_take_ms,
            r.duplicates,
            r.job_copies
        );
    }
    if args.freeze_ms > 0 {
        for (client, from, by) in &r.takeovers {
            let name = |r: &Option<usize>| match r {
                Some(i) if *i == args.replicas => "r1's replacement".to_string(),
                Some(i) => format!("r{i}"),
                None => "?".to_string(),
            };
            println!("[central] the broker gave {client} to {} and closed {}'s connection", name(by), name(from));
        }
        println!(
            "[central] r1 froze and was replaced; {} of its partition connections stood down on waking after asking the delivery log",
            r.stood_down
        );
    }
    println!(
        "[central] {} device records published; replicas started after them read them all before joining",
        r.device_records
    );
    let row = |a: &str, b: &str, c: &str, d: &str, e: &str| println!("{a:<8} {b:>30} {c:>23} {d:>21} {e:>10}");
    row("replica", "partitions device/charge/jobs", "registry read at start", "charge events routed", "jobs done");
    for (i, rep) in r.replicas.iter().enumerate() {
        let (d, c, j) = rep.partitions;
        let at_start = rep.registry_at_start.map_or("?".to_string(), |n| n.to_string());
        row(&format!("r{i}"), &format!("{d}/{c}/{j}"), &at_start, &rep.routed.to_string(), &rep.delivered.to_string());
    }
    let commits: Vec<String> = r
        .device_topic_commits
        .iter()
        .map(|(g, c)| format!("{g}: {}", if c.iter().all(|o| *o < 0) { "none" } else { "some" }))
        .collect();
    println!("[central] device.upserted offsets committed by {}", commits.join(", "));
    println!(
        "[central] {} of {} expected effects carried out on {} devices, each once and in order ({} job deliveries, {} seq going backwards), in {:.0} s",
        r.delivery.effects, r.expected, r.delivery.devices, r.raw_jobs, r.order_violations, r.secs
    );
    Ok(())
}
