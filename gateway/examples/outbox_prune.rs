//! How long a prune of the dedupe window holds other outbox writes.
//!
//! `cargo run --release -p gateway --example outbox_prune -- [IDS]` fills an outbox's
//! dedupe window with `IDS` message ids (default 1,000,000) spread over a day, each
//! accepted when its event happened (256 per write, each job then removed, as a drain
//! does). Then it runs a writer of 16-record batches (a live gateway) alone, and during
//! [`Outbox::prune_seen`] with three cutoffs: nothing old, the first minute, the first
//! half day. Per case it prints how long the prune took and the slowest concurrent write.
//! Compare the slowest write with and without a prune, in the same run: the machines
//! here are noisy.
use device_protocol::{EffectKind, Job};
use gateway::store::{Accept, Outbox, Removal};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `n` records from `from` on, one job each for one of 500 devices; ids are hashes, as
/// real message ids are (random positions in the window).
fn batch(from: u64, n: u64, now_ms: u64) -> Vec<Accept> {
    // `clusterTime` as `t << 32 | i`, the event happening as it is accepted.
    let event_time = (now_ms / 1000).min(u64::from(u32::MAX)) << 32;
    (0..n)
        .map(|k| {
            let id = format!("{:064x}", (from + k).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let job = Job {
                v: 1,
                message_id: id,
                seq: 0,
                kind: EffectKind::DisplayQr,
                event_id: "e".into(),
                charge_id: "c".into(),
                content_type: "x".into(),
                payload: "AAAA".into(),
                expires_at: None,
            };
            Accept { jobs: vec![(format!("dev{}", (from + k) % 500), job)], event_time, ..Accept::default() }
        })
        .collect()
}

/// Accepts a batch, then removes its jobs as done (their ids stay in the window).
fn write(o: &Outbox, from: u64, n: u64, now_ms: u64) {
    let out = o.write(&mut batch(from, n, now_ms), &[], now_ms).expect("write");
    let done: Vec<Removal> = out
        .iter()
        .flat_map(|(q, _)| q.iter().map(|q| Removal::done(q.stored.device.clone(), q.stored.job.seq)))
        .collect();
    o.write(&mut [], &done, now_ms).expect("remove");
}

fn main() {
    let dir = std::env::temp_dir().join(format!("pixgate-outbox-prune-{}", std::process::id()));
    let o = Arc::new(Outbox::open(&dir.join("outbox.redb")).expect("open"));
    let n: u64 = std::env::args().nth(1).map_or(1_000_000, |s| s.parse().expect("IDS: a number"));
    let t = Instant::now();
    // Id i accepted at i × DAY_MS / IDS.
    const DAY_MS: u64 = 86_400_000;
    let at = |i: u64| i * DAY_MS / n;
    let mut i = 0;
    while i < n {
        write(&o, i, 256, at(i));
        i += 256;
    }
    println!("{n} ids in the window, filled in {:.1} s", t.elapsed().as_secs_f64());
    let run = |prune: Option<u64>, case: u64| {
        let stop = Arc::new(AtomicBool::new(false));
        let (o2, stop2) = (o.clone(), stop.clone());
        let writer = std::thread::spawn(move || {
            let (mut slowest, mut k) = (Duration::ZERO, 0u64);
            while !stop2.load(Ordering::Relaxed) {
                let t = Instant::now();
                // New ids, after every cutoff.
                write(&o2, (1 << 40) + (case << 32) + k * 16, 16, 2 * DAY_MS);
                slowest = slowest.max(t.elapsed());
                k += 1;
            }
            (slowest, k)
        });
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        let removed = match prune {
            Some(cutoff) => o.prune_seen(cutoff).expect("prune"),
            None => {
                std::thread::sleep(Duration::from_millis(300));
                0
            }
        };
        let took = t.elapsed();
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        let (slowest, writes) = writer.join().expect("writer");
        let what = prune.map_or("no prune".to_string(), |c| {
            format!("prune, cutoff {c}: {removed} ids removed in {:.0} ms;", took.as_secs_f64() * 1e3)
        });
        println!("{what} concurrent writer: {writes} writes, slowest {:.1} ms", slowest.as_secs_f64() * 1e3);
    };
    run(None, 0);
    run(Some(0), 1);
    run(Some(60_000), 2);
    run(Some(DAY_MS / 2), 3);
    std::fs::remove_dir_all(dir).ok();
}
