//! The outbox's cost per record in a backlog drain, as pixgate's consumer writes it:
//! batches of 256 records (`outbox.batch_max_records`), about 1.1 jobs a record spread
//! over 500 devices, payloads the size of real screens and receipts, and with each batch
//! the removals of the jobs the devices finished meanwhile: each job is finished 2 to 6
//! batches after it was queued (devices ack at their own pace, so a batch's jobs leave over
//! several writes), and the queue holds about a thousand jobs as in `pixgate-load`'s drain
//! while the dedupe window grows. Charge ids are ObjectIds (creation second first), as
//! upstream's are.
//!
//! Prints CPU time (this process, user + system) and wall time per record and per job, and
//! the bytes written to disk per record against the jobs' own size; then the time to open
//! the file the drain left, plain and with `outbox.check_on_open`'s integrity check.
//! Run: `cargo bench -p gateway --bench outbox_drain [-- RECORDS [BATCH]]`. Compare two layouts
//! by running each in the same sitting; the figures, not a pass/fail, are the output.

use cdc::ChargeStatus;
use device_protocol::{EffectKind, Job};
use gateway::model::SourceRef;
use gateway::store::reconcile::RecordTally;
use gateway::store::{Accept, ChargeState, Outbox, Removal};
use std::time::{Duration, Instant};

const DEVICES: u64 = 500;

/// A small deterministic generator (xorshift64*), so runs compare.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// User + system CPU time of this process so far (`/proc/self/stat` fields 14, 15).
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
    let t: u64 = rest.split_whitespace().skip(11).take(2).filter_map(|x| x.parse::<u64>().ok()).sum();
    Duration::from_millis(t * 10)
}

/// Bytes this process caused to be written to storage so far (`/proc/self/io`
/// `write_bytes`: what reached the block layer, the pages redb wrote).
fn written() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines().find_map(|l| l.strip_prefix("write_bytes: ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

fn job(rng: &mut Rng, n: u64) -> Job {
    // A screen's payload is a few hundred bytes of base64, a receipt's a few kilobytes.
    let (kind, len) = match rng.below(3) {
        0 => (EffectKind::PrintReceipt, 2_600 + rng.below(800) as usize),
        1 => (EffectKind::DisplayQr, 700),
        _ => (EffectKind::PaymentConfirmed, 400),
    };
    Job {
        v: 1,
        message_id: format!("{:032x}", u128::from(rng.next()) << 64 | u128::from(n)),
        seq: 0,
        kind,
        event_id: format!("{n:024x}"),
        charge_id: format!("{:024x}", rng.next()),
        content_type: "application/vnd.escpos".into(),
        payload: "QUJD".repeat(len / 4),
        expires_at: None,
    }
}

fn main() {
    let mut args = std::env::args().skip(1).filter_map(|a| a.parse::<usize>().ok());
    let records = args.next().unwrap_or(200_000);
    let batch_records = args.next().unwrap_or(256);
    let dir = std::env::temp_dir().join(format!("pixgate-outbox-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let outbox = Outbox::open(&dir.join("outbox.redb")).expect("open outbox");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // Removals due at the next writes: in_flight[0] goes with the next one.
    let mut in_flight: std::collections::VecDeque<Vec<Removal>> = (0..7).map(|_| Vec::new()).collect();
    let (mut jobs, mut n, mut wire) = (0usize, 0u64, 0u64);
    let warm_up = records / 10;
    let (mut t0, mut c0, mut jobs0, mut w0, mut wire0) = (Instant::now(), cpu(), 0, written(), 0);
    // Measured from the first batch boundary past the warm-up, for whole batches.
    let start = warm_up.div_ceil(batch_records) * batch_records;
    let mut done = 0;
    while done < start + records {
        if done == start {
            (t0, c0, jobs0, w0, wire0) = (Instant::now(), cpu(), jobs, written(), wire);
        }
        let mut batch: Vec<Accept> = (0..batch_records)
            .map(|_| {
                n += 1;
                let count = if rng.below(10) == 0 { 2 } else { 1 };
                let jobs = (0..count).map(|_| (format!("dev-{:04}", rng.below(DEVICES)), job(&mut rng, n))).collect();
                Accept {
                    // A MongoDB ObjectId: its first 4 bytes are the creation second, so
                    // new charges' ids ascend as the records do.
                    charge: Some((
                        format!("{:08x}{:016x}", 1_700_000_000 + n / 100, rng.next()),
                        ChargeState { version: 1, status: ChargeStatus::Completed },
                    )),
                    jobs,
                    source: Some(SourceRef {
                        topic: "charge.upserted".into(),
                        partition: (n % 3) as i32,
                        offset: n as i64,
                        key: None,
                    }),
                    event_time: (1_700_000_000 + n / 100) << 32 | (n % 100),
                    // The reconciliation counts, as the planner gives every record.
                    tally: Some(RecordTally { event_time_s: 1_700_000_000 + n / 100, counters: Vec::new() }),
                    ..Accept::default()
                }
            })
            .collect();
        let removals = in_flight.pop_front().unwrap_or_default();
        in_flight.push_back(Vec::new());
        let out = outbox.write(&mut batch, &removals, 1_700_000_000_000 + n).expect("write");
        for q in out.iter().flat_map(|(q, _)| q) {
            jobs += 1;
            wire += q.wire.len() as u64;
            let due = 1 + rng.below(5) as usize; // finished 2 to 6 writes from now
            in_flight[due].push(Removal::done(q.stored.device.clone(), q.stored.job.seq));
        }
        done += batch_records;
    }
    let (wall, cpu_used, jobs, bytes, wire) = (t0.elapsed(), cpu() - c0, jobs - jobs0, written() - w0, wire - wire0);
    let records = done - start;
    let per = |d: Duration, k: usize| d.as_secs_f64() * 1e6 / k as f64;
    println!(
        "outbox drain: {records} records, {jobs} jobs in batches of {batch_records} over {DEVICES} devices: CPU {:.1} µs a record ({:.1} a job), wall {:.1} µs a record; written to disk {:.0} bytes a record (the jobs themselves: {:.0} bytes a record)",
        per(cpu_used, records),
        per(cpu_used, jobs),
        per(wall, records),
        bytes as f64 / records as f64,
        wire as f64 / records as f64,
    );
    drop(outbox);
    // What `outbox.check_on_open` costs at start on the file the drain left (its dedupe
    // window and charge states included), against a plain open, alternated. The first
    // open of the pair reads from the page cache the drain warmed as much as the second.
    let path = dir.join("outbox.redb");
    let size = std::fs::metadata(&path).map_or(0, |m| m.len());
    let mut opens = [Vec::new(), Vec::new()];
    for round in 0..6 {
        let check = round % 2 == 1;
        let t = Instant::now();
        let o = Outbox::open_with_cache(&path, gateway::config::DEFAULT_CACHE_BYTES, check).expect("reopen outbox");
        opens[usize::from(check)].push(t.elapsed().as_secs_f64() * 1e3);
        drop(o);
    }
    let show = |v: &[f64]| v.iter().map(|ms| format!("{ms:.0}")).collect::<Vec<_>>().join(", ");
    println!(
        "outbox open of the drained file ({:.0} MiB): plain {} ms; with the integrity check {} ms",
        size as f64 / (1 << 20) as f64,
        show(&opens[0]),
        show(&opens[1])
    );
    let _ = std::fs::remove_dir_all(&dir);
}
