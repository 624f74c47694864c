//! How long a device-jobs partition's move takes with many queued jobs (the central shape's
//! hand-over, `docs/cluster.md`): on tansu, replica `a` claims a delivery log partition and
//! logs `--jobs` queued jobs on it (`--devices` devices, `--payload-bytes` of payload each,
//! in batches of 500 as the consumer loop logs them); then, `--rounds` times, a new
//! replica takes the partition as it does at a rebalance: it claims it (reads the log to
//! its end, appends its owner record, reads on to it) and restores the queues into a fresh
//! outbox. Printed per round: the claim and the restore, in ms, and the claim against a
//! bare consumer reading the same partition in the same run (the baseline).
//!
//! Not in the figures: opening the partition's connection to the devices' broker (one
//! MQTT CONNECT) and the dispatcher queueing the restored jobs (in memory).
//!
//!   cargo run -p pixgate-tests --bin pixgate-move -- [--jobs 10000] [--devices 500]

use anyhow::Context;
use clap::Parser;
use device_protocol::EffectKind;
use gateway::ingest::delivery_log::DeliveryLog;
use gateway::model::{Queued, SourceRef, StoredJob};
use gateway::store::Outbox;
use pixgate_tests::broker::KafkaBroker;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use simulators::capture;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const TOPIC: &str = "pixgate.delivery-log";
/// Jobs logged per `accepted` call.
const BATCH: usize = 500;
const WAIT: Duration = Duration::from_secs(30);

#[derive(Parser)]
#[command(about = "Times a device-jobs partition's move (claim + restore) with many queued jobs, on tansu")]
struct Args {
    /// Queued jobs on the moved partition.
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Devices they are queued for.
    #[arg(long, default_value_t = 500)]
    devices: usize,
    /// Payload bytes per job (before base64): a QR's BR Code is ~150, a raster receipt
    /// several KB.
    #[arg(long, default_value_t = 1_024)]
    payload_bytes: usize,
    /// Moves timed.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    pixgate_tests::init_cli_logs();
    let dir = std::env::temp_dir().join(format!("pixgate-move-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let broker = KafkaBroker::start(&dir.join("kafka"))?;
    let brokers = broker.addr().to_string();
    capture::ensure_topics(&brokers, &[(TOPIC, 1)]).await?;
    let result = run(&args, &brokers, &dir).await;
    broker.stop();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run(args: &Args, brokers: &str, dir: &std::path::Path) -> anyhow::Result<()> {
    let a = DeliveryLog::new(brokers, TOPIC, "pixgate-move-reader", "a")?;
    a.claim(&mut a.take_of(0), WAIT).await.context("a's claim")?;
    let payload = device_protocol::Job::encode_payload(&vec![0x1b; args.payload_bytes]);
    let started = Instant::now();
    let mut seqs: HashMap<String, u64> = HashMap::new();
    let mut batch = Vec::with_capacity(BATCH);
    for i in 0..args.jobs {
        let device = format!("pos-{:05}", i % args.devices.max(1));
        let seq = seqs.entry(device.clone()).or_default();
        *seq += 1;
        let job = device_protocol::Job {
            v: 1,
            message_id: format!("{i:032x}"),
            seq: *seq,
            kind: EffectKind::PrintReceipt,
            event_id: format!("ev-{i}"),
            charge_id: format!("ch-{}", i / 2),
            content_type: "application/vnd.escpos".into(),
            payload: payload.clone(),
            expires_at: None,
        };
        let source = SourceRef { topic: "pixgate.device-jobs".into(), partition: 0, offset: i as i64, key: None };
        batch.push(Queued::from_stored(StoredJob { device, job, source }));
        if batch.len() == BATCH || i + 1 == args.jobs {
            a.accepted(0, &batch, i as i64 + 1).await.context("logging jobs")?;
            batch.clear();
        }
    }
    println!(
        "[move] {} jobs for {} devices logged ({} payload bytes each) in {} ms",
        args.jobs,
        args.devices,
        args.payload_bytes,
        started.elapsed().as_millis()
    );
    println!("[move] round, records read by the bare consumer, bare ms, claim ms, claim/bare, jobs restored, restore ms, total ms");
    for round in 0..args.rounds {
        let (records, bare) = bare_read(brokers.to_string()).await?;
        let b = DeliveryLog::new(brokers, TOPIC, "pixgate-move-reader", &format!("b{round}"))?;
        let t = Instant::now();
        let restored = b.claim(&mut b.take_of(0), WAIT).await.context("the new owner's claim")?;
        let claim = t.elapsed();
        let outbox = Outbox::open(&dir.join(format!("outbox-{round}.redb")))?;
        let jobs = restored.jobs.len();
        let t = Instant::now();
        let headers = outbox.restore(restored.jobs, &restored.seqs)?;
        let restore = t.elapsed();
        anyhow::ensure!(
            jobs == args.jobs && headers.len() == jobs,
            "restored {jobs} jobs ({} queued), expected {}",
            headers.len(),
            args.jobs
        );
        println!(
            "[move] {round}, {records}, {}, {}, {:.2}, {jobs}, {}, {}",
            bare.as_millis(),
            claim.as_millis(),
            claim.as_secs_f64() / bare.as_secs_f64(),
            restore.as_millis(),
            (claim + restore).as_millis()
        );
    }
    Ok(())
}

/// A bare consumer reading the whole partition (assign, from the start, to its end now):
/// how many records and how long, creation included.
async fn bare_read(brokers: String) -> anyhow::Result<(i64, Duration)> {
    tokio::task::spawn_blocking(move || {
        let t = Instant::now();
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", "pixgate-move-bare")
            .set("enable.auto.commit", "false")
            .create()?;
        let (low, end) = c.fetch_watermarks(TOPIC, 0, WAIT)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(TOPIC, 0, Offset::Offset(low))?;
        c.assign(&tpl)?;
        let mut next = low;
        while next < end {
            match c.poll(WAIT) {
                Some(Ok(m)) => next = rdkafka::Message::offset(&m) + 1,
                Some(Err(e)) => return Err(e.into()),
                None => anyhow::bail!("bare read: nothing for {WAIT:?} at {next} of {end}"),
            }
        }
        Ok((end - low, t.elapsed()))
    })
    .await?
}
